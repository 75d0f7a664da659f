"""What a run shows its user: tqdm progress on a terminal and plain lines in a log, the loss
named for what it is, evaluation progress, and the run's figures (learning curve with the
learning rate and the evaluation points; confusion matrix with colour bar and class names)."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from vitlab.analysis import plots
from vitlab.train.report import Progress, eval_batches, plot_learning_curve

pytest.importorskip("matplotlib")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_name_the_mean_and_the_last_loss():
    log = io.StringIO()
    p = Progress(40, stream=log)
    for step in range(1, 41):
        p.update(step, 2.0 - step / 100, 1e-3, 500.0, log_line=step % 20 == 0, last_loss=1.5)
    p.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in log.getvalue()  # the first step, then every log step
    assert lines[1].startswith("step 20/40  mean loss 1.8000  last loss 1.5000  lr 1.00e-03  500 img/s  ETA")


def test_a_terminal_gets_a_tqdm_bar_and_messages_above_it():
    term = Terminal()
    p = Progress(10, start=2, stream=term)
    p.update(5, 1.25, 2e-3, 100.0, log_line=False, last_loss=1.0)
    p.message("eval test @ step 5: top1 0.5")
    p.close()
    out = term.getvalue()
    assert "\r" in out and "5/10" in out and "mean loss 1.2500" in out and "last loss 1.0000" in out
    assert "eval test @ step 5: top1 0.5\n" in out


def test_evaluation_says_what_it_evaluates():
    batches = [(np.zeros((4, 1)), np.zeros(4)), (np.zeros((2, 1)), np.zeros(2))]
    log = io.StringIO()
    assert list(eval_batches(batches, "test", 6, stream=log)) == batches
    assert log.getvalue() == "evaluating test: 6 images\n"
    term = Terminal()
    assert len(list(eval_batches(iter(batches), "test", 6, stream=term))) == 2
    assert "eval test:" in term.getvalue() and "/6 [" in term.getvalue()  # a bar over the 6 images
    quiet = io.StringIO()
    list(eval_batches(batches, "test", 6, stream=quiet, quiet=True))
    assert quiet.getvalue() == ""


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures the plot functions build, instead of their files."""
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    return figures


def write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_learning_curve_has_a_title_the_lr_axis_and_the_eval_points(tmp_path, drawn):
    records = [{"step": s, "split": "train", "loss": 2.0 / s, "accuracy": s / 40, "lr": 1e-3 * s / 30} for s in (10, 20, 30)]
    records += [{"step": 15, "split": "dev", "loss": 1.0, "top1": 0.4, "accuracy": 0.4},
                {"step": 30, "split": "test", "loss": 0.9, "top1": 0.6, "accuracy": 0.6}]
    write_metrics(tmp_path / "metrics.jsonl", records)
    plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "lc.png", title="ViT-Ti/4 on digits (run)")
    (fig,) = drawn
    assert fig._suptitle.get_text() == "ViT-Ti/4 on digits (run)"
    loss_ax, acc_ax, lr_ax = fig.axes
    assert lr_ax.get_ylabel() == "learning rate"
    assert list(lr_ax.lines[0].get_ydata()) == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    assert acc_ax.get_ylabel() == "top-1 accuracy"
    evals = {line.get_label(): line for line in acc_ax.lines}
    assert list(evals["test (evaluation)"].get_xdata()) == [30] and evals["test (evaluation)"].get_marker() == "o"
    assert list(evals["dev (evaluation)"].get_ydata()) == [0.4]
    assert any(t.get_text() == "60.0%" for t in acc_ax.texts)  # each evaluation point is labelled


