"""Masked patch prediction through the trainer: `vitlab train --objective mpp`, exact resume,
and fine-tuning / few-shot from the resulting checkpoint (§4.6)."""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab import checkpoints
from vitlab.analysis.mpp import head_from_extras
from vitlab.config import ConfigError, load_recipe
from vitlab.train import state
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer


def mpp_recipe(**overrides):
    # The shipped digits recipe (a 4-block ViT on 8x8 greyscale digits: 8 colour classes).
    o = {"train.objective": "mpp", "train.steps": 4, "train.ckpt_every": 2, "train.batch_size": 32, "train.log_every": 1}
    o.update(overrides)
    return load_recipe("digits").with_overrides(o)


@pytest.mark.slow
def test_resume_with_mpp_is_bit_exact(tmp_path):
    cfg = mpp_recipe(**{"objective.mask_rate": 0.4})
    a, b = tmp_path / "a", tmp_path / "b"
    Trainer(cfg, a, Inputs(), quiet=True).run()
    # An interrupted copy: the step-4 checkpoint and the summary never got written.
    shutil.copytree(a, b)
    for p in state.step_paths(b / "checkpoints", 4):
        p.unlink()
    (b / "summary.json").unlink()
    (b / "checkpoints" / "last.safetensors").unlink()
    step2 = state.step_paths(b / "checkpoints", 2)[0]
    inode = step2.stat().st_ino
    Trainer(cfg, b, Inputs(), quiet=True).run()
    assert step2.stat().st_ino == inode  # it resumed from step 2 rather than starting over

    full = checkpoints.read_checkpoint(state.step_paths(a / "checkpoints", 4)[0])
    resumed = checkpoints.read_checkpoint(state.step_paths(b / "checkpoints", 4)[0])
    assert full.metadata["objective"] == "mpp" and sorted(full.extras) == ["head.bias", "head.weight", "mask_token"]
    for k in full.state:
        assert torch.equal(full.state[k], resumed.state[k]), k
    for k in full.extras:  # the [mask] embedding and the prediction head too
        assert torch.equal(full.extras[k], resumed.extras[k]), k
    # The options travel in the checkpoint, and the head is not the classifier.
    head = head_from_extras(vitlab.load(state.step_paths(a / "checkpoints", 4)[0]), full.metadata, full.extras)
    assert head.cfg.mask_rate == 0.4 and head.head.out_features == 8 and full.config.num_classes == 0
    # Training moved the [mask] embedding and the head.
    start = torch.zeros_like(full.extras["head.weight"])
    assert not torch.equal(full.extras["head.weight"], start)


@pytest.mark.slow
def test_finetune_and_fewshot_from_an_mpp_checkpoint(tmp_path, capsys):
    from vitlab.cli import main

    Trainer(mpp_recipe(**{"train.steps": 2}), tmp_path / "pre", Inputs(), quiet=True).run()
    ckpt = tmp_path / "pre" / "checkpoints" / "last.safetensors"

    # Fine-tuning: the trainer starts from the checkpoint's backbone with a fresh zero head.
    ft = load_recipe("digits").with_overrides(
        {"model.checkpoint": str(ckpt), "train.steps": 2, "train.batch_size": 32, "train.ckpt_every": 2}
    )
    summary = Trainer(ft, tmp_path / "ft", Inputs(), quiet=True).run()
    assert 0.0 <= summary["splits"]["test"]["top1"] <= 1.0
    tuned = vitlab.load(tmp_path / "ft" / "checkpoints" / "last.safetensors")
    assert tuned.config.num_classes == 10

    # Few-shot on the head-less backbone: the command reads its pre-logits (the class token).
    code = main(["fewshot", str(ckpt), "--data", "digits", "--shots", "2", "--seeds", "1", "--pool", "5", "--no-cache"])
    assert code == 0
    assert "2" in capsys.readouterr().out


def test_unknown_mpp_option_is_refused_by_name():

    # The typed objective section refuses it as soon as the run config is built.
    with pytest.raises(ConfigError, match="objective.mask_ratio.*mask_rate"):
        mpp_recipe(**{"objective.mask_ratio": 0.5})


@pytest.mark.parametrize("recipe", ["mpp-paper", "mpp-cifar10", "mpp-cifar10-finetune"])
def test_shipped_mpp_recipes_read(recipe):
    from vitlab.config import MPPConfig

    cfg = load_recipe(recipe)
    if recipe == "mpp-cifar10-finetune":
        assert cfg.train.objective == "supervised"
        return
    assert cfg.train.objective == "mpp" and cfg.optim.name == "adam"
    assert cfg.objective == MPPConfig()  # the paper's values
    if recipe == "mpp-paper":
        assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.decay) == (2e-4, 10000, "cosine")
