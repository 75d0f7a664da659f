"""The model family (issue: the ViT model): counts, options, both attention paths, hybrids."""

from __future__ import annotations

import pytest
import torch

import vitlab
from test_models_pos_embed import KINDS
from vitlab.config import POS_EMBEDS, ConfigError, ResNetConfig
from vitlab.models.resnet import StdConv2d, same_padding

# Exact parameter counts with 1000 classes at 224x224. The ones the paper and the official
# code publish (B/16 86,567,656; R50+ViT-B/16 98,659,112) pin the architecture; every
# registered variant must have an entry, so a new variant cannot land without one.
PINNED_PARAMS = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-S/32": 22_878_952,
    "ViT-B/32": 88_224_232,
    "ViT-B/16": 86_567_656,
    "ViT-B/8": 86_576_872,
    "ViT-L/32": 306_535_400,
    "ViT-L/16": 304_326_632,
    "ViT-H/14": 632_045_800,
    "R50+ViT-B/16": 98_659_112,
    "R50+ViT-L/32": 328_994_856,
    "R26+ViT-S/32": 36_431_912,
    # Table 6's other hybrids (R50x1+ViT-B/32, R50x1+ViT-L/16), equal to timm's hybrid
    # built on the same stages (test_models_bit.py).
    "R50+ViT-B/32": 110_945_832,
    "R50+ViT-L/16": 316_483_624,
    "ViT-Ti/4": 6_143_656,
    "ViT-S/4": 22_903_144,
    "ViT-C/4": 3_478_504,
    "R8+ViT-C/4": 3_673_384,
    # BiT ResNets (§4.1); the published sizes are also checked against timm in test_bit.py.
    "BiT-R50x1": 25_549_352,
    "BiT-R101x1": 44_541_480,
    "BiT-R50x3": 217_319_080,
    "BiT-R101x3": 387_934_888,
    "BiT-R152x2": 236_335_208,
    "BiT-R152x4": 936_533_224,
    "BiT-R26x1": 15_987_496,
    # Table 6's ResNet50x2, ResNet152x1, ResNet200x3 (R200 = 3, 24, 36, 3 units), equal to
    # timm's ResNetV2 built with the same layers and width (test_models_bit.py).
    "BiT-R50x2": 97_988_712,
    "BiT-R152x1": 60_185_128,
    "BiT-R200x3": 568_633_000,
    "BiT-R26-C": 4_513_928,
}


@pytest.mark.parametrize("name", vitlab.list_models())
def test_parameter_count_is_pinned(name):
    assert name in PINNED_PARAMS, f"variant {name} has no pinned parameter count"
    with torch.device("meta"):
        model = vitlab.create_model(name, num_classes=1000, image_size=224)
    assert sum(p.numel() for p in model.parameters()) == PINNED_PARAMS[name]


def test_every_pinned_count_is_a_registered_variant():
    """The other half of the guard above: a count for a variant no longer registered goes too."""
    assert sorted(set(PINNED_PARAMS) - set(vitlab.list_models())) == []


def test_names_in_paper_notation_resolve():
    assert vitlab.create_model("vit-c/4").config.name == "ViT-C/4"
    with pytest.raises(ConfigError, match="'ViT-Q/16'; did you mean ViT-S/16"):
        vitlab.create_model("ViT-Q/16")
    with pytest.raises(ConfigError, match="`vitlab models` lists them"):
        vitlab.create_model("resnet50")


def small(**overrides):
    base = dict(image_size=16, num_classes=5, head_init="xavier", depth=2)
    base.update(overrides)
    return vitlab.create_model("ViT-C/4", **base)


OPTIONS = [
    {},
    {"classifier": "gap"},
    *({"pos_embed": kind} for kind in POS_EMBEDS if kind != "learned"),  # every registered kind
    {"representation_size": 24},
    {"gelu": "exact", "layer_norm_eps": 1e-5, "qkv_bias": False},
    {"image_size": (16, 24)},
    {"image_size": (24, 16), "pos_embed": "learned_2d", "classifier": "gap"},
    {"num_classes": 0},
]


