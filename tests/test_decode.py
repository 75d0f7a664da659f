"""Decoding only what the crop needs (vitlab.data.decode), on real photographs: CIFAR-10 test
images upsampled to ImageNet's typical 500x375 and re-encoded as JPEG at quality 90."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from conftest import cifar_test_images
from vitlab.config.run import CROP_SCALE
from vitlab.data import BadImageError, decode as D, open_dataset
from vitlab.data.datasets import Encoded, FileDataset
from vitlab.data.transforms import eval_transform, fast_eval_transform, train_transform
from vitlab.pixels import Normalise


@pytest.fixture
def photos(cifar_dir: Path, tmp_path: Path) -> list[Path]:
    """Eight real images at 500x375 (two portrait, 375x500), JPEG quality 90, in class folders."""
    out = []
    for k, (name, data, label) in enumerate(cifar_test_images(cifar_dir, 8)):
        size = (375, 500) if k % 4 == 3 else (500, 375)
        big = Image.open(io.BytesIO(data)).convert("RGB").resize(size, Image.BICUBIC)
        path = tmp_path / "photos" / f"class{label % 2}" / f"{Path(name).stem}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        big.save(path, quality=90)
        out.append(path)
    return out


def test_dct_scale_leaves_the_crop_at_least_the_output():
    assert D.dct_scale((375, 500), (224, 224)) == 1  # a 500x375 photo at 224 is decoded in full
    assert D.dct_scale((375, 500), (32, 32)) == 8
    assert D.dct_scale((900, 1200), (224, 224)) == 4
    assert D.dct_scale((447, 900), (224, 224)) == 1  # 447 // 2 = 223 < 224: not halved
    assert D.dct_scale((100, 100), (224, 224)) == 1  # enlarged: decoded in full


def test_crop_distribution_is_torchvisions(photos, monkeypatch):
    """The fast transform draws its box on the full image's size, from the same generator in the
    same order as torchvision's RandomResizedCrop + RandomHorizontalFlip: for one seed the same
    box and flip, so the histograms of scale and aspect ratio are the same -- also at 32 px
    output, where the image is decoded at 1/8 of its size."""
    drawn = []
    real_draw = D.draw_box

    def spy(height, width, *args, **kwargs):
        box = real_draw(height, width, *args, **kwargs)
        drawn.append((height, width, box))
        return box

    monkeypatch.setattr(D, "draw_box", spy)
    for size in (224, 32):
        fast = train_transform(size, uint8=True)
        drawn.clear()
        reference = []
        for seed in range(300):
            photo = photos[seed % len(photos)]
            shown = Image.open(photo).size[::-1]
            torch.manual_seed(seed)
            fast(Encoded(photo, str(photo)))
            torch.manual_seed(seed)
            i, j, h, w = T.RandomResizedCrop.get_params(torch.empty(1, *shown), list(CROP_SCALE), [3 / 4, 4 / 3])
            reference.append((shown, (i, j, h, w), bool(torch.rand(1) < 0.5)))
        assert [(d[0], d[1]) for d in drawn] == [r[0] for r in reference]  # drawn on the full size
        assert [tuple(d[2][:4]) for d in drawn] == [r[1] for r in reference]
        assert [d[2].flip for d in drawn] == [r[2] for r in reference]
        area = np.array([d[2].height * d[2].width / (d[0] * d[1]) for d in drawn])
        ratio = np.log([d[2].width / d[2].height for d in drawn])
        ref_area = np.array([r[1][2] * r[1][3] / (r[0][0] * r[0][1]) for r in reference])
        ref_ratio = np.log([r[1][3] / r[1][2] for r in reference])
        bins = np.linspace(CROP_SCALE[0], 1.0, 9)  # (the default: vision_transformer's 5% to 100%)
        assert np.array_equal(np.histogram(area, bins)[0], np.histogram(ref_area, bins)[0])
        rbins = np.linspace(np.log(3 / 4), np.log(4 / 3), 9)
        assert np.array_equal(np.histogram(ratio, rbins)[0], np.histogram(ref_ratio, rbins)[0])
        assert area.min() >= CROP_SCALE[0] * 0.9 and area.max() <= 1.0 and np.histogram(area, bins)[0].min() > 0


def test_fast_train_pixels_match_the_float_transform(photos):
    """Same seed, same crop: at 224 (decoded in full) the uint8 path differs from PIL's resize by
    well under a grey level; at 32 px (decoded at 1/8) by a few."""
    for size, limit in ((224, 0.25), (32, 6.0)):
        fast = train_transform(size, uint8=True)
        slow = train_transform(size, decode="pil")
        normalise = Normalise((0.5,) * 3, (0.5,) * 3)
        diffs = []
        for seed, photo in enumerate(photos):
            torch.manual_seed(seed)
            x = fast(Encoded(photo, str(photo)))
            torch.manual_seed(seed)
            y = slow(Image.open(photo).convert("RGB"))
            assert x.dtype == torch.uint8 and x.shape == (3, size, size)
            diffs.append(((normalise(x) - y).abs().mean() * 127.5).item())
        assert np.mean(diffs) < limit, diffs


def test_normalise_matches_the_float_transform(photos):
    image = Image.open(photos[0]).convert("RGB")
    x = D.to_uint8(image)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    reference = T.Normalize(mean, std)(T.functional.to_tensor(image))
    out = Normalise(mean, std)(x)
    assert out.dtype == torch.float32 and torch.equal(out, reference)  # the same bits as torchvision's
    assert torch.equal(Normalise(mean, std)(x[None].repeat(2, 1, 1, 1))[1], reference)
    assert torch.equal(Normalise(mean, std)(x[None].contiguous(memory_format=torch.channels_last))[0], reference)


def test_fast_eval_is_identical_where_nothing_is_reduced_and_close_where_it_is(photos):
    """At 224 a 500x375 photo needs its full decode: the same pixels as eval_transform. At 32
    px it is decoded at 1/8; the pixels move a little (which is why it is opt-in)."""
    for photo in photos[:4]:
        full = Image.open(photo).convert("RGB")
        for crop in ({"crop_fraction": 1.0}, {"crop_fraction": 0.875, "crop_mode": "center"}):
            same = fast_eval_transform(224, **crop)(Encoded(photo, str(photo)))
            assert torch.equal(same, eval_transform(224, **crop)(full))
        near = fast_eval_transform(32)(Encoded(photo, str(photo)))
        diff = (near - eval_transform(32)(full)).abs().mean().item() * 127.5
        assert 0 < diff < 6.0


def test_gpu_path_on_the_cpu_equals_the_cpu_path(photos):
    """decode_planned runs on the CPU the operations it runs on CUDA (decode_jpeg, crop, resize,
    flip, normalise): at 224 it gives the fast CPU path's pixels exactly, for the same seeds."""
    fast, plan = train_transform(224, uint8=True), train_transform(224, decode="cuda")
    planned, expected = [], []
    for seed, photo in enumerate(photos):
        torch.manual_seed(seed)
        expected.append(fast(Encoded(photo, str(photo))))
        torch.manual_seed(seed)
        planned.append(plan(Encoded(photo, str(photo))))
    assert all(p.encoded for p in planned)
    batch = D.decode_planned(planned, (224, 224), "cpu", ((0.5,) * 3, (0.5,) * 3))
    assert torch.allclose(batch, Normalise((0.5,) * 3, (0.5,) * 3)(torch.stack(expected)), rtol=0, atol=0)
    # a PNG (or an image held in memory) is decoded on the CPU and still cropped on the device
    png = photos[0].with_suffix(".png")
    Image.open(photos[0]).save(png)
    torch.manual_seed(0)
    item = plan(Encoded(png, str(png)))
    assert not item.encoded and item.data.shape == (3, 375, 500)
    assert D.decode_planned([item], (224, 224), "cpu").shape == (1, 3, 224, 224)


