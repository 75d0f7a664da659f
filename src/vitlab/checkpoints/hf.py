"""Hugging Face transformers `save_pretrained` folders of `ViTModel` / `ViTForImageClassification`.

A folder holds config.json and the weights (model.safetensors, a sharded index, or
pytorch_model.bin). HF keeps q, k and v as separate Linear layers (vitlab fuses them on the
output axis). Its ViT has a class token and a learned 1D position table only; `ViTModel`'s
pooler (Dense + tanh on the class token) is the paper's pre-logits layer. The config's own
`layer_norm_eps` and `hidden_act` are honoured ("gelu" is exact, "gelu_pytorch_tanh" and
"gelu_new" the tanh form); HF resizes position embeddings bicubically.

vitlab writes the classic key spelling (`encoder.layer.N.attention.attention.query`) that
every transformers version reads (v5 renames it on load), and reads that spelling and v5's
(`layers.N.attention.q_proj`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

from vitlab.checkpoints.io import CheckpointError, Imported, expected_shapes, guessed_preprocessing, head_names
from vitlab.checkpoints.peers import HF_PREPROCESSING
from vitlab.checkpoints.tables import Rule, check_carried, config_json, copy, export_state, failing, fused, import_state, read_tensors, refuse
from vitlab.config import ConfigError, ViTConfig
from vitlab.config.fields import check_type
from vitlab.config.model import as_pair
from vitlab.files import replace_folder
from vitlab.files.documents import read_json
from vitlab.models.variants import describe

FORMAT_NAME = "hf"
ACTS = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# What `write` owns in a folder: these are replaced, everything else is left alone.
WRITTEN_FILES = ("config.json", "preprocessor_config.json", *WEIGHT_FILES)


def written_by_us(name: str) -> bool:
    """A file of the kind `write` produces, or stale weights of an earlier save (shards)."""
    return name in WRITTEN_FILES or bool(re.fullmatch(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)", name))
# transformers v5 names -> the classic ones the table uses.
V5_NAMES = [(".attention.q_proj.", ".attention.attention.query."), (".attention.k_proj.", ".attention.attention.key."),
            (".attention.v_proj.", ".attention.attention.value."), (".attention.o_proj.", ".attention.output.dense."),
            (".mlp.fc1.", ".intermediate.dense."), (".mlp.fc2.", ".output.dense.")]


def rules(cfg: ViTConfig, prefix: str = "vit.") -> list[Rule]:
    e = prefix + "embeddings."
    table = [copy("cls_token", e + "cls_token"), copy("pos_embed.pos_embedding", e + "position_embeddings"),
             copy("patch_embed.proj.weight", e + "patch_embeddings.projection.weight"),
             copy("patch_embed.proj.bias", e + "patch_embeddings.projection.bias"),
             copy("norm.weight", prefix + "layernorm.weight"), copy("norm.bias", prefix + "layernorm.bias")]
    for i in range(cfg.depth):
        o, t = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        a = t + "attention.attention."
        params = ("weight", "bias") if cfg.qkv_bias else ("weight",)
        table += [fused(f"{o}attn.qkv.{p}", [f"{a}{n}.{p}" for n in ("query", "key", "value")]) for p in params]
        for ours, theirs in (("norm1", "layernorm_before"), ("attn.proj", "attention.output.dense"), ("norm2", "layernorm_after"),
                             ("mlp.fc1", "intermediate.dense"), ("mlp.fc2", "output.dense")):
            table += [copy(f"{o}{ours}.{p}", f"{t}{theirs}.{p}") for p in ("weight", "bias")]
    if cfg.representation_size:
        table += [copy("pre_logits.weight", prefix + "pooler.dense.weight"), copy("pre_logits.bias", prefix + "pooler.dense.bias")]
    if cfg.num_classes:
        table += [copy("head.weight", "classifier.weight"), copy("head.bias", "classifier.bias")]
    return table


# Reading --------------------------------------------------------------------------------
def detect(path: Path) -> bool:
    return path.is_dir() and (config_json(path, "Hugging Face config") or {}).get("model_type") == "vit"


def read_json_object(path: Path, where: str) -> dict[str, Any]:
    """A JSON file of a Hub repo (or any checkpoint folder) that must hold one object: UTF-8,
    valid JSON, a mapping; anything else is a CheckpointError naming the file."""
    return read_json(path, dict, f"JSON object ({where})", "delete the repo's copy from the cache, or fix the folder", CheckpointError)


def shard_names(index: Path, where: str) -> list[str]:
    """The shard files a model.safetensors.index.json names, each a plain .safetensors file
    name of the same folder: a path that climbs out, or a weight map of another shape, is
    refused before anything is fetched or opened."""
    weight_map = read_json_object(index, where).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{where}: {index.name} ({index}) has no weight_map of tensor names to shard files")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if "/" in shard or "\\" in shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise CheckpointError(f"{where}: {index} names the shard {shard[:80]!r}, not a .safetensors file beside it")
    return shards


def _weights(folder: Path) -> dict:
    if (folder / "model.safetensors").is_file():
        return read_tensors(folder / "model.safetensors")[0]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        state: dict = {}
        for name in shard_names(index, str(folder)):
            state.update(read_tensors(folder / name)[0])
        return state
    if (folder / "pytorch_model.bin").is_file():
        return read_tensors(folder / "pytorch_model.bin")[0]
    raise CheckpointError(f"{folder}: no weights file ({', '.join(WEIGHT_FILES)})")


def _classic_name(k: str) -> str:
    if ".layers." in k or k.startswith("layers."):
        k = k.replace("layers.", "encoder.layer.", 1)
        for new, old in V5_NAMES:
            k = k.replace(new, old)
    return k


_MISSING = object()


def field(c: dict[str, Any], key: str, kind: type, source: str, default: Any = _MISSING) -> Any:
    """config.json's `key`, which must be of `kind` (the one check of a typed setting,
    config.fields.check_type: JSON's numbers as numbers, 2 as 2.0 for a float)."""
    if key not in c:
        if default is _MISSING:
            raise CheckpointError(f"{source}: config.json has no {key!r}; a ViT config needs it")
        return default
    try:
        return check_type(c[key], kind, key)
    except ConfigError as e:
        raise CheckpointError(f"{source}: in config.json, {e}") from None


