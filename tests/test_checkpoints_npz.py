"""Official .npz checkpoints: vitlab must compute what the official implementation computes.

JAX is not installed, so the reference is an independent NumPy forward pass written from
../shared/docs/official-checkpoints.md, reading the arrays by their official names. The
checkpoints are small random ones built here in the official layout (both block spellings,
old (1, 1, 1, C) GroupNorm shapes), with biases and norm parameters away from their
initial values so that a dropped or misplaced parameter shows in the logits.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from vitlab.checkpoints import npz
from vitlab.checkpoints.io import CheckpointError

SPELLINGS = {
    "original": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "linen": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}


# An official checkpoint, from scratch ----------------------------------------------------
def official_arrays(
    rng,
    *,
    width=64,
    depth=2,
    heads=4,
    mlp=128,
    patch=8,
    image=32,
    classes=10,
    token=True,
    representation=None,
    resnet=None,
    spelling="original",
    old_gn_shape=False,
) -> dict[str, np.ndarray]:
    f32 = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    a: dict[str, np.ndarray] = {}

    def norm(prefix, c, gn=False):
        shape = (1, 1, 1, c) if (gn and old_gn_shape) else (c,)
        a[prefix + "/scale"] = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        a[prefix + "/bias"] = f32(*shape, scale=0.2)

    cin = 3
    stride = patch
    if resnet is not None:
        w0 = 64
        a["conv_root/kernel"] = f32(7, 7, 3, w0, scale=0.1)
        norm("gn_root", w0, gn=True)
        c = w0
        for s, units in enumerate(resnet):
            mid = w0 * 2**s
            for u in range(units):
                p = f"block{s + 1}/unit{u + 1}/"
                a[p + "conv1/kernel"] = f32(1, 1, c, mid, scale=0.1)
                a[p + "conv2/kernel"] = f32(3, 3, mid, mid, scale=0.1)
                a[p + "conv3/kernel"] = f32(1, 1, mid, 4 * mid, scale=0.1)
                for n, ch in (("gn1", mid), ("gn2", mid), ("gn3", 4 * mid)):
                    norm(p + n, ch, gn=True)
                if u == 0:
                    a[p + "conv_proj/kernel"] = f32(1, 1, c, 4 * mid, scale=0.1)
                    norm(p + "gn_proj", 4 * mid, gn=True)
                c = 4 * mid
        cin = c
        stride = patch * 4 * 2 ** max(len(resnet) - 1, 0)  # the root alone (no stages): /4
    a["embedding/kernel"] = f32(patch, patch, cin, width, scale=1 / math.sqrt(patch * patch * cin))
    a["embedding/bias"] = f32(width, scale=0.1)
    n = (image // stride) ** 2
    if token:
        a["cls"] = f32(1, 1, width, scale=0.1)
    a["Transformer/posembed_input/pos_embedding"] = f32(1, n + int(token), width, scale=0.1)
    ln1, mha, ln2, mb = SPELLINGS[spelling]
    dh = width // heads
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        norm(b + ln1, width)
        norm(b + ln2, width)
        for name in ("query", "key", "value"):
            a[f"{b}{mha}/{name}/kernel"] = f32(width, heads, dh, scale=1 / math.sqrt(width))
            a[f"{b}{mha}/{name}/bias"] = f32(heads, dh, scale=0.1)
        a[f"{b}{mha}/out/kernel"] = f32(heads, dh, width, scale=1 / math.sqrt(width))
        a[f"{b}{mha}/out/bias"] = f32(width, scale=0.1)
        a[f"{b}{mb}/Dense_0/kernel"] = f32(width, mlp, scale=1 / math.sqrt(width))
        a[f"{b}{mb}/Dense_0/bias"] = f32(mlp, scale=0.1)
        a[f"{b}{mb}/Dense_1/kernel"] = f32(mlp, width, scale=1 / math.sqrt(mlp))
        a[f"{b}{mb}/Dense_1/bias"] = f32(width, scale=0.1)
    norm("Transformer/encoder_norm", width)
    feat = width
    if representation:
        a["pre_logits/kernel"] = f32(width, representation, scale=1 / math.sqrt(width))
        a["pre_logits/bias"] = f32(representation, scale=0.1)
        feat = representation
    if classes:
        a["head/kernel"] = f32(feat, classes, scale=1 / math.sqrt(feat))
        a["head/bias"] = f32(classes, scale=0.1)
    return a


# The official forward pass in NumPy (float64) --------------------------------------------
def same_pad(x, k, s, value=0.0):
    """TF "SAME": out = ceil(in / s); the odd pixel of padding goes after."""
    pads = []
    for size in x.shape[1:3]:
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, [(0, 0), pads[0], pads[1], (0, 0)], constant_values=value)


def conv(x, kernel, stride, padding):
    """NHWC x HWIO, computed as a sum of shifted matrix products."""
    kh, kw, _, cout = kernel.shape
    if padding == "SAME":
        x = same_pad(x, kh, stride)
    ho = (x.shape[1] - kh) // stride + 1
    wo = (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], ho, wo, cout))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride]
            out += patch @ kernel[i, j]
    return out


def std_conv(x, kernel, stride):
    k = kernel.astype(np.float64)
    mean = k.mean(axis=(0, 1, 2), keepdims=True)
    std = k.std(axis=(0, 1, 2), keepdims=True)  # population std, eps added to it
    return conv(x, (k - mean) / (std + 1e-5), stride, "SAME")


def group_norm(x, a, prefix, groups=32):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    x = ((g - mean) / np.sqrt(var + 1e-6)).reshape(b, h, w, c)
    return x * a[prefix + "/scale"].reshape(-1) + a[prefix + "/bias"].reshape(-1)


def max_pool_same(x, k=3, s=2):
    x = same_pad(x, k, s, value=-np.inf)
    ho, wo = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
    out = np.full((x.shape[0], ho, wo, x.shape[3]), -np.inf)
    for i in range(k):
        for j in range(k):
            out = np.maximum(out, x[:, i : i + s * (ho - 1) + 1 : s, j : j + s * (wo - 1) + 1 : s])
    return out


def layer_norm(x, a, prefix):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * a[prefix + "/scale"] + a[prefix + "/bias"]


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def official_forward(a: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """images: (B, H, W, C), already scaled to [-1, 1]."""
    a = {k: v.astype(np.float64) for k, v in a.items()}
    x = images.astype(np.float64)
    if "conv_root/kernel" in a:
        x = np.maximum(group_norm(std_conv(x, a["conv_root/kernel"], 2), a, "gn_root"), 0)
        x = max_pool_same(x)
        s = 1
        while f"block{s}/unit1/conv1/kernel" in a:
            u = 1
            while f"block{s}/unit{u}/conv1/kernel" in a:
                p = f"block{s}/unit{u}/"
                stride = 2 if (s > 1 and u == 1) else 1
                y = np.maximum(group_norm(std_conv(x, a[p + "conv1/kernel"], 1), a, p + "gn1"), 0)
                y = np.maximum(group_norm(std_conv(y, a[p + "conv2/kernel"], stride), a, p + "gn2"), 0)
                y = group_norm(std_conv(y, a[p + "conv3/kernel"], 1), a, p + "gn3")
                if p + "conv_proj/kernel" in a:
                    x = group_norm(std_conv(x, a[p + "conv_proj/kernel"], stride), a, p + "gn_proj")
                x = np.maximum(x + y, 0)
                u += 1
            s += 1
    p = a["embedding/kernel"].shape[0]
    x = conv(x, a["embedding/kernel"], p, "VALID") + a["embedding/bias"]
    b, gh, gw, d = x.shape
    x = x.reshape(b, gh * gw, d)  # raster order
    if "cls" in a:
        x = np.concatenate([np.broadcast_to(a["cls"], (b, 1, d)), x], axis=1)
    x = x + a["Transformer/posembed_input/pos_embedding"]
    spelling = "original" if "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel" in a else "linen"
    ln1, mha, ln2, mb = SPELLINGS[spelling]
    i = 0
    while f"Transformer/encoderblock_{i}/{ln1}/scale" in a:
        blk = f"Transformer/encoderblock_{i}/"
        y = layer_norm(x, a, blk + ln1)
        q, k, v = (
            np.einsum("btd,dhk->bhtk", y, a[f"{blk}{mha}/{n}/kernel"]) + a[f"{blk}{mha}/{n}/bias"][None, :, None, :]
            for n in ("query", "key", "value")
        )
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
        logits = logits - logits.max(-1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        out = np.einsum("bhtk,hkd->btd", probs @ v, a[f"{blk}{mha}/out/kernel"]) + a[f"{blk}{mha}/out/bias"]
        x = x + out
        y = layer_norm(x, a, blk + ln2)
        y = gelu_tanh(y @ a[f"{blk}{mb}/Dense_0/kernel"] + a[f"{blk}{mb}/Dense_0/bias"])
        x = x + y @ a[f"{blk}{mb}/Dense_1/kernel"] + a[f"{blk}{mb}/Dense_1/bias"]
        i += 1
    x = layer_norm(x, a, "Transformer/encoder_norm")
    x = x[:, 0] if "cls" in a else x.mean(axis=1)
    if "pre_logits/kernel" in a:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    return x @ a["head/kernel"] + a["head/bias"]


def save_npz(path, arrays):
    np.savez(path, **arrays)
    return path


def images(rng, n=2, size=32):
    return rng.uniform(-1, 1, size=(n, size, size, 3)).astype(np.float32)


CASES = {
    "token+pre_logits": dict(representation=48),
    "gap": dict(token=False),
    "linen spelling": dict(spelling="linen", classes=7),
    "hybrid (old GN shapes)": dict(resnet=(1, 1), patch=1, width=64, old_gn_shape=True, representation=32),
    "hybrid 3 stages": dict(resnet=(1, 1, 1), patch=1, width=64, image=64),
    # AugReg's R+Ti/16: vision_transformer's `resnet.num_layers = ()`, the ResNet root alone.
    "R+Ti/16 (root, no stages)": dict(resnet=(), patch=2, width=64),
}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c == "hybrid 3 stages" else c for c in CASES]
)
def test_import_reproduces_the_official_forward(tmp_path, case):
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    kw = CASES[case]
    arrays = official_arrays(rng, **kw)
    path = save_npz(tmp_path / "ckpt.npz", arrays)
    model = vitlab.load(path)
    cfg = model.config
    # Architecture inferred from the arrays alone.
    assert cfg.hidden_size == kw.get("width", 64) and cfg.depth == 2 and cfg.num_heads == 4
    assert cfg.classifier == ("token" if kw.get("token", True) else "gap")
    assert cfg.representation_size == kw.get("representation")
    assert cfg.num_classes == kw.get("classes", 10)
    assert (cfg.resnet.layers if cfg.resnet else None) == kw.get("resnet")
    assert cfg.image_size == (kw.get("image", 32),) * 2
    # The official numerics.
    assert (cfg.gelu, cfg.layer_norm_eps, cfg.resize_mode) == ("tanh", 1e-6, "bilinear_aligned")
    if cfg.resnet:
        assert (cfg.resnet.ws_mode, cfg.resnet.ws_eps, cfg.resnet.gn_eps) == ("std", 1e-5, 1e-6)

    x = images(rng, size=cfg.image_size[0])
    want = official_forward(arrays, x)
    pixels = torch.from_numpy(x).permute(0, 3, 1, 2)
    assert np.abs(want).max() > 0.5  # logits of a size where a dropped parameter would show
    # The function itself, in float64 on both sides: any difference is a mistake, not rounding.
    with torch.no_grad():
        exact = model.double()(pixels.double()).numpy()
    assert np.abs(exact - want).max() < 1e-9, np.abs(exact - want).max()
    # And as it runs, in float32: rounding only (how much depends on the CPU's kernels and threads).
    with torch.no_grad():
        got = model.float()(pixels).double().numpy()
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()


LINEN = dict(zip(SPELLINGS["original"], SPELLINGS["linen"], strict=True))


def big_vision_layout(a: dict[str, np.ndarray], layout: str) -> dict[str, np.ndarray]:
    """An official checkpoint rewritten as big_vision writes the same model (vit.py's `_Model`,
    `Encoder(scan=...)`, `fix_old_checkpoints` read backwards): the position embedding of
    the patches alone at the top level, the class token carrying its own row; or, before
    2022, at Transformer/pos_embedding with the class row; linen block names; a scanned
    encoder; an optax state's params/ prefix."""
    a = dict(a)
    pos = a.pop("Transformer/posembed_input/pos_embedding")
    if layout == "Transformer/pos_embedding":
        a["Transformer/pos_embedding"] = pos
    elif "cls" in a:
        a["cls"], a["pos_embedding"] = a["cls"] + pos[:, :1], pos[:, 1:]
    else:
        a["pos_embedding"] = pos
    if layout != "pos_embedding":  # every later layout: linen's module numbering
        for old, new in LINEN.items():
            a = {k.replace(f"/{old}/", f"/{new}/"): v for k, v in a.items()}
    if layout in ("scan", "params"):
        blocks = sorted({k.split("/")[1] for k in a if k.startswith("Transformer/encoderblock_")},
                        key=lambda b: int(b.split("_")[1]))
        names = {k.split("/", 2)[2] for k in a if k.startswith("Transformer/encoderblock_0/")}
        for n in names:
            a[f"Transformer/encoderblock/{n}"] = np.stack([a.pop(f"Transformer/{b}/{n}") for b in blocks])
    if layout == "params":
        a = {f"params/{k}": v for k, v in a.items()}
    return a


