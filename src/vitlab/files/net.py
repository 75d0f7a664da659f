"""Every network read of vitlab under one deadline that covers the whole request: the
connection, the status line and headers, and the body (`open_url`; `deadlines()` for a
library that calls urllib itself, torch.hub).

A request has `timeout` seconds for its first bytes and for each read (a stall), and the
whole of it, counted from before the connection, must end within `timeout` plus its bytes at
`min_rate` bytes per second (a trickle: a server that sends a byte now and then, headers
included, is never silent for `timeout` yet would never end). The deadline is checked before
every read of the socket, whose own timeout is then the time left, so a request ends at most
one read after its deadline. Redirects are new requests, each with its own deadline.
Not covered: the name lookup (the system resolver has no timeout to give).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

USER_AGENT = "vitlab"
MIN_RATE = 16 * 1024  # bytes per second after the first `timeout` seconds: the default floor of a whole deadline


class DeadlinePassed(TimeoutError):
    """A request that did not end within its deadline; the message names the URL and the fix."""


class Deadline:
    """One request's deadline (see the module docstring)."""

    def __init__(self, url: str, timeout: float, min_rate: float):
        self.url, self.timeout, self.min_rate = url, timeout, min_rate
        self.start, self.received = time.monotonic(), 0

    def left(self) -> float:
        """Seconds the next read may wait; DeadlinePassed when none are left."""
        elapsed = time.monotonic() - self.start
        left = self.timeout + self.received / self.min_rate - elapsed
        if left <= 0 and not self.received:
            raise self.stalled()
        if left <= 0:
            raise DeadlinePassed(
                f"{self.url}: {self.received:,} bytes in {elapsed:.0f} s, slower than {self.min_rate:,.0f} bytes/s after "
                f"the first {self.timeout:g} s; the server is stalling, so the request was cut off (a slow link: set "
                "VITLAB_HTTP_MIN_RATE lower or VITLAB_HTTP_TIMEOUT higher)")
        return min(self.timeout, left)

    def passed(self, wait: float) -> DeadlinePassed:
        """What a read that timed out after waiting `wait` seconds means: a stall (no byte for
        the whole `timeout`), or the whole deadline passed (said by `left`)."""
        if wait < self.timeout:
            self.left()
        return self.stalled()

    def stalled(self) -> DeadlinePassed:
        return DeadlinePassed(f"{self.url}: no byte came for {self.timeout:g} s (timed out); the server is stalling "
                              "(a slow link: set VITLAB_HTTP_TIMEOUT higher)")


class RawReader(io.RawIOBase):
    """A raw stream of bytes that can be read (what io.BufferedReader wants of it): vitlab's
    streams of a response, a pipe and a shard subclass it."""

    def readable(self) -> bool:
        return True


class _Reads(RawReader):
    """A response's socket stream with the deadline checked before each read."""

    def __init__(self, raw: Any, sock: socket.socket, deadline: Deadline):
        self.raw, self.sock, self.deadline = raw, sock, deadline

    def readinto(self, b: Any) -> int:
        wait = self.deadline.left()
        self.sock.settimeout(wait)
        try:
            n = self.raw.readinto(b)
        except TimeoutError:
            raise self.deadline.passed(wait) from None
        self.deadline.received += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, deadline: Deadline, **kwargs: Any):
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_Reads(self.fp.detach(), sock, deadline))  # status line, headers and body


class _Timed:
    """An HTTP(S) connection whose connect (and TLS handshake) and response share one deadline."""

    timeout: Any  # http.client's per-socket-operation timeout: the time left of the deadline
    response_class: Any

    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self.response_class = functools.partial(_Response, deadline=deadline)

    def connect(self) -> None:
        self.timeout = wait = self.deadline.left()
        try:
            super().connect()  # type: ignore[misc]
        except TimeoutError:
            raise self.deadline.passed(wait) from None
        self.deadline.left()


class _HTTPConnection(_Timed, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Timed, http.client.HTTPSConnection):
    pass


def _open(handler: Any, connection: type, req: urllib.request.Request, **kwargs: Any) -> Any:
    """A request under a fresh deadline; a deadline passed while connecting is raised as itself,
    not inside urllib's URLError."""
    try:
        return handler.do_open(functools.partial(connection, deadline=Deadline(req.full_url, *handler.limits)), req,
                               **kwargs)
    except urllib.error.URLError as e:
        if isinstance(e.reason, DeadlinePassed):
            raise e.reason from None
        raise


class _Limits:
    def __init__(self, timeout: float, min_rate: float):
        super().__init__()
        self.limits = (timeout, min_rate)


class _HTTPHandler(_Limits, urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return _open(self, _HTTPConnection, req)


class _HTTPSHandler(_Limits, urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> Any:
        return _open(self, _HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


def opener(timeout: float, min_rate: float) -> urllib.request.OpenerDirector:
    """urllib's opener (file:// and the proxy settings included) with http(s) under the deadline."""
    return urllib.request.build_opener(_HTTPHandler(timeout, min_rate), _HTTPSHandler(timeout, min_rate))


def open_url(url: str, timeout: float, min_rate: float, method: str = "GET") -> Any:
    """The response to one request, every read of it under the request's deadline. Errors are
    urllib's (HTTPError, URLError), OSError, and DeadlinePassed (a TimeoutError, so an OSError)."""
    request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT})
    return opener(timeout, min_rate).open(request, timeout=timeout)


@contextlib.contextmanager
def deadlines(timeout: float, min_rate: float) -> Iterator[None]:
    """For the block, urllib.request.urlopen (which a library such as torch.hub calls itself)
    opens http(s) URLs under the deadline of `open_url`."""
    previous = urllib.request._opener  # type: ignore[attr-defined]
    urllib.request.install_opener(opener(timeout, min_rate))
    try:
        yield
    finally:
        urllib.request.install_opener(previous)
