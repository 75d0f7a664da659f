"""Writing a checkpoint and proving it: the file is written beside its destination, loaded
back as a model by the format's own reader, and run on a probe batch next to the model it
came from; only then does it replace the destination.

Comparing logits, not tensors, is the point: a state dict can hold every tensor bit for bit
and still rebuild another function (a head count the file does not store, another GELU), and
only running the reloaded model shows that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from vitlab.checkpoints.io import CheckpointError
from vitlab.files import replace_folder
from vitlab.models import Model

# The suffixes a reader looks for, per format (a folder for hf). Detection goes by them:
# vitlab's own files are recognised by ".safetensors", state dicts by these four.
SUFFIXES: dict[str, tuple[str, ...]] = {"vitlab": (".safetensors",), "npz": (".npz",), "timm": (".safetensors", ".pth", ".pt", ".bin"),
                                         "torchvision": (".pth", ".pt", ".bin", ".safetensors"), "hf": ("",)}
PROBE_BATCH = 2
PROBE_SEED = 0


@dataclass
class Verified:
    """What the check found: the largest logit difference, whether the logits are identical,
    and the warnings the writer gave (settings the file does not carry)."""

    max_diff: float
    exact: bool
    warnings: list[str] = field(default_factory=list)


def suffix_warning(path: str | os.PathLike, format: str) -> Optional[str]:
    """A sentence when `path` lacks the suffix its format's readers look for, else None."""
    suffix = Path(path).suffix
    wanted = SUFFIXES.get(format, ())
    if format == "hf":
        return None if suffix == "" else f"{path}: a Hugging Face checkpoint is a folder; its name has the suffix {suffix}"
    if suffix in wanted:
        return None
    return (f"{path}: a {format} file is recognised by the suffix {' or '.join(wanted)}; without it, reading it "
            f"needs the format named (--format {format})")


def probe_logits(model: Model) -> torch.Tensor:
    """The model's logits and the representation its head reads, side by side, for a fixed
    batch of random images at its resolution (the representation too: a zero-initialised
    head gives zero logits whatever the network below it computes)."""
    cfg = model.config
    g = torch.Generator().manual_seed(PROBE_SEED)
    x = torch.randn(PROBE_BATCH, cfg.in_channels, *cfg.image_size, generator=g)
    with torch.no_grad():
        out = model.eval()(x, return_intermediates=True)
    return torch.cat([out["logits"].flatten(1), out["pre_logits"].flatten(1)], dim=1).float()


def write_verified(model: Model, dst: str | os.PathLike, format: str, load, save, owned=None,
                   tolerance: float = 1e-5, verify: bool = True, **kwargs) -> Verified:
    """Write `model` to `dst` in `format` through `save(model, path, format, **kwargs)`, load
    it back with `load(path, format)` and compare logits on a probe batch; replace `dst` only
    when they agree (to `tolerance`, or whatever the writer warned it could not carry). A
    folder format (hf) replaces only the files `owned(name)` claims. Raises CheckpointError,
    leaving `dst` as it was, when they do not."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".verify", dir=dst.parent))
    try:
        tmp = staging / dst.name
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                save(model, tmp, format, **kwargs)
            said = [str(w.message).replace(str(tmp), str(dst)) for w in caught]
            result = Verified(0.0, True, said)
            if verify:
                result = compare(model, load(tmp, format), dst, tolerance, said)
        except CheckpointError as e:  # name the destination, not the staging copy
            raise CheckpointError(str(e).replace(str(tmp), str(dst)), reason=e.reason) from None
        if tmp.is_dir():
            def move_in(folder: Path) -> None:
                for p in tmp.iterdir():
                    os.replace(p, folder / p.name)

            replace_folder(dst, move_in, owned or (lambda n: False))
        else:
            os.replace(tmp, dst)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def compare(model: Model, back: Model, dst: Path, tolerance: float, said: list[str]) -> Verified:
    ours, theirs = probe_logits(model), probe_logits(back)
    if ours.shape != theirs.shape:
        raise CheckpointError(f"{dst}: reloaded, the model gives outputs of shape {tuple(theirs.shape)}, "
                              f"not {tuple(ours.shape)}; not written")
    diff = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    expected_loss = any("will differ" in s for s in said)
    if diff > tolerance and not expected_loss:
        raise CheckpointError(f"{dst}: reloaded, the model's logits differ from the original's by up to {diff:.3g} on a probe batch "
                              f"(tolerance {tolerance:g}); not written")
    if back.class_names != model.class_names and model.class_names is not None:
        said = [*said, f"{dst}: the class names do not survive the format (read back: "
                       f"{'none' if back.class_names is None else len(back.class_names)})"]
    return Verified(diff, bool(torch.equal(ours, theirs)), said)
