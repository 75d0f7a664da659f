"""Precision, recall, F1 and calibration (eval/calibration.py) on a real trained model and real
data, against scikit-learn and a direct computation; `vitlab eval` shows them and draws the
reliability diagram."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.data import make_loader, open_dataset
from vitlab.eval.accuracy import add_counts, evaluate
from vitlab.eval.calibration import calibration_counts, calibration_metrics, class_metrics


@pytest.fixture(scope="module")
def digits_eval(digits_run):
    model = vitlab.load(digits_run / "checkpoints" / "last.safetensors")
    ds = open_dataset("digits", "test", vitlab.transform(model))
    batches = [(x, y) for x, y, _ in make_loader(ds, 64, train=False)]
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    return model, batches, logits, labels


def test_precision_recall_f1_are_sklearns(digits_eval):
    from sklearn.metrics import precision_recall_fscore_support

    model, batches, logits, labels = digits_eval
    m = evaluate(model, batches)
    pred = logits.argmax(1).numpy()
    p, r, f, _ = precision_recall_fscore_support(labels.numpy(), pred, labels=range(10), zero_division=0)
    assert np.allclose(m["per_class_precision"], p) and np.allclose(m["per_class_recall"], r)
    assert np.allclose(m["per_class_f1"], f)
    macro = precision_recall_fscore_support(labels.numpy(), pred, average="macro", zero_division=0)
    assert np.allclose([m["precision"], m["recall"], m["f1"]], macro[:3])
    assert m["per_class_recall"] == pytest.approx(m["per_class"])  # recall is the per-class accuracy


def test_ece_is_the_binned_gap_and_adds_up_across_batches(digits_eval):
    model, batches, logits, labels = digits_eval
    probs = logits.softmax(1)
    conf, pred = probs.max(1)
    right = (pred == labels).double()
    ece = 0.0
    for b in range(15):
        inside = (conf > b / 15) & (conf <= (b + 1) / 15)
        if inside.any():
            ece += inside.double().mean() * (right[inside].mean() - conf[inside].double().mean()).abs()
    sums = None
    for lo in range(0, len(labels), 50):
        sums = add_counts(sums, calibration_counts(logits[lo : lo + 50], labels[lo : lo + 50]))
    cal = calibration_metrics(sums)
    assert cal["ece"] == pytest.approx(float(ece), abs=1e-9) and cal["ece"] > 0
    assert sum(cal["reliability"]["count"]) == len(labels)
    assert evaluate(model, batches)["ece"] == pytest.approx(cal["ece"], abs=1e-6)


def test_a_class_never_predicted_and_a_class_without_images():
    # 3 classes; class 2 has no images; class 1 is never predicted.
    confusion = [[3, 0, 1], [2, 0, 0], [0, 0, 0]]
    m = class_metrics(confusion)
    assert m["per_class_precision"] == [0.6, 0.0, 0.0] and m["per_class_recall"] == [0.75, 0.0, None]
    assert m["recall"] == pytest.approx(0.375)  # over the classes that have images


def test_vitlab_eval_prints_them_and_draws_the_reliability_diagram(digits_run, tmp_path, capsys):
    ckpt = str(digits_run / "checkpoints" / "last.safetensors")
    assert main(["eval", ckpt, "--data", "digits", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "macro precision" in out and "ECE" in out and "precision      F1" in out
    assert (tmp_path / "reliability-test.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "eval-test.json").read_text())
    assert set(saved["per_class_f1"]) == set(saved["class_names"]) and 0 <= saved["ece"] <= 1
    assert len(saved["reliability"]["count"]) == 15
