"""`--device` on `vitlab serve` and `vitlab export`: the model runs where it is asked to, a
device the machine lacks is one line before anything loads, and CPU-only serving copies are
refused on a GPU. (On a machine with CUDA the same tests run the model there.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitlab
from conftest import perturb, small_classifier, tiny_model
from vitlab.cli import main
from vitlab.serve.engine import Engine

GPU = "cuda" if torch.cuda.is_available() else None


@pytest.mark.parametrize("device", ["cpu", *([GPU] if GPU else [])])
def test_the_engine_runs_on_its_device_and_answers_as_on_the_cpu(device):
    model = small_classifier()
    x = [torch.randn(model.config.in_channels, *model.config.image_size) for _ in range(3)]
    reference = Engine(model, "fp32").classify(x)
    engine = Engine(small_classifier(), "fp32", device=device)
    assert next(engine.model.parameters()).device.type == device
    assert np.allclose(np.stack(engine.classify(x)), np.stack(reference), atol=1e-4)
    looked = engine.look(x[:1])
    assert np.allclose(looked[0].probs, reference[0], atol=1e-4)


def test_a_cpu_serving_copy_is_refused_on_a_gpu():
    with pytest.raises(ValueError, match="CPU serving copy"):
        Engine(small_classifier(), "int8", device="cuda")


@pytest.mark.skipif(GPU is not None, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", ["serve", "export"])
def test_a_missing_gpu_is_one_line_before_loading(command, tmp_path, capsys):
    argv = [command, str(tmp_path / "not-read.safetensors"), "--device", "cuda"]
    argv += ["--format", "onnx", "--out", str(tmp_path / "m.onnx")] if command == "export" else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--device cuda: torch sees no CUDA GPU" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("device", ["cpu", *([GPU] if GPU else [])])
def test_export_traces_and_checks_on_the_device(device, tmp_path, capsys):
    vitlab.save(perturb(tiny_model()), tmp_path / "m.safetensors")
    assert main(["export", str(tmp_path / "m.safetensors"), "--format", "torch-export", "--out",
                 str(tmp_path / "m.pt2"), "--device", device]) == 0
    assert ": ok" in capsys.readouterr().out
