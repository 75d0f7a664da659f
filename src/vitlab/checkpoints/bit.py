"""BiT ResNets in the official `.npz` layout and as timm `resnetv2_*_bit` state dicts, both ways.

This is the only file that knows the BiT names. The formats' files (npz.py, timm.py) read
and write the tensors and hand BiT archives to the tables and inferences here.

The official archives (google-research/big_transfer, BiT-S/BiT-M-R50x1.npz, ...) hold TF
arrays under `resnet/`: conv kernels HWIO, GroupNorm `gamma`/`beta` flat, the head a 1x1
conv `head/conv2d` of shape (1, 1, C, classes). A unit's three convolutions are `a`, `b`,
`c`, its projection `a/proj`. The official code standardises kernels with
(w - mean) / sqrt(var + 1e-10); its PyTorch port uses GroupNorm eps 1e-5.

timm (timm/models/resnetv2.py, `_create_resnetv2_bit`) builds the same network with
`stem_type="fixed"` (a zero pad of 1 before the max-pool, as the official code), StdConv2d
eps 1e-8, GroupNormAct eps 1e-5, and a 1x1-conv head `head.fc` of shape (classes, C, 1, 1).
"""

from __future__ import annotations

from typing import Any, Sequence

from vitlab.checkpoints.io import CheckpointError
from vitlab.checkpoints.tables import Rule, copy, failing, permuted, refuse, resnet_layers
from vitlab.config import BiTConfig
from vitlab.config.model import as_pair
from vitlab.extras import require
from vitlab.models.variants import describe

HWIO_TO_OIHW = (3, 2, 0, 1)
NPZ_ROOT = "resnet/root_block/standardized_conv2d/kernel"
TIMM_ROOT = "stem.conv.weight"
OFFICIAL_WS_EPS, TIMM_WS_EPS, GN_EPS = 1e-10, 1e-8, 1e-5
NPZ_UNIT = "resnet/block{}/unit{:02d}/"


def _units(cfg: BiTConfig):
    """(our prefix, stage index, unit index) of every residual unit, in order."""
    for s, units in enumerate(cfg.layers):
        for u in range(units):
            yield f"stages.{s}.{u}.", s, u


# The official .npz ------------------------------------------------------------------------
def npz_rules(cfg: BiTConfig) -> list[Rule]:
    # The head: a (1, 1, C, K) conv kernel; torch's Linear weight is (K, C).
    head = Rule("head.weight", ("resnet/head/conv2d/kernel",),
                lambda t: t.reshape(t.shape[-2], t.shape[-1]).t(), lambda t: (t.t()[None, None],))
    table = [permuted("root.conv.weight", NPZ_ROOT, HWIO_TO_OIHW), copy("norm.weight", "resnet/group_norm/gamma"),
             copy("norm.bias", "resnet/group_norm/beta")]
    for o, s, u in _units(cfg):
        b = NPZ_UNIT.format(s + 1, u + 1)
        for n, letter in ((1, "a"), (2, "b"), (3, "c")):
            table += [permuted(f"{o}conv{n}.weight", f"{b}{letter}/standardized_conv2d/kernel", HWIO_TO_OIHW),
                      copy(f"{o}gn{n}.weight", f"{b}{letter}/group_norm/gamma"), copy(f"{o}gn{n}.bias", f"{b}{letter}/group_norm/beta")]
        if u == 0:  # the first unit of a stage widens (and after stage 1 halves): a projection
            table.append(permuted(f"{o}proj.weight", f"{b}a/proj/standardized_conv2d/kernel", HWIO_TO_OIHW))
    if cfg.num_classes:
        table += [head, copy("head.bias", "resnet/head/conv2d/bias")]
    return table


def config_from_npz(a: dict, source: str) -> BiTConfig:
    """The architecture from the arrays: root width and kernel, units per stage, classes."""
    kh, _, cin, width = a[NPZ_ROOT].shape
    layers = resnet_layers(a, lambda s, u: NPZ_UNIT.format(s + 1, u + 1) + "a/standardized_conv2d/kernel")
    if not layers:
        raise CheckpointError(f"{source}: a BiT root block but no resnet/block1/unit01/... arrays")
    head = a.get("resnet/head/conv2d/kernel")
    return _config(source, kh, cin, width, layers, head.shape[-1] if head is not None else 0, ws_eps=OFFICIAL_WS_EPS)


# timm resnetv2_*_bit -------------------------------------------------------------------------
def timm_rules(cfg: BiTConfig) -> list[Rule]:
    head = Rule("head.weight", ("head.fc.weight",), lambda t: t.flatten(1), lambda t: (t[:, :, None, None],))
    table = [copy("root.conv.weight", TIMM_ROOT), copy("norm.weight", "norm.weight"), copy("norm.bias", "norm.bias")]
    for o, s, u in _units(cfg):
        t = f"stages.{s}.blocks.{u}."
        table += timm_unit_rules(o, t)
        if u == 0:
            table.append(copy(f"{o}proj.weight", f"{t}downsample.conv.weight"))
    if cfg.num_classes:
        table += [head, copy("head.bias", "head.fc.bias")]
    return table


