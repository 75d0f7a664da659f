"""Every long command shows a progress bar on a terminal (tqdm, on stderr) and none in a log."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def commands(ckpt, tmp_path) -> dict[str, tuple[list[str], str]]:
    image = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8), dtype=np.uint8)).save(image)
    return {
        "eval": (["eval", ckpt, "--data", "digits", "--out", str(tmp_path / "e")], "eval test"),
        "fewshot": (["fewshot", ckpt, "--data", "digits", "--shots", "1", "--seeds", "1", "--no-cache"], "features train"),
        "linear-probe": (["linear-probe", ckpt, "--data", "digits", "--max-per-class", "5", "--no-cache"], "features test"),
        "inspect": (["inspect", ckpt, "--images", "digits", "--out", str(tmp_path / "i"), "--num-images", "4"], "inspect"),
        "predict": (["predict", ckpt, str(image)], "predict"),
        "convert": (["convert", ckpt, str(tmp_path / "c.safetensors"), "--to", "timm"], "verify"),
        "export": (["export", ckpt, "--format", "torch-export", "--out", str(tmp_path / "m.pt2")], "export torch-export"),
    }


@pytest.mark.parametrize("name", ["eval", "fewshot", "linear-probe", "inspect", "predict", "convert", "export"])
def test_a_terminal_gets_a_bar_and_a_log_does_not(name, digits_run, tmp_path, monkeypatch, capsys):
    if name == "inspect":
        pytest.importorskip("matplotlib")
    argv, desc = commands(str(digits_run / "checkpoints" / "last.safetensors"), tmp_path)[name]
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(argv) == 0
    shown = term.getvalue()
    assert f"{desc}:" in shown and "\r" in shown, shown[-500:]
    monkeypatch.undo()
    capsys.readouterr()
    if name in ("export", "inspect", "convert"):
        return  # once is enough for the slow ones; the log case is the same switch
    assert main(argv) == 0
    assert "\r" not in capsys.readouterr().err
