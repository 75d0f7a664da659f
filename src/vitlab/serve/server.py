"""Starting `vitlab serve`: the socket, the start-up lines, uvicorn, and a graceful stop.

    engine = Engine(model, "bf16")
    server.run(engine, ServeConfig(port=8080), say=print)     # blocks until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from typing import Callable

from vitlab.config import ConfigError
from vitlab.config.serve import ServeConfig
from vitlab.serve.app import create_app
from vitlab.serve.engine import Engine


def run(engine: Engine, config: ServeConfig, access_log: bool = False, say: Callable[[str], None] = print) -> int:
    """Bind config.host:port, say where the model is, warm up, serve until stopped; 0 after
    a graceful stop (SIGTERM lets the requests in flight finish)."""
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    if not ipaddress.ip_address(host).is_loopback:
        guard = "" if config.api_key else "; /predict is open to them (set --api-key)"
        say(f"listening on {host}: every machine that can reach this one can use the model{guard}")
    say(f"{engine.config.name} ({engine.precision}) at {url}  (the page: {url}/  the API: {url}/docs); warming up")
    app = create_app(engine, config, on_ready=lambda s: say(f"ready ({s:.1f} s warm-up)"))
    code = serve_socket(app, sock, config, access_log)
    say("stopped")
    return code


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET  # checked by ServeConfig
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise ConfigError(
            f"cannot listen on {host}:{port} ({e.strerror}); pick another --port (0: any free one)"
        ) from None
    # Accepted connections inherit this. Without it, on a kept-alive connection each answer
    # (headers, then body: two writes) waits for the client's delayed ACK: about 40 ms a request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve_socket(app, sock: socket.socket, config: ServeConfig, access_log: bool) -> int:
    # uvicorn is the serve extra's; imported here so the other commands start without it.
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=access_log,
            timeout_graceful_shutdown=config.shutdown_timeout_s,
            limit_concurrency=config.max_connections,
            lifespan="on",
        )
    )
    # uvicorn finishes the requests in flight on SIGTERM, then raises the signal again for the
    # handler it found installed. That handler is this no-op, so a graceful stop exits 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 0 if server.started else 1
