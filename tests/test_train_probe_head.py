"""A fine-tune's head started as a linear probe of the frozen features (model.head_start=probe,
train/probe_head.py), on the real digits: the head is the probe, the compute counts it, resume
is exact, and the recipe choice uses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vitlab.config import ConfigError, load_recipe
from vitlab.data import open_dataset
from vitlab.data.transforms import model_transform
from vitlab.eval.features import extract_features
from vitlab.eval.linear_probe import fit_logistic, logistic_probe
from vitlab.train import finetune, finetune_choice as choice, probe_head
from vitlab.train.build import architecture, build_model
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer
from vitlab.train.recipe import Given


def test_the_folded_head_gives_the_logistic_regressions_logits():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    feats = rng.normal(size=(300, 12)) * rng.uniform(0.1, 20, 12) + rng.normal(size=12) * 5
    feats[:, :4] += 3 * np.eye(4)[labels]  # something to find
    weight, bias = probe_head.head_from_probe(feats, labels, 4)
    x = torch.as_tensor(feats, dtype=torch.float64)
    mean, std = x.mean(0), x.std(0, unbiased=False) + 1e-6
    w, b = fit_logistic(((x - mean) / std).numpy(), labels, 4)
    torch.testing.assert_close(x @ weight.T + bias, ((x - mean) / std) @ w + b, rtol=1e-9, atol=1e-9)
    assert weight.shape == (4, 12) and bias.shape == (4,)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A small ViT trained 60 steps on the digits: features that separate them somewhat."""
    out = tmp_path_factory.mktemp("source") / "run"
    cfg = load_recipe("digits").with_overrides({"train.steps": 60, "train.threads": 1, "data.num_workers": 0,
                                                "train.eval_every": 0, "data.eval_splits": []})
    Trainer(cfg, out, Inputs(), quiet=True).run()
    return out / "checkpoints" / "last.safetensors"


def probe_config(ck: Path, **extra):
    return load_recipe("finetune").with_overrides({
        "model.checkpoint": str(ck), "model.head_start": "probe", "data.name": "digits", "data.eval_splits": ["test"],
        "train.steps": 6, "train.batch_size": 64, "train.ckpt_every": 3, "train.threads": 1, "data.num_workers": 0,
        "optim.name": "adamw", "optim.lr": 0.0003, "optim.warmup_steps": 2, **extra})


def test_the_head_starts_as_the_linear_probe_and_counts_as_compute(source, tmp_path):
    out = tmp_path / "ft"
    cfg = probe_config(source, **{"train.steps": 1, "optim.lr": 1e-12})
    summary = Trainer(cfg, out, Inputs(), quiet=True).run()
    probe = summary["head_probe"]
    assert probe["images"] == 1437 and probe["C"] == probe_head.C
    # The same probe, fitted by the linear-probe evaluation on the features of the fine-tune's
    # network (the source, zero head, at the fine-tune's evaluation preprocessing).
    arch = architecture(cfg.model, Inputs())
    model = build_model(cfg.model, [str(i) for i in range(10)], Inputs(), "fp32")
    train = open_dataset("digits", "train", model_transform(arch))
    test = open_dataset("digits", "test", model_transform(arch))
    xtr, ytr = extract_features(model, train)
    xte, yte = extract_features(model, test)
    reference = logistic_probe(xtr, ytr, xte, yte)
    assert probe["train_top1"] == pytest.approx(reference["train_accuracy"], abs=1 / 1437)
    # After one step at a negligible rate the model is the probe: its test top-1 is the probe's.
    assert summary["splits"]["test"]["top1"] == pytest.approx(reference["test_accuracy"], abs=2 / 360)
    assert reference["test_accuracy"] > 0.5  # a probe of trained features, far above chance
    # Where the fine-tune starts is measured before its first step: the probe head's test score.
    assert probe["start"]["test"] == pytest.approx(reference["test_accuracy"], abs=2 / 360)
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert (first["step"], first["split"], first["top1"]) == (0, "test", probe["start"]["test"])
    c = summary["compute"]
    assert c["forward_images"] == 1437 and c["images_seen"] == 64
    assert c["train_flops"] == pytest.approx(c["forward_gflops"] * 1e9 * (3 * 64 + 1437))


def test_a_fine_tune_that_ends_below_its_probe_start_says_so(source, tmp_path, capfd):
    """A rate far too high for the weights (AdamW at 0.05) undoes what the probe head gave;
    the run warns on stderr, naming both scores and the fix. A gentle rate ends above and says
    nothing. (The two runs share one fit of the head.)"""
    shared = Inputs()
    hot = Trainer(probe_config(source, **{"optim.lr": 0.05}), tmp_path / "hot", quiet=True, inputs=shared).run()
    start, end = hot["head_probe"]["start"]["test"], hot["splits"]["test"]["top1"]
    assert end < start - 0.01  # the premise: this rate ruins the features
    (said,) = [line for line in capfd.readouterr().err.splitlines() if "below its start" in line]
    assert f"{end:.1%}" in said and f"{start:.1%}" in said and "lower --lr" in said
    smoothed = probe_head.below_start(hot["head_probe"], hot["splits"], 6,
                                      probe_config(source, **{"train.label_smoothing": 0.1}))
    assert "smoothed labels" in smoothed[0] and "train.label_smoothing=0" in smoothed[0]  # the recipe's mismatches first
    calm = Trainer(probe_config(source, **{"optim.lr": 1e-5}), tmp_path / "calm", quiet=True, inputs=shared).run()
    assert calm["splits"]["test"]["top1"] >= calm["head_probe"]["start"]["test"] - 0.01
    assert "below its start" not in capfd.readouterr().err


