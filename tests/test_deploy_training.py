"""vitlab.deploy.training: the training step's kernels. The oneDNN Dense path computes the
model's function and its gradients (float rounding apart), the same bits on every call; autocast
and unchosen shapes keep the model's own ops; the fused optimiser is used where torch has it and
an old checkpoint resumes on the update it was trained with; a run on the oneDNN path resumes
bit-identically."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from test_train_loop import assert_identical, tiny
from vitlab.config import OptimConfig
from vitlab.deploy import kernels, training
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer
from vitlab.train.optim import build_optimizer, param_groups


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITLAB_DENSE_KERNEL", raising=False)
    monkeypatch.setattr(kernels, "_MADE", {})


def step(model, shapes, x, y):
    model.zero_grad(set_to_none=True)
    with training.dense_kernels(shapes):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_onednn_path_computes_the_same_gradients_every_time(monkeypatch):
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "oneDNN")
    model = tiny_model().train()
    shapes = training.chosen_shapes(model)
    d, m = model.config.hidden_size, model.config.mlp_dim
    assert shapes == sorted([[d, 3 * d], [d, d], [d, m], [m, d]])
    cfg = model.config
    x, y = torch.randn(4, cfg.in_channels, *cfg.image_size), torch.tensor([0, 1, 2, 0])
    plain_loss, plain = step(model, [], x, y)
    loss, grads = step(model, shapes, x, y)
    again_loss, again = step(model, shapes, x, y)
    assert torch.equal(loss, again_loss) and all(torch.equal(grads[k], again[k]) for k in grads)
    torch.testing.assert_close(loss, plain_loss)
    for k in plain:
        torch.testing.assert_close(grads[k], plain[k], rtol=1e-4, atol=1e-6)


def test_autocast_and_the_forced_model_kernel_leave_f_linear_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(training._OneDnnLinear, "apply", lambda *a: calls.append(a) or F.linear(*a))
    x, w = torch.randn(5, 8), torch.randn(16, 8)
    with training.dense_kernels([[8, 16]]), torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.linear(x, w).dtype == torch.bfloat16
    with training.dense_kernels([[8, 32]]):  # another shape
        F.linear(x, w)
    assert not calls
    with training.dense_kernels([[8, 16]]):
        F.linear(x, w)
    assert len(calls) == 1
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "F.linear")
    assert training.chosen_shapes(tiny_model()) == []


def test_adamw_is_fused_and_an_old_checkpoint_keeps_its_update():
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-3, weight_decay=0.05))
    assert all(g["fused"] for g in opt.param_groups)
    groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(model, 0.05)]
    old = torch.optim.AdamW(groups)  # torch's default: the update before issue 51
    assert not any(g["fused"] for g in old.param_groups)
    opt.load_state_dict(old.state_dict())  # a checkpoint from before: it resumes on torch's default
    assert not any(g["fused"] for g in opt.param_groups)


def test_a_run_on_the_onednn_path_resumes_bit_identically(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "oneDNN")
    Trainer(tiny(), tmp_path / "straight", Inputs(), quiet=True).run()
    real_log = Trainer._log_step

    def dies_at_step_7(self, run, step, *a):
        if step == 7:
            raise KeyboardInterrupt  # killed after the checkpoint of step 5
        return real_log(self, run, step, *a)

    monkeypatch.setattr(Trainer, "_log_step", dies_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(), tmp_path / "stopped", Inputs(), quiet=True).run()
    monkeypatch.setattr(Trainer, "_log_step", real_log)
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "F.linear")  # the resumed run keeps its checkpoint's kernels
    Trainer(tiny(), tmp_path / "stopped", Inputs(), quiet=True).run()
    assert_identical(tmp_path / "stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "straight" / "checkpoints" / "last.safetensors")
