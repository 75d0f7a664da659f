"""Where WebDataset shard bytes come from (`open_shard`): a file, or what is not a local file: `http://` and `https://` URLs, read as a
stream with the standard library, and `pipe:COMMAND`, the standard output of a shell command
the user wrote (WebDataset's own convention: `pipe:curl -s URL`, `pipe:aws s3 cp URL -`,
`pipe:gsutil cat URL`). Brace patterns expand as for files (`https://host/train-{000..009}.tar`).

A `pipe:` command is the one place vitlab runs a shell, so it runs only what the user wrote
(`check_command`): in a `vitlab` process, a command typed on its command line (`--data
wds:pipe:...`, `data.name=wds:pipe:...`), never one that came from a file (a recipe, a run's
config.yaml, a sweep spec) unless the command line says --allow-pipe or the environment
switch VITLAB_ALLOW_PIPE is on (1, true, yes or on; any other word is refused, never read as
on); in Python, the strings its caller passes.

Nothing is stored: a shard is streamed each time it is read. The per-shard index (sample
counts, labels) is cached as for files when the server names the version it sends (an ETag,
or Last-Modified with Content-Length); a pipe, whose output may change, is indexed afresh.
"""

from __future__ import annotations

import bz2
import contextlib
import ctypes
import gzip
import hashlib
import io
import lzma
import os
import signal
import subprocess
import sys
import urllib.error
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

from vitlab.config.fields import ConfigError, env_switch, number
from vitlab.data.datasets import DataError
from vitlab.files import net
from vitlab.files.net import DeadlinePassed, RawReader, open_url

SCHEMES = ("http://", "https://", "pipe:")
TIMEOUT_S = 30.0  # for the first byte of a response and each read; a stalled server is named, not waited on forever
# A request's whole deadline, from before it connects: TIMEOUT_S plus its bytes at MIN_RATE
# (vitlab.files.net), so that a server that sends a byte now and then, in its headers or its body
# (never silent for TIMEOUT_S), is cut off too. Both may be set for a slow link in the
# environment: VITLAB_HTTP_TIMEOUT (seconds), VITLAB_HTTP_MIN_RATE (bytes per second).
MIN_RATE = net.MIN_RATE


def limits() -> tuple[float, float]:
    """(TIMEOUT_S, MIN_RATE), or what the environment sets instead."""
    def setting(name: str, default: float) -> float:
        text = os.environ.get(name, "")
        try:
            return float(number(text, name, above=0, hint=f"the default is {default:g}")) if text.strip() else default
        except ConfigError as e:
            raise DataError(str(e)) from None

    return setting("VITLAB_HTTP_TIMEOUT", TIMEOUT_S), setting("VITLAB_HTTP_MIN_RATE", MIN_RATE)

# Who may run a shell command. None: no command line set the rule (a Python caller, whose
# strings run as WebDataset runs them); else the commands typed on this process's command line.
ALLOW_ENV = "VITLAB_ALLOW_PIPE"
_typed: Optional[frozenset[str]] = None


def typed_commands(words: Iterable[str]) -> frozenset[str]:
    """The `pipe:` commands written in command-line words (`wds:pipe:CMD`, `data.name=wds:pipe:CMD`)."""
    return frozenset(w.split("pipe:", 1)[1] for w in words if "pipe:" in w)


@contextlib.contextmanager
def command_line_rule(argv: Iterable[str], allow: bool = False) -> Iterator[None]:
    """While a command runs: only the pipe: commands typed in `argv` run (all of them with
    `allow`, the command's --allow-pipe, or with the switch VITLAB_ALLOW_PIPE on)."""
    global _typed
    allow = allow or env_switch(ALLOW_ENV)  # read once, in the process whose command line it is
    before, _typed = _typed, None if allow else typed_commands(argv)
    try:
        yield
    finally:
        _typed = before


def check_command(command: str, where: str = "wds") -> None:
    """Refuse, before it runs, a pipe: command nobody allowed (see the module docstring)."""
    if _typed is None or command in _typed:
        return
    raise DataError(f"{where}: pipe:{command} would run a shell command that is not on this command line (it comes from a file); if "
                    f"you trust that file, allow it with --allow-pipe (or {ALLOW_ENV}=1)")


class RemoteShard(str):
    """A shard's URL (or pipe: command); prints as itself in every message."""

    @property
    def is_pipe(self) -> bool:
        return self.startswith("pipe:")


Shard = Union[Path, RemoteShard]  # a shard file, or a URL or pipe: command (open_shard reads both)


