"""Masked patch prediction (§4.6, Appendix B.1.2): corruption, targets, loss, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitlab
from conftest import tiny_config
from vitlab.analysis.mpp import head_from_extras
from vitlab.checkpoints import io
from vitlab.config import ConfigError, MPPConfig, ResNetConfig, ViTConfig
from vitlab.data import masking
from vitlab.data.masking import MASKED, RANDOM, UNCHANGED, UNTOUCHED, draw_corruption, draw_others
from vitlab.models.mpp import apply_corruption, dequantise_colors, patch_targets, quantise_colors, unnormalise
from vitlab.train.objectives import MaskedPatchPrediction


def tiny(**kw) -> ViTConfig:
    return tiny_config(**{"num_classes": 0, **kw})


def within_binomial(hits: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


# Corruption rates --------------------------------------------------------------------------
@pytest.mark.parametrize("rate,fm,fr", [(0.5, 0.8, 0.1), (0.15, 0.6, 0.3)])
def test_corruption_rates_match_within_sampling_error(rate, fm, fr):
    b, n = 4000, 64
    gen = torch.Generator().manual_seed(1)
    kind = draw_corruption(b, n, rate, fm, fr, generator=gen)
    selected = kind != UNTOUCHED
    k = int(rate * n + 0.5)
    # Exactly k patches per image, and every position equally likely to be picked.
    assert (selected.sum(1) == k).all()
    per_position = selected.sum(0)
    assert all(within_binomial(int(c), b, k / n) for c in per_position)
    # Among the selected, the 80/10/10 split (here: fm / fr / rest) within sampling error.
    m = int(selected.sum())
    for code, p in ((MASKED, fm), (RANDOM, fr), (UNCHANGED, 1 - fm - fr)):
        assert within_binomial(int((kind == code).sum()), m, p), (code, int((kind == code).sum()), m * p)


def test_random_source_is_another_patch_of_the_batch():
    gen = torch.Generator().manual_seed(0)
    kind = draw_corruption(8, 16, generator=gen)
    src = draw_others(kind, generator=gen).reshape(-1)
    assert (src != torch.arange(src.numel())).all()
    assert src.min() >= 0 and src.max() < src.numel()
    # Other images of the batch are reachable, not just the same image.
    assert ((src // 16) != (torch.arange(src.numel()) // 16)).any()


def test_the_drawn_corruption_replaces_exactly_what_kind_says():
    """The data draws (kind, sources); the model's gather puts the [mask] embedding, another
    patch's embedding or the patch's own where `kind` says, and the gradient reaches each."""
    b, n, d = 6, 20, 5
    x = torch.randn(b, n, d, requires_grad=True)
    token = torch.randn(d, requires_grad=True)
    kind, src = masking.draw(MPPConfig(), torch.zeros(b, 3, 4 * 4, 4 * 5), 4, torch.Generator().manual_seed(3))
    again = torch.Generator().manual_seed(3)  # the same stream, step by step: draw's RANDOM rows
    assert torch.equal(draw_corruption(b, n, generator=again), kind) and src.shape == (b, n)
    other = draw_others(kind, generator=again)
    out = apply_corruption(x, src, token)
    flat = x.reshape(b * n, d)
    for i in range(b):
        for j in range(n):
            want = {MASKED: token, RANDOM: flat[other[i, j]]}.get(int(kind[i, j]), x[i, j])
            assert torch.equal(out[i, j], want)
    assert (kind == RANDOM).any() and (kind == UNCHANGED).any() and (kind == MASKED).any()
    out.sum().backward()
    assert float(token.grad.sum()) == pytest.approx(float((kind == MASKED).sum()) * d)


# Targets -------------------------------------------------------------------------------------
def test_target_of_a_patch_of_known_colour_is_its_class_of_512():
    cfg = tiny()
    p = cfg.patch_size
    levels = torch.tensor([[7, 0, 4], [0, 0, 0], [7, 7, 7], [3, 5, 1]])  # per patch, 3 bits each
    expected = levels[:, 0] * 64 + levels[:, 1] * 8 + levels[:, 2]  # r*64 + g*8 + b
    pixels = torch.zeros(1, 3, 2 * p, 2 * p)
    for idx, q in enumerate(levels):
        r, c = divmod(idx, 2)
        # Colours inside the bin, not at its centre: floor(mean * 8) must still land on q.
        colour = (q.float() + 0.3) / 8
        pixels[0, :, r * p : (r + 1) * p, c * p : (c + 1) * p] = colour.view(3, 1, 1)
    # The model sees normalised pixels; the target must undo the normalisation.
    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    images = (pixels - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    target = patch_targets(unnormalise(images, mean, std), p, MPPConfig())
    assert target.tolist() == [expected.tolist()]
    assert int(quantise_colors(torch.tensor([1.0, 0.0, 0.5]))) == 7 * 64 + 0 * 8 + 4  # 1.0 clips to 7
    assert torch.allclose(dequantise_colors(expected), (levels.float() + 0.5) / 8)


def test_color_grid_and_pixel_targets_follow_the_patch_layout():
    p = 8
    pixels = torch.rand(2, 3, 16, 16)
    grid = patch_targets(pixels, p, MPPConfig(target="color_grid"))  # (B, N, 16)
    assert grid.shape == (2, 4, 16)
    # Patch 1 is row 0, column 1; its cell (1, 2) covers pixels rows 2:4, cols 8+4:8+6.
    cell = pixels[0, :, 2:4, 12:14].mean(dim=(1, 2))
    assert int(grid[0, 1, 1 * 4 + 2]) == int(quantise_colors(cell))
    flat = patch_targets(pixels, p, MPPConfig(target="pixels"))  # (B, N, P*P*C)
    assert flat.shape == (2, 4, p * p * 3)
    patch3 = pixels[1, :, 8:16, 8:16].permute(1, 2, 0).reshape(-1)  # (P, P, C) order
    assert torch.equal(flat[1, 3], patch3)


# Loss and objective ---------------------------------------------------------------------------
def captured_head_output(obj: MaskedPatchPrediction, images: torch.Tensor, seed: int):
    outs = []

    def keep(module, inputs, out):
        out.retain_grad()
        outs.append(out)

    hook = obj.mpp.head.register_forward_hook(keep)
    loss, metrics = obj(images, generator=torch.Generator().manual_seed(seed))
    hook.remove()
    loss.backward()
    return loss, metrics, outs[0]


def test_loss_counts_only_corrupted_patches_including_unchanged_ones():
    torch.manual_seed(0)
    obj = MaskedPatchPrediction(vitlab.create_model(tiny()))
    torch.nn.init.normal_(obj.mpp.head.weight, std=0.1)
    images = torch.randn(16, 3, 16, 16)
    loss, metrics, pred = captured_head_output(obj, images, seed=5)
    kind = masking.draw(obj.cfg, images, 4, torch.Generator().manual_seed(5))[0]
    touched = pred.grad.abs().sum(-1) > 0  # (B, N): patches whose prediction enters the loss
    assert torch.equal(touched, kind != UNTOUCHED)
    assert touched[kind == UNCHANGED].all() and (kind == UNCHANGED).any()
    # And the loss is exactly the mean cross-entropy over those patches.
    target = patch_targets(unnormalise(images, obj.model.config.mean, obj.model.config.std), 4, obj.cfg)
    sel = kind != UNTOUCHED
    manual = torch.nn.functional.cross_entropy(pred[sel].detach(), target[sel])
    assert torch.allclose(loss.detach(), manual)
    assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_first_loss_is_uniform_over_512_classes():
    obj = MaskedPatchPrediction(vitlab.create_model(tiny()))
    loss, _ = obj(torch.randn(4, 3, 16, 16))
    assert abs(loss.item() - math.log(512)) < 1e-5


@pytest.mark.parametrize("target", ["mean_color", "color_grid", "pixels"])
def test_three_target_kinds_run_forward_and_backward(target):
    torch.manual_seed(0)
    obj = MaskedPatchPrediction(vitlab.create_model(tiny(classifier="gap")), MPPConfig(target=target))
    torch.nn.init.normal_(obj.mpp.head.weight, std=0.1)
    opt = torch.optim.Adam(obj.parameters(), lr=1e-3)
    images = torch.rand(8, 3, 16, 16) * 2 - 1
    first, _ = obj(images, generator=torch.Generator().manual_seed(1))
    first.backward()
    for name, p in obj.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    opt.step()
    opt.zero_grad()
    after, _ = obj(images, generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(after) and after.item() < first.item()
    assert obj.mpp.head.out_features == {"mean_color": 512, "color_grid": 16 * 512, "pixels": 48}[target]


def test_eval_is_repeatable_and_leaves_the_global_generator_alone():
    torch.manual_seed(0)
    obj = MaskedPatchPrediction(vitlab.create_model(tiny()))
    torch.nn.init.normal_(obj.mpp.head.weight, std=0.1)
    images = torch.randn(4, 3, 16, 16)
    state = torch.get_rng_state()
    a, b = obj.eval_step(images), obj.eval_step(images)
    assert all(torch.equal(a[k], b[k]) for k in a) and int(a["count"]) == 4
    assert torch.equal(torch.get_rng_state(), state)
    # Summed over two batches, the metrics are per corrupted patch.
    sums = {k: a[k] + b[k] for k in a}
    result = obj.finish_eval(sums)
    assert result["count"] == 8 and 0 <= result["color_acc"] <= 1
    loss, _ = obj(images, generator=torch.Generator().manual_seed(0))
    assert result["loss"] == pytest.approx(loss.item(), rel=1e-6)


def test_training_draws_masks_from_the_global_generator():
    obj = MaskedPatchPrediction(vitlab.create_model(tiny()))
    torch.nn.init.normal_(obj.mpp.head.weight, std=0.1)
    images = torch.randn(4, 3, 16, 16)
    torch.manual_seed(7)
    a, _ = obj(images)
    b, _ = obj(images)
    torch.manual_seed(7)
    c, _ = obj(images)
    assert a.item() != b.item() and a.item() == c.item()


# Configuration and refusals -------------------------------------------------------------------
def test_hybrids_are_refused_with_the_reason():
    hybrid = tiny(patch_size=1, resnet=ResNetConfig(layers=(1,), gn_groups=8), image_size=16)
    with pytest.raises(ConfigError, match="hybrid"):
        MaskedPatchPrediction(vitlab.create_model(hybrid))


def test_bad_options_name_the_fix():
    with pytest.raises(ConfigError, match="exceeds 1"):
        MPPConfig(mask_token_frac=0.8, random_patch_frac=0.3)
    with pytest.raises(ConfigError, match="mask_rate"):
        MPPConfig(mask_rate=0.0)
    with pytest.raises(ConfigError, match="target"):
        MPPConfig(target="mean_colour")
    with pytest.raises(ConfigError, match="divisible by objective.grid"):
        MaskedPatchPrediction(vitlab.create_model(tiny(patch_size=2, image_size=16)), MPPConfig(target="color_grid"))


# Checkpoints and fine-tuning --------------------------------------------------------------------
def test_checkpoint_keeps_extras_and_finetuning_drops_the_head(tmp_path):
    torch.manual_seed(0)
    obj = MaskedPatchPrediction(vitlab.create_model(tiny(num_classes=10)), MPPConfig(mask_rate=0.4, target="color_grid"))
    assert obj.model.config.num_classes == 0
    torch.nn.init.normal_(obj.mpp.head.weight)
    path = tmp_path / "mpp.safetensors"
    io.write(obj.model, path, extra_tensors=obj.extra_tensors(), extra_metadata=obj.checkpoint_metadata())

    imported = vitlab.checkpoints.read_checkpoint(path)
    back = head_from_extras(vitlab.load(path), imported.metadata, imported.extras)
    assert back.cfg == obj.cfg
    for k, v in obj.extra_tensors().items():
        assert torch.equal(back.extra_tensors()[k], v)

    model = vitlab.load(path, num_classes=10)  # the fine-tuning path
    assert not any(k.startswith((io.EXTRA_PREFIX, "objective")) for k in model.state_dict())
    assert model.head.out_features == 10 and torch.count_nonzero(model.head.weight) == 0
    for k, v in obj.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(model(x), torch.zeros(2, 10))

    # Few-shot reads the representation of the head-less backbone.
    backbone = vitlab.load(path)
    feats = backbone.forward_head(backbone.forward_features(x), pre_logits=True)
    assert feats.shape == (2, 32) and torch.allclose(backbone(x), feats, atol=1e-6)


def test_mpp_head_refuses_a_supervised_checkpoint(tmp_path):
    path = tmp_path / "sup.safetensors"
    vitlab.save(vitlab.create_model(tiny(num_classes=3)), path)
    imported = vitlab.checkpoints.read_checkpoint(path)
    with pytest.raises(io.CheckpointError, match="not a masked-patch-prediction checkpoint"):
        head_from_extras(vitlab.load(path), imported.metadata, imported.extras)


# The inspect figure ---------------------------------------------------------------------------
def test_inspect_figure_of_an_mpp_checkpoint(tmp_path):
    pytest.importorskip("matplotlib")
    from vitlab import checkpoints
    from vitlab.analysis import objective_figures
    from vitlab.analysis.mpp import mpp_predictions

    torch.manual_seed(0)
    obj = MaskedPatchPrediction(vitlab.create_model(tiny()))
    torch.nn.init.normal_(obj.mpp.head.weight, std=0.1)
    path = tmp_path / "mpp.safetensors"
    io.write(obj.model, path, extra_tensors=obj.extra_tensors(), extra_metadata=obj.checkpoint_metadata())
    imported = checkpoints.read_checkpoint(path)
    model = checkpoints.build_model(imported, str(path))
    images = torch.rand(3, 3, 16, 16) * 2 - 1

    figures = objective_figures(model, imported.metadata, imported.extras, images, tmp_path / "out")
    assert [f.name for f in figures] == ["mpp"] and figures[0].png.stat().st_size > 1000
    numbers = figures[0].numbers
    # Same seed as eval_step: the figure's accuracy is the objective's own eval accuracy.
    assert numbers["color_accuracy"] == pytest.approx(obj.finish_eval(obj.eval_step(images))["color_acc"])
    assert numbers["corrupted_patches"] == 3 * 8

    # True colours are the bin centres of each patch's quantised mean colour.
    result = mpp_predictions(obj.model, obj.mpp, images)
    pixels = unnormalise(images, obj.model.config.mean, obj.model.config.std)
    centre = dequantise_colors(patch_targets(pixels, 4, obj.cfg), 3, 3)  # (B, N, 3)
    assert np.allclose(result.true.reshape(3, 16, 3), centre.numpy())

    # A supervised checkpoint gets no extra figure.
    assert objective_figures(model, {"objective": "supervised"}, {}, images, tmp_path / "out2") == []
