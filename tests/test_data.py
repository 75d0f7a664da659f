"""vitlab.data: every source from real files, splits, the loader layout, bad images."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data import BadImageError, DataError, DataOptions, make_loader, open_dataset, read_image, transforms as T
from vitlab.data.tar_shards import expand_braces

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CIFAR_WDS = SHARED / "cifar10"
FASHION = Path("/usr/share/datasets/fashion-mnist")
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
GREY = dict(in_channels=1, mean=(0.5,), std=(0.5,))


def need_cifar():
    if not (CIFAR_WDS / "test-000000.tar.gz").exists():
        pytest.skip(f"the CIFAR-10 shards are not at {CIFAR_WDS} (../shared/data/cifar10)")


def cifar_samples(n: int) -> list[tuple[str, bytes, int]]:
    """The first n (key, PNG/JPEG bytes, label) of the real CIFAR-10 test shard."""
    need_cifar()
    out, parts = [], {}
    with tarfile.open(CIFAR_WDS / "test-000000.tar.gz", "r|gz") as tf:
        for m in tf:
            key, ext = m.name.split(".", 1)
            parts.setdefault(key, {})[ext] = tf.extractfile(m).read()
            if len(parts[key]) == 2:
                out.append((key, parts[key]["jpg"], int(parts[key]["cls"])))
                if len(out) == n:
                    break
    return out


def decoded(sample_bytes: bytes) -> np.ndarray:
    return np.array(Image.open(io.BytesIO(sample_bytes)).convert("RGB"))


# Sources ----------------------------------------------------------------------------------
def test_digits_ship_inside_the_package_with_fixed_splits():
    train = open_dataset("digits", "train", T.eval_transform(8, **GREY))
    test = open_dataset("digits", "test", T.eval_transform(8, **GREY))
    assert (len(train), len(test)) == (1437, 360)
    assert train.class_names == [str(i) for i in range(10)]
    x, y = test[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and -1.0 <= x.min() and x.max() <= 1.0
    assert 0 <= y < 10
    # No image is in both splits.
    tr = {train.images[i].tobytes() for i in train.indices}
    assert not any(test.images[i].tobytes() in tr for i in test.indices[:50])


@pytest.mark.skipif(not FASHION.exists(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_debian_idx_files(tmp_path):
    ds = open_dataset("fashion-mnist", "test", T.eval_transform(28, **GREY))
    assert len(ds) == 10_000 and ds.class_names[9] == "Ankle boot"
    # The same files, un-gzipped, in a folder of one's own.
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(gzip.decompress((FASHION / f"{name}.gz").read_bytes()))
    mine = open_dataset(f"fashion-mnist:{tmp_path}", "test", T.eval_transform(28, **GREY))
    a, la = ds[123]
    b, lb = mine[123]
    assert la == lb and torch.equal(a, b)
    raw = gzip.decompress((FASHION / "t10k-images-idx3-ubyte.gz").read_bytes())
    pixels = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)[123].copy()
    assert torch.allclose(a[0], torch.from_numpy(pixels).float() / 127.5 - 1, atol=1e-6)


def test_fashion_mnist_offline_error_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_DATA", str(tmp_path))
    with pytest.raises(DataError, match="not found in .*nowhere"):
        open_dataset(f"fashion-mnist:{tmp_path / 'nowhere'}", "train", T.eval_transform(28, **GREY))
    # No local copy and a download that cannot connect: the message says what to install.
    import vitlab.data.datasets as ds

    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    with pytest.raises(DataError, match="download .* failed.*apt-get install"):
        open_dataset("fashion-mnist", "train", T.eval_transform(28, **GREY), options=DataOptions(mirror="http://127.0.0.1:9/"))


def test_cifar10_in_torchvision_format(tmp_path):
    """torchvision's cifar-10-batches-py built from real CIFAR-10 images."""
    samples = cifar_samples(60)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    images = np.stack([decoded(b) for _, b, _ in samples])  # (N, 32, 32, 3)
    labels = [y for _, _, y in samples]
    flat = images.transpose(0, 3, 1, 2).reshape(len(samples), -1)  # the format's CHW rows
    for i in range(1, 6):
        part = slice((i - 1) * 10, i * 10)
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump({"data": flat[part], "labels": labels[part]}, f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"data": flat[50:], "labels": labels[50:]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CIFAR_NAMES}, f)
    for spec in (f"cifar10:{tmp_path}", f"cifar10:{folder}"):
        train = open_dataset(spec, "train", T.eval_transform(32))
        test = open_dataset(spec, "test", T.eval_transform(32))
        assert (len(train), len(test)) == (50, 10) and train.class_names == CIFAR_NAMES
        x, y = test[3]
        assert y == labels[53]
        assert torch.allclose(x, torch.from_numpy(images[53]).permute(2, 0, 1).float() / 127.5 - 1, atol=1e-6)
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        open_dataset(f"cifar10:{tmp_path / 'empty'}", "train", T.eval_transform(32))


