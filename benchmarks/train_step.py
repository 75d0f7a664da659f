"""Issue 51, item 2: vitlab's training step now (`vitlab train`'s wrapper: fused AdamW, fp32
Dense products on the kernels timed fastest here) beside the step before (the plain model,
torch's default AdamW), timm's step and the matrix-product ceilings, in the same process.

    python benchmarks/train_step.py --name training-step-zen4     # about 6 minutes for ViT-S/16 b32
    python benchmarks/train_step.py --name training-step-zen4-b16 --model ViT-B/16 --rounds 3
    python benchmarks/train_step.py --name training-step-zen4-b16-384 --model ViT-B/16 --image-size 384 --batch-size 8

--image-size times fine-tuning at a higher resolution: the model built at that size, which is
the model a fine-tune runs once its position embeddings are resized to the new grid (the resize
happens once, at load, and is not part of the step).

One thread timed by its own CPU time (`vitlab bench --clock cpu`: other processes cannot inflate
it), one step per sample, the systems interleaved in shuffled rounds; then a profile of the new
step per precision (`op_profile.py`'s operator timer). Writes NAME.md and NAME.csv.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from op_profile import kind_of, profile
from vitlab.api import get_config
from vitlab.bench import machine, runner, tables
from vitlab.bench.ceiling import ceiling_precision
from vitlab.bench.systems import Setting, System, prepare
from vitlab.deploy import kernels
from vitlab.files import atomic_write_text
from vitlab.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"


def paired(row: runner.Row, ref: runner.Row) -> str:
    """The median over rounds of row's rate over ref's in the same round, with the range."""
    by_round = {s.round: s.rate for s in ref.samples}
    r = [s.rate / by_round[s.round] for s in row.samples if s.round in by_round]
    return f"{statistics.median(r):.3f} ({min(r):.3f}–{max(r):.3f})" if r else ""


def per_round_share(row: runner.Row, rows: list[runner.Row]) -> str:
    """The median and range over rounds of row's share of the ceiling measured in the same round
    (the faster kernel's product rate in that round)."""
    dtype = ceiling_precision(row.system.precision)
    ceilings: dict[int, float] = {}
    for g in rows:
        if g.system.impl == "gemm" and g.system.precision == dtype:
            for s in g.samples:
                ceilings[s.round] = max(ceilings.get(s.round, 0.0), s.rate)
    r = [100 * row.flops_per_image * s.rate / ceilings[s.round] for s in row.samples if s.round in ceilings]
    return f"{statistics.median(r):.0f} ({min(r):.0f}–{max(r):.0f})" if r else ""


def summary(rows: list[runner.Row]) -> str:
    out = []
    for precision in sorted({r.system.precision for r in rows if r.system.impl != "gemm"}):
        mine = {(r.system.impl, r.system.wrapper): r for r in rows if r.system.precision == precision}
        new, old, timm = mine[("vitlab", True)], mine.get(("vitlab", False)), mine.get(("timm", True))
        for row in (old, new, timm):
            if row is None or not row.samples:
                continue
            d = tables.row_dict(row)
            memory = (f"{row.work_mib / timm.work_mib:.2f}" if timm is not None and row is not timm
                      and timm.work_mib > 0 else "")
            out.append([precision, row.system.label, f"{row.setting.batch / row.median:.2f}", d["images_per_s"],
                        per_round_share(row, rows), d["ceiling_gflops"], paired(row, old) if old and row is not old else "",
                        paired(row, timm) if timm is not None and row is not timm else "",
                        f"{row.work_mib:,.0f}", memory])
    return markdown_table(["precision", "step", "s/step (median)", "img/s", "% of ceiling (per round)", "ceiling GFLOP/s",
                           "× old step (per round)", "× timm (per round)", "work MiB", "× timm's work MiB"], out)


def profiles(cfg, batch: int, precisions: list[str], top: int) -> str:
    parts = []
    for precision in precisions:
        step = prepare(Setting(cfg, batch, "train"), System("vitlab", precision), warmup=1)
        prof = profile(step.fn, calls=1, warmup=0)
        kinds = [[k, f"{s * 1e3:,.0f}", f"{s / prof.timed:.0%}"] for k, s in prof.by_kind.items() if s > 0]
        ops = [[op, kind_of(op), f"{s * 1e3:,.0f}", f"{s / prof.timed:.0%}", str(prof.calls[op])]
               for op, s in sorted(prof.by_op.items(), key=lambda kv: -kv[1])[:top]]
        parts += [f"### The new step, {precision}: {prof.seconds:.2f} CPU-s per step", "",
                  markdown_table(["kind of work", "ms", "share"], kinds), "",
                  markdown_table(["operator", "kind", "ms", "share", "calls"], ops), ""]
    return "\n".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="result file name in benchmarks/results (say the CPU kind)")
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, help="square images of this size (fine-tuning at 384: 384)")
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16-autocast"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--no-timm", action="store_true")
    p.add_argument("--no-old", action="store_true", help="leave out the plain step (before issue 51)")
    p.add_argument("--no-profile", action="store_true", help="timings only (a busy machine's short session)")
    p.add_argument("--top", type=int, default=12, help="operators listed per profile")
    p.add_argument("--warmup", type=int, default=2, help="steps of each system before its timed rounds (a busy machine: 1)")
    args = p.parse_args()
    cfg = get_config(args.model)
    if args.image_size:
        cfg = cfg.replace(image_size=(args.image_size, args.image_size))
    systems = [System(impl, precision, wrapper=wrapper) for precision in args.precision
               for impl, wrapper in [("vitlab", False)] * (not args.no_old) + [("vitlab", True)]
               + [("timm", True)] * (not args.no_timm)]
    bench = runner.BenchConfig(rounds=args.rounds, min_time=0.0, min_calls=1, clock="cpu", warmup=args.warmup)
    rows = runner.run([(Setting(cfg, args.batch_size, "train"), systems)], bench, log=print)
    torch.set_num_threads(1)  # (runner.run gives the threads back)
    info = machine.machine_info()
    info["kernels"] = "\n".join(map(str, kernels.choices()))
    tables.write_csv(rows, RESULTS / f"{args.name}.csv")
    text = "\n\n".join([f"# Benchmark: {args.name}", tables.header(info), tables.noise_line(rows, bench),
                        summary(rows), tables.markdown(rows) + tables.kernels_foot(info)])
    atomic_write_text(RESULTS / f"{args.name}.md", text + "\n")  # the timings stand even if the profile is cut short
    print(text)
    if args.no_profile:
        return
    text = "\n\n".join([text, "## Where the new step's time goes", profiles(cfg, args.batch_size, args.precision, args.top)])
    atomic_write_text(RESULTS / f"{args.name}.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
