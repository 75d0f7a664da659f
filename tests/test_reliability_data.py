"""Reliability of reading data: hostile and broken tar shards, labels out of range, odd
images (decompression bombs, zero bytes, 1x1, 16-bit, CMYK, EXIF-rotated), degenerate class
folders, and unreadable files counted once each (vitlab.data)."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import tarfile
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import assert_one_line_error, tree_state, unchanged, vitlab_cli
from vitlab.cli import main
from vitlab.data import BadImageError, DataError, DataOptions, make_loader, open_dataset, read_image
from vitlab.data.transforms import eval_transform
from vitlab.train.run_folder import LOCK_FILE

GREY16 = eval_transform(16)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Shard indexes go to a cache of the test's own, not the user's."""
    monkeypatch.setenv("VITLAB_DATA", str(tmp_path / "cache"))


def png(seed: int, size=(16, 16), mode="RGB") -> bytes:
    a = np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(a).convert(mode).save(buffer, format="PNG")
    return buffer.getvalue()


def add(tf: tarfile.TarFile, name: str, payload: bytes, **kind) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    for k, v in kind.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(payload) if info.isfile() else None)


def shard(path, samples, mode="w") -> None:
    """samples: (key, image bytes or None, label text or None)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tf:
        for key, image, label in samples:
            if image is not None:
                add(tf, f"{key}.png", image)
            if label is not None:
                add(tf, f"{key}.cls", label.encode())


def good_samples(n=8, classes=2):
    return [(f"s{i:03d}", png(i), str(i % classes)) for i in range(n)]


# Hostile and broken tars -------------------------------------------------------------------------
def test_member_names_that_climb_out_are_only_keys(tmp_path):
    """Shards are read as streams, never extracted: `../../x` and `/abs/x` are sample keys."""
    root = tmp_path / "data"
    samples = [("../../escaped", png(0), "0"), ("/abs/path", png(1), "1"), ("ok", png(2), "1")]
    shard(root / "train-000000.tar", samples)
    before = tree_state(tmp_path.parent, skip=(tmp_path / "cache",))
    ds = open_dataset(f"wds:{root}", "train", transform=GREY16)
    assert len(ds) == 3 and [y for _, y in ds] == [0, 1, 1]
    assert tree_state(tmp_path.parent, skip=(tmp_path / "cache",)) == before  # nothing written anywhere


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_links_in_a_shard_are_never_followed(tmp_path, link):
    root = tmp_path / "data"
    secret = tmp_path / "secret.png"
    secret.write_bytes(png(5))
    root.mkdir()
    with tarfile.open(root / "train-000000.tar", "w") as tf:
        add(tf, "a.png", png(0))
        add(tf, "a.cls", b"0")
        add(tf, "b.png", b"", type=tarfile.SYMTYPE if link == "symlink" else tarfile.LNKTYPE, linkname=str(secret))
        add(tf, "b.cls", b"1")
    ds = open_dataset(f"wds:{root}", "train", transform=GREY16, options=DataOptions(classes=("x", "y")))
    with pytest.raises(BadImageError, match="sample b: .*no image member"):
        list(ds)
    lenient = open_dataset(f"wds:{root}", "train", transform=GREY16, options=DataOptions(classes=("x", "y"), skip_bad_images=True))
    batches = list(make_loader(lenient, 2, train=False))
    assert [n for b in batches for n in b[2]] == [f"{root / 'train-000000.tar'}:b"]


def test_a_member_claiming_a_huge_size_is_refused_before_reading(tmp_path):
    path = tmp_path / "train-000000.tar"
    info = tarfile.TarInfo("big.png")
    info.size = 2**40
    path.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + b"\x00" * 4096)
    with pytest.raises(DataError, match=r"big.png claims 1,099,511,627,776") as e:
        open_dataset(f"wds:{path}", "train", transform=GREY16)
    assert e.value.reason == "too-big"


@pytest.mark.parametrize("damage", ["truncated", "flipped gzip", "not a tar", "empty", "truncated gzip", "garbled header",
                                    "cut in a member"])
def test_broken_shards_are_named_in_one_line(tmp_path, capsys, damage):
    root = tmp_path / "data"
    gz = "gzip" in damage
    path = root / f"train-000000.tar{'.gz' if gz else ''}"
    shard(path, good_samples(16), mode="w:gz" if gz else "w")
    blob = path.read_bytes()
    with tarfile.open(path) as tf:
        tenth = tf.getmembers()[10].offset  # the header of the 11th member
    blob = {
        "garbled header": blob[:tenth] + b"x" * 512 + blob[tenth + 512 :],
        "cut in a member": blob[: tenth + 700],
        "truncated": blob[: len(blob) // 2 + 7],
        "flipped gzip": blob[:40] + bytes(b ^ 0xFF for b in blob[40:140]) + blob[140:],
        "not a tar": b"hello " * 300,
        "empty": b"",
        "truncated gzip": blob[: len(blob) // 3],
    }[damage]
    path.write_bytes(blob)
    with unchanged(tmp_path, skip=(tmp_path / "cache", tmp_path / "run" / LOCK_FILE)):  # the refused run's lock only
        with pytest.raises(DataError, match="cannot read the shard"):
            list(open_dataset(f"wds:{path}", "train", GREY16, options=DataOptions(classes=("a", "b"))))
        rc = main(["train", "--data", f"wds:{path}", "--steps", "1", "--out", str(tmp_path / "run"), "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, "train", mentions=(str(path),))


def test_an_empty_shard_is_named_in_one_line(tmp_path):
    """A valid tar with no files among good shards (a writer that died before its first
    sample) is refused by name, not read as a shard of no samples."""
    shard(tmp_path / "train-000000.tar", good_samples(16))
    shard(tmp_path / "train-000001.tar", [])
    spec = f"wds:{tmp_path}/train-{{000000..000001}}.tar"
    with pytest.raises(DataError, match="train-000001.tar: an empty shard") as e:
        open_dataset(spec, "train", GREY16, options=DataOptions(classes=("a", "b")))
    assert e.value.reason == "empty-shard"
    r = vitlab_cli("train", "--data", spec, "--steps", "1", "--out", str(tmp_path / "run"), timeout=120)
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=(str(tmp_path / "train-000001.tar"), "leave it out"))


def test_a_fifo_shard_is_refused(tmp_path):
    os.mkfifo(tmp_path / "train-000000.tar")
    r = vitlab_cli("train", "--data", f"wds:{tmp_path}/train-000000.tar", "--steps", "1", "--out", str(tmp_path / "run"),
                   timeout=120)
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=("FIFO",))


@pytest.mark.parametrize("label, words", [("12", "has label 12, outside the 10 classes"), ("-1", "has label -1"),
                                          ("cat", "has a label that is not an integer"), (None, "has no label")])
def test_labels_out_of_range_name_the_shard_and_key(tmp_path, capsys, label, words):
    root = tmp_path / "data"
    samples = good_samples(6)
    samples[3] = (samples[3][0], samples[3][1], label)
    shard(root / "train-000000.tar", samples)
    (root / "classes.txt").write_text("\n".join(f"c{i}" for i in range(10)))
    with unchanged(tmp_path, skip=(tmp_path / "cache", tmp_path / "run" / LOCK_FILE)):  # the refused run's lock only
        with pytest.raises(DataError, match=f"train-000000.tar: sample s003 {words}"):
            open_dataset(f"wds:{root}", "train", transform=GREY16)
        rc = main(["train", "--data", f"wds:{root}", "--steps", "1", "--batch-size", "2", "--out", str(tmp_path / "run"),
                   "--quiet", "model.image_size=16"])
    assert_one_line_error(rc, capsys.readouterr().err, "train", mentions=("train-000000.tar", "s003"))


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie that no one has reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_pipe_command_dies_with_the_data_loader_worker_that_ran_it(tmp_path):
    """A killed worker (vitlab's loader sends SIGKILL to one busy past its grace) takes its
    pipe: command with it, and what the command started: none is left running, reading or
    holding a connection. The command here streams the shard for the index, then, in the
    worker, starts a process that hangs."""
    import signal
    import time

    path, pid = tmp_path / "train-000000.tar", tmp_path / "pid"
    shard(path, good_samples(4))
    command = f"if [ -e {tmp_path}/indexed ]; then sleep 300 & echo $! > {pid}; wait; else touch {tmp_path}/indexed; exec cat {path}; fi"
    ds = open_dataset(f"wds:pipe:{command}", "train", GREY16, options=DataOptions(classes=("a", "b")))
    batches = iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1))
    try:
        for _ in range(600):  # the worker starts the command
            if pid.is_file() and pid.read_text().strip():
                break
            time.sleep(0.1)
        child = int(pid.read_text())
        assert running(child)
        os.kill(batches._workers[0].pid, signal.SIGKILL)
        for _ in range(600):
            try:
                if not running(child):
                    break
                time.sleep(0.1)
            except RuntimeError as e:  # torch's SIGCHLD handler says so in the parent
                assert "killed by signal" in str(e)
        assert not running(child)
    finally:
        if pid.is_file() and pid.read_text().strip() and running(int(pid.read_text())):
            os.kill(int(pid.read_text()), signal.SIGKILL)  # (without the fix: not left behind by the test)
        batches._shutdown_workers()


# Odd images -----------------------------------------------------------------------------------------
def bomb(path, width=40_000, height=40_000) -> None:
    """A tiny PNG whose header claims width x height pixels (over twice PIL's limit)."""
    blob = bytearray(png(0, (8, 8)))
    ihdr = 8 + 8  # signature, then length + type of the IHDR chunk
    blob[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    blob[ihdr + 13 : ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(blob[12 : ihdr + 13])))
    path.write_bytes(bytes(blob))


def exif_rotated(path) -> None:
    """A 16x8 JPEG, left half black, right half white, tagged Orientation=6 (a phone held
    upright): viewers show it 8 wide, 16 tall, black on top."""
    a = np.zeros((8, 16), dtype=np.uint8)
    a[:, 8:] = 255
    im = Image.fromarray(a).convert("RGB")
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(path, format="JPEG", exif=exif.tobytes(), quality=95)


def test_exif_orientation_is_applied(tmp_path):
    exif_rotated(tmp_path / "phone.jpg")
    im = read_image(tmp_path / "phone.jpg")
    a = np.asarray(im.convert("L"), dtype=float)
    assert im.size == (8, 16)
    assert a[:6].mean() < 30 and a[-6:].mean() > 225  # rotated 90 degrees clockwise: black on top


@pytest.mark.parametrize("kind", ["bomb", "moderate bomb", "zero bytes", "truncated jpeg", "text", "zero-size header"])
def test_unreadable_images_are_named(tmp_path, kind):
    path = tmp_path / ("x.png" if kind != "truncated jpeg" else "x.jpg")
    if kind == "bomb":
        bomb(path)
    elif kind == "moderate bomb":  # 100 Mpx: PIL only warns; vitlab refuses to decode it
        bomb(path, width=10_000, height=10_000)
    elif kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "truncated jpeg":
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path, quality=90)
        path.write_bytes(path.read_bytes()[:300])
    elif kind == "text":
        path.write_text("not an image")
    else:
        bomb(path, width=0, height=0)
    with pytest.raises(BadImageError, match="x.(png|jpg): cannot read this image"):
        read_image(path)


@pytest.mark.parametrize("mode", ["1x1", "I;16", "CMYK", "LA", "P", "1x300"])
def test_odd_but_valid_images_are_predicted(tmp_path, capsys, mode):
    import vitlab
    from conftest import tiny_model

    ckpt = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), ckpt)
    path = tmp_path / ("x.jpg" if mode == "CMYK" else "x.png")
    if mode == "1x1":
        Image.new("RGB", (1, 1), (200, 10, 10)).save(path)
    elif mode == "1x300":
        Image.new("RGB", (1, 300), (200, 10, 10)).save(path)
    elif mode == "I;16":
        Image.fromarray(np.full((12, 12), 40_000, dtype=np.uint16)).save(path)
    elif mode == "CMYK":
        Image.new("CMYK", (20, 20), (0, 128, 255, 0)).save(path)
    elif mode == "LA":
        Image.new("LA", (20, 20), (100, 128)).save(path)
    else:
        im = Image.new("P", (20, 20))
        im.info["transparency"] = 0
        im.save(path, transparency=0)
    assert main(["predict", str(ckpt), str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert result["image"] == str(path) and len(result["predictions"]) == 5


def test_a_fifo_image_is_refused_without_blocking(tmp_path):
    import vitlab
    from conftest import tiny_model

    ckpt = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(), ckpt)
    os.mkfifo(tmp_path / "x.png")
    r = vitlab_cli("predict", str(ckpt), str(tmp_path / "x.png"), timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "FIFO" in r.stderr


# Degenerate datasets ---------------------------------------------------------------------------------
def image_folder(root, counts: dict[str, int]) -> None:
    for name, n in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / name / f"{i}.png").write_bytes(png(i))


@pytest.mark.parametrize("counts, words", [({"only": 6}, "1 class (only)"), ({"a": 5, "b": 0}, "class folder(s) b hold no image"),
                                           ({"a": 0, "b": 0, "c": 3}, "a, b hold no image")])
def test_one_class_or_an_empty_class_folder_is_refused(tmp_path, capsys, counts, words):
    image_folder(tmp_path / "pets", counts)
    with pytest.raises(DataError, match=re.escape(words)):
        open_dataset(f"imagefolder:{tmp_path / 'pets'}", "train", transform=GREY16)
    rc = main(["train", "--data", f"imagefolder:{tmp_path / 'pets'}", "--steps", "1", "--out", str(tmp_path / "run"), "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, "train", mentions=(words.split(" (")[0],))
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_one_class_in_shards_is_refused(tmp_path):
    shard(tmp_path / "train-000000.tar", [(f"k{i}", png(i), "0") for i in range(4)])
    with pytest.raises(DataError, match="1 class"):
        open_dataset(f"wds:{tmp_path}", "train", transform=GREY16)


def test_a_held_out_split_missing_a_class_is_said(tmp_path):
    image_folder(tmp_path / "pets" / "train", {"a": 4, "b": 4})
    image_folder(tmp_path / "pets" / "val", {"a": 3})
    with pytest.warns(UserWarning, match="no images of the class"):
        ds = open_dataset(f"imagefolder:{tmp_path / 'pets'}", "test", transform=GREY16)
    assert ds.class_names == ["a", "b"] and len(ds) == 3


def test_an_unreadable_file_counts_once_however_many_epochs_meet_it(tmp_path, capsys):
    image_folder(tmp_path / "pets", {"a": 6, "b": 6})
    (tmp_path / "pets" / "a" / "0.png").write_bytes(b"\x89PNG broken")
    out = tmp_path / "run"
    rc = main(["train", "--data", f"imagefolder:{tmp_path / 'pets'}", "--epochs", "4", "--batch-size", "4",
               "--skip-bad-images", "--out", str(out), "--quiet", "model.image_size=16", "model.depth=1",
               "model.hidden_size=32", "model.num_heads=2", "model.mlp_dim=64", "data.eval_splits=[train]"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bad_images_skipped"] == 1 and summary["epochs"] >= 3
    assert torch.isfinite(torch.tensor(summary["splits"]["train"]["loss"]))
