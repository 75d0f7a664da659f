"""The transfer table (docs/transfer.md): a vitlab CIFAR-10 model carried to other datasets,
in the shape of the paper's Table 2 / Figure 2, at CPU scale.

    python benchmarks/transfer.py --source runs/cifar10-src/checkpoints/last.safetensors

For each target dataset, all from the same source checkpoint and at the same compute:

- fine-tune: `vitlab finetune --from SOURCE --data D --steps S --batch-size B` with the
  fitted defaults (its own 32 px resolution, 5% warm-up, the quick learning-rate sweep on
  small sets, whose steps count towards the compute);
- from scratch: `vitlab train --config cifar10 --data D` (the same architecture and batch,
  the CPU CIFAR recipe), for as many steps as the fine-tuning used in all;
- the control: `vitlab finetune` from the source with the from-scratch arm's recipe (AdamW,
  its rate, warm-up, crop and label smoothing) for the from-scratch arm's steps, which tells
  what the pre-trained weights buy apart from what the paper's fine-tuning recipe does
  (`--control-only` adds it to earlier results);
- few-shot (1/5/10/25 shots, 3 seeds) and a logistic-regression linear probe on the frozen
  features of the source, and of a randomly initialised model of the same shape.

The source was trained with `vitlab train --config cifar10 --data wds:../shared/data/cifar10
--epochs 2 --out runs/cifar10-src`. Results go to benchmarks/results/transfer.json and
benchmarks/results/transfer.md. Run it alone (`flock /work/heavy.lock`, `nice`): it is
about 50 CPU-minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMPS = Path("/usr/share/tuxpaint/stamps")  # Debian's tuxpaint-stamps-default
STAMP_CLASSES = ("animals", "food", "household", "plants", "town", "vehicles")
FASHION = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def stamps_folder(root: Path) -> Path:
    """An imagefolder of Tux Paint's stamp photographs, one class per top-level category
    (links to the PNGs; vitlab holds out a fixed 20% as the test split)."""
    out = root / "stamps"
    for cls in STAMP_CLASSES:
        (out / cls).mkdir(parents=True, exist_ok=True)
        for png in sorted((STAMPS / cls).rglob("*.png")):
            link = out / cls / ("_".join(png.relative_to(STAMPS / cls).parts))
            if not link.exists():
                link.symlink_to(png)
    return out


def vitlab(*args: str) -> tuple[str, float]:
    """Run a vitlab command; (stdout, CPU seconds of the child)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = os.times()
    r = subprocess.run([sys.executable, "-m", "vitlab", *args], capture_output=True, text=True, env=env)
    after = os.times()
    if r.returncode != 0:
        raise SystemExit(f"vitlab {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r.stdout, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def summary(run: Path) -> dict:
    final = run / "final" if (run / "final" / "summary.json").exists() else run
    return json.loads((final / "summary.json").read_text())


def finetune_and_scratch(source: Path, data: str, out: Path, steps: int, batch: int) -> dict:
    ft_dir, sc_dir = out / "finetune", out / "scratch"
    text, ft_cpu = vitlab("finetune", "--from", str(source), "--data", data, "--steps", str(steps), "--batch-size",
                          str(batch), "--out", str(ft_dir), "--quiet", "train.threads=1")
    ft = summary(ft_dir)
    sweep = json.loads((ft_dir / "sweep.json").read_text()) if (ft_dir / "sweep.json").exists() else None
    # The quick sweep's steps are compute too: scratch gets the same total.
    total = steps + (sum(summary(p)["steps"] for p in (ft_dir / "sweep").iterdir()) if sweep else 0)
    _, sc_cpu = vitlab("train", "--config", "cifar10", "--data", data, "--steps", str(total), "--batch-size", str(batch),
                       "--out", str(sc_dir), "--quiet", "train.threads=1", "data.num_workers=0")
    sc = summary(sc_dir)
    return {
        "finetune_top1": ft["splits"]["test"]["top1"], "finetune_steps": total, "finetune_cpu_s": round(ft_cpu),
        "finetune_lr": sweep["best_lr"] if sweep else None,
        "scratch_top1": sc["splits"]["test"]["top1"], "scratch_steps": sc["steps"], "scratch_cpu_s": round(sc_cpu),
        "batch": batch,
    }


# The from-scratch arm's recipe (configs/cifar10.yaml), given to `vitlab finetune`: the same
# start as the fine-tuned arm, the same optimiser and augmentation as the from-scratch arm.
SCRATCH_RECIPE = ("--lr", "0.002", "--warmup-steps", "100", "--quiet", "train.threads=1", "optim.name=adamw",
                  "optim.weight_decay=0.05", "data.crop_scale=[0.35,1.0]", "train.label_smoothing=0.1")


def scratch_recipe_from_source(source: Path, data: str, out: Path, steps: int, batch: int) -> dict:
    """The control that tells the two arms' differences apart: the source's weights trained
    with the from-scratch recipe for the from-scratch arm's steps."""
    run = out / "finetune-scratch-recipe"
    _, cpu = vitlab("finetune", "--from", str(source), "--data", data, "--steps", str(steps), "--batch-size", str(batch),
                    "--out", str(run), *SCRATCH_RECIPE)
    return {"control_top1": summary(run)["splits"]["test"]["top1"], "control_steps": steps, "control_cpu_s": round(cpu)}


def frozen(source: Path, data: str, out: Path) -> dict:
    result = {}
    for name, extra in (("source", []), ("random", ["--random-init", "0"])):
        few_file, probe_file = out / f"fewshot-{name}.json", out / f"probe-{name}.json"
        vitlab("fewshot", str(source), "--data", data, "--shots", "1,5,10,25", "--seeds", "3", "--out", str(few_file),
               *extra)
        vitlab("linear-probe", str(source), "--data", data, "--max-per-class", "500", "--out", str(probe_file), *extra)
        few = json.loads(few_file.read_text())
        result[f"{name}_fewshot"] = {s: r["mean"] for s, r in few["shots"].items()}
        result[f"{name}_probe"] = json.loads(probe_file.read_text())["logistic"]["test_accuracy"]
    return result


def table(results: dict) -> str:
    rows = ["| target | train images | fine-tuned | from scratch, same compute "
            "| fine-tuned with the from-scratch recipe | linear probe (CIFAR-10 features / random) "
            "| 1 / 5 / 10 / 25-shot (CIFAR-10 features) | 1 / 5 / 10 / 25-shot (random) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        few = lambda k: " / ".join(f"{100 * v:.1f}" for v in r[k].values())  # noqa: E731
        best = max(r.get(k, 0) for k in ("finetune_top1", "scratch_top1", "control_top1"))  # in bold
        pct = lambda k: (f"**{100 * r[k]:.1f}%**" if r[k] == best else f"{100 * r[k]:.1f}%")  # noqa: E731
        rows.append(
            f"| {name} | {r['train_images']:,} | {pct('finetune_top1')} ({r['finetune_steps']} steps"
            + (f", lr {r['finetune_lr']:g}" if r["finetune_lr"] else "") + f") | {pct('scratch_top1')} "
            f"({r['scratch_steps']} steps) | {control(r, pct)} | {100 * r['source_probe']:.1f}% / "
            f"{100 * r['random_probe']:.1f}% | {few('source_fewshot')} | {few('random_fewshot')} |"
        )
    return "\n".join(rows)


def control(r: dict, pct) -> str:
    return f"{pct('control_top1')} ({r['control_steps']} steps)" if "control_top1" in r else "not run"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True, help="the vitlab CIFAR-10 checkpoint to transfer from")
    p.add_argument("--out", default="runs/transfer", help="where the runs go")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps (the quick sweep adds its own)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--only", help="comma-separated targets to run (default: all)")
    p.add_argument("--control-only", action="store_true",
                   help="run only the control arm (the from-scratch recipe from the source), keeping the other results")
    args = p.parse_args()
    out, source = Path(args.out), Path(args.source)
    targets = {"digits": "digits", "fashion-mnist": f"fashion-mnist:{FASHION}",
               "tux-paint-photos": f"imagefolder:{stamps_folder(out)}"}
    wanted = args.only.split(",") if args.only else list(targets)
    results_file = ROOT / "benchmarks" / "results" / "transfer.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    for name in wanted:
        t0 = time.time()
        data = targets[name]
        if args.control_only:
            print(f"{name}: the from-scratch recipe from the source", flush=True)
            results[name].update(scratch_recipe_from_source(source, data, out / name, results[name]["scratch_steps"],
                                                            args.batch_size))
            results_file.write_text(json.dumps(results, indent=2) + "\n")
            continue
        print(f"{name}: fine-tune and from scratch", flush=True)
        r = finetune_and_scratch(source, data, out / name, args.steps, args.batch_size)
        print(f"{name}: few-shot and linear probe", flush=True)
        r.update(scratch_recipe_from_source(source, data, out / name, r["scratch_steps"], args.batch_size))
        r.update(frozen(source, data, out / name))
        r["train_images"] = _train_size(data)
        r["wall_s"] = round(time.time() - t0)
        results[name] = r
        results_file.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(r), flush=True)
    write_tables(results, source)


def write_tables(results: dict, source: Path) -> None:
    """The table into benchmarks/results/transfer.md and between docs/transfer.md's markers."""
    md = ROOT / "benchmarks" / "results" / "transfer.md"
    md.write_text(f"# Transfer from a vitlab CIFAR-10 model\n\n`python benchmarks/transfer.py --source {source}`\n\n"
                  + table(results) + "\n")
    doc = ROOT / "docs" / "transfer.md"  # the table between its markers, the prose around it kept
    text = doc.read_text()
    start, end = text.index("<!-- transfer-table -->"), text.index("<!-- /transfer-table -->")
    doc.write_text(text[:start] + "<!-- transfer-table -->\n" + table(results) + "\n" + text[end:])
    print(table(results))


def _train_size(data: str) -> int:
    from vitlab.data import open_dataset
    from vitlab.data.transforms import eval_transform

    return len(open_dataset(data, "train", eval_transform(32)))


if __name__ == "__main__":
    main()
