"""vitlab.eval.accuracy: the counts behind top-1/top-5, per-class accuracy and the confusion matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitlab.analysis.plots import plot_confusion
from vitlab.eval.accuracy import add_counts, batch_counts, evaluate, metrics_from_counts, report


def test_counts_add_up_across_batches_to_the_whole():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 7, generator=g)
    labels = torch.randint(0, 7, (50,), generator=g)
    whole = metrics_from_counts(batch_counts(logits, labels, 7))
    parts = None
    for lo, hi in ((0, 13), (13, 31), (31, 50)):
        parts = add_counts(parts, batch_counts(logits[lo:hi], labels[lo:hi], 7))
    split = metrics_from_counts(parts)
    assert split["top1"] == whole["top1"] and split["confusion"] == whole["confusion"]
    # Against a direct computation.
    assert whole["top1"] == (logits.argmax(1) == labels).double().mean().item()
    top5 = logits.topk(5, 1).indices
    assert whole["top5"] == (top5 == labels[:, None]).any(1).double().mean().item()
    assert abs(whole["loss"] - F.cross_entropy(logits, labels).item()) < 1e-6
    conf = torch.tensor(whole["confusion"])
    assert conf.sum() == 50 and conf[labels[0], logits[0].argmax()] >= 1
    for c in range(7):
        n = int((labels == c).sum())
        expected = None if n == 0 else float(((logits.argmax(1) == labels) & (labels == c)).sum()) / n
        assert whole["per_class"][c] == expected


def test_evaluate_a_model_and_draw(tmp_path):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.copy_(torch.eye(3, 4) * 10)
        model[1].bias.zero_()
    x = torch.eye(4)[:3].reshape(3, 1, 2, 2).repeat(4, 1, 1, 1)  # one-hot images of classes 0, 1, 2
    y = torch.tensor([0, 1, 2] * 4)
    y[0] = 1  # one wrong label
    m = evaluate(model, [(x[:6], y[:6]), (x[6:], y[6:])], 3)
    assert m["top1"] == 11 / 12 and m["top5"] == 1.0 and m["count"] == 12
    assert m["per_class"] == [1.0, 4 / 5, 1.0] and m["confusion"][1][0] == 1
    assert plot_confusion(m["confusion"], ["a", "b", "c"], tmp_path / "c.png") and (tmp_path / "c.png").stat().st_size > 0
    text = report(m, ["a", "b", "c"])
    assert "top-1 91.67%" in text and "b" in text
