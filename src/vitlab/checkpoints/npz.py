"""The official JAX/Flax checkpoints (`.npz`) of the paper and of AugReg, both ways; the
official BiT ResNet archives go through the same reader and writer with bit.py's table.
big_vision's layouts of the same model are read as big_vision's `load` reads them: linen
block names, a scanned encoder, the position embedding of the patches alone
(`from_big_vision`), a training state's `params/` or `opt/target/` (`parameter_arrays`),
bfloat16 arrays, and posemb='sincos2d' models, which store no position embedding
(`sincos_2d_big_vision`).

This is the only file that knows the official ViT parameter names (see
../shared/docs/official-checkpoints.md for the layout). The architecture is inferred from
the arrays alone, and the config records the official numerics (tanh GELU, LayerNorm eps
1e-6, TF "SAME" padding and (w - mean) / (std + 1e-5) weight standardisation in the ResNet,
GroupNorm eps 1e-6, order-1 zoom of position embeddings), so an imported model computes
what the official code computes.
"""

from __future__ import annotations

import json
import math
import os
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from vitlab.checkpoints import bit
from vitlab.checkpoints.io import CheckpointError, Imported, guessed_preprocessing, regular_file
from vitlab.checkpoints.labels import is_imagenet
from vitlab.checkpoints.tables import (
    Rule,
    check_carried,
    copy,
    count_indexed,
    expected_shapes,
    export_state,
    failing,
    fused,
    import_state,
    permuted,
    refuse,
    resnet_layers,
    resnet_rules,
    square_grid,
    transposed,
    zip_names,
)
from vitlab.config import BiTConfig, ModelConfig, ResNetConfig, ViTConfig
from vitlab.files import atomic_write
from vitlab.models.variants import describe

