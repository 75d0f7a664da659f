"""Writing files so that nothing is ever half written, and where vitlab keeps its caches.

The bottom layer: it imports nothing else of vitlab, so every package may use it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Union

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: PathLike, write_fn: Callable[[str], object]) -> None:
    """Call `write_fn(tmp_path)`, then rename over `path`: a crash never leaves half a file,
    and an old file is replaced only by a complete new one. The file gets the permissions a
    plain open() would give it (mkstemp's 0600 would hide it from the group)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_fn(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # after writing: some writers (safetensors) recreate the file
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def replace_folder(target: PathLike, fill: Callable[[Path], object], owned: Callable[[str], bool]) -> None:
    """Write the files `fill(folder)` creates into `target`, each atomically. Files already in
    `target` that `owned(name)` claims (the ones this writer produces) and that `fill` did not
    write again are removed; every other file there is left as it was."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(staging)
        written = {p.name for p in staging.iterdir()}
        for p in staging.iterdir():
            os.chmod(p, 0o666 & ~_umask())
            os.replace(p, target / p.name)
        for p in target.iterdir():
            if p.is_file() and p.name not in written and owned(p.name):
                p.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_dir(*parts: str) -> Path:
    """vitlab's cache: $VITLAB_CACHE, else ~/.cache/vitlab; `parts` name a folder inside it."""
    root = os.environ.get("VITLAB_CACHE")
    return Path(root or Path.home() / ".cache" / "vitlab").joinpath(*parts)