BIG_VISION = {
    "pos_embedding": {},
    "linen": {},
    "linen, gap": dict(token=False),
    "scan": dict(representation=48),
    "params": {},
    "Transformer/pos_embedding": {},
}


@pytest.mark.parametrize("layout", BIG_VISION)
def test_big_vision_layouts_give_the_official_logits(tmp_path, layout):
    """Each of big_vision's layouts of an official checkpoint loads to the same model: its
    logits equal the original file's and the independent NumPy forward's."""
    rng = np.random.default_rng(zlib.crc32(layout.encode()))
    kw = BIG_VISION[layout]
    arrays = official_arrays(rng, **kw)
    rewritten = big_vision_layout(arrays, layout.split(",")[0])
    assert "Transformer/posembed_input/pos_embedding" not in rewritten
    model = vitlab.load(save_npz(tmp_path / "bv.npz", rewritten))
    original = vitlab.load(save_npz(tmp_path / "official.npz", arrays))
    assert model.config == original.config and model.config.classifier == ("token" if kw.get("token", True) else "gap")
    x = images(rng)
    pixels = torch.from_numpy(x).permute(0, 3, 1, 2)
    with torch.no_grad():
        got, want = model(pixels).double().numpy(), original(pixels).double().numpy()
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()
    assert np.abs(got - official_forward(arrays, x)).max() < 1e-5
    assert np.abs(want).max() > 0.5


