"""`--workers` on fewshot and linear-probe: decoding in data-loader processes gives the same
features, in the same order, as decoding in the main process (a map-style set and a streamed
WebDataset of real CIFAR-10); and a one-seed few-shot table shows no "± 0.00"."""

from __future__ import annotations

import re

import numpy as np
import pytest

import vitlab
from conftest import SHARED_DATA, perturb, tiny_model
from vitlab.cli import main
from vitlab.data import open_dataset
from vitlab.eval.features import extract_features


@pytest.fixture(scope="module")
def model():
    return perturb(tiny_model(image_size=32, class_names=[str(i) for i in range(10)]))


def test_workers_give_the_same_features_on_a_map_style_set(model):
    grey = perturb(tiny_model(in_channels=1, mean=(0.5,), std=(0.5,)))
    ds = open_dataset("digits", "test", vitlab.transform(grey))
    one, y1 = extract_features(grey, ds, batch_size=32, max_per_class=5)
    two, y2 = extract_features(grey, ds, batch_size=32, max_per_class=5, workers=2)
    assert np.array_equal(y1, y2) and np.allclose(one, two, atol=1e-6) and len(y1) == 50


def test_workers_give_the_same_features_on_a_stream(model):
    if not any((SHARED_DATA / "cifar10").glob("test-*.tar*")):
        pytest.skip("needs the CIFAR-10 shards")
    ds = open_dataset(f"wds:{SHARED_DATA / 'cifar10'}", "test", vitlab.transform(model))
    one, y1 = extract_features(model, ds, batch_size=64, limit=300)
    two, y2 = extract_features(model, ds, batch_size=64, limit=300, workers=2)
    assert np.array_equal(y1, y2) and np.allclose(one, two, atol=1e-6)


def test_the_commands_take_workers_and_one_seed_shows_no_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    grey = perturb(tiny_model(in_channels=1, mean=(0.5,), std=(0.5,), class_names=[str(i) for i in range(10)]))
    vitlab.save(grey, tmp_path / "m.safetensors")
    args = ["--data", "digits", "--workers", "2", "--no-cache"]
    assert main(["fewshot", str(tmp_path / "m.safetensors"), *args, "--shots", "1,5", "--seeds", "1", "--pool", "20"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\s+[15]\s", line)]
    assert len(rows) == 2 and not any("±" in r for r in rows), out
    assert main(["fewshot", str(tmp_path / "m.safetensors"), *args, "--shots", "1", "--seeds", "2", "--pool", "20"]) == 0
    assert "±" in capsys.readouterr().out  # two seeds: a spread
    assert main(["linear-probe", str(tmp_path / "m.safetensors"), *args, "--max-per-class", "20", "--json"]) == 0
