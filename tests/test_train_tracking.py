"""`--log wandb|mlflow|tensorboard`: each tracker receives the metrics records, a resumed run
continues the same tracker run, nothing is imported unless asked for, and a missing or
failing tracker is a one-line error. wandb runs in its offline mode and MLflow against a
local file store; each test skips, saying so, where the package is not installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_train_loop import tiny
from vitlab import extras
from vitlab.config import ConfigError
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer


def metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_nothing_is_imported_unless_asked_for(tmp_path):
    code = (
        "import sys; from vitlab.train.loop import Trainer; from vitlab.train.inputs import Inputs; "
        f"from test_train_loop import tiny; Trainer(tiny(train={{'steps': 2}}), {str(tmp_path / 'r')!r}, Inputs(), "
        "quiet=True).run(); "
        "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=str(__import__("pathlib").Path(__file__).parent))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "r" / "tensorboard").exists()


def test_unknown_or_missing_trackers_are_refused_before_training(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="choose from tensorboard, wandb, mlflow"):
        Trainer(tiny(), tmp_path / "r", Inputs(), trackers=("neptune",)).run()
    monkeypatch.setattr(extras, "_present", lambda module: False)  # as if wandb were not installed
    with pytest.raises(ConfigError, match=r'pip install "vitlab\[wandb\]"'):
        Trainer(tiny(), tmp_path / "r", Inputs(), trackers=("wandb",)).run()
    assert not (tmp_path / "r").exists()


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "r"
    Trainer(tiny(), run, Inputs(), quiet=True, trackers=("tensorboard",)).run()
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    jsonl = [(r["step"], r["loss"]) for r in metrics(run) if r["split"] == "train"]
    assert [s for s, _ in loss] == [s for s, _ in jsonl]
    assert [v for _, v in loss] == pytest.approx([v for _, v in jsonl], rel=1e-6)
    assert events.Scalars("test/top1")[0].step == 12


def test_wandb_offline_logs_every_record_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged = []
    real_log = wandb.sdk.wandb_run.Run.log

    def spy(self, data, step=None, **kw):
        logged.append((step, dict(data)))
        return real_log(self, data, step=step, **kw)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    run = tmp_path / "r"
    Trainer(tiny(train={"steps": 8}), run, Inputs(), quiet=True, trackers=("wandb",)).run()
    first = json.loads((run / "trackers.json").read_text())["wandb"]
    Trainer(tiny(), run, Inputs(), quiet=True, trackers=("wandb",), extend=True).run()  # extended to 12 steps
    assert json.loads((run / "trackers.json").read_text())["wandb"] == first
    jsonl = [r for r in metrics(run)]
    assert [step for step, _ in logged] == [r["step"] for r in jsonl]
    for (_, data), r in zip(logged, jsonl, strict=True):
        assert data[f"{r['split']}/loss"] == pytest.approx(r["loss"])
    # Offline, each session is a folder of its own under the same run id (`wandb sync` joins them).
    sessions = sorted((run / "wandb").glob(f"offline-run-*-{first}/run-{first}.wandb"))
    assert len(sessions) == 2
    assert all(b"train/loss" in f.read_bytes() and b"test/top1" in f.read_bytes() for f in sessions)


def test_mlflow_file_store_gets_params_and_metrics(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "vitlab-test")
    run = tmp_path / "r"
    Trainer(tiny(train={"steps": 8}), run, Inputs(), quiet=True, trackers=("mlflow",)).run()
    Trainer(tiny(), run, Inputs(), quiet=True, trackers=("mlflow",), extend=True).run()
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(store)
    info = client.get_run(run_id)
    assert info.data.params["optim.lr"] == "0.003" and info.data.params["train.objective"] == '"supervised"'
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")]
    jsonl = [(r["step"], r["loss"]) for r in metrics(run) if r["split"] == "train"]
    history = sorted(history)
    assert [s for s, _ in history] == [s for s, _ in jsonl]
    assert [v for _, v in history] == pytest.approx([v for _, v in jsonl])
    assert [m.step for m in client.get_metric_history(run_id, "test/top1")] == [8, 12]


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")
    with pytest.raises(ConfigError, match=r"could not start .*MLFLOW_TRACKING_URI") as e:
        Trainer(tiny(train={"steps": 2}), tmp_path / "r", Inputs(), trackers=("mlflow",)).run()
    assert "\n" not in str(e.value)