def test_a_big_vision_map_head_is_refused(tmp_path):
    a = big_vision_layout(official_arrays(np.random.default_rng(3), token=False), "linen")
    a["MAPHead_0/probe"] = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(CheckpointError, match="MAP head"):
        vitlab.load(save_npz(tmp_path / "map.npz", a))


# big_vision's own archives -----------------------------------------------------------------
# Written by big_vision's code (tests/fixtures/big_vision/make_fixtures.py says how), with the
# logits big_vision's `vit.load` + `model.apply` computes from each archive as read back.
BV_DIR = Path(__file__).parent / "fixtures" / "big_vision"
BV = json.loads((BV_DIR / "manifest.json").read_text())["archives"]


@pytest.mark.parametrize("name", sorted(BV))
def test_big_vision_written_archives_give_big_vision_logits(name):
    """Each layout big_vision writes (a release's params, an optax or Flax training state with
    int32 counts, bfloat16 '|V2' arrays, posemb='sincos2d' without a position array) loads
    to the model big_vision's own code computes: logits within 5e-6 of its."""
    info, ref = BV[name], np.load(BV_DIR / "logits.npz")
    spec = info["model"]
    with np.load(BV_DIR / f"{name}.npz") as f:  # the archive is what the name says
        assert sorted({str(f[k].dtype) for k in f.files}) == info["dtypes"]
    model = vitlab.load(BV_DIR / f"{name}.npz", image_size=info["image_size"])
    cfg = model.config
    assert cfg.pos_embed == {"learn": "learned", "sincos2d": "sincos_2d_big_vision"}[spec["posemb"]]
    assert cfg.classifier == {"tok": "token", "gap": "gap"}[spec["pool_type"]]
    assert (cfg.patch_size, cfg.hidden_size, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.num_classes) == (
        spec["patch_size"][0], spec["width"], spec["depth"], spec["num_heads"], spec["mlp_dim"], spec["num_classes"])
    assert cfg.representation_size == (spec.get("rep_size") or None)
    with torch.no_grad():
        got = model(torch.from_numpy(ref["input"]).permute(0, 3, 1, 2)).double().numpy()
    want = ref[name].astype(np.float64)
    assert np.abs(want).max() > 1.0  # logits of a size where a dropped parameter would show
    assert np.abs(got - want).max() < 5e-6, np.abs(got - want).max()


