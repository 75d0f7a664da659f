"""The transfer tables of docs/transfer.md: a vitlab CIFAR-10 model carried to other datasets,
in the shape of the paper's Table 2 / Figure 2, at CPU scale.

    python benchmarks/transfer.py                     # the page's measurement, from the shipped source
    python benchmarks/transfer.py --build-source      # the source, rebuilt and compared with the shipped one
    python benchmarks/transfer.py --tables            # the page's tables from the results, no runs

The source is `vitlab train --config cifar10 --data wds:../shared/data/cifar10 --epochs 2
--out runs/cifar10-src`. Its run folder (config, summary, the 3.2 MB checkpoint) is shipped in
benchmarks/results/transfer-source/, because training is bit-exact on one kind of CPU but not
across them (the kernels' summation order differs between AVX2, AVX-512 and AMX): the same
command gives other weights on another machine. `--build-source` runs it and says whether its
weights are the shipped ones (SHA-256 of the tensors, recorded in
benchmarks/results/transfer.json as `source.weights_sha256`); `--ship` makes a fresh build the
shipped source (the measurement must then be rerun: each records `protocol.source_sha256`).

For each target and each seed, at equal fine-tuning compute (the same model and batch, and the
same training FLOPs on the target; the source's own pretraining is not counted):

- default fine-tune: `vitlab finetune SOURCE --data D --steps S --batch-size B --seed N`,
  nothing else: its quick sweep chooses the recipe (the paper's SGD, or AdamW from a
  linear-probe head) and the rate on a dev split, then trains the winner for S steps; the
  sweep's steps and the probes' forward passes count as compute;
- the control: the same command with `--random-init N`, the source's network from untrained
  weights, with the same dev-split search, steps and so compute (seeds 10-13 by default: 0-4
  were the ones the probe head was chosen on).

The differences are paired by seed (95% t interval). Results go to
benchmarks/results/transfer.json; the tables into benchmarks/results/transfer.md and between
the markers of docs/transfer.md (tests/test_transfer_page.py checks that they agree). Run
it alone (`flock LOCKFILE nice -n 5`): the defaults (300 steps of 32, four seeds, both arms, two at a
time) took 26 minutes on 2 shared cores, the source's rebuild about 10-20 minutes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "transfer.json"
PAGE = ROOT / "docs" / "transfer.md"
SOURCE_COMMAND = ("train", "--config", "cifar10", "--data", "wds:../shared/data/cifar10", "--epochs", "2",
                  "--out", "runs/cifar10-src")
BUILT = Path("runs/cifar10-src")  # where SOURCE_COMMAND trains
SHIPPED = ROOT / "benchmarks" / "results" / "transfer-source"  # the page's source, as its run folder
SOURCE = SHIPPED / "checkpoints" / "last.safetensors"
STAMPS = Path("/usr/share/tuxpaint/stamps")  # Debian's tuxpaint-stamps-default
STAMP_CLASSES = ("animals", "food", "household", "plants", "town", "vehicles")
FASHION = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
TARGETS = ("digits", "fashion-mnist", "tux-paint-photos")


def stamps_folder(root: Path) -> Path:
    """An imagefolder of Tux Paint's stamp photographs, one class per top-level category
    (links to the PNGs; vitlab holds out a fixed 20% as the test split)."""
    if not STAMPS.is_dir():
        raise SystemExit(f"{STAMPS} is missing: apt-get install tuxpaint-stamps-default")
    out = root / "stamps"
    for cls in STAMP_CLASSES:
        (out / cls).mkdir(parents=True, exist_ok=True)
        for png in sorted((STAMPS / cls).rglob("*.png")):
            link = out / cls / ("_".join(png.relative_to(STAMPS / cls).parts))
            if not link.exists():
                link.symlink_to(png)
    return out


def data_spec(name: str, out: Path) -> str:
    return {"digits": "digits", "fashion-mnist": f"fashion-mnist:{FASHION}"}.get(name) or f"imagefolder:{stamps_folder(out)}"


def vitlab(*args: str) -> float:
    """Run a vitlab command; the CPU seconds of the child."""
    start = time.time()
    r = subprocess.run([sys.executable, "-m", "vitlab", *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"vitlab {' '.join(args)} failed after {time.time() - start:.0f} s:\n{r.stderr[-3000:]}")
    return time.time() - start


def finished(run: Path) -> bool:
    return (run / "final" / "summary.json").exists() or (run / "summary.json").exists()


def summary(run: Path) -> dict:
    final = run / "final" if (run / "final" / "summary.json").exists() else run
    return json.loads((final / "summary.json").read_text())


def weights_digest(path: Path) -> str:
    """SHA-256 of a checkpoint's tensors (names, dtypes, shapes and bytes, in name order):
    the weights themselves, not the file's metadata."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(str(path)).items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def one_seed(source: Path, name: str, data: str, out: Path, seed: int, steps: int, batch: int) -> dict:
    """Default fine-tune and its control, one seed: the same command from the source's network at
    random initialisation (`--random-init SEED`), with the same dev-split recipe search and the
    same steps, so at equal fine-tuning compute."""
    ft_dir, sc_dir = out / f"finetune-seed{seed}", out / f"scratch-seed{seed}"
    command = ["finetune", str(source), "--data", data, "--steps", str(steps), "--batch-size", str(batch), "--seed",
               str(seed), "--quiet"]
    # a finished run (its summary written) is reused: a measurement stopped part way resumes
    ft_wall = 0.0 if finished(ft_dir) else vitlab(*command, "--out", str(ft_dir))
    sc_wall = 0.0 if finished(sc_dir) else vitlab(*command, "--random-init", str(seed), "--out", str(sc_dir))
    ft, sc = summary(ft_dir), summary(sc_dir)
    sweeps = [json.loads((d / "sweep.json").read_text()) if (d / "sweep.json").exists() else {} for d in (ft_dir, sc_dir)]
    cost, sc_cost = (r.get("compute_with_sweep", r["compute"]) for r in (ft, sc))
    spent = sc_cost["train_flops"] / cost["train_flops"]
    # The same steps and sweep; the final run's probe head is fitted only when the AdamW recipe
    # wins, so an arm whose search chose the paper's recipe spends its forward passes less.
    assert 0.9 < spent < 1.01, spent
    return {
        "target": name, "seed": seed, "finetune_top1": ft["splits"]["test"]["top1"], "finetune_steps": ft["steps"],
        "steps_with_sweep": ft.get("steps_with_sweep", ft["steps"]), "recipe": sweeps[0].get("best_recipe"),
        "lr": sweeps[0].get("best_lr"), "dev_margin": sweeps[0].get("margin"), "dev_noise": sweeps[0].get("noise"),
        "finetune_wall_s": round(ft_wall), "scratch_top1": sc["splits"]["test"]["top1"], "scratch_steps": sc["steps"],
        "scratch_recipe": sweeps[1].get("best_recipe"), "scratch_lr": sweeps[1].get("best_lr"),
        "scratch_wall_s": round(sc_wall), "images_seen": cost["images_seen"],
        "probe_forward_images": cost.get("forward_images", 0), "finetune_gflops": round(cost["train_flops"] / 1e9, 1),
        "scratch_gflops": round(sc_cost["train_flops"] / 1e9, 1), "test_images": sc["splits"]["test"]["count"],
    }


