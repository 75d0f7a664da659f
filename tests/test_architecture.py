"""The house's layering, read from the source: every `import` of every module under
src/vitlab, function-local ones included, parsed with `ast` (docs/architecture.md draws it).

- no import cycles between modules;
- each package imports only packages of the rows below its own (ROWS), and exactly those
  LAYERS lists: every pair listed is used; docs/architecture.md shows ROWS and LAYERS as they
  are here;
- outside cli/ and the package root, vitlab's own modules are imported at the top of the file
  (package __init__ files included), where a reader sees every dependency;
- no function longer than MAX_FUNCTION_LINES, no file longer than MAX_FILE_LINES;
- every import in benchmarks/ and tools/ resolves, and benchmarks/serving.py starts;
- no function-local import binds a name the module binds at its top (`import torch._dynamo`
  inside a function makes `torch` local to the whole function: every CUDA run once failed so).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "vitlab"

# The layers, top to bottom, as docs/architecture.md draws them: a package imports only from
# rows below its own.
ROWS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("serve", "sweep", "bench", "api"),
    ("train", "predictor"),
    ("analysis", "deploy"),
    ("eval",),
    ("checkpoints", "data"),
    ("models",),
    ("config",),
    ("files", "progress", "run_layout", "extras", "pixels", "tables", "spread", "suggest"),
    ("log",),
)
# package -> exactly the vitlab packages it imports: every pair used is listed, and every pair
# listed is used (a pair no longer used is taken out, so the table never allows more than the
# code needs). "api" is vitlab.api and the package root.
LAYERS: dict[str, set[str]] = {
    "files": set(),
    "progress": {"log"},
    "log": set(),
    "run_layout": set(),
    "extras": set(),
    "pixels": set(),
    "tables": set(),
    "spread": set(),
    "suggest": set(),
    "config": {"files", "suggest"},
    "models": {"config", "pixels"},
    "checkpoints": {"config", "extras", "files", "log", "models", "progress", "run_layout", "suggest", "tables"},
    "data": {"config", "extras", "files", "pixels", "suggest"},
    "eval": {"config", "data", "files"},
    "analysis": {"checkpoints", "config", "data", "eval", "extras", "files", "models", "spread"},
    "deploy": {"checkpoints", "config", "extras", "files", "models"},
    "train": {"analysis", "checkpoints", "config", "data", "deploy", "eval", "extras", "files", "log", "models",
              "progress", "run_layout", "spread", "tables"},
    "bench": {"checkpoints", "config", "deploy", "extras", "files", "models", "tables"},
    "predictor": {"analysis", "checkpoints", "config", "data", "deploy", "files", "models", "suggest"},
    "api": {"checkpoints", "config", "data", "models", "predictor"},
    "serve": {"analysis", "config", "data", "log", "models", "predictor"},
    "sweep": {"analysis", "config", "data", "extras", "files", "run_layout", "spread", "tables", "train"},
    "cli": {"analysis", "api", "bench", "checkpoints", "config", "data", "deploy", "eval", "extras", "files",
            "predictor", "progress", "run_layout", "serve", "spread", "suggest", "sweep", "train"},
}
ROOT = SRC.parents[1]


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
    rowed = [p for row in ROWS for p in row]
    assert sorted(rowed) == sorted(LAYERS) and len(set(rowed)) == len(rowed), "each package in one of ROWS"


def test_the_table_points_down_only():
    row_of = {p: i for i, row in enumerate(ROWS) for p in row}
    up = [f"{a} -> {b}" for a, targets in LAYERS.items() for b in targets if row_of[b] <= row_of[a]]
    assert not up, f"LAYERS lets a package import its own row or one above it: {up}"


def used_pairs() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {p: set() for p in LAYERS}
    for module, found in GRAPH.items():
        for target, _, _ in found:
            if package_of(target) != package_of(module):
                used.setdefault(package_of(module), set()).add(package_of(target))
    return used


def test_the_table_lists_only_what_is_used():
    unused = sorted(f"{a} -> {b}" for a, targets in LAYERS.items() for b in targets - used_pairs().get(a, set()))
    assert not unused, f"LAYERS allows imports no module makes; take them out: {unused}"


def layer_table() -> str:
    """docs/architecture.md's table of who imports whom, made from LAYERS."""
    lines = ["| package | imports |", "| --- | --- |"]
    for row in ROWS:
        for p in row:
            lines.append(f"| `{p}` | {', '.join(f'`{t}`' for t in sorted(LAYERS[p])) or 'nothing of vitlab'} |")
    return "\n".join(lines)


