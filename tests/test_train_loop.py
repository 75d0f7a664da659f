"""The training loop: run-folder outputs, exact resume (in process and after SIGKILL), atomic
checkpoints, the NaN stop, refusing to overwrite a run, fine-tuning at a higher resolution."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.config import ConfigError, RunConfig
from vitlab.train import state
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer, TrainingDiverged

# A ViT small enough to train in a second: 8x8 digits, 4x4 patches, 2 blocks of width 32.
TINY = {
    "model": {"name": "ViT-Ti/4", "image_size": 8, "patch_size": 4, "in_channels": 1, "mean": [0.5], "std": [0.5],
              "hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "head_init": "xavier", "dropout": 0.1},
    "data": {"name": "digits", "crop_scale": [0.5, 1.0], "hflip": False},
    "optim": {"lr": 3e-3, "warmup_steps": 3, "weight_decay": 0.05},
    "train": {"steps": 12, "batch_size": 32, "ckpt_every": 5, "keep_checkpoints": 2, "log_every": 4, "threads": 1,
              "label_smoothing": 0.1, "mixup": 0.2, "ema": 0.9},
}
TINY_ARGS = [
    "--steps", "150", "--batch-size", "32", "--ckpt-every", "10", "--seed", "3",
    "model.hidden_size=32", "model.depth=2", "model.num_heads=2", "model.mlp_dim=64", "model.image_size=8",
    "model.patch_size=4", "model.dropout=0.1", "train.ema=0.9", "train.mixup=0.2", "train.eval_every=50",
    "train.threads=1", "train.keep_checkpoints=2",
]


def tiny(**sections) -> RunConfig:
    d = json.loads(json.dumps(TINY))
    for section, values in sections.items():
        d[section].update(values)
    return RunConfig.from_dict(d)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def assert_identical(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs"


def test_a_run_writes_its_folder(tmp_path):
    out = tmp_path / "run"
    summary = Trainer(tiny(), out, Inputs(), quiet=True).run()
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "learning_curve.png", "confusion-test.png"):
        assert (out / name).is_file(), name
    # Trackers are off by default: no TensorBoard events, no tracker ids (tests/test_train_tracking.py).
    assert not (out / "tensorboard").exists() and not (out / "trackers.json").exists()
    assert RunConfig.from_dict(__import__("yaml").safe_load((out / "config.yaml").read_text())) == tiny()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert {"step", "epoch", "split", "loss", "accuracy", "lr", "images_per_s"} <= set(train[0])
    test = [r for r in records if r["split"] == "test"]
    assert len(test) == 1 and test[0]["top1"] == summary["splits"]["test"]["top1"]
    s = json.loads((out / "summary.json").read_text())
    assert set(s["splits"]["test"]) >= {"top1", "top5", "loss"} and 0 <= s["splits"]["test"]["top1"] <= 1
    assert s["checkpoint"].endswith("ema.safetensors")
    # The last 2 checkpoints are kept (steps 10 and 12), each loadable with its class names.
    assert state.complete_steps(out / "checkpoints") == [10, 12]
    model = vitlab.load(out / "checkpoints" / "last.safetensors")
    assert model.class_names == [str(i) for i in range(10)] and model.config.depth == 2
    assert_identical(out / "checkpoints" / "last.safetensors", out / "checkpoints" / "step-00000012.safetensors")
    # No pickle anywhere: the training state is safetensors with JSON metadata.
    tensors, meta = state.read_state(state.step_paths(out / "checkpoints", 12)[1])
    assert meta["step"] == 12 and "rng.rank0.torch" in tensors and any(k.startswith("ema.") for k in tensors)


def test_same_command_again_finishes_or_refuses_a_different_config(tmp_path):
    out = tmp_path / "run"
    Trainer(tiny(train={"steps": 4}), out, Inputs(), quiet=True).run()
    before = (out / "checkpoints" / "last.safetensors").read_bytes()
    again = Trainer(tiny(train={"steps": 4}), out, Inputs(), quiet=True).run()  # already complete: nothing changes
    assert again["steps"] == 4 and (out / "checkpoints" / "last.safetensors").read_bytes() == before
    with pytest.raises(ConfigError, match=r"optim.lr: 0.003 -> 0.01") as e:
        Trainer(tiny(train={"steps": 4}, optim={"lr": 0.01}), out, Inputs(), quiet=True).run()
    assert e.value.reason == "different-config"
    assert (out / "checkpoints" / "last.safetensors").read_bytes() == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a vitlab run folder"):
        Trainer(tiny(), tmp_path / "other", Inputs(), quiet=True).run()


def test_crash_while_writing_a_checkpoint_keeps_the_last_one_and_resumes_exactly(tmp_path, monkeypatch):
    """A write that dies half-way leaves no partial file; the rerun continues bit-identically."""
    Trainer(tiny(), tmp_path / "straight", Inputs(), quiet=True).run()

    real_save = __import__("safetensors.torch", fromlist=["save_file"]).save_file
    def dying_save(tensors, filename, metadata=None):
        if metadata and metadata.get("format") == "vitlab" and json.loads(metadata.get("step", "0")) == 10:
            Path(filename).write_bytes(b"half a file")  # the temporary file, mid-write
            raise OSError("disk died")
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr("safetensors.torch.save_file", dying_save)
    out = tmp_path / "crashed"
    with pytest.raises(OSError, match="disk died"):
        Trainer(tiny(), out, Inputs(), quiet=True).run()
    ckpt = out / "checkpoints"
    assert state.latest(ckpt) == 5
    assert not list(ckpt.glob("*.tmp")) and not (ckpt / "step-00000010.safetensors").exists()
    assert_identical(ckpt / "last.safetensors", ckpt / "step-00000005.safetensors")
    monkeypatch.setattr("safetensors.torch.save_file", real_save)
    Trainer(tiny(), out, Inputs(), quiet=True).run()  # the same command again: resumes from step 5
    assert_identical(out / "checkpoints" / "last.safetensors", tmp_path / "straight" / "checkpoints" / "last.safetensors")
    assert_identical(out / "checkpoints" / "ema.safetensors", tmp_path / "straight" / "checkpoints" / "ema.safetensors")
    a = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"], r["loss"]) for r in a] == [(r["step"], r["split"], r["loss"]) for r in b]


def _train(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vitlab", "train", "--out", str(out), "--quiet", *TINY_ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_and_resume_is_bit_identical(tmp_path):
    straight = _train(tmp_path / "straight")
    victim = _train(tmp_path / "killed")
    ckpt = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 240
    while state.latest(ckpt) is None or state.latest(ckpt) < 40:
        assert victim.poll() is None, victim.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "summary.json").exists()
    killed_at = state.latest(ckpt)
    assert killed_at < 150
    resumed = _train(tmp_path / "killed")  # the same command: continues from the newest checkpoint
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    straight.communicate(timeout=300)
    assert straight.returncode == 0
    for name in ("last.safetensors", "ema.safetensors"):
        assert_identical(tmp_path / "killed" / "checkpoints" / name, tmp_path / "straight" / "checkpoints" / name)
    s1 = json.loads((tmp_path / "killed" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert s1["splits"] == s2["splits"]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    # Plain SGD at an absurd rate without clipping: the weights blow up within a few steps.
    cfg = tiny(optim={"name": "sgd", "lr": 1e12, "clip_grad_norm": 0.0, "warmup_steps": 0},
               train={"ckpt_every": 1, "steps": 50, "ema": 0.0, "mixup": 0.0})
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"loss is (nan|inf).*step-0000000\d"):
        Trainer(cfg, out, Inputs(), quiet=True).run()
    last = state.latest(out / "checkpoints")
    assert last is not None and last < 50
    w = weights(out / "checkpoints" / "last.safetensors")
    assert all(torch.isfinite(v).all() for v in w.values())
    assert not (out / "summary.json").exists()


def test_cli_nan_stop_exit_code(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "vitlab", "train", "--out", str(tmp_path / "r"), "--steps", "30", "--quiet",
         "optim.name=sgd", "optim.lr=1e12", "optim.clip_grad_norm=0", "optim.warmup_steps=0", "train.ckpt_every=1",
         "model.depth=1", "model.hidden_size=32", "model.num_heads=2", "model.mlp_dim=32", "train.threads=1"],
        capture_output=True, text=True, timeout=180,
    )
    assert r.returncode == 3 and "stopped: step" in r.stderr and "Traceback" not in r.stderr


def test_bf16_and_accumulation_run(tmp_path):
    cfg = tiny(train={"steps": 3, "precision": "bf16", "micro_batch_size": 8, "ema": 0.0})
    s = Trainer(cfg, tmp_path / "r", Inputs(), quiet=True).run()
    assert math.isfinite(s["splits"]["test"]["loss"])


@pytest.mark.slow
def test_finetune_at_a_higher_resolution_and_eval(tmp_path):
    """Pretrain on 8x8, fine-tune at 16x16: position embeddings resized, fresh zero head,
    pre-logits dropped; the fine-tuned model beats chance by far; `vitlab eval` agrees."""
    pre = tmp_path / "pre"
    Trainer(tiny(model={"representation_size": 32, "dropout": 0.0},
                 train={"steps": 60, "ema": 0.0, "mixup": 0.0, "ckpt_every": 60}), pre, Inputs(), quiet=True).run()
    src = pre / "checkpoints" / "last.safetensors"
    from vitlab.train.build import build_model

    section = RunConfig.from_dict({"model": {"checkpoint": str(src), "image_size": 16, "representation_size": None}}).model
    start = build_model(section, list("0123456789"), Inputs(), "bf16")
    old = vitlab.load(src)
    assert start.config.image_size == (16, 16) and start.pos_embed.pos_embedding.shape[1] == 1 + 16
    assert start.pre_logits is None and torch.count_nonzero(start.head.weight) == 0
    assert torch.equal(start.blocks[1].mlp.fc1.weight, old.blocks[1].mlp.fc1.weight)
    assert {b.attn.cpu_attention for b in start.blocks} == {"explicit"}  # a bf16 run's CPU kernel, chosen when built

    out = tmp_path / "ft"
    r = subprocess.run(
        [sys.executable, "-m", "vitlab", "finetune", "--from", str(src), "--data", "digits", "--image-size", "16",
         "--steps", "40", "--batch-size", "64", "--out", str(out), "--quiet", "optim.warmup_steps=5",
         "optim.lr=0.03", "train.threads=1", "train.log_every=10"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    ft = vitlab.load(out / "checkpoints" / "last.safetensors")
    assert ft.config.image_size == (16, 16) and ft.config.representation_size is None
    # It learns at the new resolution: the loss falls and accuracy clears chance (0.1). (A
    # 60-step, 4-token model transfers little to 16 tokens; the point here is the mechanics.)
    train_log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert train_log[-1]["loss"] < train_log[0]["loss"]
    assert summary["splits"]["test"]["top1"] > 0.15

    r = subprocess.run([sys.executable, "-m", "vitlab", "eval", str(out / "checkpoints" / "last.safetensors"),
                        "--data", "digits", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["top1"] == pytest.approx(summary["splits"]["test"]["top1"])
    assert set(result["per_class"]) == set("0123456789")
    assert (out / "eval" / "eval-test.json").is_file() and (out / "eval" / "confusion-test.png").is_file()


def test_lr_sweep_picks_on_dev_then_trains_on_everything(tmp_path):
    from vitlab.train import finetune_choice as choice

    cfg = tiny(train={"steps": 4, "ema": 0.0, "mixup": 0.0, "ckpt_every": 4})
    seen = []

    def train(c, out, _notes=()):
        seen.append((c.optim.lr, c.data.train_split, c.data.eval_splits))
        return Trainer(c, out, Inputs(), quiet=True).run()

    arms = [choice.Arm(choice.PLANNED, lr) for lr in (1e-4, 3e-3)]  # the rate alone: the paper's sweep
    result = choice.choose(cfg, tmp_path, arms, 4, set(), train, log=lambda _: None)
    assert seen[:2] == [(1e-4, "train-minus-dev", ("dev",)), (3e-3, "train-minus-dev", ("dev",))]
    scores = {a["lr"]: a["dev_top1"] for a in result["arms"]}
    best = max((1e-4, 3e-3), key=lambda lr: (scores[lr], -lr))
    assert result["best_lr"] == best and seen[2] == (best, "train", ("test",)) and result["best_recipe"] == ""
    assert json.loads((tmp_path / "sweep.json").read_text())["best_lr"] == best
    assert (tmp_path / "final" / "summary.json").is_file() and (tmp_path / "sweep" / "lr-0.003" / "summary.json").is_file()
    dev = json.loads((tmp_path / "sweep" / "lr-0.0001" / "summary.json").read_text())["splits"]["dev"]
    assert dev["count"] == 144  # 10% of the 1,437 training digits
    # Whether the two dev scores are within noise of each other is recorded with them.
    noise = choice.two_standard_errors(scores[1e-4], scores[3e-3], 144)
    assert result["within_noise"] == (abs(scores[1e-4] - scores[3e-3]) <= noise)


# The BiT ResNet baseline through the same loop: a 14-layer, half-width ResNet on 8x8 digits.
BIT = {"model": {"name": "BiT-R26-C", "layers": [1, 1, 1, 1], "image_size": 8, "in_channels": 1, "mean": [0.5],
                 "std": [0.5]},
       "data": {"name": "digits", "crop_scale": [0.5, 1.0], "hflip": False},
       "optim": {"lr": 3e-3, "warmup_steps": 2},
       "train": {"steps": 6, "batch_size": 16, "ckpt_every": 3, "log_every": 3, "threads": 1, "ema": 0.9}}


def test_a_bit_resnet_trains_resumes_exactly_and_fine_tunes(tmp_path):
    cfg = RunConfig.from_dict(BIT)
    straight = Trainer(cfg, tmp_path / "straight", Inputs(), quiet=True).run()
    assert straight["model"] == "BiT-R26-C (custom: layers (1, 1, 1, 1))"
    assert straight["compute"]["images_seen"] == 6 * 16
    model = vitlab.load(tmp_path / "straight" / "checkpoints" / "last.safetensors")
    assert model.config.kind == "bit" and model.class_names == [str(i) for i in range(10)]
    # Stopped after step 3 (its newer checkpoint and summary gone), the same run continues exactly.
    out = tmp_path / "stopped"
    Trainer(cfg, out, Inputs(), quiet=True).run()
    ckpt = out / "checkpoints"
    for p in [*ckpt.glob("step-00000006*"), ckpt / "last.safetensors", ckpt / "ema.safetensors", out / "summary.json"]:
        p.unlink()
    resumed = Trainer(cfg, out, Inputs(), quiet=True).run()
    for name in ("step-00000006.safetensors", "ema.safetensors"):
        assert_identical(ckpt / name, tmp_path / "straight" / "checkpoints" / name)
    assert resumed["compute"]["images_seen"] == straight["compute"]["images_seen"]
    assert resumed["splits"] == straight["splits"]
    # Fine-tuning from it: the checkpoint's ResNet, a fresh zero head for the new classes.
    ft = RunConfig.from_dict({**BIT, "model": {"checkpoint": str(ckpt / "last.safetensors")},
                              "train": {**BIT["train"], "steps": 2, "ema": 0.0}})
    assert Trainer(ft, tmp_path / "ft", Inputs(), quiet=True).run()["steps"] == 2
    # And through `vitlab finetune`, whose recipe drops a ViT's pre-logits (representation_size:
    # null): a ResNet has none to drop, so the recipe applies to it as it is.
    from vitlab.cli import main

    assert main(["finetune", "--from", str(ckpt / "last.safetensors"), "--data", "digits", "--steps", "2", "--lr", "0.01",
                 "--batch-size", "16", "--eval-every", "0", "--quiet", "--out", str(tmp_path / "cli-ft")]) == 0
    tuned = vitlab.load(tmp_path / "cli-ft" / "checkpoints" / "last.safetensors")
    assert tuned.config.kind == "bit" and tuned.config.layers == (1, 1, 1, 1)


def test_masked_patch_prediction_refuses_a_resnet(tmp_path):
    cfg = RunConfig.from_dict({**BIT, "train": {**BIT["train"], "objective": "mpp"}})
    with pytest.raises(ConfigError, match="train.objective=supervised"):
        Trainer(cfg, tmp_path / "mpp", Inputs(), quiet=True).run()


class PILDigits(torch.utils.data.Dataset):
    """The digits as a user's own torch Dataset would hold them: PIL images and int labels."""

    def __init__(self, split: str):
        from vitlab.data.datasets import digits_arrays

        self.images, self.labels = digits_arrays()[split]
        self.classes = [str(i) for i in range(10)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self.images[i]), int(self.labels[i])


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([])