def infer_config(c: dict[str, Any], state: dict, source: str) -> tuple[ViTConfig, Optional[list[str]]]:
    act = field(c, "hidden_act", str, source, "gelu")
    if act not in ACTS:
        raise CheckpointError(f"{source}: hidden_act={act!r} has no vitlab equivalent (known: {', '.join(ACTS)})")
    if field(c, "pooler_act", str, source, "tanh") != "tanh" and any("pooler." in k for k in state):
        raise CheckpointError(f"{source}: pooler_act={c['pooler_act']!r}; vitlab's pre-logits layer is Dense + tanh")
    image = c.get("image_size", 224)
    if not (isinstance(image, int) and not isinstance(image, bool)) and not (
            isinstance(image, list) and len(image) == 2 and all(isinstance(v, int) for v in image)):
        raise CheckpointError(f"{source}: config.json has image_size={image!r}, not a size or [height, width]")
    prefix = "vit." if any(k.startswith("vit.") for k in state) else ""
    classes = state["classifier.weight"].shape[0] if "classifier.weight" in state else 0
    pooler = state.get(prefix + "pooler.dense.weight")
    rep = pooler.shape[0] if pooler is not None and not classes else None
    names = None
    labels = field(c, "id2label", dict, source, None) or {}
    if classes and len(labels) == classes:
        names = [str(labels.get(str(i), labels.get(i, ""))) for i in range(classes)]
        if all(n == f"LABEL_{i}" for i, n in enumerate(names)):
            names = None  # transformers' placeholders, not names
    channels = field(c, "num_channels", int, source, 3)
    # transformers 5.x's image processors (AutoImageProcessor, pipeline) resize a uint8 tensor
    # with torchvision's antialiased kernels, whatever the folder's processor type: resize_backend.
    cfg = ViTConfig(name="hf", image_size=as_pair(tuple(image) if isinstance(image, list) else image),
                    patch_size=field(c, "patch_size", int, source, 16), in_channels=channels,
                    hidden_size=field(c, "hidden_size", int, source), depth=field(c, "num_hidden_layers", int, source),
                    num_heads=field(c, "num_attention_heads", int, source), mlp_dim=field(c, "intermediate_size", int, source),
                    num_classes=classes, representation_size=rep, gelu=ACTS[act],
                    layer_norm_eps=field(c, "layer_norm_eps", float, source, 1e-12),
                    qkv_bias=field(c, "qkv_bias", bool, source, True), resize_mode="bicubic", mean=(0.5,) * channels,
                    std=(0.5,) * channels, resize_backend=HF_PREPROCESSING["resize_backend"])
    return cfg.replace(name=describe(cfg)), names