def timm_unit_rules(ours: str, theirs: str) -> list[Rule]:
    """A unit's three convolutions and norms: vitlab's conv{n}/gn{n}, timm's conv{n}/norm{n}
    (the same in a BiT ResNet and in a ViT hybrid's backbone)."""
    return [copy(f"{ours}{a}{n}.{p}", f"{theirs}{b}{n}.{p}") for n in (1, 2, 3)
            for a, b, p in (("conv", "conv", "weight"), ("gn", "norm", "weight"), ("gn", "norm", "bias"))]


def is_timm(keys) -> bool:
    """timm's ResNetV2 names: a root `stem.conv` and `stages.N.blocks.M` (a timm ViT hybrid
    nests the same names under `patch_embed.backbone.`)."""
    return TIMM_ROOT in keys and "stages.0.blocks.0.conv1.weight" in keys


def config_from_timm(state: dict, source: str) -> BiTConfig:
    width, cin, kh, _ = state[TIMM_ROOT].shape
    if "stem.norm.weight" in state:
        raise CheckpointError(f"{source}: a ResNetV2 with a normalised stem (timm's preact=False, the ViT hybrids' backbone), "
                              "not a pre-activation BiT ResNet")
    layers = resnet_layers(state, lambda s, u: f"stages.{s}.blocks.{u}.conv1.weight")
    if kh != 7:
        raise CheckpointError(f"{source}: stem.conv is {kh}x{kh}; timm's BiT ResNets have the 7x7 root")
    head = state.get("head.fc.weight")
    return _config(source, kh, cin, width, layers, head.shape[0] if head is not None else 0, ws_eps=TIMM_WS_EPS)


def timm_model_args(cfg: BiTConfig) -> dict[str, Any]:
    """JSON-able arguments of timm's ResNetV2 for this network; `create_timm_model` adds the
    convolution and norm layers (objects) from the `ws_eps`, `gn_eps` and `gn_groups` here."""
    return {"layers": list(cfg.layers), "channels": [4 * cfg.base_width * 2**s for s in range(len(cfg.layers))],
            "stem_chs": cfg.base_width, "width_factor": cfg.width_factor, "num_classes": cfg.num_classes,
            "in_chans": cfg.in_channels, "stem_type": "fixed", "ws_eps": cfg.ws_eps, "gn_eps": cfg.gn_eps,
            "gn_groups": cfg.gn_groups}


def create_timm_model(cfg: BiTConfig):
    """A timm ResNetV2 (needs timm) that computes what `BiTResNet(cfg)` does."""
    from functools import partial  # timm is optional: imported only for its peer model

    require("peers", "a timm peer model", modules=("timm",))
    from timm.layers import GroupNormAct, StdConv2d
    from timm.models.resnetv2 import ResNetV2

    refuse("timm", _common_features(cfg), [], True)
    args = timm_model_args(cfg)
    ws_eps, gn_eps, groups = args.pop("ws_eps"), args.pop("gn_eps"), args.pop("gn_groups")
    return ResNetV2(conv_layer=partial(StdConv2d, eps=ws_eps), norm_layer=partial(GroupNormAct, num_groups=groups, eps=gn_eps), **args)


# Shared -------------------------------------------------------------------------------------
def _config(source: str, kernel: int, cin: int, width: int, layers: Sequence[int], classes: int, ws_eps: float) -> BiTConfig:
    if kernel not in (7, 3):
        raise CheckpointError(f"{source}: a {kernel}x{kernel} root convolution; BiT has 7x7 (or 3x3 for 32 px)")
    stem = "bit" if kernel == 7 else "cifar"
    base, factor = (64, width // 64) if width % 64 == 0 else (width, 1)
    try:
        cfg = BiTConfig(name="bit", image_size=as_pair(224 if stem == "bit" else 32), in_channels=cin, layers=tuple(layers),
                        width_factor=factor, base_width=base, stem=stem, num_classes=classes, ws_eps=ws_eps, gn_eps=GN_EPS,
                        mean=(0.5,) * cin, std=(0.5,) * cin)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return cfg.replace(name=describe(cfg))


def _common_features(cfg: BiTConfig) -> list[str]:
    return failing((cfg.stem != "bit", f"stem={cfg.stem!r} (BiT's root is the 7x7/2 convolution and max-pool)"),
                   (cfg.gn_groups != 32, f"gn_groups={cfg.gn_groups} (BiT's GroupNorm has 32 groups)"))


# What each format's BiT writer targets: its name, its weight-standardisation eps, the words.
WRITERS = {"npz": ("the official BiT .npz format", OFFICIAL_WS_EPS, "official: 1e-10 and 1e-5"),
           "timm": ("timm", TIMM_WS_EPS, "timm's resnetv2_*_bit: 1e-8 and 1e-5")}


def check_writable(cfg: BiTConfig, fmt: str, allow_numerics_change: bool = False) -> None:
    target, ws_eps, words = WRITERS[fmt]
    refuse(target, _common_features(cfg), failing(((cfg.ws_eps, cfg.gn_eps) != (ws_eps, GN_EPS),
                                                   f"ws_eps={cfg.ws_eps:g} gn_eps={cfg.gn_eps:g} ({words})")), allow_numerics_change)
