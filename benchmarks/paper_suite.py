"""The whole paper suite in one command: the shipped `paper/*` sweeps in turn, then their
evidence kept and docs/paper-in-miniature.md regenerated from it.

    python benchmarks/paper_suite.py                    # runs/sweeps/SPEC, two cells side by side
    python benchmarks/paper_suite.py --keep results/paper --page docs/paper-in-miniature.md
    python benchmarks/paper_suite.py --only pos-embed cls-gap --scale 10 --jobs 8 --threads 2

Each spec is `vitlab sweep paper/SPEC --jobs J --threads T --scale S --out OUT/SPEC` (skipping
finished cells, resuming an interrupted one). `--keep DIR` replaces DIR/SPEC with the sweep's
evidence (paper_evidence.keep: cell JSON, step times, reports; no checkpoints): a DIR/SPEC
that holds anything but such evidence, or that is the sweep's own folder, is refused and kept; and
`--page` rewrites the page's generated blocks from DIR. Each cell's steps record their wall
time, so the page's time table is this run's, on this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import paper_evidence as evidence  # benchmarks/paper_evidence.py, beside this script
from vitlab.cli import main as vitlab
from vitlab.config import ConfigError

# Cheapest first: a broken setup shows in minutes, not after the longest spec.
SPECS = ("pos-embed-at", "pos-embed", "compute", "data-size", "cls-gap", "attention-distance", "table8", "local-heads")


def not_evidence(folder: Path) -> list[str]:
    """The files of `folder` that keeping it again would not copy (evidence.keep), in order:
    none for a folder of kept evidence; a live sweep's checkpoints, logs and notes otherwise."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    if not (folder / "sweep.json").is_file():
        return files or ["(no sweep.json)"]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            kept = {p.relative_to(Path(tmp) / "copy").as_posix() for p in evidence.keep(folder, Path(tmp) / "copy")}
        except (ConfigError, OSError) as e:
            return [f"(its sweep.json cannot be read: {e})"]
    return [f for f in files if f not in kept]


def check_keep(src: Path, dest: Path) -> None:
    """Refuse (SystemExit) a --keep destination that may not be replaced: the sweep folder
    itself, one inside it or around it, or a folder holding anything but kept evidence
    (`not_evidence`). Checked for every spec before the first sweep runs, and again before
    each replacement."""
    s, d = src.resolve(), dest.resolve()
    if s == d or s in d.parents or d in s.parents:
        raise SystemExit(f"paper_suite: --keep puts {dest} where the sweep {src} is (the same folder, inside it or "
                         "around it); keep the evidence in a folder of its own, e.g. --keep results/paper")
    if dest.exists():
        foreign = not_evidence(dest)
        if foreign:
            listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise SystemExit(f"paper_suite: {dest} holds files that are not a kept sweep's evidence ({listed}); "
                             "nothing was removed: move them away or choose another --keep folder")


def replace_evidence(src: Path, dest: Path) -> None:
    """dest becomes a copy of src's evidence, made beside it and then swapped in; what
    `check_keep` refuses is left as it is."""
    check_keep(src, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new-", dir=dest.parent))
    try:
        evidence.keep(src, staging)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / dest.name)
            os.replace(staging, dest)
            shutil.rmtree(old)  # the previous evidence, every file of it checked to be evidence above
        else:
            os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=SPECS, default=list(SPECS), help="these specs only")
    parser.add_argument("--out", type=Path, default=Path("runs/sweeps"), help="sweep folders go in OUT/SPEC")
    parser.add_argument("--jobs", type=int, default=2, help="cells side by side (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per cell (default 1)")
    parser.add_argument("--scale", type=float, default=1.0, help="--scale of every spec (default 1)")
    parser.add_argument("--keep", type=Path, help="replace KEEP/SPEC with each sweep's evidence")
    parser.add_argument("--page", type=Path, help="regenerate this page's blocks from --keep")
    args = parser.parse_args(argv)
    if args.page and not args.keep:
        parser.error("--page needs --keep (the page is generated from the kept evidence)")
    outs = {name: args.out / (name if args.scale == 1 else f"{name}-x{args.scale:g}") for name in args.only}
    for name, out in outs.items():
        if args.keep:  # before hours of sweeps, not after them
            check_keep(out, args.keep / name)
    failed = []
    for name, out in outs.items():
        rc = vitlab(["sweep", f"paper/{name}", "--out", str(out), "--jobs", str(args.jobs),
                     "--threads", str(args.threads), "--scale", f"{args.scale:g}"])
        if rc != 0:
            failed.append(name)
            continue
        if args.keep:
            replace_evidence(out, args.keep / name)
    if args.page:
        evidence.write_reports(args.keep)  # p_holm and p_bh across the page's claims
        args.page.write_text(evidence.render(args.page.read_text(), args.keep))
        print(f"page:    {args.page} regenerated from {args.keep}")
    if failed:
        print(f"paper_suite: {', '.join(failed)} had failed cells (see their logs); rerun to resume them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