FORMAT_NAME = "npz"
HWIO_TO_OIHW = (3, 2, 0, 1)  # conv kernels: TF stores (kh, kw, in, out)
POS = "Transformer/posembed_input/pos_embedding"
# The two spellings of the modules inside an encoder block: (LN before attention,
# attention, LN before the MLP, MLP). "original" is what the paper's release (and timm's npz
# reader) uses; vitlab writes it. "linen" is the later Flax Linen numbering.
SPELLINGS = {"original": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
             "linen": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")}


def official_numerics(cfg: ViTConfig) -> ViTConfig:
    """The official code's forward, as config values (official-checkpoints.md)."""
    resnet = cfg.resnet
    if resnet is not None:
        resnet = ResNetConfig(layers=resnet.layers, width_factor=resnet.width_factor, ws_eps=1e-5, ws_mode="std", gn_eps=1e-6)
    return cfg.replace(gelu="tanh", layer_norm_eps=1e-6, resize_mode="bilinear_aligned", resnet=resnet,
                       mean=(0.5,) * cfg.in_channels, std=(0.5,) * cfg.in_channels, head_init="zeros")


# The table ------------------------------------------------------------------------------
def rules(cfg: ViTConfig, spelling: str = "original") -> list[Rule]:
    d, h, dh = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    ln1, mha, ln2, mlp = SPELLINGS[spelling]
    # q/k/v kernels are (D, heads, head_dim); heads are the major axis of the output index.
    qkv_kernel = Rule("", ("",), lambda t: t.reshape(d, h * dh).t(), lambda t: (t.t().reshape(d, h, dh),))
    qkv_bias = Rule("", ("",), lambda t: t.reshape(h * dh), lambda t: (t.reshape(h, dh),))

    def out_kernel(ours: str, theirs: str) -> Rule:  # (heads, head_dim, D)
        return Rule(ours, (theirs,), lambda t: t.reshape(h * dh, d).t(), lambda t: (t.t().reshape(h, dh, d),))

    table = [permuted("patch_embed.proj.weight", "embedding/kernel", HWIO_TO_OIHW), copy("patch_embed.proj.bias", "embedding/bias")]
    if cfg.pos_embed == "learned":
        table.append(copy("pos_embed.pos_embedding", POS))
    if cfg.has_class_token:
        table.append(copy("cls_token", "cls"))
    for i in range(cfg.depth):
        b, o = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        a = f"{b}{mha}/"
        table += [*_norm(o + "norm1", b + ln1), fused(o + "attn.qkv.weight", [f"{a}{n}/kernel" for n in ("query", "key", "value")], qkv_kernel),
                  *_dense(o + "attn.proj", a + "out", out_kernel), *_norm(o + "norm2", b + ln2),
                  *_dense(o + "mlp.fc1", f"{b}{mlp}/Dense_0"), *_dense(o + "mlp.fc2", f"{b}{mlp}/Dense_1")]
        if cfg.qkv_bias:
            table.append(fused(o + "attn.qkv.bias", [f"{a}{n}/bias" for n in ("query", "key", "value")], qkv_bias))
    table += _norm("norm", "Transformer/encoder_norm")
    if cfg.representation_size:
        table += _dense("pre_logits", "pre_logits")
    if cfg.num_classes:
        table += _dense("head", "head")
    if cfg.resnet is not None:
        table += resnet_rules(cfg.resnet.layers, _resnet_name, _kernel, ("scale", "bias"))
    return table


def _norm(ours: str, theirs: str) -> list[Rule]:
    """A LayerNorm: Flax's scale and bias."""
    return [copy(ours + ".weight", theirs + "/scale"), copy(ours + ".bias", theirs + "/bias")]


def _dense(ours: str, theirs: str, kernel: Callable[[str, str], Rule] = transposed) -> list[Rule]:
    """A Dense layer: its kernel (stored (in, out): transposed, unless `kernel` says) and bias."""
    return [kernel(ours + ".weight", theirs + "/kernel"), copy(ours + ".bias", theirs + "/bias")]


def _resnet_name(part: str, s: int = 0, u: int = 0, n: int = 0) -> str:
    unit = f"block{s + 1}/unit{u + 1}/"  # the official names count from 1
    return {
        "root_conv": "conv_root/kernel", "root_norm": "gn_root/", "conv": f"{unit}conv{n}/kernel",
        "norm": f"{unit}gn{n}/", "proj_conv": unit + "conv_proj/kernel", "proj_norm": unit + "gn_proj/",
    }[part]


def _kernel(ours: str, theirs: str) -> Rule:
    return permuted(ours, theirs, HWIO_TO_OIHW)


# Reading --------------------------------------------------------------------------------
def detect(path: Path) -> bool:
    """A zip archive of .npy arrays (whatever the file is called)."""
    names = zip_names(path) if path.is_file() else []
    return bool(names) and all(n.endswith(".npy") for n in names)


def load_arrays(path: str | os.PathLike) -> tuple[dict[str, Tensor], list[str]]:
    """The model's arrays as tensors (a big_vision training state's parameters alone, as
    `parameter_arrays` picks them), and what was read that the original layout lacks.
    `allow_pickle=False`: an object array (which would need unpickling, i.e. running code
    from the file) is refused."""
    import numpy as np

    regular_file(path)
    try:
        with np.load(str(path), allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except ValueError as e:
        if "allow_pickle" in str(e):  # numpy: "Object arrays cannot be loaded when allow_pickle=False"
            raise CheckpointError(f"{path}: refused: the archive holds pickled objects ({e}); vitlab never unpickles") from None
        raise CheckpointError(f"{path}: not a readable .npz archive ({e})") from None
    except Exception as e:  # a damaged archive: zipfile, zlib and numpy's header parser raise many types
        raise CheckpointError(f"{path}: not a readable .npz archive ({type(e).__name__}: {e})") from None
    arrays, notes = parameter_arrays(arrays, str(path))
    out = {}
    for k, a in arrays.items():
        if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bfloat16: numpy writes it as the void type '|V2'
            t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        elif a.dtype.kind != "f":
            raise CheckpointError(f"{path}: array {k!r} has dtype {a.dtype.str}; a model's parameters are floats")
        else:
            t = torch.from_numpy(np.ascontiguousarray(a))
        out[k] = t.reshape(-1) if t.ndim == 4 and t.shape[:3] == (1, 1, 1) else t  # old hybrids: GroupNorm (1, 1, 1, C)
    if any(t.dtype == torch.bfloat16 for t in out.values()):
        notes.append("bfloat16 arrays")
    return out, notes


# big_vision's layouts (big_vision/models/vit.py: `load`, `fix_old_checkpoints`,
# `scan_to_pyloop`; utils.py: `load_params`, `recover_dtype`), each read as big_vision reads it.
SCANNED = "Transformer/encoderblock/"  # nn.scan: one block's arrays stacked over depth


def parameter_arrays(a: dict, source: str) -> tuple[dict, list[str]]:
    """What big_vision's `load_params` takes as the model from an archive: an optax training
    state's `params/`, else a Flax optimizer's `opt/target/`, the rest of the state (optimizer
    moments, int32 step counts, the chronometer) ignored; else the whole archive."""
    tops = {k.split("/", 1)[0] for k in a}
    prefix = "params/" if "params" in tops else "opt/target/" if "opt" in tops else None
    if prefix is None:
        return a, []
    picked = {k[len(prefix):]: v for k, v in a.items() if k.startswith(prefix)}
    if not picked:
        raise CheckpointError(f"{source}: a training state ({', '.join(sorted(a)[:3])}, ...) without params/... or opt/target/... arrays")
    both = sorted(k for k in picked if k in a)
    if both:
        raise CheckpointError(f"{source}: {both[0]!r} is both at the top level and under {prefix}: the archive holds two "
                              f"models; keep one (big_vision would read the {prefix} one)")
    ignored = sorted(tops - {prefix.split("/")[0]}) + (["opt/state"] if prefix == "opt/target/" else [])
    return picked, [prefix.rstrip("/") + (f" ({', '.join(ignored)} ignored)" if ignored else "")]


def scanned_depth(stacked: dict[str, Tensor], rest: dict[str, Tensor], source: str) -> int:
    """The depth of a scanned encoder: the one count of blocks that every stacked array holds.
    Arrays that disagree, or the encoder also written block by block, are refused naming what
    disagrees: either copy could be the model, and reading one would drop or hide the other."""
    per_block = sorted(k for k in rest if k.startswith("Transformer/encoderblock_"))
    if per_block:
        raise CheckpointError(f"{source}: the encoder is written twice, scanned ({SCANNED}...) and block by block "
                              f"({per_block[0]}, ...); keep one layout")
    depths: dict[int, list[str]] = {}
    for name, v in sorted(stacked.items()):
        depths.setdefault(int(v.shape[0]) if v.ndim else 0, []).append(name)
    if len(depths) > 1:
        said = "; ".join(f"{SCANNED}{names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''} "
                         f"stack{'s' if len(names) == 1 else ''} {d} blocks" for d, names in sorted(depths.items()))
        raise CheckpointError(f"{source}: the scanned encoder's arrays disagree on the depth: {said}")
    return next(iter(depths))


def from_big_vision(a: dict[str, Tensor], source: str) -> tuple[dict[str, Tensor], list[str]]:
    """big_vision's layouts rewritten into the original one, and what was rewritten: a
    scanned encoder, the position embedding at the top level (or at
    `Transformer/pos_embedding`, before 2022) where it covers only the patches, the class
    token then having none (a zero row here is the same sum)."""
    notes = []
    if any(k.startswith("MAPHead_0/") for k in a):
        raise CheckpointError(f"{source}: a big_vision model with a MAP head (pool_type='map'), which vitlab's ViT lacks")
    if any(k.startswith(SCANNED) for k in a):
        stacked = {k[len(SCANNED):]: v for k, v in a.items() if k.startswith(SCANNED)}
        a = {k: v for k, v in a.items() if not k.startswith(SCANNED)}
        depth = scanned_depth(stacked, a, source)
        a.update({f"Transformer/encoderblock_{i}/{k}": v[i] for i in range(depth) for k, v in stacked.items()})
        notes.append(f"scanned encoder ({depth} blocks)")
    for name in ("Transformer/pos_embedding", "pos_embedding"):
        if name in a and POS not in a:
            pos = a.pop(name)
            if "cls" in a and pos.ndim == 3 and math.isqrt(pos.shape[1]) ** 2 == pos.shape[1]:
                pos = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)  # patches only: the class token has none
            a[POS] = pos
            notes.append(name)
    return a, notes


def infer_config(a: dict[str, Tensor], source: str) -> tuple[ViTConfig, str]:
    """The architecture, from the arrays' names and shapes alone."""
    if "embedding/kernel" not in a:
        raise CheckpointError(f"{source}: no 'embedding/kernel' array, so not an official ViT checkpoint; found {', '.join(sorted(a)[:6])}")
    ph, pw, cin, d = a["embedding/kernel"].shape
    if ph != pw:
        raise CheckpointError(f"{source}: embedding/kernel {tuple(a['embedding/kernel'].shape)} has non-square patches")
    depth = count_indexed(a, lambda i: f"Transformer/encoderblock_{i}/LayerNorm_0/scale")
    spelling = next((s for s, names in SPELLINGS.items() if f"Transformer/encoderblock_0/{names[1]}/query/kernel" in a), None)
    if depth == 0 or spelling is None:
        raise CheckpointError(f"{source}: no Transformer/encoderblock_0/... arrays in either known spelling "
                              f"({', '.join(n[1] for n in SPELLINGS.values())})")
    _, mha, _, mlp = SPELLINGS[spelling]
    _, heads, _ = a[f"Transformer/encoderblock_0/{mha}/query/kernel"].shape
    mlp_dim = a[f"Transformer/encoderblock_0/{mlp}/Dense_0/kernel"].shape[1]

    resnet = None
    in_channels = cin
    if "conv_root/kernel" in a:
        _, _, in_channels, width = a["conv_root/kernel"].shape
        layers = resnet_layers(a, lambda s, u: _resnet_name("conv", s, u, 1))
        resnet = ResNetConfig(layers=layers, width_factor=width // 64)

    token = "cls" in a
    stride = ph * (resnet.stride if resnet else 1)
    if POS in a:
        pos_embed, side = "learned", square_grid(a[POS].shape[1] - int(token), source)
    elif spelling == "linen":  # big_vision's posemb='sincos2d': computed for the input's grid, so any size
        pos_embed, side = "sincos_2d_big_vision", max(1, round(224 / stride))
    else:
        raise CheckpointError(f"{source}: no {POS} array, which every model of the original layout has")
    cfg = ViTConfig(name="npz", image_size=(side * stride, side * stride), patch_size=ph, in_channels=in_channels,
                    hidden_size=d, depth=depth, num_heads=heads, mlp_dim=mlp_dim,
                    num_classes=a["head/kernel"].shape[1] if "head/kernel" in a else 0,
                    classifier="token" if token else "gap", pos_embed=pos_embed,
                    representation_size=a["pre_logits/kernel"].shape[1] if "pre_logits/kernel" in a else None,
                    qkv_bias=f"Transformer/encoderblock_0/{mha}/query/bias" in a, resnet=resnet,
                    mean=(0.5,) * in_channels, std=(0.5,) * in_channels)
    cfg = official_numerics(cfg)
    return cfg.replace(name=describe(cfg)), spelling


def read(path: str | os.PathLike) -> Imported:
    arrays, layout = load_arrays(path)
    metadata: dict[str, str] = {}
    if bit.NPZ_ROOT in arrays:
        bit_cfg = bit.config_from_npz(arrays, str(path))
        cfg: ModelConfig = bit_cfg
        table = bit.npz_rules(bit_cfg)
    else:
        arrays, rewritten = from_big_vision(arrays, str(path))
        vit_cfg, spelling = infer_config(arrays, str(path))
        cfg, table, metadata["spelling"] = vit_cfg, rules(vit_cfg, spelling), spelling
        layout += rewritten + (["posemb sincos2d (no position array; image size not recorded, "
                                f"{vit_cfg.image_size[0]} assumed)"] if vit_cfg.pos_embed != "learned" else [])
        if layout:
            metadata["big_vision"] = "; ".join(layout)
    state = import_state(table, arrays, expected_shapes(cfg), str(path))
    names = read_class_names(path, cfg.num_classes)
    return Imported(cfg, state, names, source_format=FORMAT_NAME, metadata=metadata,
                    guessed=guessed_preprocessing("the official code's (a whole-image resize)"))


# Class names travel in the zip archive's comment, which every .npy reader ignores.
NAMES_TAG = b"vitlab.class_names="
ZIP_COMMENT_MAX = 65535


def read_class_names(path: str | os.PathLike, num_classes: int) -> Optional[list[str]]:
    try:
        with zipfile.ZipFile(path) as z:
            comment = z.comment
    except (OSError, zipfile.BadZipFile):
        return None
    if not comment.startswith(NAMES_TAG):
        return None
    try:
        names = json.loads(comment[len(NAMES_TAG) :].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return names if isinstance(names, list) and len(names) == num_classes else None


def _names_comment(model) -> bytes:
    """The class names as the archive's comment. ImageNet's 1k and 21k names need no room:
    a checkpoint of those class counts gets them on reading (labels.py)."""
    names = model.class_names
    if not names or is_imagenet(names):
        return b""
    comment = NAMES_TAG + json.dumps(list(names), ensure_ascii=False).encode("utf-8")
    if len(comment) > ZIP_COMMENT_MAX:
        warnings.warn(f"{len(names)} class names do not fit in an .npz archive's comment (64 kB); they are not written", stacklevel=2)
        return b""
    return comment


# Writing --------------------------------------------------------------------------------
def check_writable(cfg: ViTConfig, allow_numerics_change: bool = False) -> list[str]:
    """Refuse what the official format cannot represent; returns the allowed numerics changes."""
    (gh, gw), r = cfg.grid_size, cfg.resnet
    return refuse("the official .npz format", failing(
        (cfg.pos_embed != "learned", f"pos_embed={cfg.pos_embed!r} (the official models have learned 1D position embeddings)"),
        (cfg.pos_embed_at != "stem", f"pos_embed_at={cfg.pos_embed_at!r} (the official models add it once, after the stem)"),
        (gh != gw, f"a {gh}x{gw} token grid (readers assume a square grid)"),
        (not cfg.qkv_bias, "qkv_bias=False (the official attention always has biases)"),
        (r and r.gn_groups != 32, r and f"resnet.gn_groups={r.gn_groups} (the official ResNet uses 32)"),
    ), failing(
        (cfg.gelu != "tanh", f"gelu={cfg.gelu!r} (official: tanh approximation)"),
        (cfg.layer_norm_eps != 1e-6, f"layer_norm_eps={cfg.layer_norm_eps:g} (official: 1e-6)"),
        (r and (r.ws_mode, r.ws_eps, r.gn_eps) != ("std", 1e-5, 1e-6),
         r and f"ResNet ws_mode={r.ws_mode!r} ws_eps={r.ws_eps:g} gn_eps={r.gn_eps:g} (official: (w-mean)/(std+1e-5), GroupNorm eps 1e-6)"),
    ), allow_numerics_change)


def write(model, path: str | os.PathLike, allow_numerics_change: bool = False) -> None:
    """The official layout in the original spelling (`MultiHeadDotProductAttention_1`,
    `MlpBlock_3`), or BiT's for a BiT ResNet; GroupNorm parameters flat (C,), float arrays
    only. The class names go in the archive's comment (invisible to numpy, timm and the
    official code)."""
    import numpy as np

    cfg = model.config
    if isinstance(cfg, BiTConfig):
        bit.check_writable(cfg, "npz", allow_numerics_change)
        table = bit.npz_rules(cfg)
    else:
        numerics = check_writable(cfg, allow_numerics_change=True)  # refused below, with what the file loses
        table = rules(cfg, "original")
    theirs = export_state(table, model.state_dict(), f"{path} (npz)")
    if not isinstance(cfg, BiTConfig):
        # The archive holds arrays only: a reader infers the config from them, with official numerics.
        check_carried(f"{path} (npz)", cfg, infer_config(theirs, str(path))[0], allow_numerics_change, numerics)
    arrays = {k: v.numpy() for k, v in theirs.items()}

    comment = _names_comment(model)

    def save(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a name
            np.savez(f, **arrays)  # type: ignore[arg-type]  # the arrays' names, which numpy's stub mistakes for its flags
        if comment:
            with zipfile.ZipFile(tmp, "a") as z:
                z.comment = comment

    atomic_write(path, save)
