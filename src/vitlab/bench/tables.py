"""`vitlab bench`'s results: the CSV and Markdown files of its throughput rows
(`vitlab.bench.runner`), headed by the machine, the versions and the noise, written through
vitlab.tables (the one table writer). The repository's own benchmark pages add their tables
in benchmarks/report_tables.py. Files are written atomically.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Optional, Sequence

from vitlab.bench.runner import BenchConfig, Row
from vitlab.files import atomic_write_text, check_name, child
from vitlab.tables import csv_table, markdown_table

COLUMNS = [
    "model", "gelu", "image_size", "batch", "task", "impl", "precision", "compiled", "checkpointing", "kernel",
    "images_per_s", "min", "max", "clean_samples", "samples", "pct_of_ceiling", "ceiling_gflops", "mfu_pct",
    "x_best_fp32_peer", "x_timm_fp32", "work_mib", "compile_s", "error",
]


def fmt(v: Optional[float], spec: str) -> str:
    """A number formatted, or "" for None and NaN."""
    if v is None or v != v:
        return ""
    return format(v, spec)


def row_dict(row: Row) -> dict[str, str]:
    rates = row.clean()
    scale = 1e-9 if row.system.impl == "gemm" else 1.0  # ceilings in GFLOP/s
    frac = row.fraction
    return {
        "model": row.setting.config.name,
        "gelu": getattr(row.setting.config, "gelu", ""),  # a BiT ResNet has none
        "image_size": str(row.setting.config.image_size[0]),
        "batch": str(row.setting.batch),
        "task": row.setting.task,
        "impl": row.system.impl,
        "precision": row.system.precision,
        "compiled": row.system.compile_mode if row.system.compiled else "",
        "checkpointing": "yes" if row.system.checkpointing else "",
        "kernel": row.system.kernel,
        "images_per_s": fmt(row.median * scale if rates else None, ".4g"),
        "min": fmt(min(rates) * scale if rates else None, ".4g"),
        "max": fmt(max(rates) * scale if rates else None, ".4g"),
        "clean_samples": str(row.n_clean),
        "samples": str(len(row.samples)),
        "pct_of_ceiling": fmt(100 * frac if frac is not None else None, ".0f"),
        "ceiling_gflops": fmt(row.ceiling * 1e-9 if row.ceiling else None, ".0f"),
        "mfu_pct": fmt(100 * row.mfu if row.mfu is not None else None, ".1f"),
        "x_best_fp32_peer": fmt(row.vs_peer, ".2f"),
        "x_timm_fp32": fmt(row.vs_timm, ".2f"),
        "work_mib": fmt(row.work_mib, ".0f"),
        "compile_s": fmt(row.compile_s, ".1f"),
        "error": row.error,
    }


def csv_text(records: Sequence[dict], columns: Sequence[str]) -> str:
    return csv_table(columns, [[r.get(c, "") for c in columns] for r in records])


def write_csv(rows: Sequence[Row], path: str | os.PathLike) -> None:
    atomic_write_text(path, csv_text([row_dict(r) for r in rows], COLUMNS))


def header(info: dict[str, str]) -> str:
    """One line: when, on what machine, with which library versions."""
    device = info.get("device", "cpu")
    on = info["cpu"] if device == "cpu" else f"{device} (host: {info['cpu']})"
    return (f"Measured {info['date']} on {on} ({info['cores']} cores, {info['threads']} threads; "
            f"{info['isa']}); python {info['python']}, torch {info['torch']}, timm {info['timm']}, "
            f"transformers {info['transformers']}, torchvision {info['torchvision']}.")


def contention_summary(rows: Sequence[Row], threshold: float, word: str = "contended") -> str:
    samples = [s for r in rows for s in r.samples]
    if not samples:
        return "no samples"
    bad = sum(s.others > threshold for s in samples)
    mean_others = statistics.fmean(s.others for s in samples)
    return (f"{bad} of {len(samples)} samples {word} ({bad / len(samples):.0%}); "
            f"other processes used {mean_others:.2f} cores on average during samples")


def noise_line(rows: Sequence[Row], bench: BenchConfig) -> str:
    """How the samples were taken and how many were disturbed."""
    if bench.clock == "cpu":
        return (f"{bench.rounds} rounds, samples of at least {bench.min_time:g} s. **Single-thread CPU-time "
                "clock**: one PyTorch thread, each call timed by its own CPU time, so other processes "
                "cannot inflate it; figures are single-core rates, ceilings too. "
                + contention_summary(rows, bench.contended_cores, "taken while others were busy") + ".")
    return (f"{bench.rounds} rounds, samples of at least {bench.min_time:g} s; a sample is contended "
            f"when other processes used more than {bench.contended_cores:g} cores during it. "
            + contention_summary(rows, bench.contended_cores) + ".")


def markdown_cells(row: Row, with_mfu: bool = False) -> list[str]:
    d = row_dict(row)
    mfu = [d["mfu_pct"]] if with_mfu else []
    if row.error:
        return [row.setting.label, row.system.label, "—", f"skipped: {row.error}", *[""] * (6 + with_mfu)]
    if row.system.impl == "gemm":
        return [row.setting.label, row.system.label, f"{d['images_per_s']} GFLOP/s", f"{d['min']}–{d['max']}",
                f"{d['clean_samples']}/{d['samples']}", *[""] * (5 + with_mfu)]
    return [row.setting.label, row.system.label, d["images_per_s"], f"{d['min']}–{d['max']}",
            f"{d['clean_samples']}/{d['samples']}", d["pct_of_ceiling"], *mfu, d["x_best_fp32_peer"], d["x_timm_fp32"],
            d["work_mib"], d["compile_s"]]


def markdown(rows: Sequence[Row], info: Optional[dict[str, str]] = None, bench: Optional[BenchConfig] = None) -> str:
    """The results as a Markdown table, headed by the machine, versions and noise; an MFU
    column where the device's peak is known (GPUs)."""
    lines = ([header(info)] if info else []) + ([noise_line(rows, bench)] if bench else [])
    with_mfu = any(r.mfu is not None for r in rows)
    columns = ["setting", "system", "img/s (median)", "spread", "clean/all", "% of ceiling"]
    columns += ["MFU %"] * with_mfu + ["× best fp32 peer", "× timm fp32", "work MiB", "compile s"]
    table = markdown_table(columns, [markdown_cells(row, with_mfu) for row in rows])
    foot = kernels_foot(info or {})
    return ("\n".join([*lines, ""]) + table if lines else table) + foot


def kernels_foot(info: dict[str, str]) -> str:
    """The kernels vitlab's inference copies chose on this machine and why (the timings), one
    item per Dense shape and attention (`vitlab.deploy.kernels`), or "" when none was built."""
    if not info.get("kernels"):
        return ""
    items = "\n".join(f"- {item}" for item in info["kernels"].splitlines())
    return f"\n\nKernels of vitlab's inference copies on this machine (`vitlab.deploy.kernels`):\n\n{items}\n"


def write_results(rows: Sequence[Row], out_dir: str | os.PathLike, name: str, info: dict[str, str],
                  bench: BenchConfig) -> tuple[Path, Path]:
    """NAME.csv and NAME.md in `out_dir`."""
    out = Path(out_dir)
    check_name(name, "--name")  # one file name: never a path out of out_dir
    csv_path, md_path = child(out, f"{name}.csv", "--name"), child(out, f"{name}.md", "--name")
    write_csv(rows, csv_path)
    atomic_write_text(md_path, f"# Benchmark: {name}\n\n" + markdown(rows, info, bench))
    return csv_path, md_path