@pytest.mark.parametrize("overrides", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_every_option_forward_backward_and_gradients(overrides):
    torch.manual_seed(0)
    model = small(**overrides).train()
    cfg = model.config
    x = torch.randn(3, 3, *cfg.image_size)
    out = model(x)
    width = cfg.num_classes or cfg.feature_dim
    assert out.shape == (3, width)
    out.square().sum().backward()
    # Every parameter takes part in the function, so every one must receive a gradient.
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    if not KINDS[cfg.pos_embed].parameters(cfg.grid_size, cfg.hidden_size):
        assert not any("pos_embed" in n for n, _ in model.named_parameters())


def test_dropout_attention_dropout_and_drop_path_act_only_in_training():
    torch.manual_seed(0)
    model = small(dropout=0.2, attention_dropout=0.2, drop_path=0.3)
    x = torch.randn(4, 3, 16, 16)
    model.train()
    assert not torch.equal(model(x), model(x))  # randomness while training
    model.eval()
    assert torch.equal(model(x), model(x))  # deterministic at evaluation
    assert model.blocks[0].drop_path.p == 0.0 and model.blocks[-1].drop_path.p == pytest.approx(0.3)


def test_head_is_zero_initialised_by_default():
    model = vitlab.create_model("ViT-C/4", depth=1)
    assert model.head.weight.abs().sum() == 0 and model.head.bias.abs().sum() == 0
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), torch.zeros(2, 10))


@pytest.mark.parametrize("overrides", [{}, {"pos_embed": "relative"}, {"classifier": "gap", "pos_embed": "learned_2d"}])
def test_fused_and_exact_attention_agree(overrides):
    torch.manual_seed(0)
    model = small(depth=3, **overrides).eval()
    x = torch.randn(2, 3, 16, 16)
    fused = model(x)
    out = model(x, return_intermediates=True)
    torch.testing.assert_close(out["logits"], fused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["features"], model.forward_features(x), atol=1e-5, rtol=1e-5)
    T = model.config.num_tokens
    assert len(out["attentions"]) == len(out["tokens"]) == 3
    for attn in out["attentions"]:
        assert attn.shape == (2, model.config.num_heads, T, T)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, model.config.num_heads, T))
    assert out["tokens"][0].shape == (2, T, model.config.hidden_size)


# One encoder loop ------------------------------------------------------------------------
def written_out(model, x, patch_fn=None, queries=None, attention=False):
    """The encoder as the model's three loops wrote it before they became one (`encode`): Eq. 1,
    dropout, each block on its position-added input (the last one at `queries` tokens), the
    final LayerNorm. Returns (features, tokens, attentions)."""
    z, grid = model.embed(x, patch_fn)
    z = model.pos_drop(z)
    tokens, attentions = [], []
    for i, block in enumerate(model.blocks):
        last = i == len(model.blocks) - 1
        z, attn = block(model.add_position(i, z, grid), return_attention=attention, queries=queries if last else None)
        tokens.append(z)
        attentions.append(attn)
    return model.norm(z), tokens, attentions


RATES = dict(dropout=0.1, attention_dropout=0.1, drop_path=0.2, depth=3)
# Variants whose loops differ: the class token (the head reads one query), GAP, relative
# attention, per-block position embeddings with pre-logits on a non-square grid, a hybrid.
LOOP_MODELS = {
    "token": lambda: small(**RATES),
    "gap": lambda: small(classifier="gap", **RATES),
    "relative": lambda: small(pos_embed="relative", **RATES),
    "every_block": lambda: small(pos_embed_at="every_block", representation_size=24, image_size=(16, 24), **RATES),
    "hybrid": lambda: vitlab.create_model("R8+ViT-C/4", image_size=32, num_classes=5, head_init="xavier", depth=2,
                                          dropout=0.1, drop_path=0.1),
}