def measure(source: Path, out: Path, names: list[str], seeds: list[int], steps: int, batch: int, jobs: int) -> None:
    results = json.loads(RESULTS.read_text())
    results["protocol"] = {"steps": steps, "batch": batch, "seeds": seeds, "jobs": jobs,
                           "source_sha256": weights_digest(source)}
    for n in names:  # a new protocol's seeds replace the old ones whole: no table mixes two protocols
        results["targets"].setdefault(n, {})["seeds"] = {}
    todo = [(n, s) for n in names for s in seeds]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(one_seed, source, n, data_spec(n, out), out / n, s, steps, batch) for n, s in todo]
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            runs = results["targets"].setdefault(r["target"], {}).setdefault("seeds", {})
            runs[str(r["seed"])] = r
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
            print(json.dumps(r), flush=True)
    write_tables(results)


# Statistics: paired by seed ----------------------------------------------------------------
def t_quantile(df: int) -> float:
    """t(0.975, df)."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def paired(runs: dict) -> dict:
    """Fine-tune minus scratch over seeds: mean, 95% t interval, and each arm's mean."""
    diffs = [r["finetune_top1"] - r["scratch_top1"] for r in runs.values()]
    n = len(diffs)
    mean = sum(diffs) / n
    half = t_quantile(n - 1) * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half,
            "finetune": sum(r["finetune_top1"] for r in runs.values()) / n,
            "scratch": sum(r["scratch_top1"] for r in runs.values()) / n}


