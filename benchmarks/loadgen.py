"""A bounded load generator for a `vitlab serve` on this machine: the benchmark's and the tests'
(this repository's tooling, not part of the library a user imports).

`run_load(port, body, concurrency=32, requests=3000)` keeps `concurrency` clients busy, each on
its own keep-alive connection sending the same POST, until `requests` have been answered (or
`duration` seconds have passed), and times every request.

It speaks just enough HTTP/1.1 over asyncio streams (one request, a Content-Length answer):
a general client such as httpx spends more CPU per request than a small model's forward pass,
and on a 2-core machine whatever the client spends, the server loses. It refuses any address
but the loopback, so it cannot be turned on someone else's server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np


@dataclass
class LoadResult:
    concurrency: int
    elapsed: float = 0.0  # seconds, first request sent to last answer
    latencies: list[float] = field(default_factory=list)  # seconds, one per answered request
    finished: list[float] = field(default_factory=list)  # when each answer came, seconds from the start
    started: float = 0.0  # time.perf_counter() at the start
    statuses: Counter = field(default_factory=Counter)
    bad_bodies: int = 0  # 200 answers that `check` refused
    errors: list[str] = field(default_factory=list)  # requests that got no answer, and why

    @property
    def answered(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.answered / self.elapsed if self.elapsed else 0.0

    def throughput_within(self, seconds: float) -> float:
        """Answers per second in the first `seconds`: with a duration, this leaves out the
        tail in which the last requests drain and fewer clients are busy."""
        return sum(t <= seconds for t in self.finished) / seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000) if self.latencies else float("nan")


def _request_bytes(host: str, port: int, path: str, body: bytes, content_type: str, headers: dict) -> bytes:
    where = f"[{host}]" if ":" in host else host
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {where}:{port}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the server keeps the connection open)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
    fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
    if "content-length" not in fields:
        raise ValueError("the answer has no Content-Length (chunked answers are not read here)")
    body = await reader.readexactly(int(fields["content-length"]))
    return status, body, fields.get("connection", "").lower() != "close"


async def _client(host, port, request, take: Callable[[], bool], result: LoadResult, check) -> None:
    reader = writer = None
    while take():
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            await writer.drain()
            status, body, keep = await _read_response(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            result.errors.append(f"{type(e).__name__}: {e}")
            if writer is not None:
                writer.close()
            reader = writer = None
            continue
        now = time.perf_counter()
        result.latencies.append(now - started)
        result.finished.append(now - result.started)
        result.statuses[status] += 1
        if status == 200 and check is not None and not check(body):
            result.bad_bodies += 1
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def _load(host, port, request, concurrency, requests, duration, check) -> LoadResult:
    result = LoadResult(concurrency)
    left = [requests if requests is not None else -1]
    deadline = time.perf_counter() + duration if duration is not None else None

    def take() -> bool:
        if deadline is not None and time.perf_counter() >= deadline:
            return False
        if left[0] == 0:
            return False
        left[0] -= 1
        return True

    result.started = time.perf_counter()
    await asyncio.gather(*(_client(host, port, request, take, result, check) for _ in range(concurrency)))
    result.elapsed = time.perf_counter() - result.started
    return result


def run_load(
    port: int,
    body: bytes,
    *,
    concurrency: int = 32,
    requests: Optional[int] = None,
    duration: Optional[float] = None,
    path: str = "/predict",
    content_type: str = "application/octet-stream",
    headers: Optional[dict] = None,
    host: str = "127.0.0.1",
    check: Optional[Callable[[bytes], bool]] = None,
) -> LoadResult:
    """Send the same POST `requests` times (or for `duration` s) from `concurrency` clients."""
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"the load generator only sends to this machine (127.0.0.1 or ::1), not {host}")
    if requests is None and duration is None:
        raise ValueError("give a number of requests or a duration: the load is always bounded")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    request = _request_bytes(host, port, path, body, content_type, headers or {})
    return asyncio.run(_load(host, port, request, concurrency, requests, duration, check))