def test_big_vision_archives_record_what_was_read():
    """What the original layout lacks is named in the import's metadata: the state's parts
    that were ignored, bfloat16, the fixed embedding and the image size assumed for it."""
    notes = {name: npz.read(BV_DIR / f"{name}.npz").metadata["big_vision"] for name in BV}
    assert notes["trainstate_optax"] == "params (chrono, opt ignored); scanned encoder (2 blocks); pos_embedding"
    assert notes["trainstate_flax"] == "opt/target (opt/state ignored); pos_embedding"
    assert notes["bf16_sincos2d_tok"].startswith("bfloat16 arrays; posemb sincos2d (no position array;")
    assert notes["sincos2d_gap"].endswith("image size not recorded, 224 assumed)")
    assert vitlab.load(BV_DIR / "sincos2d_gap.npz").config.image_size == (224, 224)


def test_big_vision_sincos_differs_from_vitlabs_own():
    """The comparison can fail: vitlab's sincos_2d (y first, frequencies over d/4) in place of
    big_vision's moves the logits far past the tolerance."""
    ref = np.load(BV_DIR / "logits.npz")
    model = vitlab.load(BV_DIR / "sincos2d_gap.npz", image_size=32, pos_embed="sincos_2d")
    with torch.no_grad():
        got = model(torch.from_numpy(ref["input"]).permute(0, 3, 1, 2)).numpy()
    assert np.abs(got - ref["sincos2d_gap"]).max() > 0.1


