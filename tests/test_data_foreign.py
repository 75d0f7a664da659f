"""Bring your own data: torch Datasets and DataLoaders, torchvision datasets and Hugging Face
`datasets` objects give the evaluations the same numbers as vitlab's own dataset of the same
pixels; `hf:NAME` reads a dataset from the datasets cache (built here, offline) or a folder
written by `save_to_disk`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.data import DataError, open_dataset
from vitlab.data.datasets import ArrayDataset
from vitlab.data.foreign import wrap
from vitlab.data.transforms import eval_transform
from vitlab.eval.accuracy import evaluate
from vitlab.eval.features import extract_features
from vitlab.eval.fewshot import fewshot_from_data
from vitlab.eval.linear_probe import linear_probe_from_data

NAMES = ["red", "green", "blue"]
datasets = pytest.importorskip("datasets")


def pixels(n=30, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    images = rng.integers(0, 256, (n, 12, 10, 3), dtype=np.uint8)
    images[np.arange(n), :, :, labels] //= 4  # a learnable signal: one channel darker per class
    return images, labels


def model():
    torch.manual_seed(0)
    m = vitlab.create_model("ViT-Ti/4", image_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64,
                            num_classes=3, head_init="xavier", crop_fraction=0.8, crop_mode="center")
    return m.eval()


def hf_dataset(images, labels):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    return datasets.Dataset.from_dict({"image": [Image.fromarray(a) for a in images], "label": labels.tolist()},
                                      features=features)


def reference(m, images, labels):
    """vitlab's own in-memory dataset of the same pixels, with the model's preprocessing."""
    return ArrayDataset(images, labels, NAMES, vitlab.transform(m))


def test_every_kind_of_source_gives_the_same_numbers(tmp_path):
    import torchvision

    m, (images, labels) = model(), pixels()
    for i, (a, y) in enumerate(zip(images, labels, strict=True)):
        (tmp_path / NAMES[y]).mkdir(exist_ok=True)
        Image.fromarray(a).save(tmp_path / NAMES[y] / f"{i:03d}.png")
    folder = torchvision.datasets.ImageFolder(str(tmp_path))  # sorted classes: blue, green, red
    want = evaluate(m, reference(m, images, labels))
    hf = hf_dataset(images, labels)
    pre = torch.stack([vitlab.transform(m)(Image.fromarray(a)) for a in images])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(pre, torch.as_tensor(labels)), batch_size=7)
    hf_loader = torch.utils.data.DataLoader(hf.with_format("torch"), batch_size=8)  # dict batches of uint8 HWC
    for source in (hf, loader, hf_loader):
        got = evaluate(m, source)
        assert got["confusion"] == want["confusion"] and got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    # ImageFolder orders classes by name: compare per class name.
    got = evaluate(m, folder)
    assert wrap(folder, vitlab.transform(m)).class_names == ["blue", "green", "red"] and got["count"] == len(labels)
    assert wrap(hf, vitlab.transform(m)).class_names == NAMES


def test_features_fewshot_and_probe_from_any_source():
    m, (images, labels) = model(), pixels()
    ref = reference(m, images, labels)
    want_x, want_y = extract_features(m, ref)
    hf = hf_dataset(images, labels)
    got_x, got_y = extract_features(m, torch.utils.data.DataLoader(hf.with_format("torch"), batch_size=4))
    np.testing.assert_allclose(got_x, want_x, atol=1e-6)
    assert list(got_y) == list(want_y)
    few = fewshot_from_data(m, hf, hf, shots=(2,), seeds=2)
    assert few == fewshot_from_data(m, ref, ref, shots=(2,), seeds=2) and few["num_classes"] == 3
    probe = linear_probe_from_data(m, hf, hf)
    assert probe == linear_probe_from_data(m, ref, ref) and probe["train_accuracy"] > 0.5


def test_bad_sources_say_what_to_do():
    m = model()
    hf = datasets.Dataset.from_dict({"picture": [Image.new("RGB", (8, 8))], "y": [0]})
    with pytest.raises(DataError, match="rename_column"):
        evaluate(m, hf)
    with pytest.raises(DataError, match=r"pass one split, e\.g\. data\['train'\]"):
        wrap(datasets.DatasetDict({"train": hf}), vitlab.transform(m))


def save_to_datasets_cache(dataset_dict, repo_id: str, cache) -> None:
    """Write `dataset_dict` where `datasets.load_dataset(repo_id)` finds it offline: the
    datasets cache layout a download leaves (ORG___NAME/default/0.0.0/HASH/NAME-SPLIT.arrow
    and dataset_info.json), written by datasets' own parquet builder."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo_id.split("/")
    staging = cache.parent / "parquet"
    staging.mkdir(exist_ok=True)
    files = {}
    for split, ds in dataset_dict.items():
        ds.to_parquet(str(staging / f"{split}.parquet"))
        files[split] = [str(staging / f"{split}.parquet")]
    builder = Parquet(dataset_name=f"{org}___{name}", data_files=DataFilesDict.from_local_or_remote(files),
                      cache_dir=str(cache), hash="0" * 16)
    builder.download_and_prepare()
    built = next((cache / f"{org}___{name}").iterdir())
    target = built.parent / "default"  # the config a plain load_dataset(repo_id) looks for
    built.rename(target)
    for arrow in target.rglob(f"{org}___{name}-*.arrow"):
        arrow.rename(arrow.with_name(arrow.name.replace(f"{org}___", "")))


def test_hf_spec_reads_the_datasets_cache_offline(tmp_path, monkeypatch, hub_cache):
    import datasets.config

    (images, labels), (test_images, test_labels) = pixels(), pixels(12, seed=1)
    splits = datasets.DatasetDict({"train": hf_dataset(images, labels), "test": hf_dataset(test_images, test_labels)})
    cache = tmp_path / "datasets-cache"
    save_to_datasets_cache(splits, "org/tiny", cache)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # datasets copies the flag at import
    m = model()
    train = open_dataset("hf:org/tiny", "train", vitlab.transform(m))
    assert len(train) == 30 and train.class_names == NAMES
    x, y = train[4]
    assert torch.equal(x, vitlab.transform(m)(Image.fromarray(images[4]))) and y == labels[4]
    dev = open_dataset("hf:org/tiny", "dev", eval_transform(8))
    assert len(dev) == 3  # 10% of the training set, as for every dataset without a paper value
    assert len(open_dataset("hf:org/tiny", "test", eval_transform(8))) == 12
    with pytest.raises(DataError, match="datasets cache"):
        open_dataset("hf:org/absent", "train", eval_transform(8))


def test_hf_folder_spec_on_the_command_line(tmp_path, capsys):
    (images, labels) = pixels()
    datasets.DatasetDict({"train": hf_dataset(images, labels), "test": hf_dataset(images, labels)}).save_to_disk(
        str(tmp_path / "saved"))
    m = model()
    vitlab.save(m, tmp_path / "m.safetensors")
    want = evaluate(m, reference(m, images, labels))
    assert main(["eval", str(tmp_path / "m.safetensors"), "--data", f"hf:{tmp_path / 'saved'}", "--json",
                 "--out", str(tmp_path / "eval")]) == 0
    out = capsys.readouterr().out
    import json

    got = json.loads(out[out.index("{"):])
    assert got["top1"] == pytest.approx(want["top1"]) and got["class_names"] == NAMES
