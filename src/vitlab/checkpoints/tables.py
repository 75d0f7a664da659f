"""What the foreign formats share: conversion tables, tensor files, and the checks around them.

A converter is a table of `Rule`s, one per vitlab parameter: which of their tensors it comes
from and how (copy, transpose, reshape, split a fused q/k/v). The same table runs both ways,
so every transform is exact (transposes, reshapes and concatenations only) and a round trip
reproduces every bit. Applying a table fails on any key left over on either side and checks
every shape, naming the file, the keys and the shapes.
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Collection, Optional, Sequence

import torch
from torch import Tensor

from vitlab.checkpoints.io import (
    CheckpointError,
    Imported,
    expected_shapes,
    guessed_preprocessing,
    head_names,
    parse_class_names,
    read_metadata,
    regular_file,
)
from vitlab.checkpoints.labels import is_imagenet
from vitlab.config import ModelConfig, ViTConfig, config_from_dict, config_kind
from vitlab.files import atomic_write, atomic_write_bytes
from vitlab.files.documents import read_json

ToOurs = Callable[..., Tensor]  # their tensors, in rule order -> our tensor
ToTheirs = Callable[[Tensor], tuple[Tensor, ...]]  # our tensor -> their tensors


@dataclass(frozen=True)
class Rule:
    ours: str
    theirs: tuple[str, ...]
    to_ours: ToOurs
    to_theirs: ToTheirs


def copy(ours: str, theirs: str) -> Rule:
    return Rule(ours, (theirs,), lambda t: t, lambda t: (t,))


def transposed(ours: str, theirs: str) -> Rule:
    """A Dense kernel stored (in, out): torch's Linear.weight is its transpose."""
    return Rule(ours, (theirs,), lambda t: t.t(), lambda t: (t.t(),))


def permuted(ours: str, theirs: str, perm: Sequence[int]) -> Rule:
    """Axes reordered, e.g. a conv kernel HWIO -> OIHW is (3, 2, 0, 1)."""
    perm = tuple(perm)
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return Rule(ours, (theirs,), lambda t: t.permute(perm), lambda t: (t.permute(inverse),))


def fused(ours: str, theirs: Sequence[str], part: Optional[Rule] = None) -> Rule:
    """Our fused tensor (q, k, v concatenated on the output axis, dim 0) from their separate
    ones; `part` (a rule with dummy names) converts each piece before the concatenation."""
    to_ours = part.to_ours if part else (lambda t: t)
    to_theirs = part.to_theirs if part else (lambda t: (t,))
    n = len(theirs)

    def join(*ts: Tensor) -> Tensor:
        return torch.cat([to_ours(t) for t in ts], dim=0)

    def split(t: Tensor) -> tuple[Tensor, ...]:
        return tuple(to_theirs(p)[0] for p in t.chunk(n, dim=0))

    return Rule(ours, tuple(theirs), join, split)


def _few(keys: Sequence[str], n: int = 8) -> str:
    keys = list(keys)
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "")


def import_state(rules: Sequence[Rule], theirs: dict[str, Tensor], expected: dict[str, tuple[int, ...]], source: str) -> dict[str, Tensor]:
    """Their state dict -> ours. Every one of their keys must be used, every shape must fit."""
    missing = [k for r in rules for k in r.theirs if k not in theirs]
    used = {k for r in rules for k in r.theirs}
    unused = sorted(k for k in theirs if k not in used)
    if missing or unused:
        parts = [f"missing keys {_few(missing)}"] if missing else []
        parts += [f"unexpected keys {_few([f'{k} {tuple(theirs[k].shape)}' for k in unused])}"] if unused else []
        raise CheckpointError(f"{source}: the tensors do not fit the layout vitlab inferred: " + "; ".join(parts))
    out, wrong = {}, []
    for r in rules:
        tensors = [theirs[k] for k in r.theirs]
        want = expected.get(r.ours)
        try:
            t = r.to_ours(*tensors)
        except RuntimeError:  # a reshape or concatenation that the shapes do not allow
            t = None
        if t is None or want is None or tuple(t.shape) != want:
            got = ", ".join(f"{k} {tuple(p.shape)}" for k, p in zip(r.theirs, tensors, strict=True))
            wrong.append(f"{got} -> {r.ours} needs {want}")
            continue
        out[r.ours] = t.contiguous()
    if wrong:
        raise CheckpointError(f"{source}: wrong shapes: " + "; ".join(wrong[:8]), reason="shape")
    return out


