"""The tables of this repository's benchmark pages (benchmarks/results/*.md and .csv): a title,
the machine line, notes, then the table, through vitlab.tables (the one table writer) and the
machine line of vitlab.bench.tables. What `vitlab bench` itself writes stays in the library;
these writers serve only the scripts here, so they live beside them.

    import report_tables as tables   # a script's folder is on sys.path when it runs
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from vitlab.bench.tables import csv_text, fmt, header, markdown, noise_line, row_dict, write_results  # noqa: F401
from vitlab.files import atomic_write_text
from vitlab.tables import markdown_table


def table(records: Sequence[dict], columns: Sequence[str]) -> str:
    """A Markdown table of `records` (dicts), one column per name in `columns`."""
    return markdown_table(columns, [[r.get(c, "") for c in columns] for r in records])


def write_table(out_dir: str | os.PathLike, name: str, title: str, info: dict[str, str],
                records: Sequence[dict], columns: Sequence[str], notes: str = "") -> tuple[Path, Path]:
    """NAME.csv and NAME.md for any table: a title, the machine line, notes, the table."""
    out = Path(out_dir)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    atomic_write_text(csv_path, csv_text(records, columns))
    atomic_write_text(md_path, f"# {title}\n\n{header(info)}\n\n{notes}\n{table(records, columns)}")
    return csv_path, md_path