# PIL's resampling filters, by the number HF's image processors store.
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def preprocessing_from(p: dict[str, Any], cfg: ViTConfig) -> dict[str, Any]:
    """Config changes from an image processor's settings: mean, std, resize filter and crop.

    HF's ViT processor resizes the whole image to `size` (squash). A processor with
    `do_center_crop` (DeiT's) resizes to `size` and crops `crop_size`: the crop fraction is
    their ratio; a `shortest_edge` size keeps the aspect ratio ("center"). vitlab writes
    `crop_pct` / `crop_mode` beside ViT's keys, which transformers' ViT processor ignores.
    """
    changes: dict[str, Any] = {}
    if "image_mean" in p and len(p["image_mean"]) == cfg.in_channels:
        changes["mean"], changes["std"] = tuple(p["image_mean"]), tuple(p["image_std"])
    if p.get("resample") in RESAMPLE:
        changes["interpolation"] = RESAMPLE[p["resample"]]
    size = p.get("size")
    size = {"height": size, "width": size} if isinstance(size, int) else (size or {})
    if "shortest_edge" in size:
        changes["crop_mode"] = "center"
    crop = p.get("crop_size")
    crop = {"height": crop, "width": crop} if isinstance(crop, int) else (crop or {})
    if p.get("do_center_crop") and crop.get("height") and size:
        side = size.get("height") or size.get("shortest_edge")
        changes["crop_fraction"] = min(1.0, crop["height"] / side)
    if "crop_pct" in p:
        changes["crop_fraction"] = float(p["crop_pct"])
    if p.get("crop_mode") in ("squash", "center"):
        changes["crop_mode"] = p["crop_mode"]
    return changes


def _preprocessing(folder: Path, cfg: ViTConfig) -> ViTConfig:
    """The mean/std of preprocessor_config.json (absent: the ViT default 0.5/0.5; do_normalize
    false: pixels in [0, 1]). A file that is there but unreadable is an error, not a default:
    a wrong normalisation would shift every prediction without a word."""
    f = folder / "preprocessor_config.json"
    if not f.is_file():
        return cfg
    p = read_json(f, dict, "preprocessor config", "restore it, or remove it to use the model's defaults", CheckpointError)
    return apply_preprocessing(p, cfg, str(f))


