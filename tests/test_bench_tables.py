"""vitlab.bench.tables: the CSV and Markdown files of a run."""

from __future__ import annotations

import csv

from vitlab.api import get_config
from vitlab.bench.machine import machine_info
from vitlab.bench.runner import BenchConfig, Row, Sample
from vitlab.bench.systems import Setting, System
from vitlab.bench.tables import COLUMNS, markdown, row_dict, write_results

INFO = {"date": "2026-12-01 10:00", "cpu": "Test CPU", "cores": "2", "threads": "2", "isa": "avx512f",
        "device": "cpu", "python": "3.11", "torch": "2.14.1", "timm": "1", "transformers": "4",
        "torchvision": "0.29"}


def rows() -> list[Row]:
    s = Setting(get_config("ViT-B/16"), 8)
    ours = Row(s, System("vitlab", "bf16"), [Sample(0, 40.0, 0.0, False), Sample(1, 44.0, 0.0, False),
                                            Sample(2, 10.0, 1.5, True)])
    ours.ceiling, ours.vs_peer, ours.vs_timm, ours.work_mib = 2e12, 4.4, 4.5, 123.4
    gemm = Row(s, System("gemm", "bf16", kernel="oneDNN"), [Sample(0, 1.0e12, 0.0, False)])
    broken = Row(s, System("hf", "fp32"), error="ValueError: no")
    return [ours, gemm, broken]


def test_row_figures():
    d = row_dict(rows()[0])
    assert d["images_per_s"] == "42" and d["min"] == "40" and d["max"] == "44"  # contended sample left out
    assert (d["clean_samples"], d["samples"]) == ("2", "3")
    # 35.1 GFLOPs (2 x 17.56 GMACs) per ViT-B/16 image x 42 img/s / 2 TFLOP/s
    assert d["pct_of_ceiling"] == "74" and d["ceiling_gflops"] == "2000"
    assert d["x_best_fp32_peer"] == "4.40" and d["work_mib"] == "123" and d["compile_s"] == ""
    assert row_dict(rows()[1])["images_per_s"] == "1000"  # a ceiling in GFLOP/s


def test_files_are_written_with_every_column(tmp_path):
    bench = BenchConfig(rounds=3)
    csv_path, md_path = write_results(rows(), tmp_path / "new", "t", INFO, bench)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert [r["impl"] for r in table] == ["vitlab", "gemm", "hf"] and list(table[0]) == COLUMNS
    text = md_path.read_text()
    assert text.startswith("# Benchmark: t\n\nMeasured 2026-12-01 10:00 on Test CPU (2 cores")
    assert "1 of 4 samples contended (25%)" in text
    assert "| ViT-B/16 224px b8 infer | vitlab bf16 | 42 | 40–44 | 2/3 | 74 | 4.40 | 4.50 | 123 |  |" in text
    assert "| ViT-B/16 224px b8 infer | matmul ceiling bf16 (oneDNN) | 1000 GFLOP/s | 1000–1000 | 1/1 |  |  |  |  |  |\n" in text
    assert "| ViT-B/16 224px b8 infer | hf fp32 | — | skipped: ValueError: no |  |  |  |  |  |  |\n" in text
    assert "MFU" not in text  # no device peak on a CPU
    cpu = markdown(rows(), None, BenchConfig(clock="cpu"))
    assert "Single-thread CPU-time clock" in cpu and "taken while others were busy" in cpu


def test_the_kernels_the_inference_copies_chose_follow_the_table():
    """vitlab bench puts deploy.kernels' choices (and their timings) in `info`; the table ends with them."""
    kernels = ("Dense float32 768x2304, 197 tokens: oneDNN (measured; ms per image: oneDNN 6.6, F.linear 7.9)\n"
               "attention float32 12 heads x 64, 197 tokens: fused (cached; ms per image: fused 2.1, explicit 2.3)")
    text = markdown(rows(), {**INFO, "kernels": kernels}, BenchConfig())
    assert text.endswith("Kernels of vitlab's inference copies on this machine (`vitlab.deploy.kernels`):\n\n"
                         f"- {kernels.splitlines()[0]}\n- {kernels.splitlines()[1]}\n")
    assert "Kernels of" not in markdown(rows(), INFO, BenchConfig())


def test_an_mfu_column_where_the_peak_is_known():
    ours, gemm, broken = rows()
    ours.peak = 1e13  # 35.15 GFLOPs x 42 img/s / 10 TFLOP/s = 14.8%
    assert row_dict(ours)["mfu_pct"] == "14.8"
    text = markdown([ours, gemm, broken])
    assert "| % of ceiling | MFU % | × best fp32 peer |" in text and "| 74 | 14.8 | 4.40 |" in text
    assert all(line.count("|") == 12 for line in text.splitlines()[2:])


def test_any_table_gets_the_same_header(tmp_path):
    """benchmarks/report_tables.py: the repository's pages, through the same writer."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("report_tables", ROOT / "benchmarks" / "report_tables.py")
    report_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_tables)
    csv_path, md_path = report_tables.write_table(tmp_path, "x", "A title", machine_info(), [{"a": 1, "b": "two"},
                                                  {"a": 3}], ["a", "b"], notes="Some notes.\n")
    assert csv_path.read_text() == "a,b\n1,two\n3,\n"
    text = md_path.read_text()
    assert text.startswith("# A title\n\nMeasured ") and "Some notes.\n\n| a | b |\n| --- | --- |\n| 1 | two |\n| 3 |  |\n" in text
