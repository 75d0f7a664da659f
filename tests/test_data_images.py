"""One image opener (data/images.py) for every path that reads images: the fast training path,
the PIL path of training, evaluation and predict, the GPU path's planning, WebDataset shards,
uploads. They agree on what is an image, on real JPEG variants (CIFAR-10 photographs re-encoded
by libjpeg-turbo's own jpegtran), also when one of the two decoders refuses a file the other
reads; and the decompression-bomb limit is checked in one place, before any pixel is decoded."""

from __future__ import annotations

import io
import pickle
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image, JpegImagePlugin

import vitlab
from conftest import SHARED_DATA, cifar_test_images, vitlab_cli, zero_png
from vitlab.data import BadImageError, decode as D, images, read_image
from vitlab.data.datasets import Encoded
from vitlab.data.transforms import eval_transform, train_transform

JPEGTRAN = shutil.which("jpegtran")  # libjpeg-turbo-progs (.ci/run installs it)


def jpegtran(data: bytes, *flags: str) -> bytes:
    return subprocess.run([JPEGTRAN, *flags], input=data, capture_output=True, check=True).stdout


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """name -> a file: a real photograph at 160x120 in JPEG variants, and broken ones."""
    if JPEGTRAN is None:
        pytest.skip("needs jpegtran (Debian's libjpeg-turbo-progs)")
    cifar_dir = SHARED_DATA / "cifar10"
    if not any(cifar_dir.glob("test-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {cifar_dir}")
    root = tmp_path_factory.mktemp("variants")
    _, data, _ = cifar_test_images(cifar_dir, 1)[0]
    photo = Image.open(io.BytesIO(data)).convert("RGB").resize((160, 120), Image.BICUBIC)
    base = io.BytesIO()
    photo.save(base, "JPEG", quality=90)
    grey, exif = io.BytesIO(), Image.Exif()
    photo.convert("L").save(grey, "JPEG", quality=90)
    exif[0x0112] = 6
    turned = io.BytesIO()
    photo.save(turned, "JPEG", quality=90, exif=exif)
    out = {
        "baseline": base.getvalue(),
        "progressive": jpegtran(base.getvalue(), "-progressive"),
        "arithmetic": jpegtran(base.getvalue(), "-arithmetic"),
        "arithmetic progressive": jpegtran(base.getvalue(), "-arithmetic", "-progressive"),
        "arithmetic grey": jpegtran(grey.getvalue(), "-arithmetic"),
        "arithmetic turned by EXIF": jpegtran(turned.getvalue(), "-arithmetic", "-copy", "all"),
    }
    out["arithmetic cut short"] = out["arithmetic"][: len(out["arithmetic"]) // 3]
    out["not an image"] = b"\xff\xd8\xff\xe0 and then text"
    paths = {}
    for name, content in out.items():
        paths[name] = root / "photos" / ("a" if len(paths) % 2 else "b") / f"{name.replace(' ', '-')}.jpg"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_bytes(content)
    return paths


def readings(path) -> dict[str, object]:
    """What each path makes of a file: a tensor, or the BadImageError's class."""
    def attempt(fn):
        try:
            return fn()
        except BadImageError:
            return BadImageError

    encoded = Encoded(path, str(path))
    torch.manual_seed(0)
    return {
        "PIL (eval, predict)": attempt(lambda: eval_transform(64)(read_image(path))),
        "PIL training": attempt(lambda: train_transform(64, decode="pil")(encoded)),
        "fast training": attempt(lambda: train_transform(64)(encoded)),
        "GPU planning": attempt(lambda: D.decode_planned([train_transform(64, decode="cuda")(encoded)], (64, 64), "cpu")),
    }


def assert_agree(variants):
    for name, path in variants.items():
        seen = readings(path)
        refused = {k for k, v in seen.items() if v is BadImageError}
        assert refused in (set(), set(seen)), (name, refused)  # all read it, or all refuse it
        if not refused:
            assert seen["PIL (eval, predict)"].shape == (3, 64, 64), name
        assert bool(refused) == (name in ("arithmetic cut short", "not an image")), (name, refused)


def test_every_path_reads_the_same_files(variants):
    assert_agree(variants)
    # The two decoders give the same pixels for an arithmetic-coded file as for its baseline twin.
    a, b = read_image(variants["arithmetic"]), read_image(variants["baseline"])
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_file_one_decoder_refuses_is_read_by_the_other_for_both_paths(variants, monkeypatch):
    """A PIL built without arithmetic decoding (as some libjpeg builds are), then a torchvision
    whose decoder refuses it: each path still reads it, through the other decoder."""
    real_load, real = JpegImagePlugin.JpegImageFile.load, {m: JpegImagePlugin.MARKER[m] for m in (0xFFC9, 0xFFCA, 0xFFCB)}

    def seen(handler):
        def mark(self, marker):  # the header is still read (PIL parses markers itself) ...
            handler(self, marker)
            self.arithmetic = True
        return mark

    def load(self):  # ... and libjpeg refuses the pixels, as a build without arithmetic decoding does
        if getattr(self, "arithmetic", False):
            raise OSError("Unsupported JPEG process: SOF type 0xc9")
        return real_load(self)

    with monkeypatch.context() as m:
        for marker, (name, words, handler) in real.items():
            m.setitem(JpegImagePlugin.MARKER, marker, (name, words, seen(handler)))
        m.setattr(JpegImagePlugin.JpegImageFile, "load", load)
        with pytest.raises(OSError, match="SOF type"):
            Image.open(variants["arithmetic"]).load()  # PIL itself refuses it now
        assert_agree(variants)
    with monkeypatch.context() as m:
        m.setattr(images, "_libjpeg", lambda *a, **k: None)  # torchvision's decoder refuses everything
        assert_agree(variants)


def test_the_bomb_limit_is_one_check_before_decoding(tmp_path, monkeypatch):
    """Every reader refuses an image over the pixel limit from its header alone: a 10000x8000
    PNG of zeros (a few kB) is never decompressed, whichever path opens it."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(zero_png(10_000, 8_000))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50_000_000)
    decoded = []
    monkeypatch.setattr(images, "decoded", lambda im: decoded.append(im) or im)
    encoded = Encoded(bomb, str(bomb))
    for read in (lambda: read_image(bomb), lambda: train_transform(64)(encoded),
                 lambda: train_transform(64, decode="pil")(encoded), lambda: train_transform(64, decode="cuda")(encoded),
                 lambda: images.read_image(bomb.read_bytes(), "an upload", max_pixels=1_000)):
        with pytest.raises(BadImageError, match="10000x8000 pixels, over the limit"):
            read()
    assert decoded == []


def test_pils_limit_turned_off_is_no_limit(monkeypatch):
    """PIL documents MAX_IMAGE_PIXELS = None as turning its limit off; the size check compared
    every image with None (TypeError). The caller's own limit (serve's) still applies."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    images.check_size(10_000, 8_000, "big.png")
    with pytest.raises(BadImageError, match="over the limit of 1,000 pixels"):
        images.check_size(10_000, 8_000, "big.png", max_pixels=1_000)


def test_predict_and_eval_read_arithmetic_jpegs_in_a_fresh_process(variants, tmp_path):
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/4", image_size=16, patch_size=4, hidden_size=32, depth=1, num_heads=2,
                                mlp_dim=64, num_classes=2)
    vitlab.save(model, tmp_path / "ck.safetensors")
    arithmetic = [variants[n] for n in variants if n.startswith("arithmetic") and "short" not in n]
    r = vitlab_cli("predict", str(tmp_path / "ck.safetensors"), *map(str, arithmetic))
    assert r.returncode == 0 and all(p.name in r.stdout for p in arithmetic), r.stderr
    for split, files in (("train", arithmetic), ("val", arithmetic[:2])):  # an image folder of them
        for k, f in enumerate(files):
            (tmp_path / "folder" / split / "ab"[k % 2]).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, tmp_path / "folder" / split / "ab"[k % 2] / f.name)
    r = vitlab_cli("eval", str(tmp_path / "ck.safetensors"), "--data", f"imagefolder:{tmp_path / 'folder'}")
    assert r.returncode == 0 and "(2 images)" in r.stdout, r.stderr
    r = vitlab_cli("predict", str(tmp_path / "ck.safetensors"), str(variants["arithmetic cut short"]))
    assert r.returncode != 0 and "cannot read this image" in r.stderr and "Traceback" not in r.stderr


def _png(size: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


# Each reason an image is refused for, made as a user meets it: what the server turns into a status.
WHY_REFUSED = {
    "unknown-format": lambda tmp: images.read_image(b"a text file, not an image", "x.png"),
    "no-pixels": lambda tmp: images.check_size(0, 5, "x.png"),
    "too-big": lambda tmp: images.read_image(_png(16), "x.png", max_pixels=100),
    "not-a-file": lambda tmp: images.read_image(str(tmp), "x.png"),
    "damaged": lambda tmp: images.read_image(_png(64)[:2000], "x.png"),
}


def test_every_reason_an_image_is_refused_is_tested():
    assert set(WHY_REFUSED) == set(images.REASONS)


@pytest.mark.parametrize("reason", sorted(WHY_REFUSED))
def test_a_refused_image_says_why_as_data(tmp_path, reason):
    with pytest.raises(images.BadImageError) as e:
        WHY_REFUSED[reason](tmp_path)
    assert e.value.reason == reason and "x.png" in str(e.value)
    assert "--skip-bad-images" in str(e.value) and "--skip-bad-images" not in e.value.detail
    assert pickle.loads(pickle.dumps(e.value)).reason == reason  # crosses from a data-loader worker whole
