"""Starting the server: bind the socket, say where it listens, run uvicorn until SIGTERM.

    engine = Engine(model, "bf16")
    exit_code = start(engine, ServeConfig(port=8080))     # blocks; 0 after a graceful stop

The socket is bound before uvicorn starts, so a port in use is one clear error and a port 0
is known (and announced) before the first request. SIGTERM lets the requests in flight
finish, then `start` returns 0.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from typing import Callable

from vitlab.config import ConfigError
from vitlab.config.serve import ServeConfig
from vitlab.log import get_logger, notice
from vitlab.serve.app import create_app
from vitlab.serve.engine import Engine

LOG = get_logger("serve")


def say(message: str) -> None:
    """The server's own lines, on stderr as they happen."""
    notice(LOG, f"vitlab serve: {message}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one), or one line naming the fix."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET  # checked by ServeConfig
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port (0: any free one)") from None
    # Accepted connections inherit this. Without it, on a kept-alive connection each answer
    # (headers, then body: two writes) waits for the client's delayed ACK: about 40 ms a request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def start(engine: Engine, config: ServeConfig, access_log: bool = False, log: Callable[[str], None] = say) -> int:
    """Serve `engine` as `config` says until stopped; 0 after a graceful stop, 1 if uvicorn
    never started. `log` receives where it listens, a warning when that is not this machine
    only, "ready" after the warm-up and "stopped"."""
    sock = bind(config.host, config.port)
    url = url_of(sock)
    if not ipaddress.ip_address(config.host).is_loopback:
        guard = "" if config.api_key else "; /predict is open to them (set --api-key)"
        log(f"listening on {config.host}: every machine that can reach this one can use the model{guard}")
    log(f"{engine.config.name} ({engine.precision}) at {url}  (the page: {url}/  the API: {url}/docs); warming up")
    app = create_app(engine, config, on_ready=lambda s: log(f"ready ({s:.1f} s warm-up)"))
    return run(app, sock, config, access_log, log)


def run(app, sock: socket.socket, config: ServeConfig, access_log: bool = False,
        log: Callable[[str], None] = say) -> int:
    """uvicorn on an already bound socket, until SIGTERM or Ctrl-C."""
    import uvicorn  # the serve extra's; imported here so that the other commands start without it

    # timeout_graceful_shutdown a float: uvicorn waits with asyncio, which takes one; its annotation says int
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=access_log, lifespan="on",
                                           timeout_graceful_shutdown=config.shutdown_timeout_s,  # type: ignore[arg-type]
                                           limit_concurrency=config.max_connections))
    # uvicorn finishes the requests in flight on SIGTERM, then raises the signal again for the
    # handler it found installed. That handler is this no-op, so a graceful stop exits 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    log("stopped")
    return 0 if server.started else 1
