"""benchmarks/paper_tables.py: Table 6's compute column reproduced here from vitlab's FLOP
count, and Table 5's ImageNet / ReaL cells on small official-format fixtures (an .npz written
in the official layout) and a constructed validation set with known answers."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import torch
from PIL import Image

import vitlab
from conftest import ROOT, perturb, tiny_model
from vitlab.data import open_dataset

spec = importlib.util.spec_from_file_location("paper_tables", ROOT / "benchmarks" / "paper_tables.py")
paper_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paper_tables)


def test_table6_compute_column_matches_the_paper(tmp_path, capsys):
    """vitlab's 3 x forward x images count gives the paper's exaFLOPs: within 2.5% for every ViT
    and hybrid (ViT-B/16, L/16, L/32 and R50+ViT-B/16 to the unit), but R50+ViT-L/16 at 7 epochs
    (3%: the paper's 859 is not half of its own 1,668 at 14), and 3-4% above it for the ResNets."""
    assert paper_tables.main(["--out", str(tmp_path), "compute"]) == 0
    rows = {(r["model"], r["epochs"]): r for r in paper_tables.compute_rows()}
    assert len(rows) == 18
    for (model, epochs), r in rows.items():
        tolerance = 0.05 if model.startswith("BiT") else (0.035 if model == "R50+ViT-L/16" and epochs == 7 else 0.025)
        assert abs(r["ratio"] - 1) <= tolerance, (model, epochs, r)
    assert "| ViT-B/16 | 7 | 223.5 | 224 |" in (tmp_path / "paper-tables-compute.md").read_text()
    assert "ViT-H/14" in capsys.readouterr().out


def test_table5_on_official_format_fixtures(tmp_path, capsys):
    # A tiny ViT written as the official release names its files, with 5 classes and a
    # 5-class constructed validation set in the wnid layout.
    wnids = [f"n0{i}" for i in range(5)]
    model = perturb(tiny_model(seed=1, class_names=wnids, num_classes=5))
    ckpts = tmp_path / "official"
    ckpts.mkdir()
    vitlab.save(model, ckpts / "ViT-B_16.npz", format="npz")
    rng = np.random.default_rng(0)
    val = tmp_path / "val"
    for i in range(1, 21):
        (val / wnids[i % 5]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(val / wnids[i % 5] / f"ILSVRC2012_val_{i:08d}.png")
    loaded = vitlab.load(ckpts / "ViT-B_16.npz", image_size=16).eval()
    data = open_dataset(f"imagenet-val:{val}", "test", vitlab.transform(loaded))
    with torch.no_grad():
        preds = [int(loaded(data[i][0][None]).argmax()) for i in range(len(data))]
    real = [[p] if i % 2 == 0 else ([(p + 1) % 5] if i % 4 == 1 else []) for i, p in enumerate(preds)]  # 10 hit, 5 miss, 5 out
    (tmp_path / "real.json").write_text(json.dumps(real))
    argv = ["--out", str(tmp_path / "res"), "table5", "--checkpoints", str(ckpts), "--imagenet-val", str(val),
            "--real", str(tmp_path / "real.json"), "--image-size", "16", "--batch-size", "8"]
    assert paper_tables.main(argv) == 0
    out = capsys.readouterr().out
    top1 = 100 * np.mean([p == y for p, y in zip(preds, data.labels.tolist(), strict=True)])
    assert f"| ViT-B/16 | {round(top1, 2)} | 83.97 | {round(100 * 10 / 15, 2)} | 88.35 | 20 |" in out
    assert "| ViT-L/16 | absent | 85.15 | absent | 88.4 |" in out  # no file: listed, not measured
    assert (tmp_path / "res" / "paper-tables-table5.csv").read_text().startswith("model,imagenet,paper_imagenet")
    assert paper_tables.main(["table5", "--checkpoints", str(tmp_path / "none"), "--imagenet-val", str(val)]) == 2
