"""Two procedural 16x16 RGB tasks whose answer is known by construction: the paper's
inductive-bias story (§3.1 "Inductive bias", §4.2, Appendix D.4) at CPU scale.

- `synthetic:halfswap`: a picture whose left and right halves are swapped (label 1) or not
  (label 0). Every picture has a left-to-right brightness ramp under per-image colour and
  noise, so the order of the halves is visible. The halves are 8 px wide: with 4x4 (or 8x8)
  patches, a picture and its swap have the same patches in another order, so a ViT without
  a position embedding (and a class-token or GAP head) computes the same output for both and
  is at chance *by construction*; with a position embedding the task is easy.
- `synthetic:crossover`: four classes, texture x position. Texture is the orientation of
  a stripe grating (horizontal or vertical, random phase: a translation-invariant cue a
  convolution reads at once); position is whether a bright 3x3 marker lies in the left or the
  right half (an absolute-position cue a convolution with global pooling can only infer from
  the borders). label = 2 * vertical + right. A texture-only reader is capped at 50%.

Splits: 10,000 training and 2,000 test images, fixed by the task's seed (`synthetic:halfswap`
or `synthetic:halfswap:SEED`); dev and train-minus-dev split the training part as for any set.
Train with no flips and no crop (a flip swaps the halves): the `synthetic` recipe does.
"""

from __future__ import annotations

import numpy as np

from vitlab.data.datasets import DataError

TASKS = ("halfswap", "crossover")
SIZE = 16
CLASSES = {"halfswap": ["in-order", "swapped"],
           "crossover": ["horizontal-left", "horizontal-right", "vertical-left", "vertical-right"]}
COUNTS = {"train": 10_000, "test": 2_000}


def _halfswap(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(0.0, 1.0, SIZE)[None, None, :, None]  # the ramp, dark left to bright right
    tint = rng.uniform(0.4, 1.0, size=(n, 1, 1, 3))
    noise = rng.uniform(0.0, 0.45, size=(n, SIZE, SIZE, 3))
    images = 0.55 * x * tint + noise
    labels = rng.integers(0, 2, size=n)
    half = SIZE // 2
    swapped = np.concatenate([images[:, :, half:], images[:, :, :half]], axis=2)
    images = np.where(labels[:, None, None, None] == 1, swapped, images)
    return images, labels


def _crossover(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    vertical = rng.integers(0, 2, size=n)
    right = rng.integers(0, 2, size=n)
    coord = np.arange(SIZE)
    phase = rng.integers(0, 4, size=n)
    along = np.where(vertical[:, None, None] == 1, coord[None, None, :], coord[None, :, None])  # x or y
    stripes = ((along + phase[:, None, None]) // 2) % 2  # period 4 px
    images = 0.15 + 0.35 * stripes[..., None] * rng.uniform(0.6, 1.0, size=(n, 1, 1, 3))
    images = images + rng.uniform(0.0, 0.15, size=(n, SIZE, SIZE, 3))
    half = SIZE // 2
    ys = rng.integers(0, SIZE - 2, size=n)
    xs = rng.integers(0, half - 2, size=n) + right * half  # the marker lies wholly in its half
    for i in range(n):
        images[i, ys[i]:ys[i] + 3, xs[i]:xs[i] + 3] = 1.0
    return images, 2 * vertical + right


def arrays(task: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": (uint8 images (N, 16, 16, 3), int64 labels), "test": ...} of one task."""
    if task not in TASKS:
        raise DataError(f"synthetic:{task}: no such task; use synthetic:halfswap or synthetic:crossover")
    make = _halfswap if task == "halfswap" else _crossover
    out = {}
    for k, (split, n) in enumerate(COUNTS.items()):
        rng = np.random.default_rng([seed, k, TASKS.index(task)])
        images, labels = make(rng, n)
        out[split] = (np.clip(images * 255.0, 0, 255).astype(np.uint8), labels.astype(np.int64))
    return out


def parse(arg: str) -> tuple[str, int]:
    """"halfswap" or "halfswap:3" -> (task, seed)."""
    task, _, seed = arg.partition(":")
    if not task:
        raise DataError("synthetic needs a task: --data synthetic:halfswap or synthetic:crossover")
    try:
        return task.strip().lower(), int(seed or 0)
    except ValueError:
        raise DataError(f"synthetic:{arg}: the seed after the task must be a whole number, e.g. synthetic:{task}:1") from None


def named(arg: str) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
    """The arrays and class names of `synthetic:ARG`."""
    task, seed = parse(arg)
    return arrays(task, seed), CLASSES.get(task, [])