def test_the_architecture_page_draws_this_table():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert layer_table() in page, "docs/architecture.md's import table differs from LAYERS; it should read:\n" + layer_table()
    diagram = page.split("```text\n", 1)[1].split("```", 1)[0]
    drawn = []
    for line in diagram.splitlines():
        names: list[str] = []
        for word in line.split():
            if word.removesuffix(".py") not in LAYERS:
                break
            names.append(word.removesuffix(".py"))
        if names:
            drawn.append(tuple(names))
    assert tuple(drawn) == ROWS, f"docs/architecture.md's diagram draws the rows {drawn}; ROWS are {ROWS}"


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


# Every module outside cli/, package __init__ files included. The package root is the one
# exception: it resolves the API on first use (`vitlab.load`), so that `import vitlab` does no work.
LAZY_ROOT = SRC / "__init__.py"
LIBRARY = [f for f in FILES if f != LAZY_ROOT and "cli" not in f.relative_to(SRC).parts]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda f: str(f.relative_to(SRC)))
def test_library_modules_import_vitlab_at_the_top(path):
    local = [f"line {line}: {target}" for target, line, top in imports(path) if not top]
    assert not local, f"{path.relative_to(SRC)} imports vitlab inside functions (move to the top): {local}"


MATPLOTLIB = {"analysis/plots.py", "analysis/mpp_plot.py", "analysis/sweep_plots.py", "analysis/overlay.py"}


def test_only_the_drawing_modules_import_matplotlib():
    found = set()
    for f in FILES:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "matplotlib" for n in names):
                found.add(str(f.relative_to(SRC)))
    assert found == MATPLOTLIB, f"modules that import matplotlib: {sorted(found)}; docs/architecture.md names {sorted(MATPLOTLIB)}"
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"`{Path(m).name}`" in page for m in MATPLOTLIB)


# What the model must never compute with (docs/architecture.md, models/): private backend ops,
# oneDNN/MKL-DNN kernels, CPU capability probes, process-global caches. Any of them makes
# `model(x)` depend on the process (a probe cached inside an export trace broke every fresh
# export); kernel choices belong to vitlab.deploy's inference copy.
PRIVATE_IN_MODELS = ("torch.ops.", "torch._C", "mkldnn", "onednn", "torch.backends", "cpu_capability",
                     "get_cpu_capability", "functools.cache", "lru_cache", "_linear_pointwise")


def private_ops(folder: Path) -> list[str]:
    """`file:line: text` for each line of the .py files under folder that names one of PRIVATE_IN_MODELS."""
    return [f"{f.relative_to(folder.parent)}:{n}: {line.strip()}" for f in sorted(folder.rglob("*.py"))
            for n, line in enumerate(f.read_text().splitlines(), 1)
            if any(word in line.lower() for word in (w.lower() for w in PRIVATE_IN_MODELS))]


def test_models_compute_with_public_ops_only():
    found = private_ops(SRC / "models")
    assert not found, ("models/ computes with PyTorch's public ops only; move kernel choices to "
                       "vitlab.deploy's inference copy:\n" + "\n".join(found))


def test_the_public_ops_rule_can_fail(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "layers.py").write_text("import torch\n\ndef f(x, w):\n    return torch.ops.mkldnn._linear_pointwise(x, w)\n")
    (models / "vit.py").write_text("import functools\n\n@functools.cache\ndef probe():\n    return 1\n")
    assert [line.split(":")[0] for line in private_ops(models)] == ["models/layers.py", "models/vit.py"]
    assert private_ops(SRC / "deploy"), "deploy/ holds the oneDNN copies: the scan must see them"


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


# The command line is thin: a command parses its arguments, calls the library and prints.
MAX_CLI_FUNCTION_LINES = 40
CLI = SRC / "cli"
SHARED_CLI = {"vitlab.cli", "vitlab.cli.common"}  # the parser and what the commands share, not commands


def test_cli_functions_stay_short():
    long = [f"cli/{f.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for f in sorted(CLI.glob("*.py")) for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_CLI_FUNCTION_LINES]
    assert not long, f"move the work into the library (cli functions stay under {MAX_CLI_FUNCTION_LINES} lines):\n" + "\n".join(long)


def test_no_command_imports_another():
    bad = [f"{m}:{line} imports {t}" for m, found in GRAPH.items() if m.startswith("vitlab.cli.") and m not in SHARED_CLI
           for t, line, _ in found if t.startswith("vitlab.cli.") and t not in SHARED_CLI and t != m]
    assert not bad, "a command imports another command; move what they share to cli/common.py or the library:\n" + "\n".join(bad)


def test_the_rules_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from vitlab.train import loop\n")
    assert imports(bad) == [("vitlab.train.loop", 2, False)]


# benchmarks/ and tools/: scripts that use the library. Every import in them must resolve: a
# vitlab module that exists and holds each name imported from it, a library that is
# installed, or a script of the same folder that defines the name.
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "tools").glob("*.py"))


