"""bf16 and int8 serving copies (vitlab.deploy.copies), checked on real CIFAR-10 images.

What is checked: the int8 layer's arithmetic against a float computation of the same
rounded numbers; that the serving copies leave the model untouched; and that bf16 and int8
predict the same class as fp32 on 128 real CIFAR-10 test images for a ViT-C/4 with random
weights (a head initialised with Xavier so the logits are spread). Random weights make this
a check of the arithmetic, not of a trained model's robustness: with a trained model the
benchmarks measure it on all 10,000 test images.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab import deploy
from vitlab.data.transforms import eval_transform

CIFAR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10"


@pytest.fixture(scope="module")
def cifar_images() -> torch.Tensor:
    if not (CIFAR / "test-000000.tar.gz").exists():
        pytest.skip(f"real CIFAR-10 shards not found at {CIFAR}")
    from vitlab.data import open_dataset

    data = open_dataset(f"wds:{CIFAR}", "test", eval_transform(32))
    return torch.stack([x for x, _ in itertools.islice(iter(data), 128)])


def model(**overrides) -> vitlab.VisionTransformer:
    torch.manual_seed(0)
    return vitlab.create_model("ViT-C/4", head_init="xavier", **overrides).eval()


def test_int8_linear_is_the_rounded_product():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    q = deploy.Int8Linear(linear)
    x = torch.randn(2, 5, 64)
    # The same product in float64 from the rounded values: int32 accumulation is exact.
    x2 = x.reshape(-1, 64).double()
    sx = x2.abs().amax(1, keepdim=True) / 127
    want = (torch.round(x2 / sx) @ q.weight_int8.double().t()) * sx * q.weight_scale.double() + linear.bias.double()
    torch.testing.assert_close(q(x).double(), want.reshape(2, 5, 48), atol=1e-4, rtol=1e-5)
    # And close to the float layer: two int8 roundings cost about 1% of the output scale.
    ref = linear(x)
    assert (q(x) - ref).abs().max() < 0.03 * ref.abs().max()


def test_packed_fp32_is_the_same_function():
    if torch.float32 not in deploy.copies.onednn_dtypes():
        pytest.skip("this PyTorch build has no oneDNN")
    m = model(depth=2)
    packed = deploy.to_packed_fp32(m)
    assert isinstance(packed.model.blocks[0].mlp.fc1, deploy.PackedLinear)
    assert packed.model.blocks[0].mlp.fc1.activation == "gelu_tanh"  # the variant's GELU, fused
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), m(x), atol=1e-4, rtol=1e-4)
    exact = model(depth=2, gelu="exact")
    with torch.inference_mode():
        torch.testing.assert_close(deploy.to_packed_fp32(exact)(x), exact(x), atol=1e-4, rtol=1e-4)


def test_a_bf16_copy_is_packed_exactly_where_this_cpu_runs_onednn_in_bf16(monkeypatch):
    """oneDNN's bf16 kernel needs AVX-512 or AVX-NE-CONVERT; an AVX2-only CPU raises at the
    call. The copy asks the kernel (`onednn_dtypes`), packs where it runs (here forced, where
    it would otherwise pack only what timed faster) and stays plain elsewhere, and on both
    computes the model's function to bf16 rounding."""
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "oneDNN")
    m = model(depth=2)
    copy = deploy.to_bfloat16(m)
    packed = isinstance(copy.model.blocks[0].mlp.fc1, deploy.PackedLinear)
    assert packed == (torch.bfloat16 in deploy.copies.onednn_dtypes())
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        got, want = copy(x), m(x)
    assert got.dtype == torch.float32
    assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_serving_copies_leave_the_model_alone():
    m = model(depth=2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bf16, int8 = deploy.to_bfloat16(m), deploy.quantize_int8(m)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(isinstance(b.mlp.fc1, torch.nn.Linear) for b in m.blocks)
    assert all(isinstance(b.attn.qkv, deploy.Int8Linear) for b in int8.model.blocks)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    x = torch.randn(2, 3, 32, 32)
    assert bf16(x).dtype == torch.float32 and int8(x).shape == (2, 10)
    with pytest.raises(ValueError, match="not one of"):
        deploy.for_precision(m, "fp8")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_agrees_with_fp32_on_cifar(cifar_images, precision):
    m = model()
    result = deploy.agreement(m, deploy.for_precision(m, precision), cifar_images)
    assert result.count == 128
    assert result.top1 >= 0.95, str(result)
    # Logit errors small against the logits' own spread.
    with torch.inference_mode():
        spread = m(cifar_images).std().item()
    assert result.max_abs_diff < 0.25 * spread, str(result)


def test_agreement_notices_a_different_model(cifar_images):
    m = model()
    other = model()
    torch.manual_seed(1)
    other.reset_classifier(10, init="xavier")  # a different head: predictions must differ
    result = deploy.agreement(m, other, cifar_images)
    assert result.top1 < 0.5


# The inference copy: vitlab's CPU inference path (deploy.inference_copy) -------------------
PARITY = 1e-4  # the copy against the plain model: float32 rounding of another summation order


@pytest.mark.parametrize("dense", ["oneDNN", "F.linear", "auto"])
def test_the_inference_copy_is_the_plain_model_to_float32_rounding_on_real_images(cifar_images, monkeypatch, dense):
    """The default of Predictor, predict, serve, eval and the feature commands on a CPU: the
    fp32 copy whose Dense layers run the kernel timed fastest here (vitlab.deploy.kernels;
    oneDNN packed, or F.linear, forced here one by one, or measured); the same logits as the
    plain model within PARITY, deterministically (two calls give the same bits)."""
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", dense)
    m = model(depth=2)
    fast = deploy.inference_copy(m)
    d = m.config.hidden_size
    chosen = {c.what: c.kernel for c in deploy.kernels.choices()}[f"Dense float32 {d}x{3 * d}, {m.config.num_tokens} tokens"]
    packed = chosen == "oneDNN" and torch.float32 in deploy.onednn_dtypes()
    assert isinstance(fast.model.blocks[0].attn.qkv, deploy.PackedLinear) == packed and fast is not m
    assert deploy.inference_copy(m, plain=True) is m
    x = cifar_images[:16]
    with torch.inference_mode():
        got, want = fast(x), m(x)
        assert torch.equal(got, fast(x))
    torch.testing.assert_close(got, want, atol=PARITY, rtol=PARITY)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_inference_copy_refuses_plain_with_another_precision_and_export():
    m = model(depth=2)
    with pytest.raises(vitlab.config.ConfigError, match=r"drop plain \(--plain\) to run bf16"):
        deploy.inference_copy(m, "bf16", plain=True)
    fast = deploy.inference_copy(m)
    if not hasattr(fast, "serving"):
        pytest.skip("no oneDNN here: the copy is the plain model")
    refusals = ((deploy.export_program, "export the model itself"),
                (lambda c: deploy.export_onnx(c, "never.onnx"), "export the fp32 model"))
    for export, fix in refusals:
        with pytest.raises(ValueError, match=r"inference copy|serving copy") as e:
            export(fast)
        assert len(str(e.value).splitlines()) == 1 and fix in str(e.value) and "(fp32-auto)" in str(e.value)


def test_the_attention_kernel_is_the_constructor_s_whatever_the_input_dtype(monkeypatch):
    """No kernel is chosen by the dtype at forward time: a model built with the default runs
    the fused kernel in bf16 too, and one built with "explicit" never calls it."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    m, x = model(depth=2), torch.randn(2, 3, 32, 32)
    explicit = vitlab.VisionTransformer(m.config, cpu_attention="explicit").eval()
    with torch.inference_mode():
        m.to(torch.bfloat16)(x.bfloat16())
        assert len(calls) == 2  # one per block
        explicit(x), explicit.to(torch.bfloat16)(x.bfloat16())
    assert len(calls) == 2


def test_a_bf16_copy_takes_the_attention_kernel_this_cpu_runs_faster_and_the_same_function(monkeypatch):
    """The fused kernel or the explicit matmul-softmax path, timed when the copy is built
    (vitlab.deploy.kernels: fused wins with AMX, loses on AVX-512 without it) and built into it
    (the model's constructor takes it); both compute the model's attention."""
    m = model(depth=2)
    fast = deploy.inference_copy(m, "bf16")
    attn = [b.attn.cpu_attention for b in fast.model.blocks]
    assert len(set(attn)) == 1 and attn[0] in deploy.kernels.ATTENTION
    assert {b.attn.cpu_attention for b in m.blocks} == {"fused"}  # the model keeps its own
    x = torch.randn(4, 3, 32, 32)
    out = {}
    with torch.inference_mode():
        want = m(x)
        for kernel in deploy.kernels.ATTENTION:  # each forced, as $VITLAB_ATTENTION_KERNEL does
            monkeypatch.setenv("VITLAB_ATTENTION_KERNEL", kernel)
            forced = deploy.inference_copy(m, "bf16")
            assert {b.attn.cpu_attention for b in forced.model.blocks} == {kernel}
            out[kernel] = forced(x)
    for got in out.values():
        assert (got - want).abs().max() < 0.05 * want.abs().max()




def test_every_copy_gives_the_models_features():
    """eval.features reads a copy's pre-logits through the model's API (forward_features,
    forward_head), as `vitlab fewshot` and `linear-probe` run on the inference copy."""
    m = model(depth=2)
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        want = m.forward_head(m.forward_features(x), pre_logits=True)
        for precision in ("fp32", "fp32-packed", "bf16", "int8"):
            copy = deploy.inference_copy(m, precision)
            got = copy.forward_head(copy.forward_features(x), pre_logits=True)
            assert got.dtype == torch.float32 and got.shape == want.shape, precision
            assert (got - want).abs().max() < (1e-4 if precision.startswith("fp32") else 0.1) * want.abs().max(), precision
