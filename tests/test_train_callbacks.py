"""Trainer callbacks on real data (sklearn digits): the events, early stopping and keep-best
(the Fig. 4 protocol: evaluate on a dev split, keep the best, stop after a patience), their
exactness on resume, the command line, and two processes under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.cli import main
from vitlab.config import ConfigError
from vitlab.config.run import load_recipe
from vitlab.train.callbacks import Callback
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer

TINY = {"model.depth": 1, "model.hidden_size": 32, "model.num_heads": 2, "model.mlp_dim": 64, "model.image_size": 8,
        "model.patch_size": 4, "model.dropout": 0.0, "train.threads": 1, "train.batch_size": 32, "train.steps": 200,
        "train.log_every": 10, "optim.warmup_steps": 2, "optim.lr": 0.01}
PROTOCOL = {"train.eval_every": 10, "train.ckpt_every": 10, "data.train_split": "train-minus-dev",
            "data.eval_splits": ["dev", "test"], "train.early_stop.metric": "dev.top1",
            "train.early_stop.patience": 2, "train.keep_best": "dev.top1"}


def config(**extra):
    return load_recipe("digits").with_overrides({**TINY, **PROTOCOL, **extra})


class Recorder(Callback):
    name = "recorder"

    def __init__(self):
        self.events = []

    def on_log(self, trainer, run, step, record):
        self.events.append(("log", step, record["split"]))

    def on_eval(self, trainer, run, step, results):
        self.events.append(("eval", step, round(results["dev"]["top1"], 6)))

    def on_checkpoint(self, trainer, run, step, path):
        self.events.append(("checkpoint", step, path.name))

    def on_end(self, trainer, run, step):
        self.events.append(("end", step, None))
        return {"recorded": len(self.events)}


class Crash(Callback):
    name = "crash"

    def __init__(self, at):
        self.at = at

    def on_checkpoint(self, trainer, run, step, path):
        if step == self.at:
            raise KeyboardInterrupt


def dev_evals(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["top1"]) for r in rows if r["split"] == "dev"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    out = tmp_path_factory.mktemp("cb") / "run"
    rec = Recorder()
    summary = Trainer(config(), out, Inputs(), quiet=True, callbacks=[rec]).run()
    return out, summary, rec


def test_early_stopping_and_keep_best_follow_the_dev_evaluations(stopped):
    out, summary, rec = stopped
    evals = dev_evals(out)[:-1]  # the last dev record is the final evaluation
    best_step, best = None, None
    for step, top1 in evals:  # an independent reading of the rule, from metrics.jsonl
        if best is None or top1 > best:
            best_step, best = step, top1
    stop = summary["stopped_early"]["step"]
    assert stop < 200, "digits at lr 0.01 plateaus well before 200 steps: the run must stop early"
    assert stop == best_step + 2 * 10 and evals[-1][0] == stop  # two evaluations without improvement
    assert summary["steps"] == stop and summary["best"]["step"] == best_step
    assert summary["best"]["value"] == pytest.approx(best) and summary["best"]["dev"]["top1"] == pytest.approx(best)
    assert 0 < summary["best"]["test"]["top1"] <= 1 and summary["early_stop"]["stopped_at"] == stop
    model = vitlab.load(str(out / "checkpoints" / "best.safetensors"))  # a normal vitlab checkpoint
    assert sum(p.numel() for p in model.parameters()) > 0
    best_w, last_w = (load_file(str(out / "checkpoints" / f)) for f in ("best.safetensors", "last.safetensors"))
    assert any(not torch.equal(best_w[k], last_w[k]) for k in best_w)  # the best is not the last
    # the events, in order, with the metrics the trainer logged
    assert [e for e in rec.events if e[0] == "eval"] == [("eval", s, round(v, 6)) for s, v in evals]
    assert [e[1] for e in rec.events if e[0] == "checkpoint"] == list(range(10, stop + 1, 10))
    assert rec.events[-1] == ("end", stop, None) and summary["recorded"] == len(rec.events)
    assert ("log", 10, "train") in rec.events


def test_a_stopped_run_is_complete_and_resume_is_exact(stopped, tmp_path):
    out, summary, _ = stopped
    again = Trainer(config(), out, Inputs(), quiet=True).run()  # finished: nothing more is trained
    assert again["steps"] == summary["steps"] and again["best"] == summary["best"]
    crash_at = summary["best"]["step"] + 10  # after the best, inside the patience
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(), cut, Inputs(), quiet=True, callbacks=[Crash(crash_at)]).run()
    resumed = Trainer(config(), cut, Inputs(), quiet=True).run()
    for key in ("steps", "best", "early_stop", "stopped_early"):
        assert resumed[key] == summary[key] if key != "best" else {**resumed[key], "checkpoint": None} == {
            **summary[key], "checkpoint": None}
    for f in ("last.safetensors", "best.safetensors"):
        a, b = load_file(str(out / "checkpoints" / f)), load_file(str(cut / "checkpoints" / f))
        assert all(torch.equal(a[k], b[k]) for k in a), f


def test_the_command_line_and_its_mistakes(tmp_path, capsys):
    base = ["train", "--config", "digits", "--steps", "20", "--quiet", *[f"{k}={v}" for k, v in TINY.items()
                                                                      if k != "train.steps"]]
    assert main([*base, "--out", str(tmp_path / "a"), "train.keep_best=dev.top1"]) != 0
    assert "need periodic evaluations" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--eval-every", "10", "train.keep_best=dev.top1"]) != 0
    err = capsys.readouterr().err
    assert "has no dev.top1" in err and "test.top1" in err and "Traceback" not in err
    assert main([*base, "--out", str(tmp_path / "c"), "train.early_stop.patiense=2"]) != 0
    assert "valid train.early_stop keys" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "d"), "--eval-every", "10", "train.early_stop.metric=test.loss",
                 "train.early_stop.patience=1"]) == 0
    s = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert s["early_stop"]["metric"] == "test.loss" and s["early_stop"]["best_step"] in (10, 20)
    with pytest.raises(ConfigError, match="two callbacks"):
        Trainer(config(), tmp_path / "e", Inputs(), quiet=True, callbacks=[Recorder(), Recorder()]).run()


@pytest.mark.slow
def test_two_processes_stop_where_one_does(tmp_path):
    args = ["--config", "digits", "--quiet", "--seed", "3", "data.crop_scale=[1.0,1.0]", "data.crop_ratio=[1.0,1.0]",
            *[f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in {**TINY, **PROTOCOL}.items()]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"one": [sys.executable, "-m", "vitlab", "train"],
            "two": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    "-m", "vitlab", "train"]}
    got = {}
    for name, cmd in runs.items():
        r = subprocess.run([*cmd, *args, "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=600,
                           env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        got[name] = json.loads((tmp_path / name / "summary.json").read_text())
        assert (tmp_path / name / "checkpoints" / "best.safetensors").exists()
    assert got["two"]["world_size"] == 2 and "stopped_early" in got["one"]
    assert got["one"]["stopped_early"]["step"] == got["two"]["stopped_early"]["step"]
    assert got["one"]["best"]["step"] == got["two"]["best"]["step"]
    assert got["one"]["best"]["value"] == pytest.approx(got["two"]["best"]["value"], abs=1.5 / 144)
