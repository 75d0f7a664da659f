"""A sweep's evidence, kept in this repository, and the page tables generated from it.

This repository's tooling, not the library's: it writes docs/paper-in-miniature.md and the
committed results/paper/ folders (benchmarks/paper_suite.py and the page's test use it). What a
user runs on their own sweep, results.csv and report.md/json, is `vitlab sweep --report`
(vitlab.sweep.findings).

    keep(Path("runs/sweeps/pos-embed"), Path("results/paper/pos-embed"))
        copies what the numbers rest on (kilobytes): sweep.json, results.csv, report.md and
        report.json, and per cell its cell.json, timing.json, train/summary.json,
        train/config.yaml and each after-step's result JSON (few-shot, fine-tuning,
        analysis); never checkpoints.
        An after-step's JSON keeps the part its results row is built from (results.columns_only:
        not an analysis's position-similarity grid of grids or rollout maps, 100 kB a cell that
        no table reads; the run folder keeps the whole file), and the records a column's
        mean was taken over (a random-init null's draws). `vitlab sweep --report DEST`
        rebuilds the same report from the copy.

    render(page_text, Path("results/paper")) -> page_text
        replaces each generated block of a Markdown page with the table built now from the
        committed cells:

            <!-- findings: SPEC arms METRIC -->        per-arm mean, std, 95% interval (METRIC
                                                      may be a difference, `A - B`)
            <!-- findings: SPEC compare [METRIC] -->   the secondary rows (not a declared claim's)
            <!-- findings: SPEC verdicts -->            a verdict sentence per declared claim
            <!-- findings: claims -->                  one row per declared claim of every spec,
                                                      p_holm and p_bh across them (the page)
            <!-- findings: SPEC slopes -->              fitted slopes (report.slopes)
            <!-- findings: SPEC time -->               cells finished, wall time, summed step times
            <!-- findings: suite time -->              the same, one row per committed spec
            <!-- findings: rule -->                    the verdict rule, as the code applies it
            (the generated lines)
            <!-- /findings -->

        A spec with no committed folder gets "not run in this session". A test diffs the page
        against render(page), so the page cannot drift from the results.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from vitlab.config import ConfigError
from vitlab.files import atomic_write_text
from vitlab.sweep import claims_declared, findings, load_folder, results as res, stats, timing
from vitlab.sweep.cells import TRAIN_RESULT, expand

TOP = ("sweep.json", "results.csv", "report.md", "report.json")
PER_CELL = ("cell.json", timing.FILE, TRAIN_RESULT, "train/config.yaml")
BLOCK = re.compile(r"(<!-- findings: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /findings -->)", re.S)
NOT_RUN = "*Not run in this session.*"


def keep(src: Path, dest: Path) -> list[Path]:
    """Copy a sweep folder's evidence (see the module docstring); returns the files copied."""
    spec, scale = load_folder(src)
    names, trimmed = [*TOP], set()
    for cell in expand(spec, src, scale):
        for rel in (*PER_CELL, *(s.result for s in cell.steps[1:])):
            names.append(f"{cell.key}/{rel}")
        trimmed.update(f"{cell.key}/{s.result}" for s in cell.steps[1:] if s.result.endswith(".json"))
    copied = []
    for rel in names:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            data = res.read_json(src / rel) if rel in trimmed else None
            if data is None:
                shutil.copyfile(src / rel, dest / rel)
            else:
                atomic_write_text(dest / rel, json.dumps(res.columns_only(data), indent=2) + "\n")
            copied.append(dest / rel)
    return copied


def load(folder: Path) -> tuple[Any, list[dict[str, Any]], float]:
    spec, scale = load_folder(folder)
    cells = expand(spec, folder, scale)
    return spec, res.collect(cells, folder), scale


def declared(folder: Path) -> dict[str, Any]:
    """When the folder's claims were declared, as its evidence proves it (declare.verify)."""
    spec, scale = load_folder(folder)
    return claims_declared(spec, folder, expand(spec, folder, scale))


def _seconds(rows: list[dict[str, Any]]) -> float:
    return sum(float(r.get("train_seconds") or 0) for r in rows if r.get("status") == "done")


def _time(folder: Path) -> tuple[dict[str, Any], Optional[dict[str, Any]], float, list[dict[str, Any]]]:
    spec, rows, scale = load(folder)
    report = findings.build(spec, rows)
    return report, timing.summary(folder / r["cell"] for r in rows), scale, rows


