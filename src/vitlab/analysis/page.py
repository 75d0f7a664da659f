"""One self-contained HTML page for `vitlab inspect`: every PNG inlined as base64, so the
page can be mailed or attached without its folder."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Sequence

from vitlab.analysis.figure import Figure
from vitlab.files import OutputFolder, atomic_write_text

# Every file `vitlab inspect` may write into its --out folder, which may hold the user's own
# files: those of these names are replaced only when inspect wrote them (files.OutputFolder).
REPORT_FILES = ("index.html", "analysis.json", "filters.png", "position_similarity.png", "attention_distance.png",
                "rollout.png", "mpp_predictions.png")


class ReportFolder(OutputFolder):
    """inspect's --out: refused up front where it holds a user's file of a report's name;
    `record()` afterwards lists the files this run wrote."""

    def __init__(self, folder: str | Path, force: bool = False):
        import time

        super().__init__(folder, "inspect", force)
        self.started = time.time() - 1  # mtimes are coarse on some file systems
        self.claim(REPORT_FILES)
        self.folder.mkdir(parents=True, exist_ok=True)

    def record(self, names=()) -> None:
        fresh = [n for n in REPORT_FILES if (self.folder / n).is_file() and (self.folder / n).stat().st_mtime >= self.started]
        super().record([*names, *fresh])


def _img(png: Path) -> str:
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(Path(png).name)}">'


def write_html(path: str | Path, title: str, facts: dict, figures: Sequence[Figure]) -> Path:
    """Write the page: a table of facts (checkpoint, model, images), then each figure with
    its caption. Returns the path."""
    rows = "\n".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    sections = "\n".join(
        f'<section id="{html.escape(f.name)}"><h2>{html.escape(f.title)}</h2>{_img(f.png)}'
        f"<p>{html.escape(f.caption)}</p></section>"
        for f in figures
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ text-align: left; padding: 0.15em 0.8em; border-bottom: 1px solid #ddd; font-size: 0.9em; }}
img {{ max-width: 100%; }}
section {{ margin-bottom: 2em; }}
p {{ font-size: 0.9em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<table>
{rows}
</table>
{sections}
</body></html>
"""
    atomic_write_text(path, page)
    return Path(path)
