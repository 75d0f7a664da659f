"""`vitlab train` on the command line: extending a run with --resume, refusing what cannot
change on resume, --quiet, the DeiT/AugReg flags, --fp16 and --device checks, the warm-up
warning, and fp16 with its loss scaler resuming exactly."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from test_train_loop import assert_identical, tiny
from vitlab.cli import build_parser, main
from vitlab.cli.common import given
from vitlab.config import load_recipe
from vitlab.train import loop, state
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer
from vitlab.train.recipe import resolve

SMALL = ["--batch-size", "32", "model.depth=1", "model.hidden_size=16", "model.num_heads=2", "model.mlp_dim=32", "model.image_size=8",
         "model.patch_size=4", "train.threads=1", "train.log_every=5", "optim.warmup_steps=2"]


def train(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["train", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_resume_with_steps_extends_a_finished_run(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert train(capsys, "--out", run, "--steps", "10", "--quiet", *SMALL)[0] == 0
    code, out, err = train(capsys, "--resume", run, "--steps", "16", "--ckpt-every", "8", "--quiet")
    assert code == 0, err
    assert "done: 16 steps" in out  # --quiet still prints the final summary
    assert "resuming" not in out and "step 15/16" not in err  # ... and nothing else
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 16 and cfg["train"]["ckpt_every"] == 8
    assert state.complete_steps(tmp_path / "run" / "checkpoints")[-1] == 16
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 16
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [5, 10, 15, 16]
    # Asking for fewer steps than were trained is refused, and so is nothing new: it is complete.
    code, _, err = train(capsys, "--resume", run, "--steps", "12")
    assert code == 2 and "already trained 16 steps" in err
    code, out, _ = train(capsys, "--resume", run, "--steps", "16", "--quiet")
    assert code == 0 and "already complete (16 steps)" in out


def test_resume_refuses_settings_that_would_change_the_run_by_name(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert train(capsys, "--out", run, "--steps", "4", "--quiet", *SMALL)[0] == 0
    before = (tmp_path / "run" / "config.yaml").read_text()
    code, _, err = train(capsys, "--resume", run, "--steps", "8", "--lr", "0.1", "--mixup", "0.2",
                         "optim.weight_decay=0.1", "train.threads=1")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "--lr" in line and "--mixup" in line and "optim.weight_decay=0.1" in line and "threads=1" not in line.split("would")[0]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for flags in (["--config", "cifar10"], ["--model", "ViT-S/16"], ["--out", str(tmp_path / "elsewhere")]):
        code, _, err = train(capsys, "--resume", run, *flags)
        assert code == 2 and flags[0] in err, flags
    assert (tmp_path / "run" / "config.yaml").read_text() == before


def test_the_deit_flags_set_their_config_keys():
    args = build_parser().parse_args(
        ["train", "--mixup", "0.8", "--cutmix", "1.0", "--randaugment", "2", "9", "--label-smoothing", "0.1",
         "--drop-path", "0.1", "--fp16"])
    assert given(args).values == {
        "train.mixup": 0.8, "train.cutmix": 1.0, "data.randaugment": 2, "data.randaugment_magnitude": 9,
        "train.label_smoothing": 0.1, "model.drop_path": 0.1, "train.precision": "fp16",
    }
    cfg = resolve(load_recipe("digits"), given(args))
    assert (cfg.train.mixup, cfg.data.randaugment, cfg.model.changes["drop_path"]) == (0.8, 2, 0.1)
    deit, base = resolve(load_recipe("cifar10-deit")), resolve(load_recipe("cifar10"))
    assert deit.train.mixup > 0 and deit.train.cutmix > 0 and deit.data.randaugment == 2
    assert (deit.optim, deit.train.batch_size) == (base.optim, base.train.batch_size)  # the same compute


def test_fp16_and_cuda_without_a_gpu_are_one_line_errors(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for flags, words in ((["--fp16"], "needs a CUDA GPU"), (["--device", "cuda"], "no CUDA GPU")):
        code, _, err = train(capsys, "--out", str(tmp_path / "r"), "--steps", "2", *flags, *SMALL)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_a_warm_up_longer_than_the_run_is_warned_about(tmp_path, capsys):
    small = [a for a in SMALL if not a.startswith("optim.warmup_steps=")]  # one setting of the key: two are refused
    code, _, err = train(capsys, "--out", str(tmp_path / "r"), "--steps", "3", "--quiet", *small, "optim.warmup_steps=5")
    assert code == 0 and "warmup_steps=5 is not shorter than" in err


def test_fp16_with_its_loss_scaler_resumes_exactly(tmp_path, monkeypatch):
    """The scaler's state (its scale and growth counter) is saved with the training state: a
    run that dies after step 5 and is rerun ends bit-identical to an uninterrupted one, with
    the same scaler state. CPUs refuse fp16 (no fast fp16 there); the test lets the CPU run it."""
    monkeypatch.setattr(loop, "FP16_DEVICES", ("cuda", "cpu"))
    cfg = tiny(train={"precision": "fp16"})
    Trainer(cfg, tmp_path / "straight", Inputs(), quiet=True).run()

    real_save = state.write_state

    def dying(path, tensors, meta):
        if meta["step"] == 10:
            raise OSError("power cut")
        return real_save(path, tensors, meta)

    monkeypatch.setattr(state, "write_state", dying)
    with pytest.raises(OSError, match="power cut"):
        Trainer(cfg, tmp_path / "cut", Inputs(), quiet=True).run()
    monkeypatch.setattr(state, "write_state", real_save)
    assert state.latest(tmp_path / "cut" / "checkpoints") == 5
    Trainer(cfg, tmp_path / "cut", Inputs(), quiet=True).run()
    assert_identical(tmp_path / "cut" / "checkpoints" / "last.safetensors",
                     tmp_path / "straight" / "checkpoints" / "last.safetensors")
    scalers = [state.read_state(state.step_paths(tmp_path / run / "checkpoints", 12)[1])[1]["grad_scaler"]
               for run in ("straight", "cut")]
    assert scalers[0] == scalers[1] and scalers[0]["_growth_tracker"] == 12 and scalers[0]["scale"] > 0