def make_image_folder(root: Path, samples, split_dirs: bool) -> None:
    for i, (key, data, y) in enumerate(samples):
        sub = ("train" if i % 4 else "val") if split_dirs else ""
        d = root / sub / CIFAR_NAMES[y]
        d.mkdir(parents=True, exist_ok=True)
        Image.open(io.BytesIO(data)).save(d / f"{key}.png")


def test_image_folder_with_and_without_split_folders(tmp_path):
    samples = cifar_samples(40)
    make_image_folder(tmp_path / "a", samples, split_dirs=True)
    train = open_dataset(f"imagefolder:{tmp_path / 'a'}", "train", T.eval_transform(32))
    val = open_dataset(f"imagefolder:{tmp_path / 'a'}", "val", T.eval_transform(32))
    assert len(train) == 30 and len(val) == 10
    assert set(train.class_names) <= set(CIFAR_NAMES) and val.class_names == train.class_names
    key, data, label = samples[0]  # i = 0 went to val
    x, y = val[[val.files[i].stem for i in val.indices].index(key)]
    assert train.class_names[y] == CIFAR_NAMES[label]
    assert torch.allclose(x, torch.from_numpy(decoded(data)).permute(2, 0, 1).float() / 127.5 - 1, atol=1e-6)

    make_image_folder(tmp_path / "b", samples, split_dirs=False)
    tr = open_dataset(f"imagefolder:{tmp_path / 'b'}", "train", T.eval_transform(32))
    te = open_dataset(f"imagefolder:{tmp_path / 'b'}", "test", T.eval_transform(32))
    assert len(tr) + len(te) == 40 and len(te) == 8
    assert not {str(tr.files[i]) for i in tr.indices} & {str(te.files[i]) for i in te.indices}


