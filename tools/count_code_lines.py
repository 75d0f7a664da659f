"""Count the code lines of Python files, read with `tokenize` (issue 55's size measure).

    python tools/count_code_lines.py                 # src/vitlab, the total and each package
    python tools/count_code_lines.py src/vitlab/models src/vitlab/config/run.py

The rule: a code line is a physical line that holds some token other than a comment, a line
break (NL, NEWLINE), indentation (INDENT, DEDENT) or a docstring, where a docstring is a
string literal standing alone as a statement (the first one of a module, class or function,
and any other bare string). A token that spans lines (a triple-quoted string used as a value,
an expression continued in brackets) counts every line it touches. So blank lines, comment
lines and docstrings are not code; a line of code with a comment after it is.
"""

from __future__ import annotations

import argparse
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
        tokenize.ENDMARKER}
# Tokens after which a string literal starts a statement of its own.
STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def code_lines(source: str) -> int:
    """How many lines of `source` are code, by the rule in the module docstring."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in
              (tokenize.COMMENT, tokenize.NL)]
    lines: set[int] = set()
    i = 0
    while i < len(tokens):
        end = _docstring_end(tokens, i)
        if end:
            i = end  # a docstring
            continue
        tok = tokens[i]
        if tok.type not in SKIP:
            lines.update(range(tok.start[0], tok.end[0] + 1))
        i += 1
    return len(lines)


def _docstring_end(tokens: list[tokenize.TokenInfo], i: int) -> int:
    """Where the docstring starting at token `i` ends (the index after its last string), or 0
    where none starts there: a string literal that starts a statement and ends it (strings
    written side by side, "a" "b", are one literal)."""
    if tokens[i].type != tokenize.STRING or (i > 0 and tokens[i - 1].type not in STATEMENT_START):
        return 0
    j = i
    while j < len(tokens) and tokens[j].type == tokenize.STRING:
        j += 1
    return j if j == len(tokens) or tokens[j].type in (tokenize.NEWLINE, tokenize.ENDMARKER) else 0


def count(paths: list[Path]) -> Counter[str]:
    """Code lines per file (as a path relative to the repository root where it lies inside)."""
    out: Counter[str] = Counter()
    for path in paths:
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            name = str(f.resolve().relative_to(ROOT)) if ROOT in f.resolve().parents else str(f)
            out[name] = code_lines(f.read_text(encoding="utf-8"))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / "src" / "vitlab"])
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    per_file = count(args.paths)
    per_package: Counter[str] = Counter()
    for name, n in per_file.items():
        parts = Path(name).parts
        inner = parts[parts.index("vitlab") + 1:] if "vitlab" in parts else parts
        per_package[inner[0].removesuffix(".py") if len(inner) > 1 else "(package root)"] += n
    for package, n in sorted(per_package.items(), key=lambda kv: -kv[1]):
        print(f"{n:7,d}  {package}")
    print(f"{sum(per_file.values()):7,d}  total, {len(per_file)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