def test_trainer_takes_dataset_objects(tmp_path):
    """A torch Dataset (and a Hugging Face one) of the same pixels trains exactly as the
    `digits` spec does: same batches, same augmentation, same weights and scores."""
    cfg = tiny(train={"steps": 6, "ema": 0.0, "mixup": 0.0, "ckpt_every": 6})
    spec = Trainer(cfg, tmp_path / "spec", Inputs(), quiet=True).run()
    obj = Trainer(cfg, tmp_path / "obj", Inputs(), quiet=True, data=PILDigits("train"), eval_data=PILDigits("test")).run()
    assert obj["splits"]["test"] == spec["splits"]["test"]
    assert_identical(tmp_path / "spec" / "checkpoints" / "last.safetensors", tmp_path / "obj" / "checkpoints" / "last.safetensors")
    recorded = (tmp_path / "obj" / "config.yaml").read_text()
    assert "object:test_train_loop.PILDigits, 1437 items" in recorded
    datasets = pytest.importorskip("datasets")
    source = PILDigits("train")
    hf = datasets.Dataset.from_dict({"image": [source[i][0] for i in range(len(source))], "label": source.labels.tolist()},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.ClassLabel(names=source.classes)}))
    via_hf = Trainer(cfg, tmp_path / "hf", Inputs(), quiet=True, data=hf, eval_data={"test": PILDigits("test")}).run()
    assert via_hf["splits"]["test"] == spec["splits"]["test"]
    with pytest.raises(ConfigError, match="map-style"):
        Trainer(cfg, tmp_path / "stream", Inputs(), quiet=True, data=Stream()).run()


