"""Every line of src/vitlab under a CUDA condition, and whether the fake-GPU tests ran it.

    python tools/cuda_coverage.py                 # run the fake-GPU tests (pytest -m fake_gpu), then report
    python tools/cuda_coverage.py --data DIR      # report on what a test run recorded in DIR (.ci/run)
    python tools/cuda_coverage.py --list          # the lines alone, nothing run

A CUDA condition is the test of an `if`, `elif` or conditional expression that names CUDA: a
string such as "cuda" or "nccl" (`device.type == "cuda"`, `device.startswith("cuda")`) or the
attribute `cuda` (`torch.cuda.is_available()`). Its CUDA arm is the body where the test asks
"is it CUDA" and the `else` where it asks "is it not" (with the rest of the block after a
guard that returns or raises). The lines of that arm are found from the source's syntax tree,
so a new CUDA branch is listed the day it is written. Each must have been executed by the
fake-GPU tests (tests/fake_gpu.py), which record coverage (coverage.py) into the folder
VITLAB_CUDA_COVERAGE names, in the test process and in every process they start. The table
goes to stdout; the exit status is 1 if a line was never executed.

A conditional expression's arm shares its line with the test, so line coverage says only
that the line ran; its table row says "line", and the tests assert the arm's effect (the
NCCL backend, pinned batches) from the fake GPU's record.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vitlab"
NAMES_CUDA = re.compile(r"\b(cuda|nccl)\b")


@dataclass(frozen=True)
class CudaLine:
    path: Path
    line: int
    kind: str  # "branch": a statement of a CUDA arm; "line": a conditional expression's arm; "tensor": an
    # arm taken on a tensor's own device, which only a real GPU reaches (not required here)
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(SRC)}:{self.line}"


def is_cpu_test(node: ast.AST) -> bool:
    """`x.type == "cpu"`, `device != "cpu"`: a device's type compared with the CPU's name."""
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return False
    sides = [node.left, *node.comparators]
    said_cpu = any(isinstance(n, ast.Constant) and n.value == "cpu" for n in sides)
    about_device = any((isinstance(n, ast.Attribute) and n.attr == "type") or
                       (isinstance(n, ast.Name) and "device" in n.id) for n in sides)
    return said_cpu and about_device


def cuda_polarity(test: ast.AST, flags: dict[str, bool]) -> bool | None:
    """Whether `test` is true on a GPU (True: "is it CUDA"), false there (False: "is it the
    CPU", "is it not CUDA"), or names no device (None). `flags`: names the function bound to a
    device test (`on_cpu = device.type == "cpu"`), with their own polarity."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = cuda_polarity(test.operand, flags)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        return next((p for p in (cuda_polarity(v, flags) for v in test.values) if p is not None), None)
    if isinstance(test, ast.Name):
        return flags.get(test.id)
    negated = isinstance(test, ast.Compare) and isinstance(test.ops[0], (ast.NotEq, ast.NotIn, ast.IsNot))
    if is_cpu_test(test):
        return negated
    for n in ast.walk(test):
        if (isinstance(n, ast.Constant) and isinstance(n.value, str) and NAMES_CUDA.search(n.value)) or \
                (isinstance(n, ast.Attribute) and n.attr == "cuda"):
            return not negated
    return None


def device_flags(function: ast.AST) -> tuple[dict[str, bool], set[str]]:
    """Names a function binds to a device test, e.g. `on_cpu = next(...).device.type == "cpu"`,
    with their polarity; and those of them that read a tensor's own device."""
    flags: dict[str, bool] = {}
    from_tensor: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            polarity = cuda_polarity(node.value, flags) if isinstance(node.value, (ast.Compare, ast.UnaryOp)) else None
            if polarity is not None:
                flags[node.targets[0].id] = polarity
                if reads_tensor_device(node.value, from_tensor):
                    from_tensor.add(node.targets[0].id)
    return flags, from_tensor


def reads_tensor_device(test: ast.AST, from_tensor: set[str]) -> bool:
    """Whether a test reads the device back from a tensor (`next(model.parameters()).device`)
    rather than the device the code resolved: in the fake GPU's process tensors live in CPU
    memory, so such an arm can only run on a real GPU."""
    return any((isinstance(n, ast.Attribute) and n.attr == "device" and isinstance(n.value, ast.Call)) or
               (isinstance(n, ast.Name) and n.id in from_tensor) for n in ast.walk(test))


def statement_lines(body: list[ast.stmt]) -> list[int]:
    """The first line of each statement of a block, and of the statements of the loops, `with`
    and `try` blocks inside it (an `if` inside counts by its test, its arms are its own)."""
    lines = []
    for s in body:
        lines.append(s.lineno)
        if isinstance(s, (ast.With, ast.For, ast.While)):
            lines += statement_lines(s.body)
        elif isinstance(s, ast.Try):
            lines += statement_lines(s.body) + statement_lines(s.finalbody)
    return lines


def ends_block(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def blocks(scope: ast.AST):
    """Every list of statements in a scope (bodies, else arms), not in the functions it defines."""
    for node in walk_scope(scope):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def walk_scope(scope: ast.AST):
    """The nodes of a module or function, not descending into the functions defined in it."""
    todo = list(ast.iter_child_nodes(scope))
    yield scope
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def cuda_lines(src: Path = SRC) -> list[CudaLine]:
    found: dict[tuple[Path, int], CudaLine] = {}
    for path in sorted(src.rglob("*.py")):
        text = path.read_text().splitlines()
        tree = ast.parse("\n".join(text), str(path))

        def add(lines: list[int], kind: str, path: Path = path, text: list[str] = text) -> None:
            for n in lines:
                found.setdefault((path, n), CudaLine(path, n, kind, text[n - 1].strip()))

        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
        for scope in scopes:
            flags, from_tensor = device_flags(scope) if scope is not tree else ({}, set())
            for block in blocks(scope):
                for i, s in enumerate(block):
                    polarity = cuda_polarity(s.test, flags) if isinstance(s, ast.If) else None
                    kind = "tensor" if polarity is not None and reads_tensor_device(s.test, from_tensor) else "branch"
                    if polarity is True:
                        add(statement_lines(s.body), kind)
                    elif polarity is False:
                        add(statement_lines(s.orelse), kind)
                        if ends_block(s.body):  # a guard: the rest of the block is the CUDA arm
                            add(statement_lines(block[i + 1:]), kind)
            for node in walk_scope(scope):
                polarity = cuda_polarity(node.test, flags) if isinstance(node, ast.IfExp) else None
                if polarity is not None:
                    kind = "tensor" if reads_tensor_device(node.test, from_tensor) else "line"
                    add([(node.body if polarity else node.orelse).lineno], kind)
    return sorted(found.values(), key=lambda c: (str(c.path), c.line))


def executed(folder: Path) -> dict[str, set[int]]:
    """Lines executed per file, from every coverage data file recorded in `folder`."""
    import coverage

    files = [str(p) for p in folder.glob(".coverage*")]
    if not files:
        return {}
    cov = coverage.Coverage(data_file=str(folder / "combined"), config_file=str(ROOT / "pyproject.toml"))
    cov.combine(files, keep=True)
    data = cov.get_data()
    return {str(Path(f).resolve()): set(data.lines(f) or ()) for f in data.measured_files()}


def report(lines: list[CudaLine], ran: dict[str, set[int]]) -> tuple[str, int]:
    rows, missed, tensor = [], 0, 0
    width = max(len(c.where) for c in lines)
    for c in lines:
        ok = c.line in ran.get(str(c.path.resolve()), set())
        missed += not ok and c.kind != "tensor"
        tensor += c.kind == "tensor"
        verdict = "run" if ok else ("GPU only" if c.kind == "tensor" else "NOT RUN")
        rows.append(f"  {c.where:<{width}}  {verdict:8}  {c.kind:6}  {c.text[:100]}")
    required = len(lines) - tensor
    head = (f"CUDA lines of src/vitlab: {required} under a CUDA condition, {required - missed} executed by the "
            f"fake-GPU tests, {missed} not" + (f"; {tensor} more behind a tensor's own device, for a real GPU "
                                               "(kind 'tensor')" if tensor else ""))
    return "\n".join([head, *rows]), missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="a folder of coverage data recorded by the tests (VITLAB_CUDA_COVERAGE)")
    ap.add_argument("--list", action="store_true", help="list the CUDA lines only")
    args = ap.parse_args()
    lines = cuda_lines()
    if args.list:
        print("\n".join(f"{c.where}  {c.kind:6}  {c.text}" for c in lines))
        return 0
    if args.data is None:
        with tempfile.TemporaryDirectory() as folder:
            env = {**os.environ, "VITLAB_CUDA_COVERAGE": folder}
            code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-m", "fake_gpu"],
                                  cwd=ROOT, env=env).returncode
            text, missed = report(lines, executed(Path(folder)))
        print(text)
        return 1 if missed or code else 0
    if not args.data.is_dir():
        print(f"cuda_coverage: --data {args.data}: no such folder (run the tests with VITLAB_CUDA_COVERAGE set to it)",
              file=sys.stderr)
        return 2
    text, missed = report(lines, executed(args.data))
    print(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