def test_datasets_hand_over_encoded_images_and_bad_ones_are_named(photos, cifar_dir, tmp_path):
    root = photos[0].parent.parent
    data = open_dataset(f"imagefolder:{root}", "train", train_transform(224, uint8=True), train=True)
    x, label = data[0]
    assert x.dtype == torch.uint8 and x.shape == (3, 224, 224) and label in (0, 1)
    broken = root / "class0" / "broken.jpg"
    broken.write_bytes(photos[0].read_bytes()[:300])
    files = FileDataset([photos[0], broken], np.array([0, 1]), ["a", "b"], train_transform(224, uint8=True))
    assert files[0][0].dtype == torch.uint8
    with pytest.raises(BadImageError, match="broken.jpg: cannot read this image"):
        files[1]
    files.skip_bad_images = True
    assert str(files[1]).endswith("broken.jpg")
    stream = open_dataset(f"wds:{cifar_dir}", "train", train_transform(32, uint8=True), train=True)
    image, _ = next(iter(stream))  # a shard's JPEG bytes, handed over undecoded
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    stream = open_dataset(f"wds:{cifar_dir}", "test", fast_eval_transform(32))
    image, _ = next(iter(stream))
    assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="decode='gpu': use one of pil, fast, cuda"):
        train_transform(224, decode="gpu")


