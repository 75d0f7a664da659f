"""Where the position embedding is added (Appendix D.4, `model.pos_embed_at`): once after the
stem, at every block with its own table, or at every block with one shared table; 1D and 2D.
Each is checked against an independent NumPy forward written from the paper's equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from test_models_pos_embed import ABSOLUTE, KINDS
from vitlab.config import POS_EMBEDS, ConfigError, ViTConfig
from vitlab.models import build
from vitlab.models.pos_embed import resize_position_state

DEPTH = 3


def config(kind: str, at: str, **kw) -> ViTConfig:
    return ViTConfig(name="t", image_size=(16, 16), patch_size=4, hidden_size=16, depth=DEPTH, num_heads=2,
                     mlp_dim=32, num_classes=5, pos_embed=kind, pos_embed_at=at, **kw)


def layer_norm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def reference(model, x: np.ndarray, kind: str, at: str) -> np.ndarray:
    s = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    s.update({k: v.double().numpy() for k, v in model.named_buffers()})
    b, d, p, heads = x.shape[0], 16, 4, 2
    g = x.shape[2] // p
    patches = x.reshape(b, 3, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, g * g, 3 * p * p)
    w = s["patch_embed.proj.weight"].reshape(d, -1)
    z = patches @ w.T + s["patch_embed.proj.bias"]
    z = np.concatenate([np.broadcast_to(s["cls_token"], (b, 1, d)), z], axis=1)
    for i in range(DEPTH):  # E_pos as each kind's definition writes it (test_models_pos_embed.py)
        if i == 0 or at == "every_block_shared":
            z = z + KINDS[kind].table(model.pos_embed, (g, g), d)
        elif at == "every_block":
            z = z + KINDS[kind].table(model.block_pos_embeds[f"encoderblock_{i}"], (g, g), d)
        q = f"blocks.{i}."
        h = layer_norm(z, s[q + "norm1.weight"], s[q + "norm1.bias"])
        qkv = h @ s[q + "attn.qkv.weight"].T + s[q + "attn.qkv.bias"]
        qq, kk, vv = (qkv[..., j * d:(j + 1) * d].reshape(b, -1, heads, d // heads).transpose(0, 2, 1, 3)
                      for j in range(3))
        logits = qq @ kk.transpose(0, 1, 3, 2) / math.sqrt(d // heads)
        attn = np.exp(logits - logits.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        y = (attn @ vv).transpose(0, 2, 1, 3).reshape(b, -1, d)
        z = z + y @ s[q + "attn.proj.weight"].T + s[q + "attn.proj.bias"]
        h = layer_norm(z, s[q + "norm2.weight"], s[q + "norm2.bias"])
        h = gelu_tanh(h @ s[q + "mlp.fc1.weight"].T + s[q + "mlp.fc1.bias"])
        z = z + h @ s[q + "mlp.fc2.weight"].T + s[q + "mlp.fc2.bias"]
    z = layer_norm(z, s["norm.weight"], s["norm.bias"])
    return z[:, 0] @ s["head.weight"].T + s["head.bias"]


@pytest.mark.parametrize("kind", ABSOLUTE)
@pytest.mark.parametrize("at", ["stem", "every_block", "every_block_shared"])
def test_placement_matches_the_reference_forward(kind, at):
    torch.manual_seed(0)
    model = build(config(kind, at)).eval()
    with torch.no_grad():
        for p in model.parameters():  # the head starts at zero: give every weight a value
            p.add_(torch.randn_like(p) * 0.05)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        got = model(x).double().numpy()
        again = model(x, return_intermediates=True)["logits"].double().numpy()
    want = reference(model, x.double().numpy(), kind, at)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(again, want, atol=2e-5)
    names = [k for k, _ in model.named_parameters() if "block_pos_embeds" in k]
    if at == "every_block" and KINDS[kind].parameters((4, 4), 16):
        assert len({n.split(".")[1] for n in names}) == DEPTH - 1
        assert names[0].startswith("block_pos_embeds.encoderblock_1.")
    else:
        assert names == []


def test_the_placements_differ_and_count_their_parameters():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    counts, outs = {}, {}
    for at in ("stem", "every_block", "every_block_shared"):
        torch.manual_seed(1)
        m = build(config("learned", at)).eval()
        counts[at] = sum(p.numel() for p in m.parameters())
        with torch.no_grad():
            outs[at] = m.forward_features(x)
    tokens = 17 * 16
    assert counts["every_block"] - counts["stem"] == (DEPTH - 1) * tokens
    assert counts["every_block_shared"] == counts["stem"]
    assert not torch.allclose(outs["stem"], outs["every_block_shared"])


def test_per_block_tables_are_resized_with_the_grid():
    old, new = config("learned", "every_block"), config("learned", "every_block").replace(image_size=(24, 24))
    state = build(old).state_dict()
    out = resize_position_state(state, "", old, new)
    assert out["block_pos_embeds.encoderblock_2.pos_embedding"].shape == (1, 37, 16)
    build(new).load_state_dict(out)


@pytest.mark.parametrize("kind", [k for k in POS_EMBEDS if k not in ABSOLUTE])
def test_placement_needs_an_absolute_embedding(kind):
    with pytest.raises(ConfigError, match="needs an absolute position embedding"):
        config(kind, "every_block")
    with pytest.raises(ConfigError, match="pos_embed_at"):
        config("learned", "everywhere")
