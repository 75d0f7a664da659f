"""Loading never runs code from a file: crafted pickles are refused and do nothing."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import vitlab
from vitlab.checkpoints.io import CheckpointError


class Payload:
    """Unpickling this creates a folder: the marker that code from the file ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_crafted_pth_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "weights.pth"
    torch.save({"patch_embed.proj.weight": torch.zeros(2), "x": Payload(str(marker))}, path)
    with pytest.raises(CheckpointError):
        vitlab.load(path)  # detection does not unpickle it either
    for fmt in ("timm", "torchvision"):
        with pytest.raises(CheckpointError, match="refused"):
            vitlab.load(path, format=fmt)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_crafted_legacy_pickle_and_hf_bin_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "legacy.bin"
    path.write_bytes(pickle.dumps({"w": Payload(str(marker))}))
    with pytest.raises(CheckpointError, match="refused"):
        vitlab.load(path, format="timm")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "vit", "hidden_size": 8, "num_hidden_layers": 1, '
                                        '"num_attention_heads": 2, "intermediate_size": 16}')
    torch.save({"x": Payload(str(marker))}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused"):
        vitlab.load(folder)
    assert not marker.exists()


def test_npz_with_object_arrays_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    np.savez(path, **{"embedding/kernel": np.array([Payload(str(marker))], dtype=object)})
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="pickled objects"):
        vitlab.load(path)
    assert not marker.exists()