@pytest.mark.parametrize("name", LOOP_MODELS)
def test_every_path_is_the_written_out_encoder_to_the_bit(name):
    """forward, forward_features and the intermediates run one loop, and give exactly what
    the loops written out give: the same logits, tokens and attention probabilities."""
    torch.manual_seed(0)
    model = LOOP_MODELS[name]()
    model.eval()
    x = torch.randn(2, 3, *model.config.image_size)
    with torch.no_grad():
        queries = 1 if name in ("token", "every_block", "hybrid") else None  # the head reads z_L^0 alone
        assert model.head_queries == queries
        pooled = written_out(model, x, queries=queries)[0]
        assert torch.equal(model(x), model.forward_head(pooled))
        feats = written_out(model, x)[0]
        assert torch.equal(model.forward_features(x), feats)
        full, tokens, attentions = written_out(model, x, attention=True)
        out = model(x, return_intermediates=True)
    assert torch.equal(out["features"], full) and torch.equal(out["logits"], model.forward_head(full))
    assert all(torch.equal(a, b) for a, b in zip(out["tokens"], tokens, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(out["attentions"], attentions, strict=True))
    assert list(out) == ["logits", "embeddings", "tokens", "attentions", "features", "pre_logits", "grid"]


def block_calls(model):
    """How many times each block's forward ran: a recomputed (checkpointed) block runs twice."""
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("path", ["forward", "forward_features", "intermediates", "mpp"])
def test_gradient_checkpointing_in_every_path_gives_the_same_gradients_to_the_bit(path):
    """With dropout, attention dropout and drop-path on, a training step with each block
    recomputed in the backward pass gives the gradients of one that keeps the activations,
    bit for bit, in every path, and each path does recompute (the blocks run twice)."""
    from vitlab.config import MPPConfig
    from vitlab.models.mpp import MPPHead

    torch.manual_seed(0)
    model = small(depth=2, dropout=0.1, attention_dropout=0.1, drop_path=0.2).train()
    head = MPPHead(MPPConfig(), model.config)
    x = torch.randn(4, 3, 16, 16)
    sources = torch.randint(0, 4 * 16 + 1, (4, 16), generator=torch.Generator().manual_seed(1))

    def step():
        torch.manual_seed(2)  # the same dropout draws either way
        if path == "forward":
            y = model(x)
        elif path == "forward_features":
            y = model.forward_features(x)
        elif path == "intermediates":
            out = model(x, return_intermediates=True)
            y = out["logits"].sum() + sum(a.sum() for a in out["attentions"]) + sum(t.sum() for t in out["tokens"])
        else:
            y = head.predict(model, x, sources)[0]
        y.square().sum().backward()
        grads = {n: p.grad for n, p in [*model.named_parameters(), *head.named_parameters()] if p.grad is not None}
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        return grads

    calls = block_calls(model)
    kept = step()
    assert len(calls) == 2
    model.set_grad_checkpointing()
    recomputed = step()
    assert len(calls) == 2 + 4  # each block forward, then again in the backward pass
    assert kept.keys() == recomputed.keys() and "blocks.0.attn.qkv.weight" in kept
    for name, grad in kept.items():
        assert torch.equal(grad, recomputed[name]), name


def test_relative_attention_adds_query_dot_offset_embedding():
    """App. D.4: the extra logits are q_i . r_{p_i - p_k}, added before the softmax."""
    torch.manual_seed(0)
    model = small(pos_embed="relative", depth=1, num_heads=3).eval()
    attn = model.blocks[0].attn
    q = torch.randn(1, 3, 5, 64)
    table = torch.randn(2 * 5 - 1, 192)
    with torch.no_grad():
        attn.rel_embedding = torch.nn.Parameter(table)
        got = attn.relative_logits(q)
    r = table.reshape(9, 3, 64)
    for i in range(5):
        for k in range(5):
            want = (q[0, :, i] * r[i - k + 4]).sum(-1) * 64**-0.5
            torch.testing.assert_close(got[0, :, i, k], want)


def test_api_of_the_usual_shape():
    torch.manual_seed(0)
    model = small(representation_size=8).eval()
    x = torch.randn(2, 3, 16, 16)
    feats = model.forward_features(x)
    assert feats.shape == (2, 17, 192)
    torch.testing.assert_close(model.pool(feats), feats[:, 0])
    assert model.forward_head(feats, pre_logits=True).shape == (2, 8)
    torch.testing.assert_close(model.forward_head(feats), model(x))
    model.reset_classifier(7, init="zeros")
    assert model(x).shape == (2, 7) and model.config.num_classes == 7
    assert torch.equal(model(x), torch.zeros(2, 7))  # a fresh fine-tuning head is zero
    model.reset_classifier(0)
    assert model(x).shape == (2, 8)


def test_gap_pools_the_mean_of_all_tokens_and_has_no_class_token():
    model = small(classifier="gap").eval()
    assert model.cls_token is None and model.config.num_tokens == 16
    feats = model.forward_features(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(model.pool(feats), feats.mean(1))


def test_dynamic_image_size():
    torch.manual_seed(0)
    fixed = small().eval()
    dynamic = small(dynamic_image_size=True).eval()
    dynamic.load_state_dict(fixed.state_dict())
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(dynamic(x), fixed(x))  # native size: nothing resampled
    assert dynamic(torch.randn(1, 3, 24, 32)).shape == (1, 5)
    with pytest.raises(ValueError, match="built for 16x16"):
        fixed(torch.randn(1, 3, 24, 32))


def test_bad_inputs_are_named():
    model = small().eval()
    with pytest.raises(ValueError, match="expects 3 input channels, got 1"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match="NCHW"):
        model(torch.randn(3, 16, 16))
    with pytest.raises(ConfigError, match=r"smaller than one patch .*\(16 px\)"):
        vitlab.create_model("ViT-B/16", image_size=8)
    with pytest.raises(ConfigError, match="not divisible by num_heads"):
        vitlab.create_model("ViT-C/4", num_heads=5)
    with pytest.raises(ConfigError, match="pos_embed='learnt'"):
        vitlab.create_model("ViT-C/4", pos_embed="learnt")
    with pytest.raises(ConfigError, match=r"'model.widht'.*hidden_size") as e:  # the valid keys listed
        vitlab.create_model("ViT-C/4", widht=3)
    assert e.value.reason == "unknown-key"


def test_every_resolution_takes_the_grid_of_the_official_valid_convolution():
    """A /14 model at 384 (ViT-H/14 at the paper's VTAB resolution): the official patch
    embedding is a VALID convolution, a 27x27 grid over 378 px, the last 6 rows and columns
    read by no patch. vitlab's embedding equals torch's VALID conv2d, and pixels past the grid
    change nothing; with dynamic_image_size any input of at least one patch runs so."""
    from vitlab.config import ViTConfig
    from vitlab.models import build

    config = ViTConfig(image_size=384, patch_size=14, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)
    assert (config.grid_size, config.ignored_pixels, config.num_tokens) == ((27, 27), (6, 6), 27 * 27 + 1)
    model = build(config).eval()
    x = torch.randn(2, 3, 384, 384)
    valid = torch.nn.functional.conv2d(x, model.patch_embed.proj.weight, model.patch_embed.proj.bias, stride=14)
    assert torch.allclose(model.patch_embed(x)[0], valid.flatten(2).transpose(1, 2), atol=1e-5)
    edited = x.clone()
    edited[..., 378:, :], edited[..., :, 378:] = 3.0, -3.0
    with torch.no_grad():  # (the features: a new model's head is zero)
        assert torch.equal(model.forward_features(x), model.forward_features(edited))
        edited[..., 377, 0] = 3.0  # a pixel of the last patch row is read
        assert not torch.equal(model.forward_features(x), model.forward_features(edited))
    dynamic = build(config.replace(dynamic_image_size=True)).eval()
    with torch.no_grad():
        assert dynamic(torch.randn(1, 3, 100, 45)).shape == (1, 3)  # a 7x3 grid
    with pytest.raises(ValueError, match="smaller than one patch"):
        dynamic(torch.randn(1, 3, 13, 100))
    hybrid = vitlab.create_model("R8+ViT-C/4", image_size=37).eval()  # a "SAME"-padded stem: ceil(37 / 4) = 10
    with torch.no_grad():
        assert hybrid(torch.randn(1, 3, 37, 37), return_intermediates=True)["grid"] == hybrid.config.grid_size == (10, 10)


# Hybrids ----------------------------------------------------------------------------------
def test_hybrid_forward_and_feature_map_stride():
    torch.manual_seed(0)
    model = vitlab.create_model(
        "R50+ViT-B/16", image_size=64, num_classes=3, depth=1, hidden_size=64, num_heads=2, mlp_dim=64,
        resnet=ResNetConfig(layers=(1, 1, 1)), head_init="xavier",
    ).eval()
    assert model.config.grid_size == (4, 4)  # three stages: stride 16
    out = model(torch.randn(2, 3, 64, 64), return_intermediates=True)
    assert out["logits"].shape == (2, 3) and out["tokens"][0].shape == (2, 17, 64)
    four = vitlab.create_model("R26+ViT-S/32", image_size=64, depth=1, num_classes=2)
    assert four.config.grid_size == (2, 2)  # four stages: stride 32
    assert four(torch.randn(1, 3, 64, 64)).shape == (1, 2)


def test_tf_same_padding_is_asymmetric():
    assert same_padding(224, 7, 2) == (2, 3)  # out 112: total 5, one more after
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(56, 3, 1) == (1, 1)
    assert same_padding(7, 1, 1) == (0, 0)


@pytest.mark.parametrize("mode", ["std", "var"])
def test_weight_standardisation_matches_its_definition(mode):
    torch.manual_seed(0)
    conv = StdConv2d(4, 6, 3, eps=1e-5, mode=mode)
    w = conv.weight.detach().double()
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    var = ((w - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True)  # population variance
    want = (w - mean) / (var.sqrt() + 1e-5) if mode == "std" else (w - mean) / (var + 1e-5).sqrt()
    torch.testing.assert_close(conv.standardized_weight().double(), want, rtol=1e-6, atol=1e-7)
