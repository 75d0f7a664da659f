"""How cost grows (docs/performance.md, "Scaling"): ViT-B/16 with resolution and batch size,
and the training step's memory with and without activation checkpointing.

The figures come from `vitlab bench --suite scaling` (interleaved, wall clock, ceilings in the
same rounds) and attention's share of the time from the CPU-time profiles (profiles.py).
"""

from __future__ import annotations

from pathlib import Path

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench import runner, suites
from vitlab.files import atomic_write_text

SUMMARY = ["setting", "tokens", "system", "images_per_s", "pct_of_ceiling", "x_timm_fp32", "attention_share",
           "work_mib_per_image"]


def find(rows, impl: str, precision: str, pred, checkpointing: bool = False):
    for r in rows:
        s = r.system
        if (s.impl, s.precision, s.checkpointing) == (impl, precision, checkpointing) and pred(r.setting) and r.samples:
            return r
    return None


def summary(rows, shares: dict[int, dict[str, float]]) -> list[dict]:
    """One record per (setting, system) of the scaling suite, with attention's share."""
    records = []
    for r in rows:
        if r.system.impl == "gemm" or not r.samples:
            continue
        cfg, d = r.setting.config, tables.row_dict(r)
        share = shares.get(cfg.image_size[0], {}).get(r.system.precision) if r.setting.batch == 1 else None
        records.append({
            "setting": r.setting.label, "tokens": cfg.num_tokens, "system": r.system.label,
            "images_per_s": d["images_per_s"], "pct_of_ceiling": d["pct_of_ceiling"], "x_timm_fp32": d["x_timm_fp32"],
            "attention_share": f"{share:.0%}" if share is not None and r.system.impl == "vitlab" else "",
            "work_mib_per_image": tables.fmt(r.work_mib / r.setting.batch, ".1f"),
        })
    return records


def plot(rows, shares, path: Path) -> None:
    # matplotlib only here: the benchmarks draw one figure and vitlab itself does not need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.8))
    sizes = sorted(shares)
    for impl, precision, style in (("vitlab", "bf16", "o-"), ("vitlab", "fp32", "s-"), ("timm", "bf16", "o--"), ("timm", "fp32", "s--")):
        pts = [(s, find(rows, impl, precision, lambda st, s=s: st.batch == 1 and st.config.image_size[0] == s)) for s in sizes]
        a.plot([r.setting.config.num_tokens for _, r in pts if r], [r.median for _, r in pts if r], style,
               label=f"{impl} {precision}")
        pts = [(bs, find(rows, impl, precision, lambda st, bs=bs: st.config.image_size[0] == 224 and st.batch == bs
                         and st.task == "infer")) for bs in (1, 2, 4, 8, 16)]
        b.plot([bs for bs, r in pts if r], [r.median for _, r in pts if r], style, label=f"{impl} {precision}")
    ax2 = a.twinx()
    ax2.plot([(s // 16) ** 2 + 1 for s in sizes], [100 * shares[s]["bf16"] for s in sizes], "k:", label="attention share, bf16")
    ax2.set_ylabel("attention's share of time (%)")
    a.set(xlabel="tokens (224, 384, 512 px)", ylabel="images/s, batch 1", title="ViT-B/16 with resolution", yscale="log")
    b.set(xlabel="batch size", ylabel="images/s", title="ViT-B/16 at 224 px with batch", xscale="log")
    for impl in ("vitlab", "timm"):
        for model in ("ViT-S/16", "ViT-C/4"):
            pts = [find(rows, impl, "bf16-autocast", lambda st, model=model: st.config.name == model and st.task == "train", ck) for ck in (False, True)]
            if all(pts):
                c.plot([p.work_mib / p.setting.batch for p in pts], [p.median for p in pts], "o-",
                       label=f"{impl} {model} (right: checkpointed)")
    c.set(xlabel="peak memory added per image (MiB)", ylabel="training images/s", title="Activation checkpointing")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scaling(out: Path, info: dict, shares, figure: Path, log, bench: runner.BenchConfig) -> None:
    rows = runner.run(suites.scaling(), bench, log=log,
                      progress=lambda rows: tables.write_results(rows, out, "scaling", info, bench))
    tables.write_results(rows, out, "scaling", info, bench)
    records = summary(rows, shares)
    table = tables.table(records, SUMMARY)
    atomic_write_text(out / "scaling-summary.md", f"# Scaling\n\n{tables.header(info)}\n\n"
                      f"{tables.noise_line(rows, bench)}\n\n{table}")
    plot(rows, shares, figure)
    log(f"wrote {out / 'scaling.md'}, scaling-summary.md and {figure}")
