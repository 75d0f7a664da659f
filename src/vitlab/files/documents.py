"""Reading back what was written: the one reader of every JSON or YAML file vitlab reads.

Its own results and records (summary.json, result.json, cell.json, sweep.json, timing.json,
config.yaml, the output manifest), its caches (the shard index, the digest table), what a
dataset or a model brings (dataset_dict.json, a Hugging Face config.json, ReaL's labels) and
the user's recipes and sweep specs. A file read here is

- a regular file (a FIFO or a device is refused before it is opened), at most
  MAX_DOCUMENT_BYTES, UTF-8;
- nested at most MAX_DEPTH deep (checked on the text before a JSON parser recurses, and for
  YAML on what it built), with at most MAX_NODES values, an alias counted at each use;
- of the shape its reader declares (`check_shape`): the keys it needs, and numbers that are
  finite numbers.

Anything else is one error, of the caller's class, that names the file, what is wrong and
the fix: never a traceback from inside a parser, and never a number that is not one.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

MAX_DOCUMENT_BYTES = 256 * 2**20  # the largest file vitlab reads back (ReaL's labels) is about 2 MB
MAX_DEPTH = 40  # levels of lists and mappings; vitlab's own files use fewer than 10
MAX_NODES = 2_000_000  # values, a YAML alias counted at each use ("billion laughs"); ImageNet-21k needs 22,000
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
Error = Callable[[str], Exception]


class NotRegularFileError(OSError):
    """A path that is a FIFO, a device or a socket where a file is meant: opening it could
    block forever (a FIFO with no writer) or read without end (/dev/zero)."""

    kind = "not a regular file"  # what the path is instead ("a FIFO (named pipe)", ...)


def on_disk(path: PathLike, kind: str = "any") -> bool:
    """Whether text that may be a path or a name (a checkpoint or a model name, a recipe name)
    names something on disk: a file (`kind="file"`), a folder ("dir") or either. Text no path can
    be (longer than the file system takes, or holding NUL) names nothing: it is a name, and never
    an OSError ("File name too long") before it is looked up as one."""
    return {"any": os.path.exists, "file": os.path.isfile, "dir": os.path.isdir}[kind](path)


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


class DocumentError(ValueError):
    """A file read back that is not what it should be; the message names it and the fix."""


class Number:
    """A shape: a finite number (not a bool), an integer with `integer`, within [low, high]."""

    def __init__(self, low: float = -math.inf, high: float = math.inf, integer: bool = False):
        self.low, self.high, self.integer = low, high, integer

    def problem(self, v: object) -> Optional[str]:
        if isinstance(v, bool) or not isinstance(v, int if self.integer else (int, float)):
            return f"is {_kind(v)}, not {'an integer' if self.integer else 'a number'}"
        if not math.isfinite(v):
            return f"is {v}, not a finite number"
        if self.low <= v <= self.high:
            return None
        return f"is {v}, not from {self.low:g} to {self.high:g}" if self.integer else \
            f"is {v}, outside [{self.low:g}, {self.high:g}]"


def _kind(v: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", type(None): "null",
             int: "an integer", float: "a number"}
    return names.get(v if isinstance(v, type) else type(v), f"a {type(v).__name__}")


def check_shape(value: Any, shape: object, where: str = "the document") -> Any:
    """`value` if it has `shape`, else DocumentError naming the first place that differs.

    A shape is `object` (anything); a type (`str`, `bool`, `dict`, `list`; `int` and `float`
    mean finite numbers); a `Number`; None (null); a tuple of shapes (any one of them); a list
    `[item]` (a list of such items); a dict `{"key": shape, "key?": shape}` (a mapping with
    those keys, "?" marking an optional one; other keys allowed); or `{str: shape}` (a
    mapping of text keys to values of that shape)."""
    problem = _problem(value, shape, where)
    if problem:
        raise DocumentError(problem)
    return value


def _problem(v: object, shape: Any, where: str) -> Optional[str]:
    if shape is object:
        return None
    if shape is None or isinstance(shape, type) and shape not in (int, float):
        ok = v is None if shape is None else isinstance(v, shape) and (shape is bool or not isinstance(v, bool))
        return None if ok else f"{where} is {_kind(v)}, not {_kind(shape)}"
    if shape in (int, float) or isinstance(shape, Number):
        p = (shape if isinstance(shape, Number) else Number(integer=shape is int)).problem(v)
        return p and f"{where} {p}"
    if isinstance(shape, tuple):
        problems = [_problem(v, s, where) for s in shape]
        return None if None in problems else problems[-1]
    if isinstance(shape, list):
        if not isinstance(v, list):
            return f"{where} is {_kind(v)}, not a list"
        return next((p for i, x in enumerate(v) if (p := _problem(x, shape[0], f"{where}[{i}]"))), None)
    if not isinstance(v, dict):
        return f"{where} is {_kind(v)}, not a mapping"
    if list(shape) == [str]:
        return next((p for k, x in v.items() if (p := f"{where} has a key {k!r} that is not text" if not isinstance(k, str)
                                                  else _problem(x, shape[str], f"{where}.{k}"))), None)
    for key, inner in shape.items():
        name = key.rstrip("?")
        if name not in v and not key.endswith("?"):
            return f"{where} has no {name!r}"
        p = _problem(v[name], inner, f"{where}.{name}") if name in v else None
        if p:
            return p
    return None


def _too_big(value: object) -> bool:
    """Deeper than MAX_DEPTH, or more than MAX_NODES values counting each use of a shared one
    (walked without recursion, so the check cannot overflow the stack itself)."""
    stack, seen = [(value, 1)], 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_NODES:
            return True
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, depth + 1) for x in v)
    return False


def _json_too_deep(text: str) -> bool:
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        depth += 1 if c in "[{" else -1 if c in "]}" else 0
        if depth > MAX_DEPTH:
            return True
    return False


def _text(path: Path, what: str, error: Error, fix: str) -> str:
    try:
        require_regular_file(path, what)
        with open(path, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file (a {what} was expected); {fix}") from None
    except OSError as e:
        raise error(f"{path}: cannot be read as a {what} ({e.strerror or e}); {fix}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{path}: larger than any {what} ({MAX_DOCUMENT_BYTES:,} bytes); {fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text, so not a {what}; {fix}") from None


def _checked(data: Any, path: Path, what: str, shape: object, error: Error, fix: str) -> Any:
    if _too_big(data):
        raise error(f"{path}: nested deeper than {MAX_DEPTH} levels or too large, not a {what}; {fix}")
    problem = _problem(data, shape, path.name)
    if problem:
        raise error(f"{path}: not a {what}: {problem}; {fix}")
    return data


def parse_json(text: str, path: PathLike, shape: object = object, what: str = "JSON file",
               fix: str = "restore or remove it", error: Error = DocumentError) -> Any:
    """`text` (the content of `path`) parsed and checked as read_json does."""
    path = Path(path)
    if _json_too_deep(text):
        raise error(f"{path}: nested deeper than {MAX_DEPTH} levels, not a {what}; {fix}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise error(f"{path}: not JSON ({str(e).splitlines()[0][:120]}), so not a {what}; {fix}") from None
    return _checked(data, path, what, shape, error, fix)


def read_json(path: PathLike, shape: object = object, what: str = "JSON file", fix: str = "restore or remove it",
              error: Error = DocumentError) -> Any:
    """The JSON document in `path`, of `shape` (check_shape). Otherwise `error(message)` (the
    caller's own error class; the message names the file and ends with `fix`), also when
    there is no file."""
    return parse_json(_text(Path(path), what, error, fix), path, shape, what, fix, error)


def read_yaml(path: PathLike, shape: object = object, what: str = "YAML file", fix: str = "restore or remove it",
              error: Error = DocumentError) -> Any:
    """As read_json, for YAML (yaml.safe_load: no object is built from a tag); an empty file
    is an empty mapping."""
    import yaml

    path = Path(path)
    text = _text(path, what, error, fix)
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise error(f"{path}: not valid YAML ({str(e).splitlines()[0][:120]}), so not a {what}; {fix}") from None
    return _checked({} if data is None else data, path, what, shape, error, fix)


def read_json_lines(path: PathLike, shape: object = object, what: str = "JSON-lines log",
                    fix: str = "restore or remove it", error: Error = DocumentError) -> list[Any]:
    """Each line of a JSON-lines file, parsed and checked; a last line cut short by a crash
    (not JSON, no newline after it) is dropped, and any other bad line is `error`."""
    path = Path(path)
    lines = _text(path, what, error, fix).split("\n")
    if lines and lines[-1].strip():
        try:
            json.loads(lines[-1])
        except (ValueError, RecursionError):
            lines.pop()  # a write cut short
    return [parse_json(line, f"{path} line {n}", shape, what, fix, error) for n, line in enumerate(lines, 1) if line.strip()]