def test_jpeg_header_reads_what_pil_reads_and_rotated_photos_stay_upright(photos, tmp_path):
    for photo in photos:
        im = Image.open(photo)
        assert D.jpeg_header(photo.read_bytes()) == (im.height, im.width, 3, False)
    grey = tmp_path / "grey.jpg"
    Image.open(photos[0]).convert("L").save(grey, quality=90)
    assert D.jpeg_header(grey.read_bytes()) == (375, 500, 1, False)
    png = tmp_path / "a.png"
    Image.open(photos[0]).save(png)
    assert D.jpeg_header(png.read_bytes()) is None and D.jpeg_header(photos[0].read_bytes()[:20]) is None
    # A photo stored sideways with EXIF orientation 6 (turn 90 degrees): the box is drawn on the
    # upright 375x500 image, as the PIL path draws it, and the pixels agree.
    turned = tmp_path / "turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(photos[0]).save(turned, quality=90, exif=exif)
    assert D.jpeg_header(turned.read_bytes())[3] is True
    fast, slow = train_transform(224, uint8=True), train_transform(224, decode="pil")
    torch.manual_seed(1)
    x = fast(Encoded(turned, str(turned)))
    torch.manual_seed(1)
    from vitlab.data import read_image

    y = slow(read_image(turned))
    assert read_image(turned).size == (375, 500)
    assert (Normalise((0.5,) * 3, (0.5,) * 3)(x) - y).abs().mean() * 127.5 < 0.5


def test_a_run_written_before_the_fast_decoder_resumes_with_the_full_decode(tmp_path):
    """A config.yaml holds every setting; one without data.decode was written by code that decoded
    in full, and its resumed run must keep decoding so (bit-exact resume across the upgrade)."""
    import yaml

    from vitlab.config import RunConfig
    from vitlab.train.recipe import resume_config

    written = RunConfig.from_dict({"model": {"name": "ViT-C/4"}, "data": {"name": "digits"},
                                   "train": {"steps": 5}}).to_dict()
    assert written["data"]["decode"] == "fast"  # today's default, written out in full
    for name, drop in (("old", True), ("new", False)):
        d = yaml.safe_load(yaml.safe_dump(written))
        if drop:
            del d["data"]["decode"]
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(d))
    assert resume_config(tmp_path / "old").data.decode == "pil"
    assert resume_config(tmp_path / "new").data.decode == "fast"


