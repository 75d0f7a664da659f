"""What the HF and npz writers say about settings their files do not record: image
preprocessing in its own words, position-embedding resampling only where it changes results."""

from __future__ import annotations

import warnings

import pytest

import vitlab
from conftest import perturb, tiny_model


def written_warnings(model, path, format) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vitlab.save(model, path, format=format, **({"allow_numerics_change": True} if format == "npz" else {}))
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("format", ["hf", "npz"])
def test_a_default_model_gets_no_resampling_warning(tmp_path, format):
    said = written_warnings(perturb(tiny_model()), tmp_path / f"m.{format}", format)
    assert not any("resize_mode" in s or "position" in s for s in said), said


@pytest.mark.parametrize("format", ["hf", "npz"])
def test_resampling_on_every_forward_is_named_as_position_embeddings(tmp_path, format):
    model = perturb(tiny_model(dynamic_image_size=True, resize_mode="bilinear_aligned"))
    said = written_warnings(model, tmp_path / f"m.{format}", format)
    (line,) = [s for s in said if "resize_mode" in s]
    assert "position embeddings" in line and "dynamic_image_size=True" in line and "prepares images" not in line


def test_image_preprocessing_is_said_as_preprocessing(tmp_path):
    model = perturb(tiny_model(mean=(0.485, 0.456, 0.406), crop_fraction=0.875))
    said = written_warnings(model, tmp_path / "m.npz", "npz")
    (line,) = [s for s in said if "preprocessing" in s]
    assert "crop_fraction=0.875" in line and "resize_mode" not in line
