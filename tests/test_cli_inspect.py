"""`vitlab inspect`: the four figures, their numbers, one HTML page; any checkpoint format."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import vitlab
from conftest import tiny_model
from vitlab.cli import main

pytest.importorskip("matplotlib")


def save_model(path, fmt="vitlab", **kw):
    model = tiny_model(class_names=[str(i) for i in range(10)], depth=3, **kw)
    vitlab.save(model, path, format=fmt)
    return model


@pytest.mark.slow
def test_inspect_on_a_data_spec(tmp_path, capsys):
    save_model(tmp_path / "m.safetensors")
    out = tmp_path / "inspect"
    rc = main(
        [
            "inspect",
            str(tmp_path / "m.safetensors"),
            "--images",
            "digits",
            "--out",
            str(out),
            "--num-images",
            "20",
            "--rollout-images",
            "3",
            "--batch-size",
            "8",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "attention distance" in text
    for name in ("filters.png", "position_similarity.png", "attention_distance.png", "rollout.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    numbers = json.loads((out / "analysis.json").read_text())
    d = np.array(numbers["attention_distance"]["distance_px"])
    assert d.shape == (3, 2) and numbers["attention_distance"]["num_images"] == 20
    assert (d > 0).all() and (d < np.hypot(12, 12)).all()
    assert np.array(numbers["position_similarity"]["similarity"]).shape == (4, 4, 4, 4)
    assert len(numbers["rollout"]["maps"]) == 3
    # written as rounded, 4 decimals (3 for distances), not a float32's 0.12340000271797180
    for values, digits in ((numbers["position_similarity"]["similarity"], 4), (numbers["rollout"]["maps"], 4),
                           (numbers["attention_distance"]["distance_px"], 3)):
        flat = np.array(values, dtype=np.float64).ravel()
        assert flat.size and all(repr(v) == repr(round(v, digits)) for v in flat.tolist())
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and 'src="filters.png"' not in page


@pytest.mark.slow
def test_inspect_image_files_on_an_hf_folder(tmp_path, capsys):
    save_model(tmp_path / "hf", fmt="hf")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)).save(imgs / f"{i}.png")
    Image.fromarray(rng.integers(0, 65535, (16, 16), dtype=np.uint16)).save(imgs / "deep.png")
    (imgs / "bad.png").write_bytes(b"nope")
    out = tmp_path / "out"
    assert main(["inspect", str(tmp_path / "hf"), "--images", str(imgs), "--out", str(out)]) == 0
    assert "bad.png: not an image" in capsys.readouterr().err
    numbers = json.loads((out / "analysis.json").read_text())
    assert numbers["checkpoint"]["format"] == "hf"
    assert numbers["attention_distance"]["num_images"] == 4


@pytest.mark.slow
def test_no_position_table_is_explained(tmp_path, capsys):
    save_model(tmp_path / "m.safetensors", pos_embed="none", classifier="gap")
    out = tmp_path / "out"
    assert (
        main(["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(out), "--num-images", "4"])
        == 0
    )
    assert not (out / "position_similarity.png").exists()
    numbers = json.loads((out / "analysis.json").read_text())
    assert "no position embedding" in numbers["position_similarity"]["note"]
    assert "no position embedding" in (out / "index.html").read_text()
    assert "mean of the patch rows" in (out / "index.html").read_text()


@pytest.mark.slow
def test_objective_figures_hook(tmp_path, monkeypatch, capsys):
    from vitlab import analysis
    from vitlab.analysis import inspection

    save_model(tmp_path / "m.safetensors")
    seen = {}

    def extra(model, metadata, extras, images, out_dir):
        seen["format"] = metadata.get("format")
        seen["images"] = tuple(images.shape)
        png = out_dir / "extra.png"
        png.write_bytes((out_dir / "filters.png").read_bytes())
        return [analysis.Figure("mine", "My figure", png, "a caption", {"answer": 42})]

    monkeypatch.setattr(inspection, "objective_figures", extra)
    out = tmp_path / "out"
    assert (
        main(["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(out), "--num-images", "4"])
        == 0
    )
    assert seen == {"format": "vitlab", "images": (4, 3, 16, 16)}
    assert json.loads((out / "analysis.json").read_text())["mine"] == {"answer": 42}
    page = (out / "index.html").read_text()
    assert "My figure" in page and page.count("data:image/png;base64,") == 5


def test_bad_out(tmp_path, capsys):
    save_model(tmp_path / "m.safetensors")
    (tmp_path / "file").write_text("keep me")
    assert (
        main(["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(tmp_path / "file")]) == 2
    )
    assert "not a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "keep me"


def _inspect_random(tmp_path, seeds, out):
    args = ["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(tmp_path / out),
            "--num-images", "16", "--batch-size", "8", "--random-init", seeds]
    assert main(args) == 0
    return json.loads((tmp_path / out / "analysis.json").read_text())["attention_distance"]


def test_random_init_range_is_the_null_over_draws(tmp_path, capsys):
    """--random-init FIRST-LAST: each draw's summary kept, each summary statistic the mean of the
    draws' (the null of the most local head is the mean of each draw's most local head, not the
    most local head of averaged distances), and a draw equals inspecting that seed alone."""
    save_model(tmp_path / "m.safetensors")
    null = _inspect_random(tmp_path, "0-3", "null")
    draws = null["draws"]
    assert [d["seed"] for d in draws] == [0, 1, 2, 3]
    for seed in (0, 2):
        alone = _inspect_random(tmp_path, str(seed), f"seed{seed}")
        assert "draws" not in alone
        np.testing.assert_allclose(draws[seed]["summary"]["min_per_layer"], alone["summary"]["min_per_layer"], rtol=1e-6)
    per_draw = np.array([d["summary"]["min_per_layer"] for d in draws])  # (draws, layers)
    assert len({tuple(row) for row in per_draw.tolist()}) == 4, "each draw is its own random init"
    np.testing.assert_allclose(null["summary"]["min_per_layer"], per_draw.mean(0), rtol=1e-9)
    assert not np.allclose(null["summary"]["min_per_layer"], np.array(null["distance_px"]).min(1), atol=1e-4)


@pytest.mark.parametrize("bad", ["x", "3-1", "0-", "-2", "1-y"])
def test_a_bad_random_init_range_is_one_line(tmp_path, capsys, bad):
    save_model(tmp_path / "m.safetensors")
    rc = main(["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(tmp_path / "o"),
               "--random-init", bad])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "FIRST-LAST" in err and repr(bad) in err
    assert not (tmp_path / "o" / "analysis.json").exists()


def test_inspect_a_bit_resnet_shows_what_applies(tmp_path, capsys):
    from conftest import tiny_bit

    model = tiny_bit(stem="bit", num_classes=10)
    vitlab.save(model, tmp_path / "bit.safetensors")
    out = tmp_path / "inspect"
    assert main(["inspect", str(tmp_path / "bit.safetensors"), "--images", "digits", "--out", str(out),
                 "--num-images", "4"]) == 0
    printed = capsys.readouterr().out
    assert "BiT ResNet root convolution (7x7x3" in printed and "no attention" in printed
    assert (out / "filters.png").is_file() and (out / "index.html").is_file()
    assert not (out / "attention_distance.png").exists() and not (out / "rollout.png").exists()
    numbers = json.loads((out / "analysis.json").read_text())
    assert "no position embeddings" in numbers["position_similarity"]["note"]
    assert len(numbers["embedding_filters"]["explained_variance_ratio"]) == 28


def test_fewshot_and_eval_read_a_bit_resnet(tmp_path, capsys):
    from conftest import tiny_bit

    model = tiny_bit(num_classes=10)
    model.class_names = [str(i) for i in range(10)]
    vitlab.save(model, tmp_path / "bit.safetensors")
    assert main(["fewshot", str(tmp_path / "bit.safetensors"), "--data", "digits", "--shots", "2", "--seeds", "1",
                 "--pool", "4", "--test-limit", "50", "--no-cache", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["feature_dim"] == model.config.feature_dim and 0 <= result["shots"]["2"]["mean"] <= 1
    assert main(["eval", str(tmp_path / "bit.safetensors"), "--data", "digits", "--json", "--out", str(tmp_path / "eval")]) == 0
    assert 0 <= json.loads(capsys.readouterr().out.split("\nresults:")[0])["top1"] <= 1


def test_rollout_titles_name_the_prediction_and_heatmap_draws_a_heat_map(tmp_path, monkeypatch, capsys):
    import torch

    from vitlab.analysis import plots

    model = save_model(tmp_path / "m.safetensors", in_channels=1, mean=(0.5,), std=(0.5,))
    seen = {}
    real = plots.plot_rollout

    def spy(images, maps, path, titles=None, heatmap=False):
        seen.update(titles=titles, heatmap=heatmap, images=images)
        return real(images, maps, path, titles, heatmap=heatmap)

    monkeypatch.setattr(plots, "plot_rollout", spy)
    out = tmp_path / "inspect"
    assert main(["inspect", str(tmp_path / "m.safetensors"), "--images", "digits", "--out", str(out),
                 "--num-images", "4", "--rollout-images", "2", "--heatmap", "--device", "cpu"]) == 0
    assert seen["heatmap"] is True and len(seen["titles"]) == 2
    from vitlab.data import open_dataset

    data = open_dataset("digits", "test", vitlab.transform(model))
    x = torch.stack([data[i][0] for i in range(2)])
    with torch.no_grad():
        predicted = model(x).argmax(-1).tolist()
    truth = [int(data[i][1]) for i in range(2)]
    assert seen["titles"] == [f"{t}\npredicted: {p}" for t, p in zip(truth, predicted, strict=True)]
    assert "heat map" in (out / "index.html").read_text()
