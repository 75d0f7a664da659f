"""Writing files so that nothing is ever half written, and where vitlab keeps its caches.

The bottom layer: it imports nothing else of vitlab, so every package may use it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
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
        try:
            write_fn(tmp)
        except Exception as e:
            raise _as_os_error(e, path) from None
        os.chmod(tmp, 0o666 & ~_umask())  # after writing: some writers (safetensors) recreate the file
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# What a failed write says, whoever reports it: safetensors and torch.save wrap the OS's error
# in their own exception types, with the OS's words inside.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def _as_os_error(e: Exception, path: Path) -> Exception:
    """`e` if it is an OSError or not about the disk; else an OSError naming `path` and the
    OS's reason (a full disk inside safetensors' or torch's own error types)."""
    if isinstance(e, OSError):
        return e
    text = str(e)
    for code in _WRITE_ERRNOS:
        if os.strerror(code).lower() in text.lower():
            return OSError(code, f"cannot write {path}: {os.strerror(code)}")
    return e


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


class NotRegularFileError(OSError):
    """A path that is a FIFO, a device or a socket where a file is meant: opening it could
    block forever (a FIFO with no writer) or read without end (/dev/zero)."""


def require_regular_file(path: PathLike, what: str = "file") -> Path:
    """`path` if it is a regular file (symlinks followed); else OSError saying what it is.
    Checked before opening, so a FIFO or a device is refused instead of hanging."""
    path = Path(path)
    st = os.stat(path)  # FileNotFoundError names the path
    if stat.S_ISREG(st.st_mode):
        return path
    kind = next((name for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                                         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                         (stat.S_ISSOCK, "a socket")) if test(st.st_mode)), "not a regular file")
    error = NotRegularFileError(f"{path}: is {kind}, not a regular {what}; vitlab reads regular files only")
    error.kind = kind
    raise error


def check_writable(path: PathLike, folder: bool = False) -> None:
    """Fail now, before any long work, if `path` (a file, or a folder with `folder=True`)
    could not be written: an existing entry of the wrong kind, a parent that is a file, or a
    place where no file can be created (read-only, /proc, /sys, no permission). Creates
    nothing that stays: one empty temporary file in the nearest existing folder, removed."""
    path = Path(path)
    if path.exists():
        if folder and not path.is_dir():
            raise NotADirectoryError(f"{path}: exists and is not a folder; give a folder to write into")
        if not folder and path.is_dir():
            raise IsADirectoryError(f"{path}: is a folder; give a file name to write")
        if not folder and not path.is_file():
            require_regular_file(path, "file to write")
    probe_in = path if folder and path.is_dir() else path.parent
    while not probe_in.exists():
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        raise NotADirectoryError(f"{path}: cannot be written, {probe_in} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vitlab-write-check.", suffix=".tmp", dir=probe_in)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: no file can be created in {probe_in} ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def is_temporary(name: str) -> bool:
    """A temporary file `atomic_write` leaves behind when its process is killed mid-write."""
    return name.startswith(".") and name.endswith(".tmp")


def cache_dir(*parts: str) -> Path:
    """vitlab's cache: $VITLAB_CACHE, else ~/.cache/vitlab; `parts` name a folder inside it."""
    root = os.environ.get("VITLAB_CACHE")
    return Path(root or Path.home() / ".cache" / "vitlab").joinpath(*parts)
