"""Tables as text, in one place: Markdown and CSV from a header and rows of cells.

Every table vitlab writes goes through these two: `vitlab bench`'s results, the VTAB-1k row,
the model card's metrics and settings (and the repository's own benchmark pages:
benchmarks/report_tables.py, op_profile.py). A cell is written as `str(cell)`; None is empty.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable, Sequence


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """| a | b |, the separator, then one line per row; ends with a newline."""
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The same table as CSV (a header line, then the rows)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows([[_cell(c) for c in row] for row in rows])
    return buf.getvalue()