def test_the_final_evaluation_runs_the_inference_copy_and_leaves_the_trained_model_alone(monkeypatch):
    """A supervised run's last evaluation on one CPU process (vtab's and finetune's test
    score) runs vitlab.deploy's inference copy; the objective that trains keeps its model.
    (oneDNN forced: the copy would otherwise pack only the shapes that timed faster.)"""
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "oneDNN")
    from conftest import perturb, tiny_model
    from vitlab import deploy
    from vitlab.train.objectives import Supervised, evaluation_target

    objective = Supervised(perturb(tiny_model()))
    assert evaluation_target(objective, None, fast=False) is objective
    fast = evaluation_target(objective, None, fast=True)
    packed = torch.float32 in deploy.onednn_dtypes()
    assert fast is not objective and isinstance(fast.model.model.blocks[0].mlp.fc1, deploy.PackedLinear) == packed
    assert isinstance(objective.model.blocks[0].mlp.fc1, torch.nn.Linear)
    images, labels = torch.randn(16, 3, 16, 16), torch.arange(16) % 10
    with torch.no_grad():
        got, want = fast.eval_step(images, labels), objective.eval().eval_step(images, labels)
    assert got.keys() == want.keys()
    for k in got:  # the attention kernel is timed: the fused one rounds the loss differently at 1e-7
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)
