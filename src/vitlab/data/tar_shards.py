"""Tar shards as WebDataset writes them: where a pattern's shards are, and the samples of one.

`expand_braces` and `resolve_shards` turn `wds:PATTERN` into shard paths (local or remote);
`iter_shard` reads one shard as a stream of (key, {extension: bytes}), naming a truncated or
damaged shard instead of ending early. What the samples mean (labels, dev buckets, the
dataset) is vitlab.data.wds's.
"""

from __future__ import annotations

import glob
import lzma
import os
import re
import tarfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from vitlab.config.fields import bounded
from vitlab.data import remote
from vitlab.data.datasets import DataError
from vitlab.files import NotRegularFileError, require_regular_file
from vitlab.files.net import RawReader

# A member larger than this is refused before it is read: no image or label is near it, and
# a tar (or a gzip bomb) can claim any size in its header.
MAX_MEMBER_BYTES = 512 * 2**20


# A pattern naming more shards than this is refused before one name is made (a typo such as
# {0..999999999} would otherwise build a billion names).
MAX_SHARDS = 100_000
_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"([0-9]+)\.\.([0-9]+)")


def _options(body: str) -> tuple[int, Iterable[str]]:
    """A brace group's count of options, and the options made lazily: `000..002` -> padded
    numbers; `x,y` -> x, y."""
    r = _RANGE.fullmatch(body)
    if not r:
        parts = body.split(",")
        return len(parts), parts
    lo, hi = r.group(1), r.group(2)
    width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
    numbers = range(int(lo), int(hi) + 1)
    return len(numbers), (str(i).zfill(width) for i in numbers)


def brace_count(pattern: str) -> int:
    """How many names `pattern` expands to, counted without making one (nested groups count
    each group's options, an upper bound)."""
    count = 1
    while (m := _GROUP.search(pattern)) is not None:
        count *= _options(m.group(1))[0]
        pattern = pattern[: m.start()] + "x" + pattern[m.end():]
    return count


def expand_braces(pattern: str, bound: int = MAX_SHARDS) -> Iterator[str]:
    """`a{000..002}b` -> a000b a001b a002b (zero padding kept); `{x,y}` -> alternatives. The
    count is checked against `bound` first (config.fields.bounded), then names are made one at a time."""
    bounded(brace_count(pattern), bound, f"the pattern {pattern}", "names", "name fewer shards, or split the pattern")
    return _expand(pattern)


def _expand(pattern: str) -> Iterator[str]:
    m = _GROUP.search(pattern)
    if not m:
        yield pattern
        return
    head, tail = pattern[: m.start()], pattern[m.end():]
    for option in _options(m.group(1))[1]:
        yield from _expand(head + option + tail)


def resolve_shards(pattern: str, split: str) -> list[remote.Shard]:
    if pattern.startswith(remote.SCHEMES):  # http(s):// or pipe: (remote.py); braces expand, globs do not
        if pattern.startswith("pipe:"):
            remote.check_command(pattern[len("pipe:"):])  # a shell runs only what the user wrote
        return [remote.RemoteShard(p) for p in expand_braces(pattern)]  # (at most MAX_SHARDS)
    path = Path(pattern)
    if path.is_dir():
        prefixes = ("train",) if split in ("train", "dev", "train-minus-dev") else ("test", "val")
        for prefix in prefixes:
            found_here: list[remote.Shard] = sorted(p for p in path.glob(f"{prefix}*.tar*") if p.is_file())  # is_file: no FIFOs
            if found_here:
                return found_here
        raise DataError(f"wds: {path} holds no {' or '.join(p + '*.tar[.gz]' for p in prefixes)} shards for split {split!r}")
    shards: list[remote.Shard] = []
    for p in expand_braces(pattern):
        found = sorted(glob.glob(p)) if any(c in p for c in "*?[") else ([p] if os.path.exists(p) else [])
        if not found:
            raise DataError(f"wds: no shard {p} (from the pattern {pattern})")
        shards += [Path(f) for f in found]
    for shard in shards:
        try:
            require_regular_file(shard, "shard file")
        except NotRegularFileError as e:
            raise DataError(f"wds: {e}") from None
    return shards


def split_key(name: str) -> tuple[str, str]:
    """WebDataset convention: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (folder + "/" + stem if folder else stem), ext.lower()


class _Tail(RawReader):
    """A reader that counts the bytes it hands out and keeps the last KEEP of them: enough
    to look at the block where tarfile stopped (see `iter_shard`)."""

    KEEP = 64 * 1024

    def __init__(self, f: Any):
        self.f, self.total, self.tail = f, 0, b""

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        b[: len(data)] = data
        self.total += len(data)
        self.tail = (self.tail + data)[-self.KEEP :]
        return len(data)


def iter_shard(path: remote.Shard) -> Iterator[tuple[str, dict[str, bytes]]]:
    """The samples of one shard, in tar order: (key, {extension: bytes}).

    tarfile ends a stream quietly at a truncated or garbled header, which would make a damaged
    shard a shorter one; here the block it stopped at must be the end-of-archive marker (zeros),
    and every member must be read whole, or the shard is named as damaged."""
    try:
        with remote.open_shard(path) as stream:
            raw = _Tail(stream)
            with tarfile.open(fileobj=raw, mode="r|") as tf:
                key: Optional[str] = None
                parts: dict[str, bytes] = {}
                for member in tf:
                    if not member.isfile():  # links and folders carry no sample (and are never followed)
                        continue
                    if member.size > MAX_MEMBER_BYTES:
                        raise DataError(f"wds: {path}: member {member.name} claims {member.size:,} bytes, more than "
                                        f"any sample ({MAX_MEMBER_BYTES:,}); not read", reason="too-big")
                    k, ext = split_key(member.name)
                    if k != key and parts:
                        assert key is not None  # (parts were read under it)
                        yield key, parts
                        parts = {}
                    key = k
                    f = tf.extractfile(member)
                    parts[ext] = f.read() if f else b""
                    if len(parts[ext]) != member.size:
                        raise DataError(f"wds: {path}: member {member.name} is cut short; the shard is truncated")
                _check_end(path, raw, tf.offset, key)
                if key is None:  # a whole, valid tar of no files: a shard that was never filled
                    raise DataError(f"wds: {path}: an empty shard (a tar with no files); write it again, or leave it "
                                    "out of the data spec", reason="empty-shard")
                if parts:
                    assert key is not None  # (as above)
                    yield key, parts
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"wds: cannot read the shard {path} ({type(e).__name__}: {e})") from None


def _check_end(path: remote.Shard, raw: _Tail, end: int, last: Optional[str]) -> None:
    start = raw.total - len(raw.tail)
    block = raw.tail[end - start : end - start + tarfile.BLOCKSIZE] if end >= start else None
    after = f" after sample {last}" if last else ""
    if block is not None and len(block) < tarfile.BLOCKSIZE:
        raise DataError(f"wds: cannot read the shard {path}: it is truncated{after} (no end-of-archive marker)")
    if block is not None and block.count(0) != tarfile.BLOCKSIZE:
        raise DataError(f"wds: cannot read the shard {path}: a damaged header at byte {end:,}{after}")