def export_state(rules: Sequence[Rule], ours: dict[str, Tensor], target: str) -> dict[str, Tensor]:
    """Our state dict -> theirs. A parameter no rule covers means the target cannot hold it."""
    used = {r.ours for r in rules}
    left = sorted(k for k in ours if k not in used)
    missing = [r.ours for r in rules if r.ours not in ours]
    if left or missing:
        raise CheckpointError(f"{target}: no place for vitlab parameters {_few(left)}" if left
                              else f"{target}: the model lacks parameters {_few(missing)} that the layout needs")
    out: dict[str, Tensor] = {}
    for r in rules:
        for k, t in zip(r.theirs, r.to_theirs(ours[r.ours].detach().cpu()), strict=True):
            out[k] = t.contiguous()
    return out


# The hybrid's BiT ResNet stem, in any format -----------------------------------------------
ResNetName = Callable[..., str]  # (part, stage=0, unit=0, n=0) -> their key or key prefix


def resnet_rules(layers: Sequence[int], theirs: ResNetName, conv: Callable[[str, str], Rule],
                 norm_params: tuple[str, str]) -> list[Rule]:
    """The rules of a hybrid's ResNet stem. `theirs(part, stage, unit, n)` names a part in
    the format ("root_conv", "root_norm", "conv", "norm", "proj_conv", "proj_norm"; norms are
    prefixes); `conv(ours, theirs)` converts a kernel (a copy, or HWIO -> OIHW); norm_params
    are the format's names of GroupNorm's scale and shift."""
    scale, shift = norm_params

    def norm(ours: str, prefix: str) -> list[Rule]:
        return [copy(f"{ours}.weight", prefix + scale), copy(f"{ours}.bias", prefix + shift)]

    table = [conv("backbone.root_conv.weight", theirs("root_conv")), *norm("backbone.root_gn", theirs("root_norm"))]
    for s, units in enumerate(layers):
        for u in range(units):
            o = f"backbone.stages.{s}.{u}."
            for n in (1, 2, 3):
                table += [conv(f"{o}conv{n}.weight", theirs("conv", s, u, n)), *norm(f"{o}gn{n}", theirs("norm", s, u, n))]
            if u == 0:  # the first unit of every stage changes width (or stride): a projection
                table += [conv(f"{o}downsample.0.weight", theirs("proj_conv", s, u)),
                          *norm(f"{o}downsample.1", theirs("proj_norm", s, u))]
    return table


def count_indexed(keys: Collection[str], key: Callable[[int], str]) -> int:
    """How many of key(0), key(1), ... are present, in a row: blocks, stages, units."""
    n = 0
    while key(n) in keys:
        n += 1
    return n


def resnet_layers(keys: Collection[str], unit_key: Callable[[int, int], str]) -> tuple[int, ...]:
    """Units per stage of a ResNet stem, from `unit_key(stage, unit)` naming one unit's tensor."""
    return tuple(count_indexed(keys, partial(unit_key, s)) for s in range(count_indexed(keys, lambda s: unit_key(s, 0))))