def test_the_box_is_torchvisions_draw_for_draw_also_at_the_fallback():
    """draw_box repeats RandomResizedCrop.get_params' arithmetic without its setup: the same
    box, flip and generator state after, for ordinary images and for the shapes where every
    attempt fails and torchvision falls back to a central crop."""
    cases = [((375, 500), (0.08, 1.0), (3 / 4, 4 / 3)), ((8, 8), (0.6, 1.0), (0.8, 1.25)),
             ((100, 30), (0.9, 1.0), (3 / 4, 4 / 3)), ((7, 300), (0.08, 1.0), (3 / 4, 4 / 3))]
    for seed in range(200):
        for (h, w), scale, ratio in cases:
            torch.manual_seed(seed)
            box, after = D.draw_box(h, w, scale, ratio, True), torch.rand(1)
            torch.manual_seed(seed)
            reference = T.RandomResizedCrop.get_params(torch.empty(1, h, w), list(scale), list(ratio))
            flip = bool(torch.rand(1) < 0.5)
            assert (tuple(box[:4]), box.flip) == (reference, flip) and torch.equal(after, torch.rand(1))


def bilinear_no_filter(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """TF's tf.image.resize(method="bilinear", antialias=False) written from its definition:
    output pixel i samples the input at (i + 0.5) * in / out - 0.5 (half-pixel centres), from
    the two nearest input pixels on each axis, edges clamped; no filter, whatever the factor.
    (H, W, C) uint8 in, float out."""
    out = pixels.astype(np.float64)
    for axis, new in enumerate(size):
        old = out.shape[axis]
        src = np.clip((np.arange(new) + 0.5) * old / new - 0.5, 0, old - 1)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, old - 1)
        w = (src - lo).reshape([-1 if a == axis else 1 for a in range(out.ndim)])
        out = np.take(out, lo, axis=axis) * (1 - w) + np.take(out, hi, axis=axis) * w
    return out


def test_antialias_off_samples_as_tfs_resize_on_every_path():
    """data.antialias=False: the evaluation transform and the three training decodes (whole
    image, no flip) give TF's unfiltered bilinear resize of a photo (scikit-learn's 640x427
    JPEG), within the rounding of uint8 pixels; antialias on (the default) filters, and
    differs by grey levels when shrinking."""
    import sklearn.datasets

    photo = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"
    pixels = np.asarray(Image.open(photo).convert("RGB"))
    want = bilinear_no_filter(pixels, (96, 128)) / 127.5 - 1  # normalised with mean = std = 0.5
    want = torch.from_numpy(want).permute(2, 0, 1).float()
    off = eval_transform((96, 128), antialias=False)
    assert "not antialiased" in repr(off)
    got = off(Image.open(photo))
    assert (got - want).abs().max() <= 1.01 / 127.5  # a grey level: the uint8 kernel rounds
    on = eval_transform((96, 128))(Image.open(photo))
    assert (on - want).abs().mean() * 127.5 > 2  # the filter's doing: 2+ grey levels on average
    whole = dict(crop="whole", hflip=False, antialias=False)
    for decode in ("pil", "fast"):
        x = train_transform((96, 128), decode=decode, **whole)(Encoded(photo, str(photo)))
        assert (x - got).abs().max() <= 1.01 / 127.5, decode
    planned = train_transform((96, 128), decode="cuda", **whole)(Encoded(photo, str(photo)))
    batch = D.decode_planned([planned], (96, 128), "cpu", ((0.5,) * 3, (0.5,) * 3))[0]
    assert (batch - got).abs().max() <= 1.01 / 127.5
    # growing an image is the same either way: the filter only widens when shrinking
    small = Image.open(photo).resize((50, 40))
    assert torch.equal(eval_transform(64, antialias=False)(small), eval_transform(64, backend="tensor")(small))


def test_antialias_is_a_data_setting_and_a_flag():
    from vitlab.cli import build_parser
    from vitlab.cli.common import given
    from vitlab.config.run import DataConfig

    assert DataConfig().antialias is True
    for command in ("train", "finetune"):
        args = build_parser().parse_args([command, *([] if command == "train" else ["ckpt.safetensors"]), "--no-antialias"])
        assert ("--antialias", "data.antialias", False) in given(args).settings
