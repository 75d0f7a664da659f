"""Optional dependency groups, imported in one place.

vitlab's core needs torch, numpy, PIL, safetensors and PyYAML; everything else is an extra
of pyproject.toml (`pip install "vitlab[serve]"`). A command that needs an extra asks
`require(GROUP)`, which checks every module of the group, not just the first one, so a half
installed group (fastapi present, fastapi_offline absent) is one line naming the missing
module and the install command, never a traceback from deep inside.

The bottom layer: it imports nothing else of vitlab.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Iterable, Optional

# extra -> the modules it installs, as they are imported (python-multipart is `multipart`)
EXTRAS: dict[str, tuple[str, ...]] = {
    "plots": ("matplotlib",),
    "export": ("onnx", "onnxscript", "onnxruntime"),
    "peers": ("timm", "transformers"),
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "sweep": ("submitit",),
    "hub": ("huggingface_hub",),
    "datasets": ("datasets",),
    "serve": ("fastapi", "uvicorn", "multipart", "prometheus_client", "fastapi_offline"),
}


class MissingExtraError(ImportError):
    """An optional dependency group that is not (wholly) installed; the message says which
    module is missing and the pip command that installs the group."""


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module blanked in sys.modules
        return False


def missing(group: str) -> list[str]:
    """The modules of `group` that cannot be imported here (none: the extra is installed)."""
    return [m for m in EXTRAS[group] if not _present(m)]


def require(group: str, what: Optional[str] = None, modules: Optional[Iterable[str]] = None,
            error: type[Exception] = MissingExtraError) -> dict[str, ModuleType]:
    """Import the group's `modules` (default: all of them) after checking that every module of
    the group is there; `what` names what needs it ("vitlab serve", "--log wandb").
    Returns the imported modules by name, or raises `error` (a layer's own: DataError, ...)."""
    absent = missing(group)
    imported: dict[str, ModuleType] = {}
    for name in () if absent else (EXTRAS[group] if modules is None else modules):
        try:
            imported[name] = importlib.import_module(name)
        except ImportError as e:  # present but broken (a dependency of its own missing)
            absent = [f"{name} (it fails to import: {str(e).splitlines()[0][:100]})"]
            break
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        raise error(f"{what or 'this'} needs the {group} extra, and {', '.join(absent)} {verb} not installed: "
                                f'pip install "vitlab[{group}]"')
    return imported


def hub_client_errors() -> tuple[type[BaseException], ...]:
    """Every exception class of the Hub client's own: huggingface_hub.errors' classes and all
    the exception classes of the HTTP library it is built on (requests in older versions,
    httpx or httpx2 in newer ones: found from HfHubHTTPError's bases, not named here), with
    OSError: what a call of the Hub client (vitlab's hub reads, `vitlab push`, datasets'
    load_dataset) catches, so that any failure is one line."""
    try:
        from huggingface_hub import errors
    except ImportError:  # no Hub client: nothing of its own to raise
        return (OSError,)
    found: set[type[BaseException]] = {OSError}
    libraries = {base.__module__.split(".")[0] for base in errors.HfHubHTTPError.__mro__} - {"huggingface_hub", "builtins"}
    modules = {errors, *(importlib.import_module(name) for name in libraries)}
    for module in modules:
        found |= {c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Exception)}
    return tuple(sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}"))


def hf_cache(variable: str, sub: str) -> Optional[str]:
    """A Hugging Face library's cache folder: $VARIABLE, else $HF_HOME/SUB, read now (the
    libraries read them at import); None when neither is set."""
    if os.environ.get(variable):
        return os.path.expanduser(os.environ[variable])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), sub)
    return None


def error_line(e: BaseException) -> str:
    """An optional library's exception as the words of one line: its class and first line."""
    try:
        text = (str(e).strip().splitlines() or [""])[0][:200]
    except Exception:  # an exception class whose message needs attributes it was not given
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
