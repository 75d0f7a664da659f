"""docs/reliability.md gives the reliability suite's counts by family: they must be the
counts pytest collects, so that the page cannot drift from the suite it describes."""

from __future__ import annotations

import collections
import re
import subprocess
import sys

from conftest import ROOT

# A row of the page's table: | family | `tests/test_reliability_X.py` | N | ... |
ROW = re.compile(r"^\|[^|]+\|\s*`(tests/test_reliability_\w+\.py)`\s*\|\s*(\d+)\s*\|", re.M)


def collected_counts(files: list[str]) -> dict[str, int]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return dict(collections.Counter(line.split("::")[0] for line in r.stdout.splitlines() if "::" in line))


def test_the_counts_in_docs_reliability_are_the_suites(request):
    text = (ROOT / "docs" / "reliability.md").read_text()
    stated = {path: int(n) for path, n in ROW.findall(text)}
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_reliability_*.py")
                   if p.name != "test_reliability_docs.py")
    # The items of this session when it holds them all (the whole suite): no second collection.
    here = dict(collections.Counter(item.nodeid.split("::")[0] for item in request.session.items
                                    if item.nodeid.split("::")[0] in files))
    collected = here if here == stated else collected_counts(files)
    assert stated == collected, f"docs/reliability.md says {stated}, pytest collects {collected}"
    total = re.search(r"\*\*(\d+) tests\*\*", text)
    assert total and int(total.group(1)) == sum(collected.values())