def _bv_arrays(name: str) -> dict[str, np.ndarray]:
    with np.load(BV_DIR / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


INCONSISTENT = {
    "opt/ without target": (lambda a: {k.replace("opt/target/", "opt/model/"): v for k, v in a.items()},
                            "trainstate_flax", "without params/... or opt/target/"),
    "two models": (lambda a: {**a, "embedding/kernel": a["params/embedding/kernel"]}, "trainstate_optax",
                   "'embedding/kernel' is both at the top level and under params/"),
    "4-byte void": (lambda a: {**a, "head/bias": np.zeros(10, "V4")}, "bf16_sincos2d_tok", "dtype |V4"),
    "int parameter": (lambda a: {**a, "params/head/bias": a["params/head/bias"].astype(np.int32)},
                      "trainstate_optax", "'head/bias' has dtype <i4"),
    "original names, no position": (lambda a: {k.replace("MultiHeadDotProductAttention_0", "MultiHeadDotProductAttention_1")
                                               .replace("MlpBlock_0", "MlpBlock_3").replace("LayerNorm_1", "LayerNorm_2"): v
                                               for k, v in a.items()}, "sincos2d_gap", "no Transformer/posembed_input"),
}


@pytest.mark.parametrize("case", INCONSISTENT)
def test_inconsistent_big_vision_archives_are_refused_saying_what_disagrees(tmp_path, case):
    change, name, message = INCONSISTENT[case]
    path = save_npz(tmp_path / "bad.npz", change(_bv_arrays(name)))
    with pytest.raises(CheckpointError, match=re.escape(message)) as e:
        vitlab.load(path, image_size=32)
    assert "\n" not in str(e.value)


def test_a_perturbed_parameter_changes_the_logits(tmp_path):
    """The reference is sensitive: the comparison above can fail."""
    rng = np.random.default_rng(1)
    arrays = official_arrays(rng)
    model = vitlab.load(save_npz(tmp_path / "a.npz", arrays))
    arrays["Transformer/encoderblock_1/LayerNorm_2/bias"] += 0.01
    x = images(rng)
    with torch.no_grad():
        got = model(torch.from_numpy(x).permute(0, 3, 1, 2)).double().numpy()
    assert np.abs(got - official_forward(arrays, x)).max() > 1e-4


def test_load_at_another_resolution_is_the_official_zoom(tmp_path):
    from scipy import ndimage

    rng = np.random.default_rng(2)
    arrays = official_arrays(rng, representation=48)
    path = save_npz(tmp_path / "a.npz", arrays)
    model = vitlab.load(path, image_size=48, num_classes=5, representation_size=None)
    pos = arrays["Transformer/posembed_input/pos_embedding"][0]
    grid = pos[1:].reshape(4, 4, -1).astype(np.float64)
    zoomed = ndimage.zoom(grid, (6 / 4, 6 / 4, 1), order=1)  # what the official loader calls
    got = model.pos_embed.pos_embedding.detach()[0].numpy()
    assert got.shape == (1 + 36, 64)
    np.testing.assert_allclose(got[0], pos[0], rtol=0, atol=0)  # the class row is kept
    np.testing.assert_allclose(got[1:], zoomed.reshape(36, -1), rtol=0, atol=1e-6)
    # The fine-tuning loader's head: fresh and zero; the pre-logits layer is dropped.
    assert model.pre_logits is None and model.config.representation_size is None
    assert torch.count_nonzero(model.head.weight) == 0 and model.head.weight.shape == (5, 64)


def test_vitlab_npz_vitlab_is_bit_exact(tmp_path):
    for cfg in (
        vitlab.get_config("ViT-Ti/16", depth=2, image_size=64, num_classes=5, representation_size=24),
        vitlab.get_config("R50+ViT-B/16", depth=1, hidden_size=64, num_heads=2, mlp_dim=96, image_size=64,
                          num_classes=3, classifier="gap", resnet={"layers": (1, 1)}),
    ):
        torch.manual_seed(0)
        model = vitlab.create_model(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        path = tmp_path / "m.npz"
        vitlab.save(model, path, format="npz")
        back = vitlab.load(path)
        a, b = model.state_dict(), back.state_dict()
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
        # and npz -> vitlab -> npz gives the same arrays back
        vitlab.save(back, tmp_path / "again.npz", format="npz")
        with np.load(path) as f1, np.load(tmp_path / "again.npz") as f2:
            assert sorted(f1.files) == sorted(f2.files)
            assert all(np.array_equal(f1[k], f2[k]) for k in f1.files)


def test_timm_npz_reader_loads_what_vitlab_writes(tmp_path):
    pytest.importorskip("timm")
    from vitlab.checkpoints.timm import create_timm_model

    torch.manual_seed(0)
    model = vitlab.create_model("ViT-S/16", depth=2, image_size=64, num_classes=10)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval()
    path = tmp_path / "m.npz"
    vitlab.save(model, path, format="npz")
    theirs = create_timm_model(model.config).eval()
    theirs.load_pretrained(str(path))  # timm.models.vision_transformer._load_weights
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ours, ref = model(x), theirs(x)
    assert ref.abs().max() > 0.5
    assert (ours - ref).abs().max() < 1e-5


def test_writer_refuses_what_the_format_cannot_hold(tmp_path):
    for overrides, feature in (
        (dict(pos_embed="learned_2d"), "learned_2d"),
        (dict(qkv_bias=False), "qkv_bias"),
        (dict(image_size=(32, 64)), "token grid"),
    ):
        model = vitlab.create_model("ViT-Ti/16", depth=1, **{"image_size": 32, **overrides})
        with pytest.raises(CheckpointError, match=feature):
            vitlab.save(model, tmp_path / "x.npz", format="npz")
    model = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, gelu="exact")
    with pytest.raises(CheckpointError, match="gelu='exact'"):
        vitlab.save(model, tmp_path / "x.npz", format="npz")
    assert not (tmp_path / "x.npz").exists()
    npz.write(model, tmp_path / "x.npz", allow_numerics_change=True)  # an explicit choice
    assert vitlab.load(tmp_path / "x.npz").config.gelu == "tanh"


def test_errors_name_the_file_the_keys_and_the_shapes(tmp_path):
    rng = np.random.default_rng(3)
    arrays = official_arrays(rng)
    bad = dict(arrays)
    del bad["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
    bad["extra/kernel"] = np.zeros((2, 2), np.float32)
    path = save_npz(tmp_path / "bad.npz", bad)
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    msg = str(e.value)
    assert str(path) in msg and "Dense_1/bias" in msg and "extra/kernel (2, 2)" in msg
    bad = dict(arrays)
    bad["Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel"] = np.zeros((100, 64), np.float32)
    with pytest.raises(CheckpointError) as e:
        vitlab.load(save_npz(tmp_path / "bad2.npz", bad))
    assert e.value.reason == "shape" and "(100, 64) -> blocks.0.mlp.fc2.weight" in str(e.value)
    with pytest.raises(CheckpointError, match="embedding/kernel"):
        vitlab.load(save_npz(tmp_path / "other.npz", {"w": np.zeros(3, np.float32)}), format="npz")
