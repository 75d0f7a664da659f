"""docs/transfer.md's tables are generated from benchmarks/results/transfer.json: the page
and the committed results may not differ, and the generator reads the results as written."""

from __future__ import annotations

import importlib.util
import json

from conftest import ROOT

RESULTS = ROOT / "benchmarks" / "results" / "transfer.json"
PAGE = ROOT / "docs" / "transfer.md"


def generator():
    spec = importlib.util.spec_from_file_location("transfer_benchmark", ROOT / "benchmarks" / "transfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_tables_are_the_results():
    transfer, results = generator(), json.loads(RESULTS.read_text())
    page = PAGE.read_text()
    assert transfer.render(page, results) == page, (
        "docs/transfer.md's tables differ from benchmarks/results/transfer.json: "
        "run python benchmarks/transfer.py --tables")
    assert " ".join(transfer.SOURCE_COMMAND) in results["source"]["command"]
    assert results["source"]["command"].removeprefix("vitlab ") in " ".join(page.split())  # the rebuild command


def test_the_shipped_source_is_the_one_measured():
    """The page's numbers come from the shipped checkpoint: its weights are the recorded ones,
    and the seeded measurement used them."""
    transfer, results = generator(), json.loads(RESULTS.read_text())
    assert transfer.SOURCE.is_file(), f"{transfer.SOURCE} is missing: python benchmarks/transfer.py --build-source --ship"
    digest = transfer.weights_digest(transfer.SOURCE)
    assert digest == results["source"]["weights_sha256"], "the shipped source is not the recorded one"
    assert digest == results["protocol"]["source_sha256"], "the seeded table was measured from another source"
    assert (transfer.SHIPPED / "config.yaml").is_file() and (transfer.SHIPPED / "summary.json").is_file()


def test_a_changed_result_changes_the_page():
    transfer, results = generator(), json.loads(RESULTS.read_text())
    page = PAGE.read_text()
    digits = results["targets"]["digits"]["single_seed"]
    digits["scratch_top1"] -= 0.01
    assert transfer.render(page, results) != page
    runs = {"0": {"finetune_top1": 0.9, "scratch_top1": 0.8}, "1": {"finetune_top1": 0.8, "scratch_top1": 0.8},
            "2": {"finetune_top1": 0.85, "scratch_top1": 0.8}}
    p = transfer.paired(runs)
    assert abs(p["mean"] - 0.05) < 1e-12 and p["lo"] < 0 < p["hi"] and transfer.verdict(p) == "within the noise"
    assert transfer.verdict({**p, "lo": 0.01}) == "fine-tune better"
