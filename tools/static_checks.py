"""The static checks CI runs before the tests (.ci/run), and what a developer runs before landing.

    python tools/static_checks.py                 # this checkout
    python tools/static_checks.py --root DIR      # another copy of the tree (tests/test_static_checks.py)

Two reviewers, both pinned in the test extra, both configured in pyproject.toml:
- ruff over src, tests, benchmarks and tools: pyflakes (F: F823, a local name used before its
  function-local import, is the bug of issue 50), pycodestyle's errors (E7, E9), bugbear (B),
  import order (I);
- mypy over src/vitlab with check_untyped_defs: every function body is type-checked, annotated
  or not (DEVELOPERS.md says why mypy and this level).
Both always run, so one report names every finding. Exit status 1 when either finds anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

RUFF_PATHS = ("src", "tests", "benchmarks", "tools")
CHECKS = {
    "ruff": ["-m", "ruff", "check", *RUFF_PATHS],
    "mypy": ["-m", "mypy"],  # files, level and per-package exceptions: [tool.mypy] in pyproject.toml
}


def run(root: Path) -> list[str]:
    """Run every check in `root` (its output goes to this process's stdout); the names of those
    that failed."""
    failed = []
    for name, args in CHECKS.items():
        print(f"static checks: {name}: python {' '.join(args)}", flush=True)
        result = subprocess.run([sys.executable, *args], cwd=root, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            failed.append(name)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the tree to check (default: this checkout)")
    args = parser.parse_args(argv)
    failed = run(args.root)
    if failed:
        print(f"static checks: FAILED ({', '.join(failed)}): fix every finding above; where a finding is wrong, "
              "suppress that one line with its code and a one-line reason (DEVELOPERS.md)", flush=True)
        return 1
    print("static checks: passed (ruff, mypy)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