def unresolved(path: Path) -> list[str]:
    import importlib
    import importlib.util

    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            wanted = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            wanted = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in wanted:
            sibling = path.parent / f"{module}.py"
            if sibling.is_file():
                if name and name not in top_level_names(sibling):
                    bad.append(f"line {node.lineno}: {sibling.name} defines no {name}")
                continue
            if importlib.util.find_spec(module.split(".")[0]) is None or (
                "." in module and importlib.util.find_spec(module) is None
            ):
                bad.append(f"line {node.lineno}: no module {module}")
                continue
            if name and module.split(".")[0] == "vitlab" and name != "*":
                if not (hasattr(importlib.import_module(module), name) or is_module(f"{module}.{name}")):
                    bad.append(f"line {node.lineno}: {module} has no {name}")
    return bad


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_the_scripts_are_scanned():
    assert any(p.name == "serving.py" for p in SCRIPTS) and any(p.parent.name == "tools" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda f: str(f.relative_to(ROOT)))
def test_every_import_of_a_script_resolves(path):
    bad = unresolved(path)
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_a_broken_script_import_is_found(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("from vitlab.deploy.bench import machine_info\nfrom vitlab.bench import nothing_here\n"
                      "from helper import gone\n")
    (tmp_path / "helper.py").write_text("def here(): pass\n")
    assert len(unresolved(script)) == 3


def test_serving_benchmark_starts():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout, r.stderr[-1000:]


# The target for the command line's size, counted without the module-level help
# strings (HELP and the docstrings): those are the newcomer's --help, not logic.
MAX_CLI_CODE_LINES = 1_900  # what the commands need (1,816 with this wave's flags and checks), and room for one more


def test_the_cli_stays_small():
    def code_lines(f):
        tree = ast.parse(f.read_text())
        text = sum(n.end_lineno - n.lineno + 1 for n in tree.body if isinstance(n, (ast.Expr, ast.Assign))
                   and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))
        return len(f.read_text().splitlines()) - text

    total = sum(code_lines(f) for f in CLI.glob("*.py"))
    assert total <= MAX_CLI_CODE_LINES, f"cli/ holds {total} lines of code; move the work into the library"


def shadowing_imports(path: Path) -> list[str]:
    """`file:line` of each import inside a function that binds a name its module binds at the
    top level (an import, a def, a class or an assignment): Python then treats the name as local
    to the whole function, and a use above the import raises UnboundLocalError."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            top |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return [f"{path}:{inner.lineno}: `{ast.unparse(inner)}` in {fn.name}"
            for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for inner in ast.walk(fn) if isinstance(inner, (ast.Import, ast.ImportFrom))
            and any((a.asname or a.name).split(".")[0] in top for a in inner.names)]


@pytest.mark.parametrize("folder", ["src", "benchmarks", "tools"])
def test_no_function_local_import_shadows_a_module_name(folder):
    root = SRC.parents[1] / folder
    found = [line for f in sorted(root.rglob("*.py")) for line in shadowing_imports(f)]
    assert not found, ("a function-local import rebinds a module-level name (use the module's own import, or "
                       "importlib.import_module for a side effect):\n" + "\n".join(found))


def test_the_shadowing_rule_can_fail(tmp_path):
    bad = tmp_path / "setup.py"
    bad.write_text("import torch\n\ndef setup():\n    d = torch.device('cuda')\n    import torch._dynamo\n    return d\n")
    assert shadowing_imports(bad) == [f"{bad}:5: `import torch._dynamo` in setup"]


def test_the_code_line_count_reads_tokens():
    """tools/count_code_lines.py, issue 55's size measure: a line holding a token other than a
    comment, a line break, indentation or a docstring (a string standing alone as a statement)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("count_code_lines", ROOT / "tools" / "count_code_lines.py")
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    source = ('"""Module."""\nimport os  # a comment\n\n# a comment line\ndef f(x):\n    """Doc,\n    two lines."""\n'
              '    s = """a value\nof two lines"""\n    "bare" "joined"\n    return (x +\n            1)\n')
    # import, def, the two lines of s, the two of return: six
    assert counter.code_lines(source) == 6
    assert counter.code_lines("") == 0 and counter.code_lines('"""Only a docstring."""\n') == 0


def test_the_dispatcher_names_no_command():
    """cli/__init__.py finds the commands and asks each what it writes, whether it resumes and
    reads data: no command's name appears in its code (docstrings aside), so a new command is a
    new module and nothing else."""
    from vitlab.cli import commands

    tree = ast.parse((CLI / "__init__.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    named = set(commands()) & strings
    assert not named, f"cli/__init__.py names the commands {sorted(named)}: declare it in the command's module"
