"""vitlab.deploy.training: the training step's kernels. The oneDNN Dense path computes the
model's function and its gradients (float rounding apart), the same bits on every call; autocast
and unchosen shapes keep the model's own ops; the fused optimiser is used where torch has it and
an old checkpoint resumes on the update it was trained with; a run on the oneDNN path resumes
bit-identically. The compiled tanh GELU computes F.gelu's function and gradient (rounding apart),
the same bits every call; a run with it resumes bit-identically and an older checkpoint resumes on
the eager GELU. kept_heap reuses freed memory and changes no number. Under bf16 autocast the
packed forward products compute autocast's function and gradients (rounding apart; the same bits
on the CPUs measured), the same bits every call, only past the size gates; a bf16 run on them
resumes bit-identically and an older checkpoint resumes on autocast's products."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
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


def step(model, shapes, x, y, packed=False):
    model.zero_grad(set_to_none=True)
    with training.dense_kernels(shapes, packed):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}



def killed_at_step_7(monkeypatch, out, **sections):
    """A tiny run (`tiny(**sections)`) into `out`, killed at step 7 (after the checkpoint of step 5)."""
    real_log = Trainer._log_step

    def dies_at_step_7(self, run, step, *a):
        if step == 7:
            raise KeyboardInterrupt
        return real_log(self, run, step, *a)

    monkeypatch.setattr(Trainer, "_log_step", dies_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(**sections), out, Inputs(), quiet=True).run()
    monkeypatch.setattr(Trainer, "_log_step", real_log)

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
    monkeypatch.setattr(training, "PACKED_MIN_ROWS", 1)  # on packed weights: the same function, the same bits every call
    packed_loss, packed = step(model, shapes, x, y, packed=True)
    again_loss, again = step(model, shapes, x, y, packed=True)
    assert torch.equal(packed_loss, again_loss) and all(torch.equal(packed[k], again[k]) for k in grads)
    torch.testing.assert_close(packed_loss, loss)
    for k in plain:
        torch.testing.assert_close(packed[k], grads[k], rtol=1e-4, atol=1e-6)


def test_autocast_and_the_forced_model_kernel_leave_f_linear_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(training._OneDnnLinear, "apply", lambda *a: calls.append(a) or F.linear(*a[:3]))
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
    monkeypatch.setattr(training, "PACKED_MIN_ELEMENTS", 1)  # on packed weights too
    monkeypatch.setattr(training, "PACKED_MIN_ROWS", 1)
    Trainer(tiny(), tmp_path / "straight", Inputs(), quiet=True).run()
    killed_at_step_7(monkeypatch, tmp_path / "stopped")
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "F.linear")  # the resumed run keeps its checkpoint's kernels
    Trainer(tiny(), tmp_path / "stopped", Inputs(), quiet=True).run()
    assert_identical(tmp_path / "stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "straight" / "checkpoints" / "last.safetensors")


def _page_faults(fn) -> int:
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(training._glibc() is None, reason="glibc's mallopt only")
def test_kept_heap_reuses_a_freed_large_tensor():
    def twice():  # 64 MiB: over glibc's mmap threshold, so outside kept_heap each one faults in 16,384 fresh pages
        for _ in range(2):
            torch.ones(16 << 20)
    with training.kept_heap():
        twice()  # the heap grows
        inside = [_page_faults(twice) for _ in range(3)]
    assert min(inside) < 1_000, inside  # reused


def test_kept_heap_puts_glibc_s_settings_back_and_gives_the_memory_back_when_asked(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))

        def malloc_trim(self, pad):
            calls.append(("trim", pad))

    monkeypatch.setattr(training, "_glibc", Libc)
    with training.kept_heap():
        assert calls == [(-4, 0), (-1, 2**31 - 1)]  # no mmap, no trim
    assert calls[2:] == [*training._GLIBC_AFTER, ("trim", 0)]
    calls.clear()
    with training.kept_heap(release=False):
        pass
    assert calls[2:] == list(training._GLIBC_AFTER)
    calls.clear()
    with training.kept_heap(enabled=False):
        pass
    assert not calls


def test_kept_heap_leaves_the_step_s_numbers_alone():
    model = tiny_model().train()
    cfg = model.config
    x, y = torch.randn(4, cfg.in_channels, *cfg.image_size), torch.tensor([0, 1, 2, 0])
    plain_loss, plain = step(model, [], x, y)
    with training.kept_heap():
        loss, grads = step(model, [], x, y)
    assert torch.equal(loss, plain_loss) and all(torch.equal(grads[k], plain[k]) for k in plain)


def _gelu_and_grad(y, g, **kwargs):
    y = y.clone().requires_grad_()
    h = F.gelu(y, **kwargs)
    h.backward(g)
    return h.detach(), y.grad, h.grad_fn


def test_the_compiled_gelu_is_the_tanh_gelu_the_same_bits_every_call(monkeypatch):
    monkeypatch.setattr(training, "GELU_MIN_ELEMENTS", 1)
    y, g = torch.randn(4, 17, 64) * 3, torch.randn(4, 17, 64)
    plain, plain_grad, _ = _gelu_and_grad(y, g, approximate="tanh")
    with training.fast_gelu():
        h, grad, fn = _gelu_and_grad(y, g, approximate="tanh")
        again, again_grad, _ = _gelu_and_grad(y, g, approximate="tanh")
        _, _, exact_fn = _gelu_and_grad(y, g)  # the exact (erf) GELU keeps its own kernel
    assert not training._EAGER_GELU and "GeluTanh" in type(fn).__name__ and "GeluTanh" not in type(exact_fn).__name__
    assert torch.equal(h, again) and torch.equal(grad, again_grad)
    torch.testing.assert_close(h, plain)
    torch.testing.assert_close(grad, plain_grad, rtol=1e-5, atol=1e-5)
    big = training.GELU_MIN_ELEMENTS
    assert training.gelu_for_run(None, True, big) and not training.gelu_for_run(None, False, big)  # (a GPU or compiled run)
    assert not training.gelu_for_run(None, True, big - 1)  # a small model: no mode on every operator
    assert not training.gelu_for_run({}, True, big) and training.gelu_for_run({"compiled_gelu": True}, True, 0)  # resumed as it ran
    monkeypatch.setenv("VITLAB_COMPILED_GELU", "0")
    assert not training.gelu_for_run(None, True, big)


def test_the_compiled_gelu_is_sized_by_the_models_largest_tanh_activation():
    tanh = vitlab.create_model("ViT-S/16", num_classes=10)
    assert training.gelu_elements(tanh, 32) == 32 * 197 * 1536
    assert training.gelu_elements(vitlab.create_model("ViT-S/16", num_classes=10, gelu="exact"), 32) == 0
    tiny = vitlab.create_model("ViT-Ti/4", hidden_size=64, depth=4, num_heads=4, mlp_dim=128, image_size=16, num_classes=10)
    assert training.gelu_elements(tiny, 128) == 128 * 17 * 128 < training.GELU_MIN_ELEMENTS  # the README's model runs eager


def test_a_run_with_the_compiled_gelu_resumes_bit_identically_and_an_old_one_stays_eager(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "GELU_MIN_ELEMENTS", 1)
    calls = []
    real = training._GeluTanh.apply
    monkeypatch.setattr(training._GeluTanh, "apply", lambda *a: calls.append(1) or real(*a))
    Trainer(tiny(), tmp_path / "straight", Inputs(), quiet=True).run()
    assert calls and not training._EAGER_GELU
    killed_at_step_7(monkeypatch, tmp_path / "stopped")
    Trainer(tiny(), tmp_path / "stopped", Inputs(), quiet=True).run()
    assert_identical(tmp_path / "stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "straight" / "checkpoints" / "last.safetensors")
    # a run on the eager GELU (as one from before the compiled GELU, whose checkpoints say nothing)
    monkeypatch.setenv("VITLAB_COMPILED_GELU", "0")
    Trainer(tiny(), tmp_path / "eager", Inputs(), quiet=True).run()
    killed_at_step_7(monkeypatch, tmp_path / "eager-stopped")
    monkeypatch.delenv("VITLAB_COMPILED_GELU")
    calls.clear()
    Trainer(tiny(), tmp_path / "eager-stopped", Inputs(), quiet=True).run()  # resumed where the compiled GELU is on
    assert not calls
    assert_identical(tmp_path / "eager-stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "eager" / "checkpoints" / "last.safetensors")


def _bf16_step(model, x, y, packed):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), training.dense_kernels([], packed):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.skipif(torch.bfloat16 not in training.onednn.onednn_dtypes(), reason="oneDNN without bf16 on this CPU")
def test_the_packed_bf16_products_are_autocast_s_the_same_bits_every_call(monkeypatch):
    model = tiny_model(hidden_size=64, mlp_dim=128).train()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, model.config.num_classes, (8,))  # 8 images x 17 tokens: 136 rows
    calls = []
    real = training._OneDnnLinear.apply
    monkeypatch.setattr(training._OneDnnLinear, "apply", lambda *a: calls.append(a[0].shape[:-1].numel()) or real(*a))
    plain_loss, plain = _bf16_step(model, x, y, False)
    _bf16_step(model, x, y, True)
    assert not calls  # under PACKED_MIN_ROWS: autocast's own products
    monkeypatch.setattr(training, "PACKED_MIN_ROWS", 100)
    loss, grads = _bf16_step(model, x, y, True)
    again_loss, again = _bf16_step(model, x, y, True)
    # per step: the patch embedding, the first block's 4 Dense layers and the last block's qkv; not the
    # last block's others nor the head (the class token alone: 8 rows)
    assert len(calls) == 2 * 6 and set(calls) == {8 * 16, 8 * 17}
    assert torch.equal(loss, again_loss) and all(torch.equal(grads[k], again[k]) for k in plain)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-2, atol=1e-2)
    for k in plain:
        assert grads[k].dtype == torch.float32 and grads[k].stride() == plain[k].stride()
        torch.testing.assert_close(grads[k], plain[k], rtol=2e-2, atol=2e-3)
    calls.clear()
    with training.dense_kernels([], packed=True):
        F.cross_entropy(model(x), y).backward()  # fp32 without chosen shapes: the model's own ops
    assert not calls


def test_the_packed_bf16_products_are_gated_by_the_model_s_size_and_the_checkpoint(monkeypatch):
    assert training.dense_elements(vitlab.create_model("ViT-S/16", num_classes=10, gelu="exact"), 32) == 32 * 197 * 1536
    tiny = vitlab.create_model("ViT-Ti/4", hidden_size=64, depth=4, num_heads=4, mlp_dim=128, image_size=16, num_classes=10)
    assert training.dense_elements(tiny, 128) == 128 * 17 * 128 < training.PACKED_MIN_ELEMENTS  # the README's model: no mode
    assert training.dense_elements(torch.nn.Linear(4, 4), 32) == 0
    big = training.PACKED_MIN_ELEMENTS
    bf16 = torch.bfloat16
    monkeypatch.setattr(training.onednn, "onednn_dtypes", lambda: frozenset({torch.float32, bf16}))
    assert training.packed_for_run(None, True, big, bf16) and not training.packed_for_run(None, False, big, bf16)  # (a GPU, compiled)
    assert not training.packed_for_run(None, True, big - 1, bf16)
    assert not training.packed_for_run({}, True, big, bf16)  # resumed as it ran
    assert training.packed_for_run({"packed_dense": True}, False, 0, bf16)
    monkeypatch.setenv("VITLAB_PACKED_DENSE", "0")
    assert not training.packed_for_run(None, True, big, bf16)
    monkeypatch.delenv("VITLAB_PACKED_DENSE")
    monkeypatch.setattr(training.onednn, "onednn_dtypes", lambda: frozenset({torch.float32}))  # an AVX2-only CPU
    assert not training.packed_for_run(None, True, big, bf16) and training.packed_for_run(None, True, big, torch.float32)


@pytest.mark.skipif(torch.bfloat16 not in training.onednn.onednn_dtypes(), reason="oneDNN without bf16 on this CPU")
def test_a_bf16_run_on_packed_products_resumes_bit_identically_and_an_old_one_stays_on_autocast_s(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "PACKED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(training, "PACKED_MIN_ROWS", 1)
    calls = []
    real = training._OneDnnLinear.apply
    monkeypatch.setattr(training._OneDnnLinear, "apply", lambda *a: calls.append(1) or real(*a))
    bf16 = {"train": {"precision": "bf16"}}
    Trainer(tiny(**bf16), tmp_path / "straight", Inputs(), quiet=True).run()
    assert calls
    killed_at_step_7(monkeypatch, tmp_path / "stopped", **bf16)
    Trainer(tiny(**bf16), tmp_path / "stopped", Inputs(), quiet=True).run()
    assert_identical(tmp_path / "stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "straight" / "checkpoints" / "last.safetensors")
    # a run on autocast's products (as one from before this choice, whose checkpoints say nothing)
    monkeypatch.setenv("VITLAB_PACKED_DENSE", "0")
    Trainer(tiny(**bf16), tmp_path / "plain", Inputs(), quiet=True).run()
    killed_at_step_7(monkeypatch, tmp_path / "plain-stopped", **bf16)
    monkeypatch.delenv("VITLAB_PACKED_DENSE")
    calls.clear()
    Trainer(tiny(**bf16), tmp_path / "plain-stopped", Inputs(), quiet=True).run()  # resumed where packing is on
    assert not calls
    assert_identical(tmp_path / "plain-stopped" / "checkpoints" / "last.safetensors",
                     tmp_path / "plain" / "checkpoints" / "last.safetensors")