def test_a_probe_head_run_resumes_exactly(source, tmp_path, monkeypatch):
    straight = Trainer(probe_config(source), tmp_path / "straight", Inputs(), quiet=True).run()
    real_save = __import__("safetensors.torch", fromlist=["save_file"]).save_file

    def dying_save(tensors, filename, metadata=None):
        if metadata and metadata.get("format") == "vitlab" and json.loads(metadata.get("step", "0")) == 6:
            raise OSError("disk died")
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr("safetensors.torch.save_file", dying_save)
    with pytest.raises(OSError, match="disk died"):
        Trainer(probe_config(source), tmp_path / "crashed", Inputs(), quiet=True).run()
    monkeypatch.setattr("safetensors.torch.save_file", real_save)
    resumed = Trainer(probe_config(source), tmp_path / "crashed", Inputs(), quiet=True).run()  # from step 3
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "last.safetensors"))
    b = load_file(str(tmp_path / "crashed" / "checkpoints" / "last.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fit = lambda s: {k: v for k, v in s["head_probe"].items() if k != "seconds"}  # noqa: E731
    assert fit(resumed) == fit(straight)  # read back from the step-3 checkpoint, not fitted again
    assert resumed["compute"]["forward_images"] == straight["compute"]["forward_images"] == 1437


def test_a_head_fitted_once_gives_the_runs_that_share_it_the_same_weights(source, tmp_path):
    """Runs of one plan share the probe head (train/inputs.py): a run that reuses it ends with
    the same weights as one that fits it (the fit draws nothing from the random streams), and
    counts none of its forward passes."""

    shared = Inputs()
    first = Trainer(probe_config(source), tmp_path / "first", shared, quiet=True).run()
    again = Trainer(probe_config(source), tmp_path / "again", shared, quiet=True).run()
    alone = Trainer(probe_config(source), tmp_path / "alone", Inputs(), quiet=True).run()  # its own fit
    a, b, c = (load_file(str(tmp_path / name / "checkpoints" / "last.safetensors")) for name in ("first", "again", "alone"))
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    assert again["head_probe"]["shared_with_earlier_run"] and "shared_with_earlier_run" not in first["head_probe"]
    assert first["compute"]["forward_images"] == alone["compute"]["forward_images"] == 1437
    assert "forward_images" not in again["compute"] and len(shared.heads) == 1 and len(shared.checkpoints) == 1


def test_the_probe_needs_a_checkpoint_and_a_known_name():
    with pytest.raises(ConfigError, match="needs model.checkpoint"):
        load_recipe("digits").with_overrides({"model.head_start": "probe"})
    with pytest.raises(ConfigError, match="'linear': use one of zeros, probe"):
        load_recipe("digits").with_overrides({"model.head_start": "linear"})
    # The default is not written, so that the configs of earlier runs read back the same.
    assert "head_start" not in load_recipe("digits").to_dict()["model"]


def test_adamw_starts_from_the_probe_and_the_paper_from_zero_unless_told(source):
    cfg = load_recipe("finetune").with_overrides({"train.steps": 200, "model.checkpoint": str(source)})
    assert choice.apply(cfg, choice.ADAMW, explicit=set()).model.head_start == "probe"
    assert choice.apply(cfg, choice.PAPER, explicit=set()).model.head_start == "zeros"
    told = cfg.with_overrides({"model.head_start": "zeros"})
    assert choice.apply(told, choice.ADAMW, explicit={"model.head_start"}).model.head_start == "zeros"
    def plan(overrides=(), **settings):
        return finetune.plan(finetune.Settings(str(source), "digits", Given.of({}, overrides), **settings), Inputs())

    adamw = plan(["optim.lr=0.001"], choose="adamw")
    assert adamw.config.model.head_start == "probe" and "linear probe" in " ".join(adamw.notes)
    assert plan(choose="paper").config.model.head_start == "zeros"
    kept = plan(["optim.lr=0.001", "model.head_start=zeros"], choose="adamw")
    assert kept.config.model.head_start == "zeros"


def test_the_adamw_recipe_keeps_the_probe_start_where_crops_and_flips_undo_it(source, tmp_path, capfd):
    """The AdamW recipe trains for what its probe head was fitted for (the whole image,
    unflipped, plain labels): 40 steps on the real digits at either of its rates end at or above
    the probe start (not within a tolerance below it), with no warning. The same steps on random
    crops from 35% and mirror images (the recipe before) end far below it, and the warning names
    the augmentation first."""
    shared = Inputs()

    def tuned(lr: float, name: str, **extra):
        cfg = load_recipe("finetune").with_overrides({
            "model.checkpoint": str(source), "data.name": "digits", "data.eval_splits": ["test"], "train.steps": 40,
            "train.batch_size": 64, "train.ckpt_every": 1000, "train.threads": 1, "data.num_workers": 0})
        cfg = choice.apply(cfg, choice.ADAMW, explicit=set()).with_overrides({"optim.lr": lr, **extra})
        s = Trainer(cfg, tmp_path / name, quiet=True, inputs=shared).run()
        return s["head_probe"]["start"]["test"], s["splits"]["test"]["top1"]

    for lr in choice.ADAMW.grid or ():
        start, end = tuned(lr, f"whole-{lr}")
        assert start > 0.5 and end >= start, (lr, start, end)
        assert "below its start" not in capfd.readouterr().err
        start, end = tuned(lr, f"crops-{lr}", **{"data.crop": "inception", "data.crop_scale": (0.35, 1.0),
                                                 "data.hflip": True})
        assert end < start - 0.05, (lr, start, end)  # the premise: the old augmentation undoes the start
        (said,) = [line for line in capfd.readouterr().err.splitlines() if "below its start" in line]
        assert "random crops" in said and "mirror images" in said and "data.crop=whole" in said