def apply_preprocessing(p: Any, cfg: ViTConfig, f: str) -> ViTConfig:
    """`cfg` with an image processor's settings (preprocessing_from), its mean and std checked
    first: a value that is not one number per channel is refused, not skipped."""
    if not isinstance(p, dict):
        raise CheckpointError(f"{f}: must hold a JSON object")
    n = cfg.in_channels
    stats = {}
    for key in ("image_mean", "image_std"):
        v = p.get(key, [0.5] * n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v] * n
        if not (isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise CheckpointError(f"{f}: {key}={v!r} is not {n} number(s), one per channel")
        stats[key] = tuple(float(x) for x in v)
    if p.get("do_normalize", True) is False:
        stats = {"image_mean": (0.0,) * n, "image_std": (1.0,) * n}
    code = p.get("resample")
    if code is not None and (isinstance(code, bool) or code not in RESAMPLE):  # never the default filter without a word
        raise CheckpointError(f"{f}: resample={code!r} is not one of {', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}")
    try:
        changes = preprocessing_from({**p, **stats}, cfg)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as e:
        raise CheckpointError(f"{f}: unreadable preprocessing settings ({type(e).__name__}: {e})") from None
    return cfg.replace(**changes)


def read(path: str | os.PathLike) -> Imported:
    folder = Path(path)
    c = config_json(folder, "Hugging Face config")
    if c is None or c.get("model_type") != "vit":
        raise CheckpointError(f"{folder}: not a Hugging Face ViT folder (config.json with model_type 'vit')")
    state = {_classic_name(k): v for k, v in _weights(folder).items()}
    cfg, names = infer_config(c, state, str(folder))
    guessed = {} if (folder / "preprocessor_config.json").is_file() else guessed_preprocessing(
        "no preprocessor_config.json, ViTImageProcessor's defaults")
    cfg = _preprocessing(folder, cfg)
    prefix = "vit." if any(k.startswith("vit.") for k in state) else ""
    if prefix == "" and cfg.representation_size is None and "pooler.dense.weight" in state:
        state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    ours = import_state(rules(cfg, prefix), state, expected_shapes(cfg), str(folder))
    return Imported(cfg, ours, names, source_format=FORMAT_NAME, metadata={"architectures": json.dumps(c.get("architectures"))},
                    guessed=guessed)


# Writing --------------------------------------------------------------------------------
def check_writable(cfg: ViTConfig, allow_numerics_change: bool = False) -> None:
    refuse("Hugging Face transformers", failing(
        (cfg.classifier != "token", "classifier='gap' (HF's ViT reads the class token)"),
        (cfg.pos_embed != "learned", f"pos_embed={cfg.pos_embed!r} (HF's ViT has a learned 1D table)"),
        (cfg.resnet is not None, "a ResNet hybrid stem (vitlab writes plain ViTs for HF)"),
        (cfg.representation_size and cfg.num_classes,
         f"representation_size={cfg.representation_size} with a classifier (ViTForImageClassification has no pre-logits)"),
    ), [], allow_numerics_change)


def hf_config(cfg: ViTConfig, class_names: Optional[list[str]] = None) -> dict[str, Any]:
    """config.json of the transformers ViT that computes what `VisionTransformer(cfg)` does."""
    act = "gelu" if cfg.gelu == "exact" else "gelu_pytorch_tanh"
    h, w = cfg.image_size
    names = head_names(cfg, class_names) or [f"LABEL_{i}" for i in range(cfg.num_classes)]
    return {"architectures": ["ViTForImageClassification" if cfg.num_classes else "ViTModel"], "model_type": "vit",
            "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
            "intermediate_size": cfg.mlp_dim, "hidden_act": act, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps, "image_size": h if h == w else [h, w],
            "patch_size": cfg.patch_size, "num_channels": cfg.in_channels, "qkv_bias": cfg.qkv_bias,
            "encoder_stride": cfg.patch_size, "pooler_output_size": cfg.representation_size or cfg.hidden_size,
            "pooler_act": "tanh", "id2label": {str(i): n for i, n in enumerate(names)},
            "label2id": {n: i for i, n in enumerate(names)}, "torch_dtype": "float32"}


def write(model, path: str | os.PathLike, allow_numerics_change: bool = False) -> None:
    """A save_pretrained folder: config.json, model.safetensors, preprocessor_config.json,
    each written beside the target and renamed into place. In an existing folder only those
    files (and stale weight files of an earlier save) are replaced; nothing else is touched."""
    from safetensors.torch import save_file

    cfg = model.config
    check_writable(cfg, allow_numerics_change)
    prefix = "vit." if cfg.num_classes else ""
    theirs = export_state(rules(cfg, prefix), model.state_dict(), f"{path} (hf)")
    back = apply_preprocessing(preprocessor_config(cfg), infer_config(hf_config(cfg, model.class_names), theirs, str(path))[0], str(path))
    check_carried(f"{path} (Hugging Face)", cfg, back, allow_numerics_change)
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target}: exists and is a file; a Hugging Face checkpoint is a folder")

    def fill(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps(hf_config(cfg, model.class_names), indent=2, sort_keys=True) + "\n")
        (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(cfg), indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in theirs.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})

    # Only the files a Hugging Face folder's weights and configs live in are replaced; a
    # README, a .git or anything else already there stays.
    replace_folder(target, fill, owned=written_by_us)


def preprocessor_config(cfg: ViTConfig) -> dict[str, Any]:
    return {
        "image_processor_type": "ViTImageProcessor", "do_resize": True,
        "size": {"height": cfg.image_size[0], "width": cfg.image_size[1]}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": list(cfg.mean), "image_std": list(cfg.std),
        "resample": {v: k for k, v in RESAMPLE.items()}[cfg.interpolation],
        # vitlab's own: transformers' ViT processor resizes the whole image and ignores these.
        "crop_pct": cfg.crop_fraction, "crop_mode": cfg.crop_mode,
    }