def verdict(p: dict) -> str:
    if p["lo"] > 0:
        return "fine-tune better"
    if p["hi"] < 0:
        return "scratch better"
    return "within the noise"


# Tables --------------------------------------------------------------------------------------
def picked(runs: dict, key: str) -> str:
    """How often the dev-split search chose each recipe: "adamw 4/4"."""
    picks = sorted({str(r.get(key)) for r in runs.values()})
    return ", ".join(f"{k} {sum(str(r.get(key)) == k for r in runs.values())}/{len(runs)}" for k in picks)


def seeds_table(results: dict) -> str:
    rows = ["| target | train images | default fine-tune (recipe chosen per seed) | the same command from untrained "
            "weights (`--random-init`), equal fine-tuning compute | fine-tune − scratch, paired by seed (95% t interval) "
            "| verdict |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name in TARGETS:
        t = results["targets"].get(name, {})
        runs = t.get("seeds")
        if not runs:
            continue
        p = paired(runs)
        chosen = picked(runs, "recipe")
        each = lambda k, runs=runs: " / ".join(f"{100 * runs[s][k]:.1f}" for s in sorted(runs, key=int))  # noqa: E731
        steps = runs[min(runs, key=int)]
        rows.append(
            f"| {name} | {t['train_images']:,} | {100 * p['finetune']:.1f}% ({each('finetune_top1')}; {chosen}; "
            f"{steps['finetune_steps']} + {steps['steps_with_sweep'] - steps['finetune_steps']} sweep steps"
            + (f" + {steps['probe_forward_images']:,} probe forwards" if steps.get("probe_forward_images") else "")
            + ") "
            f"| {100 * p['scratch']:.1f}% ({each('scratch_top1')}; {picked(runs, 'scratch_recipe')}; "
            f"{steps['scratch_steps']} steps) "
            f"| {100 * p['mean']:+.1f} [{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}] points ({p['n']} seeds) "
            f"| {verdict(p)} |")
    if len(rows) == 2:
        return "Not measured yet: `python benchmarks/transfer.py` writes this table."
    return "\n".join(rows)


def single_seed_table(results: dict) -> str:
    rows = ["| target | train images | fine-tuned, the paper's recipe | from scratch, equal fine-tuning compute "
            "| fine-tuned with the from-scratch recipe | linear probe (CIFAR-10 features / random) "
            "| 1 / 5 / 10 / 25-shot (CIFAR-10 features) | 1 / 5 / 10 / 25-shot (random) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in TARGETS:
        t = results["targets"].get(name, {})
        r = t.get("single_seed")
        if not r:
            continue
        few = lambda k, r=r: " / ".join(f"{100 * v:.1f}" for v in r[k].values())  # noqa: E731
        best = max(r[k] for k in ("finetune_top1", "scratch_top1", "control_top1"))  # in bold
        pct = lambda k, r=r, best=best: (f"**{100 * r[k]:.1f}%**" if r[k] == best else f"{100 * r[k]:.1f}%")  # noqa: E731
        rows.append(
            f"| {name} | {t['train_images']:,} | {pct('finetune_top1')} ({r['finetune_steps']} steps"
            + (f", lr {r['finetune_lr']:g}" if r["finetune_lr"] else "") + f") | {pct('scratch_top1')} "
            f"({r['scratch_steps']} steps) | {pct('control_top1')} ({r['control_steps']} steps) | "
            f"{100 * r['source_probe']:.1f}% / {100 * r['random_probe']:.1f}% | {few('source_fewshot')} | "
            f"{few('random_fewshot')} |")
    return "\n".join(rows)


TABLES = {"transfer-seeds": seeds_table, "transfer-table": single_seed_table}


def render(page: str, results: dict) -> str:
    """The page with each table between its markers regenerated from the results."""
    for marker, make in TABLES.items():
        start, end = page.index(f"<!-- {marker} -->"), page.index(f"<!-- /{marker} -->")
        page = page[:start] + f"<!-- {marker} -->\n" + make(results) + "\n" + page[end:]
    return page


def write_tables(results: dict) -> None:
    md = ROOT / "benchmarks" / "results" / "transfer.md"
    md.write_text("# Transfer from a vitlab CIFAR-10 model\n\n`python benchmarks/transfer.py` (from the shipped "
                  "source in benchmarks/results/transfer-source/; tables only: `--tables`)\n\n" + "\n\n".join(make(results) for make in TABLES.values()) + "\n")
    PAGE.write_text(render(PAGE.read_text(), results))
    print("\n\n".join(make(results) for make in TABLES.values()))


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or platform.machine()


def build_source(ship: bool) -> None:
    """Train the source into runs/cifar10-src (skipped when it is there) and compare its weights
    with the shipped source's; with `ship`, make this build the shipped source."""
    import shutil

    built = BUILT / "checkpoints" / "last.safetensors"
    if not built.exists():
        print("vitlab " + " ".join(SOURCE_COMMAND), flush=True)
        vitlab(*SOURCE_COMMAND)
    results = json.loads(RESULTS.read_text())
    digest, shipped = weights_digest(built), results["source"].get("weights_sha256")
    if ship:
        (SHIPPED / "checkpoints").mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "summary.json", "checkpoints/last.safetensors"):
            shutil.copyfile(BUILT / name, SHIPPED / name)
        summary = json.loads((BUILT / "summary.json").read_text())
        results["source"].update(weights_sha256=digest, built_on=cpu_name(), steps=summary["steps"],
                                 cifar10_test_top1=round(summary["splits"]["test"]["top1"], 4))
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(f"shipped {built} as {SOURCE} (weights sha256 {digest}); rerun the measurement: "
              "python benchmarks/transfer.py")
    elif digest == shipped:
        print(f"{built}: the shipped source, bit for bit (weights sha256 {digest})")
    else:
        print(f"{built}: weights sha256 {digest}, not the shipped source's {shipped} (built on "
              f"{results['source'].get('built_on', 'another machine')}; this is {cpu_name()}): training is "
              f"bit-exact on one kind of CPU, not across them. The page's numbers are from {SOURCE}; "
              "--ship makes this build the source (then rerun the measurement)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=SOURCE,
                   help="the vitlab CIFAR-10 checkpoint to transfer from (default: the shipped source)")
    p.add_argument("--build-source", action="store_true", help=f"train the source into {BUILT} and "
                   "compare it with the shipped one")
    p.add_argument("--ship", action="store_true", help="with --build-source: make the build the shipped source")
    p.add_argument("--tables", action="store_true", help="only regenerate the tables from the results")
    p.add_argument("--out", type=Path, default=Path("runs/transfer"), help="where the runs go")
    p.add_argument("--steps", type=int, default=300, help="fine-tuning steps (the quick sweep adds its own)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seeds", default="10,11,12,13", help="fresh seeds: 0-4 chose the probe head")
    p.add_argument("--jobs", type=int, default=2, help="seeds run side by side (each on 1 thread + 1 data worker)")
    p.add_argument("--only", help="comma-separated targets (default: all)")
    args = p.parse_args()
    if args.build_source:
        return build_source(args.ship)
    if args.tables:
        return write_tables(json.loads(RESULTS.read_text()))
    names = args.only.split(",") if args.only else list(TARGETS)
    measure(args.source, args.out, names, [int(s) for s in args.seeds.split(",")], args.steps, args.batch_size,
            args.jobs)


if __name__ == "__main__":
    main()
