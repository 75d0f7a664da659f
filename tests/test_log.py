"""vitlab's own output goes through `logging` ("vitlab" and its children): a Python user can
silence it or send it elsewhere, and by default it prints exactly as the command line does."""

from __future__ import annotations

import logging

import pytest

from vitlab.config import RunConfig
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer

RUN = {"model": {"name": "ViT-Ti/4", "image_size": 16, "in_channels": 1, "mean": [0.5], "std": [0.5], "depth": 1,
                 "hidden_size": 32, "num_heads": 2, "mlp_dim": 64},
       "data": {"name": "digits"}, "optim": {"warmup_steps": 1},
       "train": {"steps": 3, "batch_size": 32, "threads": 1, "log_every": 1}}


@pytest.fixture
def vitlab_logger():
    root = logging.getLogger("vitlab")
    saved = (root.level, list(root.handlers), root.propagate)
    yield root
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    root.propagate = saved[2]


def test_by_default_a_run_prints_its_lines_on_stdout(tmp_path, capsys):
    Trainer(RunConfig.from_dict(RUN), tmp_path / "run", Inputs()).run()
    out, err = capsys.readouterr()
    assert "training ViT-Ti/4" in out and "outputs in" in out and "step 3/3" in err  # step lines: stderr, as before


def test_a_python_user_silences_it(tmp_path, capsys, vitlab_logger):
    vitlab_logger.setLevel(logging.WARNING)
    Trainer(RunConfig.from_dict(RUN), tmp_path / "run", Inputs()).run()
    out, err = capsys.readouterr()
    assert "training" not in out and "step 3/3" not in err and "evaluating" not in err


def test_a_python_user_redirects_it_to_their_own_handler(tmp_path, capsys, vitlab_logger):
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    vitlab_logger.handlers[:] = [Keep()]
    Trainer(RunConfig.from_dict(RUN), tmp_path / "run", Inputs()).run()
    assert "training" not in capsys.readouterr().out
    names = {r.name for r in seen}
    assert names == {"vitlab.train", "vitlab.progress"} and any("outputs in" in r.getMessage() for r in seen)
