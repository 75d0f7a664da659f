"""The house's layering, read from the source: every `import` of every module under
src/vitlab, function-local ones included, parsed with `ast` (docs/architecture.md draws it).

- no import cycles between modules;
- each package imports only the packages below it (LAYERS);
- outside cli/ and package __init__ files, vitlab's own modules are imported at the top of
  the file, where a reader sees every dependency;
- no function longer than MAX_FUNCTION_LINES, no file longer than MAX_FILE_LINES.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "vitlab"

# package -> the vitlab packages it may import. "api" is vitlab.api and the package root.
BASE = {"config", "files", "extras"}
LAYERS: dict[str, set[str]] = {
    "files": set(),
    "extras": set(),
    "config": {"files", "extras"},
    "models": BASE,
    "checkpoints": BASE | {"models"},
    "data": BASE,
    "eval": BASE | {"models", "checkpoints", "data"},
    "analysis": BASE | {"models", "checkpoints", "data", "eval"},
    "deploy": BASE | {"models", "checkpoints", "data"},
    "train": BASE | {"models", "checkpoints", "data", "eval", "analysis"},
    "bench": BASE | {"models", "checkpoints", "data", "deploy", "train"},
    "predictor": BASE | {"models", "checkpoints", "data", "analysis", "deploy"},
    "api": BASE | {"models", "checkpoints", "data", "predictor"},
}
EVERYTHING_BUT_CLI = set(LAYERS) | {"api", "serve", "sweep"}
LAYERS["serve"] = EVERYTHING_BUT_CLI - {"serve", "sweep"}
LAYERS["sweep"] = EVERYTHING_BUT_CLI - {"serve", "sweep"}
LAYERS["cli"] = EVERYTHING_BUT_CLI | {"cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "api":
        return "api"
    return "cli" if parts[1] == "__main__" else parts[1]  # `python -m vitlab` is the command line


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported vitlab module, line, at top level?) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` and try/except at module level count as top level
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node)}
    here = module_name(path) if SRC in path.parents else "vitlab.example"
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            # `from vitlab.x import y` may name a submodule y: count it as that module
            names = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
        for name in names:
            if name == "vitlab" or name.startswith("vitlab."):
                found.append((name, node.lineno, id(node) in top))
    return found


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC.parent / rel).with_suffix(".py").is_file() or (SRC.parent / rel / "__init__.py").is_file()


MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 500

FILES = sorted(SRC.rglob("*.py"))
GRAPH = {module_name(f): imports(f) for f in FILES}


def test_the_scan_sees_the_whole_package():
    assert len(FILES) > 50 and "vitlab.train.loop" in GRAPH and "vitlab.cli" in GRAPH
    assert any(m == "vitlab.models.pos_embed" for m, _, _ in GRAPH["vitlab.checkpoints.io"])


def test_every_package_has_a_layer():
    unknown = sorted({package_of(m) for m in GRAPH} - set(LAYERS))
    assert not unknown, f"packages without a place in LAYERS (tests/test_architecture.py): {unknown}"


def test_no_import_crosses_a_layer():
    bad = []
    for module, found in GRAPH.items():
        mine = package_of(module)
        for target, line, _ in found:
            theirs = package_of(target)
            if theirs != mine and theirs not in LAYERS[mine]:
                bad.append(f"{module}:{line} imports {target} ({mine} may import {sorted(LAYERS[mine])})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    edges = {m: sorted({t for t, _, _ in found if t in GRAPH and t != m}) for m, found in GRAPH.items()}
    # A package's __init__ re-exports its own modules; those edges are not dependencies.
    for m in edges:
        edges[m] = [t for t in edges[m] if not (t.startswith(m + ".") and is_package(m))]
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def is_package(module: str) -> bool:
    return (SRC.parent / Path(*module.split(".")) / "__init__.py").is_file()


LIBRARY = [f for f in FILES if f.name != "__init__.py" and "cli" not in f.relative_to(SRC).parts]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda f: str(f.relative_to(SRC)))
def test_library_modules_import_vitlab_at_the_top(path):
    local = [f"line {line}: {target}" for target, line, top in imports(path) if not top]
    assert not local, f"{path.relative_to(SRC)} imports vitlab inside functions (move to the top): {local}"


def test_functions_and_files_stay_short():
    long = []
    for f in FILES:
        text = f.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long.append(f"{f.relative_to(SRC)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(SRC)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "split these:\n" + "\n".join(long)


def test_the_rules_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from vitlab.train import loop\n")
    assert imports(bad) == [("vitlab.train.loop", 2, False)]