def test_a_curve_of_one_record_says_too_few_points_and_ticks_whole_steps(tmp_path, drawn):
    """A run that logged once (a 20-step run with a 50-step log window): the one record is a
    visible point, both panels say why there is no curve, and the step axis has whole steps."""
    write_metrics(tmp_path / "metrics.jsonl", [{"step": 20, "split": "train", "loss": 1.9, "accuracy": 0.3, "lr": 1e-3},
                                               {"step": 20, "split": "test", "loss": 1.7, "top1": 0.4, "accuracy": 0.4}])
    plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "lc.png")
    loss_ax, acc_ax, _ = drawn[0].axes
    for ax in (loss_ax, acc_ax):
        assert any("too few points for a curve: 1 logged step" in t.get_text() for t in ax.texts)
        assert ax.lines[0].get_marker() == "o"  # the train record drawn as a point, not an invisible line
        drawn[0].canvas.draw()
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_a_wide_loss_axis_labels_plain_numbers_and_the_legend_leaves_the_curves(tmp_path, drawn):
    records = [{"step": s, "split": "train", "loss": 3.0 / s, "accuracy": 0.5, "lr": 1e-3 * s} for s in range(1, 41)]
    write_metrics(tmp_path / "metrics.jsonl", records)
    plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "lc.png")
    fig = drawn[0]
    fig.canvas.draw()
    loss_ax = fig.axes[0]
    labels = [t.get_text() for t in loss_ax.get_yticklabels(minor=True) + loss_ax.get_yticklabels()]
    assert loss_ax.get_yscale() == "log" and not any("times" in t or "^" in t for t in labels), labels
    legend = loss_ax.get_legend()
    assert "learning rate" in [t.get_text() for t in legend.get_texts()]
    assert legend.get_window_extent().y1 <= loss_ax.get_window_extent().y0  # under the panel, not over the rate curve


def test_an_mpp_learning_curve_plots_colour_accuracy_with_its_dev_point(tmp_path, drawn):
    records = [{"step": s, "split": "train", "loss": 5.0, "accuracy": 0.1, "lr": 1e-3} for s in (10, 20)]
    records += [{"step": 20, "split": "dev", "loss": 4.0, "color_acc": 0.15, "accuracy": 0.15}]
    write_metrics(tmp_path / "metrics.jsonl", records)
    plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "lc.png", objective="mpp")
    acc_ax = drawn[0].axes[1]
    assert "colour accuracy" in acc_ax.get_ylabel() and "top-1" not in acc_ax.get_ylabel()
    dev = [line for line in acc_ax.lines if line.get_label().startswith("dev")]
    assert len(dev) == 1 and list(dev[0].get_ydata()) == [0.15]


def test_confusion_matrix_has_a_colour_bar_and_the_class_names(tmp_path, drawn):
    names = ["cat", "dog", "bird"]
    plots.plot_confusion([[5, 1, 0], [0, 6, 0], [2, 0, 4]], names, tmp_path / "c.png", title="test")
    (fig,) = drawn
    ax, bar = fig.axes
    assert bar.get_ylabel() == "share of the true class's images"
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert [t.get_text() for t in ax.get_yticklabels()] == names
    assert "18 images" in ax.get_title() and "test" in ax.get_title()


def test_progress_by_time_and_within_a_long_step(monkeypatch):
    """A line after the first step, then by steps and by time, and from a watcher when one
    step takes longer than EVERY_S (a big model on a CPU)."""
    monkeypatch.setattr(Progress, "EVERY_S", 0.3)
    out = io.StringIO()
    p = Progress(100, stream=out, tty=False)
    p.update(1, 2.0, 1e-3, 10.0, log_line=False)  # the first step always prints
    p.update(2, 2.0, 1e-3, 10.0, log_line=False)  # too soon, not a log step: silent
    time.sleep(1.6)  # a long step 3: the watcher says the run is alive
    p.update(3, 1.9, 1e-3, 10.0, log_line=False)  # the time since the last progress line has passed
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/100  mean loss 2.0000")
    assert any(line.startswith("step 3/100 running") for line in lines[1:-1])
    assert lines[-1].startswith("step 3/100  mean loss 1.9000") and not any(x.startswith("step 2/100") for x in lines)