# Naming and guessing ---------------------------------------------------------------------
# Head counts of the published widths (ViT-H has 16 heads of 80); other widths get heads of 64.
KNOWN_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def guess_num_heads(width: int) -> int:
    """Formats that fuse q/k/v (timm, torchvision) do not store the head count."""
    return KNOWN_HEADS.get(width, width // 64 if width % 64 == 0 else 1)


def square_grid(patch_tokens: int, source: str) -> int:
    side = round(patch_tokens**0.5)
    if side * side != patch_tokens:
        raise CheckpointError(f"{source}: the position embedding has {patch_tokens} patch rows, not a square grid; "
                              "pass image_size=(H, W) to vitlab.load to say which grid it is")
    return side


# Tensor files (.safetensors, .pth/.pt/.bin), never unpickled ------------------------------
STATE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def read_tensors(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A flat state dict and the file's metadata (safetensors only). `.pth` files are read
    with `weights_only=True`: PyTorch's restricted unpickler, which runs no code from the file."""
    path = regular_file(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        meta = read_metadata(path)
        try:
            return load_file(str(path)), meta
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: not a readable .safetensors file ({e})") from None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for anything but tensors and plain containers
        raise CheckpointError(f"{path}: refused: not a plain tensor file ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
                              "vitlab never runs pickled code; re-save the weights as a state dict of tensors") from None
    # Training scripts often wrap the weights: {"state_dict": ...} or {"model": ...}.
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{path}: expected a state dict of tensors, found {type(obj).__name__}")
    return dict(obj), {}


def config_json(folder: Path, what: str) -> Optional[dict[str, Any]]:
    """A folder's config.json as a mapping, or None: absent, unreadable (a FIFO is refused before
    it is opened), not UTF-8, not JSON, not an object: not the folder of that format."""
    try:
        return read_json(folder / "config.json", dict, what)
    except (OSError, ValueError):
        return None


def peek_keys(path: Path) -> Optional[set[str]]:
    """The tensor names of a state-dict file, or None when it is not one (for detection)."""
    if not path.is_file():
        return None
    # torch.save's zip layout (a `data.pkl` member) for a file without a telling suffix
    if path.suffix not in STATE_SUFFIXES and not any(n.endswith("/data.pkl") or n == "data.pkl" for n in zip_names(path)):
        return None
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return set(f.keys())
        except Exception:
            return None
    try:
        return set(read_tensors(path)[0])
    except CheckpointError:
        return None


# Networks vitlab does not hold, told by their state dicts' names: (keys that must all be there,
# what to call it). A file of one is named as what it is, not as "unrecognised".
OTHER_NETWORKS = (
    (("conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "fc.weight"), "a ResNet state dict with BatchNorm (torchvision's layout), not a ViT or a BiT ResNet"),
    (("dist_token", "pos_embed", "head_dist.weight"), "a distilled DeiT (with a distillation token), which vitlab has no form of"),
    (("layers.0.blocks.0.attn.relative_position_bias_table",), "a Swin Transformer, not a ViT"),
    (("stem.0.weight", "stages.0.blocks.0.conv_dw.weight"), "a ConvNeXt, not a ViT"),
)


def what_it_is(keys: Optional[set[str]]) -> Optional[str]:
    """What network a state dict vitlab cannot read holds, where its names say (OTHER_NETWORKS)."""
    for needed, words in OTHER_NETWORKS:
        if keys and all(k in keys for k in needed):
            return words
    return None


def zip_names(path: Path) -> list[str]:
    """The member names of a zip archive (an .npz, torch.save's layout), or none for a file
    that is not one."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


def write_tensors(path: str | os.PathLike, state: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """`.safetensors` (with metadata) or, for any other suffix, a plain `torch.save` state dict."""
    path = Path(path)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))
    else:
        names = json.loads(metadata.get("vitlab.class_names") or "null")
        if names and not is_imagenet(names):
            warnings.warn(f"{path}: a torch.save state dict drops the class names; write a .safetensors file to keep them", stacklevel=2)
        # Into memory first: torch.save reports a full disk as "unexpected pos", a plain write
        # as the OS's own error.
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(path, buffer.getvalue())


def stored_config(meta: dict[str, str], source: str) -> Optional[ModelConfig]:
    """The full vitlab config a vitlab writer left in a file's metadata (None if absent).
    The tensors are still checked against it, shape by shape, when they are imported."""
    raw = meta.get("vitlab.config")
    if not raw:
        return None
    try:
        return config_from_dict(json.loads(raw), meta.get("vitlab.config_kind", "vit"))
    except (ValueError, TypeError) as e:  # JSONDecodeError and ConfigError are ValueErrors
        raise CheckpointError(f"{source}: the vitlab.config metadata is invalid ({e}); the file is damaged") from None


def read_state_dict_file(path: str | os.PathLike, fmt: str, rules: Callable[..., list[Rule]],
                         infer: Callable[[dict[str, Tensor], str], ModelConfig],
                         rename: Callable[[dict[str, Tensor]], dict[str, Tensor]] = dict) -> Imported:
    """A state-dict format (timm, torchvision): the tensors, the config vitlab wrote beside them
    (else inferred from the tensors), the table applied with every key and shape checked."""
    state, meta = read_tensors(path)
    state = rename(state)
    stored = stored_config(meta, str(path))
    cfg = stored or infer(state, str(path))
    ours = import_state(rules(cfg), state, expected_shapes(cfg), str(path))
    names = parse_class_names(meta.get("vitlab.class_names"), cfg.num_classes, str(path), "vitlab.class_names")
    imported = Imported(cfg, ours, names, source_format=fmt, metadata=meta)
    if stored is None:  # the tensors give the shapes; the rest is the source library's default
        source = f"{DEFAULTS_OF.get(fmt, fmt)} for {cfg.name}" if isinstance(cfg, ViTConfig) else \
            "vitlab's default (this library's differs by weights: pass theirs to vitlab.load)"
        imported.guessed = guessed_preprocessing(source)
        if isinstance(cfg, ViTConfig) and cfg.num_heads:
            imported.guessed["num_heads"] = f"not in a state dict: the published count for width {cfg.hidden_size}"
    return imported


# Whose preprocessing a state dict without metadata gets (the readers' infer functions set it).
DEFAULTS_OF = {"timm": "timm's pretrained_cfg default", "torchvision": "torchvision's weights preset"}


def writer_metadata(model, fmt: str) -> dict[str, str]:
    return {"format": fmt, "vitlab.config": model.config.to_json(), "vitlab.config_kind": config_kind(model.config),
            "vitlab.class_names": json.dumps(head_names(model.config, model.class_names))}


def failing(*checks: tuple[object, Any]) -> list[str]:
    """The words of each (wrong, words) check that is wrong: a format's refusals as a table.
    Words that need a part a config may lack are written `part and f"..."`."""
    return [str(words) for wrong, words in checks if wrong]


def refuse(target: str, features: list[str], numerics: list[str], allow_numerics_change: bool) -> list[str]:
    """Stop before writing anything the target cannot hold exactly (see docs/converting.md);
    returns the numerics changes that were allowed."""
    if features:
        raise CheckpointError(f"{target} cannot represent {'; '.join(features)}: not written")
    if numerics and not allow_numerics_change:
        raise CheckpointError(f"{target} computes differently: {'; '.join(numerics)}. Not written; pass "
                              "allow_numerics_change=True (CLI: --allow-numerics-change) to write the weights anyway")
    return numerics


# What a written file carries back ---------------------------------------------------------
# Settings that decide the logits for a given input: a reader that cannot recover one builds
# another function from the same weights.
COMPUTE_FIELDS = ("image_size", "patch_size", "in_channels", "hidden_size", "depth", "num_heads", "mlp_dim",
                  "num_classes", "classifier", "pos_embed", "representation_size", "gelu", "layer_norm_eps",
                  "qkv_bias", "resnet")
# Settings around the network: how images are prepared, how position embeddings follow a new size.
IMAGE_FIELDS = ("mean", "std", "crop_fraction")  # image preprocessing
RESAMPLE_FIELDS = ("resize_mode", "dynamic_image_size")  # position-embedding resampling (§3.2)


def _short(v: object) -> str:
    if isinstance(v, tuple) and v and all(isinstance(x, float) for x in v):
        return "(" + ", ".join(f"{x:g}" for x in v) + ")"
    return repr(v)


def lost_settings(ours: ViTConfig, back: ViTConfig, named: Sequence[str] = ()) -> list[str]:
    """The settings of the network that a reader of the written file gets wrong: "num_heads=2
    reads back as 1". Fields already named in `named` (a format's own refusals) are not
    repeated; the settings around the network are around_the_network's."""
    return [f"{f}={_short(getattr(ours, f))} reads back as {_short(getattr(back, f))}"
            for f in COMPUTE_FIELDS if getattr(ours, f) != getattr(back, f) and not any(re.search(rf"\b{f}\b", n, re.I) for n in named)]


def check_carried(target: str, ours: ViTConfig, back: ViTConfig, allow_numerics_change: bool,
                  numerics: Sequence[str] = ()) -> None:
    """Refuse to write a file from which a reader would build another network: the format's
    own numerics changes (`numerics`, from its check_writable) and the settings the file
    cannot carry (`back` is the config a reader infers from what is written). Allowed, each
    is said in a warning; settings around the network are said where they change results."""
    compute = lost_settings(ours, back, numerics)
    if (numerics or compute) and not allow_numerics_change:
        parts = ([f"computes differently: {'; '.join(numerics)}"] if numerics else []) + \
            ([f"cannot carry {'; '.join(compute)} (a reader would build another model)"] if compute else [])
        fix = "write a .safetensors file (it carries vitlab's config), or pass" if compute else "pass"
        raise CheckpointError(f"{target} {' and '.join(parts)}. Not written; {fix} allow_numerics_change=True "
                              "(CLI: --allow-numerics-change) to write the weights anyway")
    if numerics or compute:
        warnings.warn(f"{target}: the reloaded model will differ: {'; '.join([*numerics, *compute])}", stacklevel=2)
    for line in around_the_network(target, ours, back):
        warnings.warn(line, stacklevel=2)


def around_the_network(target: str, ours: ViTConfig, back: ViTConfig) -> list[str]:
    """What a reader of `target` does differently around the same network, one sentence
    each, and only what changes its results: image preprocessing it does its own way, and
    position-embedding resampling, which matters only for a model that resamples on every
    forward (dynamic_image_size=True); at the trained size no resampling happens, and a
    reader fine-tuning at another size picks its own interpolation anyway."""
    lost = {f for f in IMAGE_FIELDS + RESAMPLE_FIELDS if getattr(ours, f) != getattr(back, f)}
    lines = []
    image = [f"{f}={_short(getattr(ours, f))}" for f in IMAGE_FIELDS if f in lost]
    if image:
        lines.append(f"{target} does not record the image preprocessing {', '.join(image)}: a reader "
                     "normalises and crops images with its own defaults (pass them to it yourself)")
    if ours.dynamic_image_size and lost & set(RESAMPLE_FIELDS):
        lines.append(f"{target} does not record that the position embeddings are resampled on every forward "
                     f"(dynamic_image_size=True, resize_mode={ours.resize_mode!r}): a reader runs only at "
                     f"{ours.image_size} px, or resamples its own way")
    return lines
