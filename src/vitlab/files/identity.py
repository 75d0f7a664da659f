"""What a piece of finished work is: the one identity key every cache of finished work keeps.

A result computed from a checkpoint with some settings (a VTAB task's result.json, a sweep
cell) is reused only when the checkpoint holds the same bytes and the settings, resolved,
are the same: `work_identity(checkpoint, settings)` is that key, written beside the result;
`differences(recorded, now)` says what changed, so that a refusal can name it.

The checkpoint counts by its content (sha256 of a file, or of every file of a folder with
its relative name), never by its path: a file replaced under the same name is other work,
and the same file moved or renamed is the same work.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Optional

from vitlab.files import PathLike, sha256_file


def content_digest(path: PathLike) -> str:
    """sha256 of a file's bytes, or of a folder's regular files (relative name and bytes, in
    name order; links followed). Remembered per (path, size, mtime) within a process, so a
    sweep of many cells reading one checkpoint hashes it once."""
    path = Path(path).resolve()
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns, path.is_dir())


@functools.lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int, folder: bool) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if folder else [Path(path)]
    for f in files:
        if folder:
            h.update(f"{f.relative_to(path).as_posix()}\0{f.stat().st_size}\0".encode())
        sha256_file(f, h)  # the one file digest, fed into the folder's
    return h.hexdigest()


def work_identity(checkpoint: Optional[PathLike], settings: Mapping[str, Any]) -> dict[str, Any]:
    """{"checkpoint": sha256 of its content (None without one), "settings": the resolved
    settings as plain JSON values}: what a result was computed from and with."""
    return {"checkpoint": None if checkpoint is None else content_digest(checkpoint),
            "settings": json.loads(json.dumps(settings, sort_keys=True, default=str))}


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        return {k: v for key, value in d.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: d}


def differences(recorded: Any, now: Mapping[str, Any]) -> list[str]:
    """What differs between a recorded identity and the one computed now, in words: the
    checkpoint's digest, then each setting as `key: recorded -> now`. A record that is not an
    identity at all (written before vitlab kept one) is one difference that says so."""
    if not isinstance(recorded, dict) or set(recorded) != {"checkpoint", "settings"}:
        return ["no record of the checkpoint and settings it was computed with (written by an older vitlab, "
                "or edited)"]
    out = []
    if recorded["checkpoint"] != now["checkpoint"]:
        def short(d: Any) -> str:
            return f"sha256 {d[:12]}..." if isinstance(d, str) else "none"

        out.append(f"another checkpoint ({short(recorded['checkpoint'])}, now {short(now['checkpoint'])})")
    old, new = _flat(recorded["settings"]), _flat(now["settings"])
    out += [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return out