def write_shards(folder: Path, samples, per_shard: int, gz: bool, prefix: str = "train") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(samples), per_shard):
        path = folder / f"{prefix}-{s // per_shard:06d}.tar{'.gz' if gz else ''}"
        with tarfile.open(path, "w:gz" if gz else "w") as tf:
            for key, data, y in samples[s : s + per_shard]:
                for ext, payload in (("jpg", data), ("cls", str(y).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths


def test_webdataset_real_shards_streamed():
    need_cifar()
    ds = open_dataset(f"wds:{CIFAR_WDS}/test-{{000000..000001}}.tar.gz", "test", T.eval_transform(32), options=DataOptions(classes=tuple(CIFAR_NAMES)))
    assert len(ds) == 10_000 and ds.class_names == CIFAR_NAMES
    first = cifar_samples(3)
    items = []
    for item in ds:
        items.append(item)
        if len(items) == 3:
            break
    for (x, y), (_, data, label) in zip(items, first, strict=True):
        assert y == label
        assert torch.allclose(x, torch.from_numpy(decoded(data)).permute(2, 0, 1).float() / 127.5 - 1, atol=1e-6)


@pytest.mark.parametrize("gz", [False, True])
def test_webdataset_built_shards_split_across_workers_and_processes(tmp_path, gz):
    samples = cifar_samples(45)
    write_shards(tmp_path, samples, per_shard=10, gz=gz)
    spec = f"wds:{tmp_path}/train-{{000000..000004}}.tar{'.gz' if gz else ''}"
    ds = open_dataset(spec, "train", T.eval_transform(32), train=True, options=DataOptions(shuffle_buffer=8))
    assert len(ds) == 45 and ds.class_names == [str(i) for i in range(max(y for *_, y in samples) + 1)]
    # Two processes x two workers each: together exactly the one-process batches.
    def labels_of(world, workers):
        out = []
        for rank in range(world):
            loader = make_loader(ds, 8 // world, rank=rank, world=world, num_steps=5, num_workers=workers, seed=3)
            out.append([b[1].tolist() for b in loader])
        return out
    (single,) = labels_of(1, 0)
    assert len(single) == 5 and all(len(b) == 8 for b in single)
    pair = labels_of(2, 2)
    assert [a + b for a, b in zip(*pair, strict=True)] == single
    # Shuffled, but every sample once per epoch (5 batches of 8 = 40 of the 45).
    ids = open_dataset(spec, "train", T.eval_transform(32), options=DataOptions(shuffle_buffer=8))
    assert sorted(y for _, y in ids) == sorted(y for *_, y in samples)
    # Resuming at batch 3 gives batches 3 and 4 of the uninterrupted order, images and all.
    full = [b[0] for b in make_loader(ds, 8, num_steps=5, seed=3)]
    later = [b[0] for b in make_loader(ds, 8, start_step=3, num_steps=2, seed=3)]
    assert all(torch.equal(a, b) for a, b in zip(full[3:], later, strict=True))


def test_brace_expansion():
    assert list(expand_braces("a-{000..002}.tar")) == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert list(expand_braces("{x,y}-{1..2}")) == ["x-1", "x-2", "y-1", "y-2"]


def test_wds_missing_shard_is_named(tmp_path):
    with pytest.raises(DataError, match="train-000003.tar"):
        open_dataset(f"wds:{tmp_path}/train-{{000003..000004}}.tar", "train", T.eval_transform(32))


# Splits and the loader ---------------------------------------------------------------------
def test_dev_split_is_fixed_and_disjoint():
    dev = open_dataset("digits", "dev", T.eval_transform(8, **GREY), seed=1)
    rest = open_dataset("digits", "train-minus-dev", T.eval_transform(8, **GREY), seed=2)
    again = open_dataset("digits", "dev", T.eval_transform(8, **GREY), seed=7)
    assert len(dev) == 144 and len(dev) + len(rest) == 1437
    assert np.array_equal(dev.indices, again.indices)  # independent of the run's seed
    assert not set(dev.indices) & set(rest.indices)


def test_dev_split_comes_from_the_data_not_its_path(tmp_path):
    """The same CIFAR-10 shards through their real path and through a symlink with no
    'cifar' in its name hold out the same 2% (Appendix B.1.1); a folder named cifar10 that
    holds half of the shards is not CIFAR-10 and holds out 10%."""
    need_cifar()
    (tmp_path / "c10").symlink_to(CIFAR_WDS, target_is_directory=True)
    real = open_dataset(f"wds:{CIFAR_WDS}", "dev", T.eval_transform(32))
    linked = open_dataset(f"wds:{tmp_path / 'c10'}", "dev", T.eval_transform(32))
    assert real.identity == linked.identity == "cifar10"
    assert len(real) == len(linked) and abs(len(real) - 1000) < 100  # 2% of 50,000, by key buckets
    assert real.keys_and_labels() == linked.keys_and_labels()
    rest = open_dataset(f"wds:{tmp_path / 'c10'}", "train-minus-dev", T.eval_transform(32))
    assert len(rest) + len(linked) == 50_000
    half = tmp_path / "cifar10"
    half.mkdir()
    for shard in sorted(CIFAR_WDS.glob("train-*.tar.gz"))[:5]:
        (half / shard.name).symlink_to(shard)
    part = open_dataset(f"wds:{half}", "dev", T.eval_transform(32))
    assert part.identity is None and abs(len(part) - 2500) < 200  # 10% of 25,000
    assert len(open_dataset(f"wds:{half}", "dev", T.eval_transform(32), options=DataOptions(dev_fraction=0.02))) < 700  # explicit wins


def test_dataset_identity_by_name_or_class_counts():
    from vitlab.data.identity import by_name, dev_fraction, recognise

    assert recognise([5000] * 10) == "cifar10" and recognise([500] * 100 + [0]) == "cifar100"
    assert recognise([5000] * 9 + [4999]) is None and recognise([6000] * 10) is None  # Fashion-MNIST is no paper set
    assert by_name("cifar100:/data/x") == "cifar100" and by_name("imagefolder:/data/cifar10") is None
    assert dev_fraction("cifar10") == 0.02 and dev_fraction("imagenet") == 0.01 and dev_fraction(None) == 0.1
    assert dev_fraction("cifar10", explicit=0.3) == 0.3
    assert open_dataset("digits", "train", T.eval_transform(8, **GREY)).identity is None


def test_loader_batches_are_a_function_of_seed_and_step():
    ds = open_dataset("digits", "train", T.train_transform(8, crop_scale=(0.5, 1.0), **GREY), train=True)
    full = list(make_loader(ds, 32, seed=5, num_steps=50))  # crosses an epoch (44 per epoch)
    resumed = list(make_loader(ds, 32, seed=5, start_step=40, num_steps=10, num_workers=2))
    for a, b in zip(full[40:], resumed, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    halves = [list(make_loader(ds, 16, seed=5, rank=r, world=2, num_steps=3)) for r in range(2)]
    for j in range(3):
        assert torch.equal(torch.cat([halves[0][j][0], halves[1][j][0]]), full[j][0])
    other_seed = next(iter(make_loader(ds, 32, seed=6, num_steps=1)))
    assert not torch.equal(other_seed[1], full[0][1])


# Transforms and bad images -----------------------------------------------------------------
def test_transforms_accept_every_mode():
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    rgba = rgb.convert("RGBA")
    grey16 = Image.fromarray((rng.integers(0, 65536, (20, 30))).astype(np.uint16))
    assert grey16.mode.startswith("I;16") or grey16.mode == "I"
    ev = T.eval_transform(16)
    for im in (rgb, rgba, grey16, rgb.convert("L"), rgb.convert("P")):
        x = ev(im)
        assert x.shape == (3, 16, 16) and -1 <= x.min() and x.max() <= 1
    g = T.eval_transform(16, (0.5,), (0.5,), in_channels=1)(grey16)
    assert g.shape == (1, 16, 16)
    # 16-bit is scaled, not saturated: a mid-grey stays mid-grey.
    mid = Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16))
    assert abs(float(T.eval_transform(8, (0.5,), (0.5,), 1)(mid).mean())) < 0.01
    tr = T.train_transform(16, randaugment=2)
    torch.manual_seed(0)
    a = tr(rgb)
    torch.manual_seed(0)
    assert torch.equal(a, tr(rgb)) and a.shape == (3, 16, 16)


def test_bad_images_named_or_skipped_and_counted(tmp_path):
    samples = cifar_samples(12)
    make_image_folder(tmp_path, samples, split_dirs=False)
    victim = sorted(tmp_path.rglob("*.png"))[0]
    victim.write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    with pytest.raises(BadImageError, match=victim.name):
        read_image(victim)
    strict = open_dataset(f"imagefolder:{tmp_path}", "train", T.eval_transform(32), options=DataOptions(test_fraction=0.01))
    with pytest.raises(BadImageError, match=f"{victim.name}.*--skip-bad-images"):
        list(make_loader(strict, 11, train=False))
    lenient = open_dataset(f"imagefolder:{tmp_path}", "train", T.eval_transform(32), options=DataOptions(test_fraction=0.01, skip_bad_images=True))
    batches = list(make_loader(lenient, 11, train=False))
    assert [n for b in batches for n in b[2]] == [str(victim)] and sum(len(b[1]) for b in batches) == 10


def test_bad_sample_in_a_shard_is_named(tmp_path):
    samples = cifar_samples(6)
    samples[2] = (samples[2][0], b"garbage", samples[2][2])
    write_shards(tmp_path, samples, per_shard=6, gz=False)
    ds = open_dataset(f"wds:{tmp_path}/train-000000.tar", "test", T.eval_transform(32))
    with pytest.raises(BadImageError, match=f"train-000000.tar: sample {samples[2][0]}"):
        list(ds)
    ds = open_dataset(f"wds:{tmp_path}/train-000000.tar", "test", T.eval_transform(32), options=DataOptions(skip_bad_images=True))
    batches = list(make_loader(ds, 4, train=False))
    skipped = [n for b in batches for n in b[2]]
    assert skipped == [f"{tmp_path}/train-000000.tar:{samples[2][0]}"] and sum(len(b[1]) for b in batches) == 5


@pytest.mark.skipif(not FASHION.exists(), reason="Debian's dataset-fashion-mnist is not installed")
def test_the_idx_reader_gives_torchvisions_fashion_mnist(tmp_path):
    """vitlab reads Debian's gzipped files itself (datasets.read_idx says why); torchvision's
    FashionMNIST, given the same files un-gzipped in its own layout, reads the same arrays."""
    from torchvision.datasets import FashionMNIST

    from vitlab.data.datasets import fashion_mnist_arrays

    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (raw / name).write_bytes(gzip.decompress((FASHION / f"{name}.gz").read_bytes()))
    ours = fashion_mnist_arrays(str(FASHION), download=False)
    for split, train in (("train", True), ("test", False)):
        theirs = FashionMNIST(str(tmp_path), train=train, download=False)
        images, labels = ours[split]
        assert np.array_equal(images, theirs.data.numpy()) and np.array_equal(labels, theirs.targets.numpy())


def test_a_bare_folder_and_a_folder_one_level_too_deep_name_the_spec_meant(tmp_path, monkeypatch):
    """A folder given as --data names no kind: the error offers imagefolder:PATH. An image
    folder whose one class folder holds the class folders (one level too deep) is not "1 class"
    alone: the error names the folder meant."""
    for c in ("bag", "dress"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / c / "0.png")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"did you mean imagefolder:photos "):
        open_dataset("photos", "train", lambda x: x)
    (tmp_path / "outer").mkdir()
    (tmp_path / "photos").rename(tmp_path / "outer" / "photos")
    with pytest.raises(DataError, match=r"did you mean imagefolder:outer/photos\?"):
        open_dataset("imagefolder:outer", "train", lambda x: x)
    assert len(open_dataset("imagefolder:outer/photos", "train", lambda x: x).class_names) == 2