class _Pipe(RawReader):
    """A command's standard output as a stream; closing it waits for the command, and a
    command that failed is an error naming it (a truncated stream is not a short shard)."""

    def __init__(self, command: str):
        # The user's own command, run as they wrote it (WebDataset's pipe: convention).
        self.command = command
        self.proc = subprocess.Popen(GUARDED.format(command=command), shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=_dies_with(os.getpid(), ctypes.CDLL(None))
                                     if sys.platform == "linux" else None)

    def readinto(self, b: Any) -> int:
        assert self.proc.stdout is not None  # (stdout=PIPE)
        data = self.proc.stdout.read(len(b))
        b[: len(data)] = data
        if not data:
            self._check()
        return len(data)

    def _check(self) -> None:
        code = self.proc.wait()
        if code != 0:
            assert self.proc.stderr is not None  # (stderr=PIPE)
            err = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
            raise DataError(f"wds: pipe:{self.command} exited with status {code}"
                            + (f" ({err[-1][:200]})" if err else ""))

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # (the group ended meanwhile)
                os.killpg(self.proc.pid, signal.SIGKILL)  # the command's whole group, pipeline stages and all
        self.proc.wait()
        super().close()


# The shell runs the command in the background of a process group of its own and waits for it;
# when the process that started the shell dies (a data-loader worker killed busy: loader.close's
# SIGKILL), the shell gets SIGTERM (`_dies_with`) and kills the whole group, so that no command,
# nor any stage of a pipeline, is left running, reading or holding a connection.
GUARDED = "trap 'kill -KILL 0' TERM\n{{ {command}\n}} & wait $!"


def _dies_with(parent: int, libc: Any) -> Any:
    """What the shell's process runs before the shell: SIGTERM for it when `parent` dies
    (Linux's PR_SET_PDEATHSIG). libc is loaded before the fork, not in the child."""
    def arm() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before this was armed
            os._exit(1)
    return arm


def _raw(shard: RemoteShard) -> Any:
    if shard.is_pipe:
        return _Pipe(shard[len("pipe:"):])
    try:
        return open_url(shard, *limits())
    except urllib.error.HTTPError as e:
        raise DataError(f"wds: {shard}: the server answered HTTP {e.code} ({e.reason})") from None
    except DeadlinePassed as e:
        raise DataError(f"wds: {e}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DataError(f"wds: cannot fetch {shard} ({getattr(e, 'reason', None) or e})") from None


def open_shard(shard: Any) -> Any:
    """A shard's tar bytes, from a file, a URL or a pipe, decompressed by their magic number
    (gzip, bzip2, xz) as they arrive, or as they are."""
    if not isinstance(shard, RemoteShard):
        raw = open(shard, "rb")
    else:
        raw = io.BufferedReader(_raw(shard) if shard.is_pipe else _Response(_raw(shard), shard), buffer_size=1 << 20)
    magic = raw.peek(6)[:6]
    openers: tuple[tuple[bytes, Any], ...] = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
    return next((opener(raw, "rb") for start, opener in openers if magic.startswith(start)), raw)


class _Response(RawReader):
    """An HTTP response as a raw stream (BufferedReader wants readinto); its reads are under the
    request's whole deadline (vitlab.files.net, `limits`), and passing it is a DataError naming the
    shard. Each read takes what has arrived (read1)."""

    def __init__(self, response: Any, url: str):
        self.response, self.url = response, url

    def readinto(self, b: Any) -> int:
        try:
            data = self.response.read1(len(b))
        except DeadlinePassed as e:
            raise DataError(f"wds: {e}") from None
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.response.close()
        super().close()


def version_tag(shard: RemoteShard) -> Optional[str]:
    """What identifies this version of the shard for the index cache: the URL with the
    server's ETag or Last-Modified and length; None (no caching) for a pipe or a server that
    says neither."""
    if shard.is_pipe:
        return None
    try:
        with open_url(shard, *limits(), method="HEAD") as r:
            etag, modified, length = r.headers.get("ETag"), r.headers.get("Last-Modified"), r.headers.get("Content-Length")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not (etag or (modified and length)):
        return None
    return hashlib.sha1(f"{shard}|{etag}|{modified}|{length}".encode()).hexdigest()[:20]


def classes_beside(shard: RemoteShard) -> Optional[list[str]]:
    """classes.txt in the same folder as an http(s) shard, when the server has one."""
    if shard.is_pipe:
        return None
    url = shard.rsplit("/", 1)[0] + "/classes.txt"
    try:
        with open_url(url, *limits()) as r:
            text = r.read(1 << 20).decode()  # under a request's deadline
    except DeadlinePassed as e:
        raise DataError(f"wds: {e}") from None
    except (urllib.error.URLError, OSError, ValueError, UnicodeDecodeError):
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]


def shard_version(path: Any) -> str:
    """The index cache's key for this version of a shard: a file's path, size and mtime, a
    URL's ETag or Last-Modified (version_tag); "uncached" when a remote one says neither."""
    if isinstance(path, RemoteShard):
        return version_tag(path) or "uncached"
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