def time_sentence(folder: Path) -> str:
    report, time, scale, rows = _time(folder)
    head = f"{report['finished']} of {report['cells']} cells finished (scale {scale:g})"
    if time is None:  # evidence kept before the step times were
        return (f"{head}; {_seconds(rows) / 60:.0f} minutes of training in all, summed over cells (`train_seconds`; "
                "two cells side by side on 2 CPU cores that other jobs shared).")
    return f"{head}: {timing.sentence(time)}"


def suite_table(root: Path) -> str:
    """One row per committed spec with step times, and their total."""
    lines = ["| spec | cells | wall time (min) | side by side | training, summed (min) | after-steps, summed (min) | machine |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    total = 0.0
    for folder in sorted(p.parent for p in root.glob("*/sweep.json")):
        report, time, _, _ = _time(folder)
        if time is None:
            lines.append(f"| {folder.name} | {report['finished']} of {report['cells']} | - | - | - | - | not recorded |")
            continue
        total += time["wall_s"]
        lines.append(f"| {folder.name} | {report['finished']} of {report['cells']} | {time['wall_s'] / 60:.0f} | "
                     f"{time['side_by_side']} | {time['train_s'] / 60:.0f} | {time['after_s'] / 60:.0f} | "
                     f"{'; '.join(time['machines'])} |")
    lines.append(f"| all | | {total / 60:.0f} ({total / 3600:.1f} hours) | | | | |")
    return "\n".join(lines)


def page_reports(root: Path) -> dict[str, dict[str, Any]]:
    """Every committed spec's report, with p_holm and p_bh adjusted across the page within
    each family (findings.FAMILIES): the confirmatory claims, the exploratory ones, the
    secondary rows."""
    reports = {}
    for folder in sorted(p.parent for p in root.glob("*/sweep.json")):
        spec, rows, _ = load(folder)
        reports[folder.name] = findings.build(spec, rows, declared(folder))
    findings.adjust(list(reports.values()), f"the page ({root.name}: {', '.join(reports)})")
    return reports


def write_reports(root: Path) -> list[Path]:
    """Rewrite each committed spec's report.json and report.md with the page's adjustment."""
    written = []
    for name, report in page_reports(root).items():
        spec, rows, _ = load(root / name)
        written += findings.write(spec, rows, root / name, report)
    return written


def block(args: str, root: Path, reports: Optional[dict[str, dict[str, Any]]] = None) -> str:
    words = args.split()
    if words == ["rule"]:
        return stats.RULE
    if words == ["suite", "time"]:
        return suite_table(root)
    reports = page_reports(root) if reports is None else reports
    if words == ["claims"]:
        return findings.claims_table(list(reports.values()))
    if len(words) < 2 or words[1] not in ("arms", "compare", "time", "slopes", "verdicts"):
        raise ConfigError(f"<!-- findings: {args} -->: write SPEC arms METRIC, SPEC compare [METRIC], SPEC verdicts, "
                          "SPEC time, claims or suite time")
    folder = root / words[0]
    if not (folder / "sweep.json").is_file():
        return NOT_RUN
    if words[1] == "time":
        return time_sentence(folder)
    report = reports[words[0]]
    if words[1] == "slopes":
        return findings.slopes_table(report)
    if words[1] == "verdicts":
        return findings.sentences(report)
    if words[1] == "arms":
        if len(words) < 3:
            raise ConfigError(f"<!-- findings: {args} -->: name the metric, e.g. {words[0]} arms test.top1")
        return findings.arms_table(report, " ".join(words[2:]))  # a difference metric: `A - B`
    return findings.comparisons_table(report, words[2:] or None, secondary=True)


def render(text: str, root: Path) -> str:
    reports = page_reports(root)

    def one(m: re.Match) -> str:
        return m.group(1) + block(m.group("args"), root, reports).rstrip("\n") + "\n" + m.group(4)

    return BLOCK.sub(one, text)


def main(argv: list[str]) -> int:
    """python benchmarks/paper_evidence.py PAGE ROOT [--check]: rewrite (or check) a page's blocks,
    and rewrite ROOT/*/report.json and report.md with the page's adjusted p-values."""
    page, root = Path(argv[0]), Path(argv[1])
    new = render(page.read_text(), root)
    if "--check" in argv:
        return 0 if new == page.read_text() else 1
    write_reports(root)
    page.write_text(new)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
