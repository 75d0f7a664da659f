"""Writing files so that nothing is ever half written, and where vitlab keeps its caches.

The bottom layer: it imports nothing else of vitlab, so every package may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

# The regular-file check lives with the reader of files (files/documents.py); writers use it too.
from vitlab.files.documents import NotRegularFileError, PathLike, on_disk, read_json, require_regular_file  # noqa: F401


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
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))  # as files.documents reads it back


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
    """vitlab's cache: $VITLAB_CACHE, else $XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab; `parts`
    name a folder inside it."""
    root = os.environ.get("VITLAB_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitlab"
    return Path(root).joinpath(*parts)


# User text as a file or folder name ------------------------------------------------------
# One rule wherever text that a user, a spec or a download chose becomes a path component
# (a sweep cell, a Hub cache name, an output file): one component, never a way out.
MAX_NAME_BYTES = 120  # well under every file system's 255, with room for a suffix
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafeNameError(ValueError):
    """Text that cannot be one file or folder name: a separator, `..`, empty, too long."""


def check_name(text: object, what: str = "name", max_bytes: int = MAX_NAME_BYTES) -> str:
    """`text` if it is one safe path component; else UnsafeNameError saying why. Refuses
    separators (/ and \\), `.` and `..`, NUL and control characters, a leading `-` or `~`
    (read as an option or a home folder) and more than `max_bytes` bytes of UTF-8."""
    if not isinstance(text, str):
        raise UnsafeNameError(f"{what} {text!r}: a name must be text, not {type(text).__name__}")
    problems = ((not text.strip(), "it is empty"), (text in (".", ".."), "it names a folder itself or its parent"),
                ("/" in text or "\\" in text, "it holds a path separator"), (_CONTROL.search(text), "it holds a control character"),
                (text[:1] in ("-", "~"), f"it starts with {text[:1]!r}"),
                (len(text.encode("utf-8", "surrogatepass")) > max_bytes, f"it is longer than {max_bytes} bytes"))
    why = next((words for bad, words in problems if bad), None)  # the first that applies, in this order
    if why:
        raise UnsafeNameError(f"{what} {text[:60]!r}: not usable as a file or folder name ({why}); use a short plain name")
    return text


def to_name(text: str, max_bytes: int = 80) -> str:
    """Any text as a safe path component (a folder name made from a sweep value): runs of
    characters other than letters, digits and `._+-` become `-`, leading dots go, and text
    longer than `max_bytes` is cut and given a digest of the whole, so distinct texts stay
    distinct. The result always passes `check_name`."""
    import hashlib

    word = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text)).strip("-.~") or "x"
    if len(word) > max_bytes:
        digest = hashlib.sha1(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:10]
        word = f"{word[:max_bytes - 11].rstrip('-.')}-{digest}"
    return check_name(word or "x")


def child(parent: PathLike, name: str, what: str = "name") -> Path:
    """`parent / name` for one safe component `name`, checked (symlinks followed) to stay
    inside `parent`: the only way vitlab turns a chosen name into a path."""
    parent = Path(parent)
    path = parent / check_name(name, what)
    if not path.is_symlink():  # one plain component that is no link: inside `parent` by construction
        return path
    real_parent = os.path.realpath(parent)
    real = os.path.realpath(path)
    if os.path.commonpath([real_parent, real]) != real_parent or real == real_parent:
        raise UnsafeNameError(f"{what} {name!r}: {path} leads outside {parent} (a link?); remove the link or pick another folder")
    return path


# Writing where the user keeps files ------------------------------------------------------
# A command writes only new files, files it wrote before, or files named with --force. What
# vitlab wrote into a folder is listed, with each file's digest, in the folder's MANIFEST: a
# listed file still holding those bytes is vitlab's to replace; any other file is the user's.
MANIFEST = ".vitlab-outputs.json"
LOCK = ".vitlab-outputs.lock"  # held while outputs are claimed, written and listed (OutputFolder.locked)


def sha256_file(path: PathLike, into: Any = None) -> str:
    """The sha256 of a file's bytes, read in blocks: vitlab's one file digest (output
    ownership here, the published checkpoints' check in checkpoints/pretrained.py, finished
    work's identity in files/identity.py). `into`: a hashlib object to feed instead (a
    folder's digest over its files); its digest so far is returned."""
    import hashlib

    h = hashlib.sha256() if into is None else into
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def user_file_error(path: Path, writer: str, others: tuple[str, ...] = (), force: bool = True) -> FileExistsError:
    """The refusal to replace a user's file `path` (and `others` beside it); `force`: the
    command offers --force."""
    what = f"{path.parent} holds {', '.join([path.name, *others])}, which" if others else f"{path} exists and"
    return FileExistsError(errno.EEXIST, f"{what} vitlab {writer} did not write (or changed since); kept: move it or write "
                                         f"elsewhere{', or pass --force' if force else ''}")


def check_new_file(path: PathLike, writer: str, force: bool = False) -> Path:
    """A single-file output (predict --csv, fewshot --out): new, or replaced with --force."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not force:
        raise user_file_error(path, writer)
    return path


class OutputFolder:
    """A folder a command fills with files of fixed names (inspect's report, push's repo
    folder), which may already hold the user's own files. `claim(names)` refuses, before any
    work, a name that exists and is not this writer's (see MANIFEST); `path(name)` is where
    one of them goes; `record()` lists what was written, once it is written."""

    def __init__(self, folder: PathLike, writer: str, force: bool = False, offer_force: bool = True):
        self.folder, self.writer, self.force, self.offer_force = Path(folder), writer, force, offer_force
        self.written: set[str] = set()

    def _manifest(self) -> dict:
        try:
            return read_json(self.folder / MANIFEST, {"files": {str: str}}, "list of vitlab's outputs")["files"]
        except (OSError, ValueError):
            return {}  # no manifest, or a damaged one: nothing here counts as vitlab's

    @contextlib.contextmanager
    def locked(self) -> Iterator["OutputFolder"]:
        """Hold the folder's outputs for this process while it claims, writes and records them
        (an exclusive flock on LOCK, waited for): two processes that write the same outputs
        (vtab's task jobs, each writing the row) then each find the other's files recorded."""
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    def owned(self, name: str) -> bool:
        p = self.folder / name
        recorded = self._manifest().get(name)
        return bool(recorded) and p.is_file() and not p.is_symlink() and sha256_file(p) == recorded

    def claim(self, names) -> None:
        if self.folder.exists() and not self.folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{self.folder}: exists and is not a folder; name a folder")
        theirs = []
        for name in names:
            p = child(self.folder, name, "output") if self.folder.exists() else self.folder / check_name(name, "output")
            if (p.exists() or p.is_symlink()) and not self.force and not self.owned(name):
                theirs.append(p)
        if theirs:
            raise user_file_error(theirs[0], self.writer, tuple(p.name for p in theirs[1:]), self.offer_force)

    def path(self, name: str) -> Path:
        self.claim([name])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written.add(name)
        return self.folder / name

    def record(self, names=()) -> None:
        import json

        self.written.update(names)
        files = {k: v for k, v in self._manifest().items() if (self.folder / k).is_file()}
        for name in self.written:
            p = self.folder / name
            if p.is_file():
                files[name] = sha256_file(p)
        atomic_write_text(self.folder / MANIFEST, json.dumps({"writer": f"vitlab {self.writer}", "files": files},
                                                             indent=1, sort_keys=True) + "\n")
