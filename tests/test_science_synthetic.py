"""The science regression suite: the synthetic tasks with known answers (vitlab/data/
synthetic.py). It fails if a change breaks the inductive-bias story of the paper:

- halfswap: a ViT without a position embedding cannot tell a picture from its half-swap (its
  patches are the same set), so it is at chance by construction; with a learned position
  embedding the same ViT learns the task.
- crossover: without a position embedding a ViT reads the texture but not the marker's side,
  so it stays near the texture-only cap of 50%; with one it goes past the cap.

benchmarks/synthetic.py runs the full version (more steps, seeds, a ResNet, data sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitlab
from vitlab.config import load_recipe
from vitlab.data import open_dataset, synthetic
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer

pytestmark = pytest.mark.slow


def train(tmp_path, task, pos, steps):
    cfg = load_recipe("synthetic").with_overrides({
        "data.name": f"synthetic:{task}", "model.pos_embed": pos, "train.steps": steps, "train.ckpt_every": steps,
        "data.train_size": 4000})
    out = tmp_path / f"{task}-{pos}"
    summary = Trainer(cfg, out, Inputs(), quiet=True).run()
    return summary["splits"]["test"]["top1"], out


def test_the_tasks_are_what_they_say():
    for task in synthetic.TASKS:
        a, b = synthetic.arrays(task), synthetic.arrays(task)
        assert np.array_equal(a["train"][0], b["train"][0])  # fixed by the seed
        assert not np.array_equal(a["train"][0], synthetic.arrays(task, seed=1)["train"][0])
        x, y = a["test"]
        assert x.shape == (2000, 16, 16, 3) and set(np.unique(y)) == set(range(len(synthetic.CLASSES[task])))
    x, y = synthetic.arrays("halfswap")["train"]
    left, right = x[:, :, :8].mean(axis=(1, 2, 3)), x[:, :, 8:].mean(axis=(1, 2, 3))
    assert ((right > left) == (y == 0)).mean() > 0.95  # in order: the bright half on the right


def test_halfswap_needs_a_position_embedding(tmp_path):
    none, folder = train(tmp_path, "halfswap", "none", 60)
    model = vitlab.load(str(folder / "checkpoints" / "last.safetensors")).eval()
    test = open_dataset("synthetic:halfswap", "test", vitlab.transform(model))
    x = torch.stack([test[i][0] for i in range(64)])
    swapped = torch.cat([x[..., 8:], x[..., :8]], dim=-1)
    with torch.no_grad():
        assert torch.allclose(model(x), model(swapped), atol=1e-4)  # blind to the order of the halves
    assert abs(none - 0.5) < 0.05
    learned, _ = train(tmp_path, "halfswap", "learned", 150)
    assert learned > 0.8, learned


def test_crossover_position_passes_the_texture_cap(tmp_path):
    none, _ = train(tmp_path, "crossover", "none", 200)
    learned, _ = train(tmp_path, "crossover", "learned", 200)
    assert none < 0.6, none
    assert learned > none + 0.1, (learned, none)
