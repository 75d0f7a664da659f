"""Published ViT checkpoints by name, downloaded once into a cache.

Names are `MODEL:WEIGHTS`, MODEL in the paper's notation:
- the paper's release (§4.1, Table 2): `:imagenet21k` (pre-trained, 224 px, 21,843 classes,
  with the pre-logits layer) and `:imagenet2012` (then fine-tuned on ImageNet at 384 px);
  `:imagenet2012-224` where a 224 px fine-tune was published too;
- AugReg ("How to train your ViT", Steiner et al. 2021): `:augreg-in21k` (224 px, 21,843
  classes, no pre-logits), `:augreg-in21k-ft-in1k` (fine-tuned at 224 px),
  `:augreg-in21k-ft-in1k-384`, and `:augreg-in1k` for the ImageNet-1k-only runs.
All expect pixels scaled to [-1, 1] (mean = std = 0.5).

`fetch(name)` returns a local path: from the cache ($VITLAB_CACHE, default ~/.cache/vitlab,
laid out like the official bucket) or after one download, written atomically and checked
against its sha256 — the published one when the table has it, otherwise the one recorded at
the first download. $VITLAB_OFFLINE=1 never touches the network; $VITLAB_BASE_URL replaces
the official storage (a mirror).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from vitlab import suggest
from vitlab.checkpoints.io import CheckpointError
from vitlab.config.fields import env_switch
from vitlab.files import atomic_write, atomic_write_text, cache_dir, net, sha256_file
from vitlab.files.documents import read_json
from vitlab.log import get_logger, notice
from vitlab.progress import Progress

LOG = get_logger("checkpoints")

BASE_URL = "https://storage.googleapis.com/vit_models"
TIMEOUT_S = 10.0  # the first bytes must come this fast; offline machines fail at once


@dataclass(frozen=True)
class Pretrained:
    name: str
    model: str  # the variant, e.g. "ViT-B/16"
    path: str  # path in the official bucket, e.g. "imagenet21k/ViT-B_16.npz"
    resolution: int
    num_classes: int
    dataset: str
    hf_hub_id: Optional[str] = None  # the same weights converted for transformers
    timm_name: Optional[str] = None
    sha256: Optional[str] = None  # None: the first download's digest is recorded and enforced
    crop_pct: float = 1.0  # eval: resize to resolution / crop_pct, centre-crop resolution
    crop_mode: str = "squash"  # "squash": both sides (the official code); "center": the shorter side (timm)
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def url(self) -> str:
        return f"{os.environ.get('VITLAB_BASE_URL', BASE_URL).rstrip('/')}/{self.path}"


IN21K, IN1K = "ImageNet-21k", "ImageNet-21k, fine-tuned on ImageNet-1k"


# How timm evaluates these weights (its pretrained_cfg): the 224 px files at crop 0.875
# (AugReg: 0.9), the shorter side resized bicubically; the 384 px fine-tunes of the paper at
# the official code's whole-image (squash) resize.
_TIMM_224: dict[str, Any] = {"crop_pct": 0.875, "crop_mode": "center", "interpolation": "bicubic"}


def _paper() -> list[Pretrained]:
    # (model, file stem, HF hub id of the 21k weights, of the 384 px fine-tune)
    models = [("ViT-B/16", "ViT-B_16", "google/vit-base-patch16-224-in21k", "google/vit-base-patch16-384"),
              ("ViT-B/32", "ViT-B_32", "google/vit-base-patch32-224-in21k", "google/vit-base-patch32-384"),
              ("ViT-L/16", "ViT-L_16", "google/vit-large-patch16-224-in21k", "google/vit-large-patch16-384"),
              ("ViT-L/32", "ViT-L_32", "google/vit-large-patch32-224-in21k", "google/vit-large-patch32-384"),
              ("R50+ViT-B/16", "R50+ViT-B_16", None, None)]
    out = []
    for model, stem, hf21k, hf384 in models:
        out.append(Pretrained(f"{model}:imagenet21k", model, f"imagenet21k/{stem}.npz", 224, 21843, IN21K, hf21k, **_TIMM_224))
        out.append(Pretrained(f"{model}:imagenet2012", model, f"imagenet21k+imagenet2012/{stem}.npz", 384, 1000, IN1K, hf384))
    # ViT-H/14 was published pre-trained on ImageNet-21k only.
    out.append(Pretrained("ViT-H/14:imagenet21k", "ViT-H/14", "imagenet21k/ViT-H_14.npz", 224, 21843, IN21K, "google/vit-huge-patch14-224-in21k", **_TIMM_224))
    for model, stem, hf in (("ViT-B/16", "ViT-B_16", "google/vit-base-patch16-224"), ("ViT-L/16", "ViT-L_16", "google/vit-large-patch16-224")):
        out.append(Pretrained(f"{model}:imagenet2012-224", model, f"imagenet21k+imagenet2012/{stem}-224.npz", 224, 1000, IN1K, hf, **_TIMM_224))
    return out


# AugReg files: model -> (timm model stem, the 21k run's file, the fine-tunes' learning rate,
# the resolutions fine-tuned from that run); file names as published.
_I21K = "i21k-300ep-lr_0.001-"
_FT = "--imagenet2012-steps_20k-lr_{}-res_{}"  # a fine-tune's file: the 21k run's, then this
_AUGREG = {
    "ViT-Ti/16": ("vit_tiny_patch16", "Ti_16-" + _I21K + "aug_none-wd_0.03-do_0.0-sd_0.0", "0.03", (224, 384)),
    "ViT-S/16": ("vit_small_patch16", "S_16-" + _I21K + "aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03", (224, 384)),
    "ViT-S/32": ("vit_small_patch32", "S_32-" + _I21K + "aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03", (224, 384)),
    "ViT-B/8": ("vit_base_patch8", "B_8-" + _I21K + "aug_medium1-wd_0.1-do_0.0-sd_0.0", "0.01", (224,)),
    "ViT-B/16": ("vit_base_patch16", "B_16-" + _I21K + "aug_medium1-wd_0.1-do_0.0-sd_0.0", "0.01", (224, 384)),
    "ViT-B/32": ("vit_base_patch32", "B_32-" + _I21K + "aug_medium1-wd_0.03-do_0.0-sd_0.0", "0.03", (224,)),
    "ViT-L/16": ("vit_large_patch16", "L_16-" + _I21K + "aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01", (224, 384)),
    "R26+ViT-S/32": ("vit_small_r26_s32", "R26_S_32-" + _I21K + "aug_medium2-wd_0.03-do_0.0-sd_0.0", "0.03", (384,)),
    "R50+ViT-L/32": ("vit_large_r50_s32", "R50_L_32-" + _I21K + "aug_medium2-wd_0.1-do_0.0-sd_0.0", "0.01", (384,)),
}
# Fine-tunes whose pre-training run differs from the 21k checkpoint published for the model.
_AUGREG_OTHER = {("ViT-B/32", 384): "B_32-" + _I21K + "aug_light1-wd_0.1-do_0.0-sd_0.0" + _FT.format("0.03", 384),
                 ("R26+ViT-S/32", 224): "R26_S_32-" + _I21K + "aug_light0-wd_0.03-do_0.1-sd_0.1" + _FT.format("0.03", 224),
                 ("R50+ViT-L/32", 224): "R50_L_32-" + _I21K + "aug_medium1-wd_0.1-do_0.1-sd_0.1" + _FT.format("0.01", 224)}
_AUGREG_IN1K = {"ViT-S/16": "S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0" + _FT.format("0.01", 224),
                "ViT-B/16": "B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1" + _FT.format("0.01", 224),
                "ViT-B/32": "B_32-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.1-sd_0.1" + _FT.format("0.01", 224)}


_TIMM_AUGREG: dict[str, Any] = {"crop_mode": "center", "interpolation": "bicubic"}


def _augreg() -> list[Pretrained]:
    out = []
    for model, (timm_stem, stem, lr, resolutions) in _AUGREG.items():
        out.append(Pretrained(f"{model}:augreg-in21k", model, f"augreg/{stem}.npz", 224, 21843, IN21K,
                              timm_name=f"{timm_stem}_224.augreg_in21k", crop_pct=0.9, **_TIMM_AUGREG))
        for res in (224, 384):
            file = stem + _FT.format(lr, res) if res in resolutions else _AUGREG_OTHER.get((model, res))
            if file is None:
                continue
            suffix = "" if res == 224 else "-384"
            out.append(Pretrained(f"{model}:augreg-in21k-ft-in1k{suffix}", model, f"augreg/{file}.npz", res, 1000, IN1K,
                                  timm_name=f"{timm_stem}_{res}.augreg_in21k_ft_in1k", crop_pct=0.9 if res == 224 else 1.0,
                                  **_TIMM_AUGREG))
    for model, file in _AUGREG_IN1K.items():
        timm_stem = _AUGREG[model][0]
        out.append(Pretrained(f"{model}:augreg-in1k", model, f"augreg/{file}.npz", 224, 1000, "ImageNet-1k",
                              timm_name=f"{timm_stem}_224.augreg_in1k", crop_pct=0.9, **_TIMM_AUGREG))
    return out


PRETRAINED: dict[str, Pretrained] = {p.name: p for p in _paper() + _augreg()}


def list_pretrained() -> list[str]:
    return list(PRETRAINED)


def pretrained_rows(names: list[str]) -> list[dict]:
    """What `vitlab models --pretrained` prints for each published name: its variant, the
    resolution and classes of the weights, what they were trained on, where they come from."""
    return [{"name": name, "model": e.model, "resolution": e.resolution, "classes": e.num_classes, "dataset": e.dataset,
             "file": e.path, "hf_hub_id": e.hf_hub_id, "timm_name": e.timm_name} for name in names for e in [PRETRAINED[name]]]


def lookup(name: str) -> Pretrained:
    if name in PRETRAINED:
        return PRETRAINED[name]
    folded = {k.lower().replace("_", "/"): k for k in PRETRAINED}
    key = name.strip().lower().replace("_", "/")
    if key in folded:
        return PRETRAINED[folded[key]]
    raise CheckpointError(f"unknown pretrained name {name!r}{suggest.hint(name, PRETRAINED) or ';'} `vitlab models --pretrained` lists "
                          "the MODEL:WEIGHTS names (e.g. ViT-B/16:imagenet21k); a local file loads by its path")


# The cache --------------------------------------------------------------------------------
def cache_path(entry: Pretrained) -> Path:
    return cache_dir() / entry.path


def _digests_file() -> Path:
    return cache_dir() / "sha256.json"


def _recorded() -> dict[str, dict]:
    try:
        return read_json(_digests_file(), {str: {"sha256": str, "size?": int, "mtime_ns?": int}}, "digest table")
    except (OSError, ValueError):  # none yet, or damaged: each file is hashed again and checked
        return {}


def _record(entry: Pretrained, digest: str, path: Path) -> None:
    table = _recorded()
    st = path.stat()
    table[entry.path] = {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    atomic_write_text(_digests_file(), json.dumps(table, indent=1, sort_keys=True))


def _verify_cached(entry: Pretrained, path: Path) -> None:
    """Check the cached file against the published digest, or the first download's. A file
    unchanged (size, mtime) since it was last verified is not hashed again."""
    rec = _recorded().get(entry.path)
    st = path.stat()
    if rec and (rec.get("size"), rec.get("mtime_ns")) == (st.st_size, st.st_mtime_ns) and (entry.sha256 is None or rec.get("sha256") == entry.sha256):
        return
    want = entry.sha256 or (rec or {}).get("sha256")
    digest = sha256_file(path)
    if want is not None and digest != want:
        raise CheckpointError(f"{path}: sha256 {digest[:16]}... is not {entry.name}'s {want[:16]}...; delete it and load the name again")
    _record(entry, digest, path)


def fetch(name: str, progress: Optional[bool] = None) -> Path:
    """The local path of a pretrained checkpoint, downloading it on first use."""
    entry = lookup(name)
    path = cache_path(entry)
    if path.is_file():
        _verify_cached(entry, path)
        return path
    if env_switch("VITLAB_OFFLINE"):
        raise CheckpointError(_offline_message(entry, path, "VITLAB_OFFLINE is set"))
    _download(entry, path, progress)
    return path


def _offline_message(entry: Pretrained, path: Path, reason: str) -> str:
    file = entry.path.rsplit("/", 1)[-1]
    return f"cannot download {entry.name} from {entry.url} ({reason}); put the official file ({file}) at {path}, or load a copy by its path"


def _download(entry: Pretrained, path: Path, progress: Optional[bool]) -> None:
    """One download through torch.hub.download_url_to_file (http(s) and file:// URLs, a
    temporary file renamed only when complete, its tqdm bar on a terminal), then vitlab's
    own checks: the published sha256 (torch checks it too, as a prefix) or the first
    download's, recorded in the cache's sha256.json and enforced on later reads."""
    import urllib.error

    import torch.hub

    tty = sys.stderr.isatty() if progress is None else progress
    start = time.time()

    def download(tmp: str) -> None:  # a failure here leaves no file in the cache
        # torch.hub opens the URL with urllib's urlopen: under vitlab.files.net's whole deadline
        # (connection, headers, body), so that an offline machine fails at once and a
        # trickling server is cut off instead of hanging.
        try:
            with net.deadlines(TIMEOUT_S, net.MIN_RATE):
                torch.hub.download_url_to_file(entry.url, tmp, hash_prefix=entry.sha256, progress=tty)
        except RuntimeError as e:  # torch's "invalid hash value": the file was removed
            raise CheckpointError(f"{entry.url}: sha256 does not match the published {(entry.sha256 or '')[:16]}... ({e})") from None
        except net.DeadlinePassed as e:
            raise CheckpointError(f"cannot download {entry.name}: {e}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise CheckpointError(_offline_message(entry, path, str(reason))) from None
        except Exception as e:  # http.client's IncompleteRead and kin: the connection broke
            raise CheckpointError(_offline_message(entry, path, f"connection lost: {e}")) from None

    # torch.hub draws its own byte counter on a terminal; in a log, vitlab.progress's start
    # line and heartbeat say that the download is under way.
    if tty:  # torch.hub's bar has no title: the line above it says what it counts
        notice(LOG, f"downloading {entry.name} from {entry.url}")
    shown = Progress(None, f"downloading {entry.name}", "B", start=f"downloading {entry.name} from {entry.url}",
                     tty=tty, leave=True, unit_scale=True)
    try:
        atomic_write(path, download)
    finally:
        shown.close()  # a failed download too: its heartbeat stops
    size = path.stat().st_size
    rate = size / 1e6 / max(time.time() - start, 1e-6)
    notice(LOG, f"  done: {size / 1e6:.1f} MB at {rate:.1f} MB/s")
    _record(entry, sha256_file(path), path)
