"""The whole paper suite in one command: the six shipped `paper/*` sweeps in turn, then their
evidence kept and docs/paper-in-miniature.md regenerated from it.

    python benchmarks/paper_suite.py                    # runs/sweeps/SPEC, two cells side by side
    python benchmarks/paper_suite.py --keep results/paper --page docs/paper-in-miniature.md
    python benchmarks/paper_suite.py --only pos-embed cls-gap --scale 10 --jobs 8 --threads 2

Each spec is `vitlab sweep paper/SPEC --jobs J --threads T --scale S --out OUT/SPEC` (skipping
finished cells, resuming an interrupted one). `--keep DIR` replaces DIR/SPEC with the sweep's
evidence (vitlab.sweep.evidence.keep: cell JSON, step times, reports; no checkpoints), and
`--page` rewrites the page's generated blocks from DIR. Each cell's steps record their wall
time, so the page's time table is this run's, on this machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from vitlab.cli import main as vitlab
from vitlab.sweep import evidence

# Cheapest first: a broken setup shows in minutes, not after the longest spec.
SPECS = ("pos-embed-at", "pos-embed", "compute", "data-size", "cls-gap", "attention-distance")


def replace_evidence(src: Path, dest: Path) -> None:
    """dest becomes a copy of src's evidence; an existing dest must be evidence (a sweep.json)."""
    if dest.exists():
        if not (dest / "sweep.json").is_file():
            raise SystemExit(f"paper_suite: {dest} exists and is not a kept sweep (no sweep.json); "
                             "move it away or choose another --keep folder")
        shutil.rmtree(dest)
    evidence.keep(src, dest)


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
    failed = []
    for name in args.only:
        out = args.out / (name if args.scale == 1 else f"{name}-x{args.scale:g}")
        rc = vitlab(["sweep", f"paper/{name}", "--out", str(out), "--jobs", str(args.jobs),
                     "--threads", str(args.threads), "--scale", f"{args.scale:g}"])
        if rc != 0:
            failed.append(name)
            continue
        if args.keep:
            replace_evidence(out, args.keep / name)
    if args.page:
        args.page.write_text(evidence.render(args.page.read_text(), args.keep))
        print(f"page:    {args.page} regenerated from {args.keep}")
    if failed:
        print(f"paper_suite: {', '.join(failed)} had failed cells (see their logs); rerun to resume them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