def test_a_diverging_run_says_so_and_names_the_learning_rate(tmp_path, capsys):
    """The issue's fine-tune went from loss 2.15 to 35.5 in three steps without a word: a run
    whose loss leaves its start far behind warns once, naming the learning rate and the flag;
    a run that learns does not."""
    from vitlab.cli import main
    from vitlab.train.report import Divergence

    assert main(["train", "--steps", "6", "--lr", "30", "--warmup-steps", "0", "--out", str(tmp_path / "run"),
                 "--quiet", "model.depth=2", "model.hidden_size=32", "model.num_heads=2", "model.mlp_dim=64",
                 "data.num_workers=0", "optim.clip_grad_norm=0"]) == 0
    err = capsys.readouterr().err
    assert err.count("diverging") == 1 and "optim.lr=30" in err and "--lr 3" in err
    learning = Divergence(1e-3)
    assert not any(learning.check(s, loss, 1e-3) for s, loss in enumerate([2.3, 2.1, 2.6, 1.5, 0.9, 0.7], 1))
    not_a_number = Divergence(0.1)  # stops the run instead (TrainingDiverged, exit status 3)
    assert not_a_number.check(1, 2.3, 0.1) is None and not_a_number.check(2, float("nan"), 0.1) is None
    watch = Divergence(0.1)
    watch.check(1, 2.15, 0.1)
    assert "from 2.15 at step 1 to 35.5 at step 3" in watch.check(3, 35.5, 0.1) and watch.check(4, 99.0, 0.1) is None


def test_a_diverging_run_inside_a_sweep_cell_stops(tmp_path, monkeypatch, capsys):
    """A sweep sets VITLAB_DIVERGENCE=error for its cells' steps (unless the spec says
    allow_divergence: true): the run that only warned above stops with status 3 and one line."""
    from vitlab.cli import main
    from vitlab.config import ConfigError
    from vitlab.config.sweep import SweepSpec
    from vitlab.train.report import DIVERGENCE_ENV, divergence_mode

    monkeypatch.setenv(DIVERGENCE_ENV, "error")
    assert main(["train", "--steps", "6", "--lr", "30", "--warmup-steps", "0", "--out", str(tmp_path / "run"),
                 "--quiet", "model.depth=2", "model.hidden_size=32", "model.num_heads=2", "model.mlp_dim=64",
                 "data.num_workers=0", "optim.clip_grad_norm=0"]) == 3
    err = capsys.readouterr().err
    assert "stopped" in err and "diverging" in err and "allow_divergence" in err and "Traceback" not in err
    monkeypatch.setenv(DIVERGENCE_ENV, "maybe")
    with pytest.raises(ConfigError, match="give warn or error"):
        divergence_mode()
    monkeypatch.delenv(DIVERGENCE_ENV)
    assert divergence_mode() == "warn"
    spec = {"train": {"config": "digits"}, "grid": {"seed": [0]}}
    assert not SweepSpec.from_dict(spec, "t").allow_divergence
    assert SweepSpec.from_dict({**spec, "allow_divergence": True}, "t").allow_divergence


def test_the_next_commands_are_quoted_for_a_shell():
    from pathlib import Path

    from vitlab.train.report import next_commands

    lines = next_commands("runs/x/checkpoints/last.safetensors", "wds:data/train-{000000..000004}.tar", Path("runs/x"))
    assert lines[0] == "next:" and "--data 'wds:data/train-{000000..000004}.tar'" in lines[1]
    assert lines[3].endswith("--out runs/x/inspect") and lines[4].startswith("  vitlab fewshot runs/x/checkpoints/")


def test_a_fine_tune_ends_with_the_next_commands_and_a_sweep_arm_does_not(tmp_path):
    from types import SimpleNamespace

    from vitlab.config import load_recipe
    from vitlab.train.report import final_report

    folder = SimpleNamespace(path=tmp_path, summary=tmp_path / "summary.json", metrics=tmp_path / "metrics.jsonl",
                             config=tmp_path / "config.yaml")
    summary = {"steps": 20, "train_seconds": 1.0, "bad_images_skipped": 0, "checkpoint": "runs/ft/checkpoints/last.safetensors"}
    cfg = load_recipe("finetune").with_overrides({"model.checkpoint": "runs/cifar10/checkpoints/last.safetensors",
                                                  "data.name": "imagefolder:photos"})
    text = final_report(folder, summary, {}, [], cfg=cfg)
    assert "next:\n  vitlab eval runs/ft/checkpoints/last.safetensors --data imagefolder:photos" in text
    arm = cfg.with_overrides({"data.train_split": "train-minus-dev"})
    assert "next:" not in final_report(folder, summary, {}, [], cfg=arm)
