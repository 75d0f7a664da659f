"""VTAB-1k (data/vtab.py, data/vtab_sources.py, data/tfrecord.py, train/vtab.py, `vitlab vtab`),
end to end on local stand-ins: digits dressed as DTD (image folders, Natural), Fashion-MNIST
as EuroSAT (a datasets save_to_disk folder, Specialized) and CIFAR-10 as dSprites location
(a tfds data_dir of TFRecord shards, Structured, its label derived as VTAB derives it)."""

from __future__ import annotations

import csv
import io
import json
import tarfile

import numpy as np
import pytest
import yaml
from PIL import Image

from conftest import SHARED_DATA
from tfrecord_writer import write_example, write_records
from vitlab.cli import main
from vitlab.data import DataError, open_dataset
from vitlab.data.datasets import digits_arrays, fashion_mnist_arrays
from vitlab.data.tfrecord import Records, masked_crc, parse_example
from vitlab.data.transforms import eval_transform
from vitlab.data.vtab import GROUPS, TASKS, group_sizes, resolve_slice, task_splits
from vitlab.train import vtab
from vitlab.train.inputs import Inputs

STANDINS = ("dtd", "eurosat", "dsprites_location")
# The dSprites stand-in is the source of both dSprites tasks: orientation runs too (its label
# is label_orientation // 2.5, as VTAB bins 40 angles into 16).
PRESENT = (*STANDINS, "dsprites_orientation")


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def cifar_test_images(cifar_dir, n):
    """The first n images of the CIFAR-10 test shards (mixed classes), decoded, with labels."""
    images, labels, pending = [], [], {}
    with tarfile.open(sorted(cifar_dir.glob("test-*.tar*"))[0]) as tar:
        for m in tar:
            key, ext = m.name.rsplit(".", 1)
            pending.setdefault(key, {})[ext] = tar.extractfile(m).read()
            if {"jpg", "cls"} <= pending[key].keys():
                item = pending.pop(key)
                images.append(np.asarray(Image.open(io.BytesIO(item["jpg"])).convert("RGB")))
                labels.append(int(item["cls"]))
                if len(images) == n:
                    return images, labels


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    cifar_dir = SHARED_DATA / "cifar10"  # (the cifar_dir fixture is per test; this one is per module)
    if not any(cifar_dir.glob("test-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {cifar_dir}")
    try:
        fashion = fashion_mnist_arrays(None, download=False)["train"]
    except DataError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("vtab")
    # digits as DTD: train / validation / test image folders, label folders, files named by index.
    d = digits_arrays()
    images = np.concatenate([d["train"][0], d["test"][0]])
    labels = np.concatenate([d["train"][1], d["test"][1]])
    for split, (a, b) in {"train": (0, 1000), "validation": (1000, 1300), "test": (1300, 1500)}.items():
        for i in range(a, b):
            folder = root / "dtd" / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(folder / f"{i:06d}.png")
    # Fashion-MNIST as EuroSAT: one "train" split of 1,500, as save_to_disk writes it.
    part = datasets.Dataset.from_dict({"image": [Image.fromarray(x) for x in fashion[0][:1500]],
                                       "label": fashion[1][:1500].tolist()})
    datasets.DatasetDict({"train": part}).save_to_disk(str(root / "eurosat"))
    # CIFAR-10 as dSprites: tfds's layout, two shards; label_x_position = 2 * class + (0 or 1),
    # so VTAB's 16 location bins (x // 2) give back the CIFAR class.
    cifar_images, cifar_labels = cifar_test_images(cifar_dir, 2000)
    version = root / "dsprites" / "2.0.0"
    version.mkdir(parents=True)
    (version / "dataset_info.json").write_text("{}")
    # Its pixels 0/1, as dSprites stores them (VTAB multiplies by 255).
    records = [write_example({"image": [png((x >= 128).astype(np.uint8))], "label_x_position": [2 * y + i % 2], "label_orientation": [i % 40]})
               for i, (x, y) in enumerate(zip(cifar_images, cifar_labels, strict=True))]
    for k in range(2):
        write_records(version / f"dsprites-train.tfrecord-{k:05d}-of-00002", records[k * 1000 : (k + 1) * 1000])
    return root, labels, fashion[1][:1500], np.array(cifar_labels)


def test_registry_is_vtab_1k():
    assert len(TASKS) == 19 and group_sizes() == {"Natural": 7, "Specialized": 4, "Structured": 8}
    classes = {t.name: t.classes for t in TASKS.values()}
    assert classes["sun397"] == 397 and classes["clevr_count"] == 8 and classes["smallnorb_azimuth"] == 18
    assert classes["kitti_distance"] == 4 and classes["dsprites_orientation"] == 16 and classes["retinopathy"] == 5
    # VTAB's own slices, on the real sizes of the sources: CIFAR-100's 50,000 train images.
    assert task_splits(TASKS["cifar100"], {"train": 50000, "test": 10000}) == {
        "train800": [("train", 0, 800)], "val200": [("train", 45000, 45200)],
        "train800val200": [("train", 0, 800), ("train", 45000, 45200)], "test": [("test", 0, 10000)]}
    assert resolve_slice("train[80%:]", {"train": 27000}) == ("train", 21600, 27000)  # EuroSAT's test
    assert resolve_slice("test[50%:]", {"test": 24300}) == ("test", 12150, 24300)  # SmallNORB's test
    with pytest.raises(DataError, match="runs past its end"):
        resolve_slice("train[90%:+200]", {"train": 1000})


def test_tfrecord_round_trip_and_checksum():
    record = write_example({"image": [b"\x89PNG..."], "objects/size": [0, 1, 1], "x": [0.5, -2.0], "neg": [-3]})
    assert parse_example(record) == {"image": [b"\x89PNG..."], "objects/size": [0, 1, 1], "x": [0.5, -2.0], "neg": [-3]}
    assert masked_crc(b"") == 0xA282EAD8  # CRC-32C of nothing is 0: only the mask remains


def test_standin_splits_are_vtabs(standins):
    root, digit_labels, fashion_labels, cifar_labels = standins
    sizes = {"train": 1000, "train-minus-dev": 800, "dev": 200}
    expected_test = {"dtd": 200, "eurosat": 300, "dsprites_location": 200}
    opened = {}

    def labels(task, split, seed=0):
        key = (task, split, seed)
        if key not in opened:
            opened[key] = open_dataset(f"vtab:{task}:{root}", split, eval_transform(16, [0.5], [0.5], 1),
                                       seed=seed).labels
        return opened[key]

    for task in STANDINS:
        for split, n in {**sizes, "test": expected_test[task]}.items():
            assert len(labels(task, split)) == n, (task, split)
        assert labels(task, "dev").tolist() == labels(task, "dev", seed=7).tolist()  # slices, not draws: no seed moves them
    # Which examples: DTD's val200 = validation[:200]; EuroSAT's = train[60%:+200], test = train[80%:];
    # dSprites' val200 = train[80%:+200], test = train[90%:], labels = x_position // 2.
    assert labels("dtd", "dev").tolist() == digit_labels[1000:1200].tolist()
    assert labels("dtd", "train").tolist() == digit_labels[:800].tolist() + digit_labels[1000:1200].tolist()
    assert labels("eurosat", "dev").tolist() == fashion_labels[900:1100].tolist()
    assert labels("eurosat", "test").tolist() == fashion_labels[1200:1500].tolist()
    assert labels("dsprites_location", "dev").tolist() == cifar_labels[1600:1800].tolist()
    assert labels("dsprites_location", "test").tolist() == cifar_labels[1800:2000].tolist()
    assert Records(sorted((root / "dsprites" / "2.0.0").glob("*tfrecord*"))).__len__() == 2000


def test_vtab_end_to_end_row(standins, digits_run, tmp_path, capsys):
    root = standins[0]
    ckpt = str(digits_run / "checkpoints" / "last.safetensors")
    out = tmp_path / "suite"
    argv = ["vtab", ckpt, "--root", str(root), "--out", str(out), "--steps", "6", "--batch-size", "32", "--quiet",
            "--seed", "3", "--image-size", "checkpoint"]  # (the default is the paper's 384)
    assert main([*argv, "--tasks", "dtd,eurosat,dsprites_orientation"]) == 0
    first = capsys.readouterr().out
    assert "dsprites_location: data present, not run yet" in first and "sun397: no data; put it in" in first
    # The last task as a job of the sweep's local launcher (a child `vitlab vtab --tasks ...`).
    assert main([*argv, "--launcher", "local"]) == 0
    capsys.readouterr()
    results = {t: json.loads((out / t / "result.json").read_text()) for t in PRESENT}
    cfg = (out / "eurosat" / "run" / "config.yaml").read_text()
    assert "seed: 3" in cfg and "steps: 6" in cfg and "hflip: false" in cfg
    assert results["dsprites_location"]["data"] == {
        "form": "tfds", "folder": str(root / "dsprites" / "2.0.0"), "tfds": "dsprites:2.0.0", "vtab_pins": "dsprites:2.*.*",
        "accepted_other": False}
    assert results["eurosat"]["data"]["form"] == "datasets" and results["dtd"]["image_size"] is None
    assert {t: r["test_images"] for t, r in results.items()} == {"dtd": 200, "eurosat": 300, "dsprites_location": 200,
                                                                 "dsprites_orientation": 200}
    row = json.loads((out / "vtab.json").read_text())
    tops = {t: r["top1"] for t, r in results.items()}
    assert {t: v for t, v in row["tasks"].items() if v is not None} == tops
    assert row["groups"]["Natural"] == {"mean": tops["dtd"], "tasks": 1, "of": 7}
    assert row["groups"]["Specialized"] == {"mean": tops["eurosat"], "tasks": 1, "of": 4}
    structured = (tops["dsprites_location"] + tops["dsprites_orientation"]) / 2
    assert row["groups"]["Structured"] == {"mean": pytest.approx(structured), "tasks": 2, "of": 8}
    assert row["mean"]["mean"] == pytest.approx(sum(tops.values()) / 4) and row["mean"]["tasks"] == 4
    assert not row["complete"] and len(row["missing"]) == 15 and "cifar100" in row["missing"]
    assert "put it in" in row["missing"]["sun397"]
    table = list(csv.DictReader((out / "vtab.csv").open()))[0]
    assert float(table["mean"]) == pytest.approx(row["mean"]["mean"], abs=1e-6) and table["cifar100"] == ""
    md = (out / "vtab.md").read_text()
    assert "absent" in md and "(4/19)" in md and f"{100 * tops['eurosat']:.1f} (1/4)" in md
    assert all(g in md for g in GROUPS)
    # Rerun: every task has its result, nothing trains again, the row is the same.
    stamp = (out / "dtd" / "result.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (out / "dtd" / "result.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "vtab.json").read_text())["mean"] == row["mean"]


def test_aggregation_of_a_complete_row():
    results = {t: {"top1": (k + 1) / 100} for k, t in enumerate(TASKS)}
    row = vtab.table_row(results, "m", {})
    assert row["complete"] and row["mean"]["mean"] == pytest.approx(sum(range(1, 20)) / 19 / 100)
    assert row["groups"]["Natural"]["mean"] == pytest.approx(sum(range(1, 8)) / 7 / 100)
    assert row["groups"]["Structured"]["mean"] == pytest.approx(sum(range(12, 20)) / 8 / 100)
    assert "Incomplete" not in vtab.markdown(row)


def test_bad_specs_are_one_line(tmp_path):
    with pytest.raises(DataError, match="vtab:TASK:ROOT"):
        open_dataset("vtab:cifar100", "train", eval_transform(16))
    with pytest.raises(DataError, match=f"{len(TASKS)} VTAB-1k tasks"):
        open_dataset(f"vtab:imagenet:{tmp_path}", "train", eval_transform(16))
    with pytest.raises(DataError, match="put it in"):
        open_dataset(f"vtab:cifar100:{tmp_path}", "train", eval_transform(16))


def test_derived_labels_follow_vtab():
    from vitlab.data.vtab import LABELS

    # CLEVR: 3..10 objects -> 0..7; the closest object's depth binned at 8, 8.5, 9, 9.5, 10.
    assert LABELS["clevr_count"]({"objects/size": [0] * 5}) == 2
    assert LABELS["clevr_distance"]({"objects/pixel_coords": [1.0, 2.0, 9.2, 3.0, 4.0, 12.0]}) == 3
    # KITTI: the closest Car/Van/Truck (types 0-2) by z; no vehicle is class 3.
    kitti = {"objects/location": [0.0, 0.0, 5.0, 0.0, 0.0, 15.0], "objects/type": [3, 1]}  # a pedestrian at 5 m
    assert LABELS["kitti_distance"](kitti) == 1
    assert LABELS["kitti_distance"]({"objects/location": [], "objects/type": []}) == 3
    # dSprites: 32 positions / 40 angles into 16 bins.
    assert LABELS["dsprites_location"]({"label_x_position": [31]}) == 15
    assert LABELS["dsprites_orientation"]({"label_orientation": [39]}) == 15
    assert LABELS["dsprites_orientation"]({"label_orientation": [5]}) == 2


def test_lr_grid_chooses_on_the_200_and_reruns_on_the_1000(tmp_path):
    """The orchestration of --lr-grid with a recording train function (no training): each
    rate on train800 scored on val200, then the best rate on train800val200, tested on test."""
    calls = []

    def train(cfg, out, inputs):
        calls.append((cfg.optim.lr, cfg.data.train_split, tuple(cfg.data.eval_splits), out.name))
        score = {0.001: 0.4, 0.01: 0.6}.get(cfg.optim.lr, 0.5)
        return {"splits": {s: {"top1": score, "count": 200} for s in cfg.data.eval_splits}}

    task = TASKS["dtd"]
    s = vtab.Settings(steps=10, grid=(0.001, 0.01), seed=2)
    (tmp_path / "ckpt.safetensors").write_bytes(b"weights")  # its content is part of the result's identity
    ckpt = str(tmp_path / "ckpt.safetensors")
    result = vtab.run_task(ckpt, task, tmp_path / "data", tmp_path / "out", s, train, Inputs(), log=lambda _: None)
    assert calls == [(0.001, "train-minus-dev", ("dev",), "lr-0.001"), (0.01, "train-minus-dev", ("dev",), "lr-0.01"),
                     (0.01, "train", ("test",), "final")]
    assert result["lr"] == 0.01 and result["top1"] == 0.6
    assert json.loads((tmp_path / "out" / "dtd" / "result.json").read_text())["lr"] == 0.01
    cfg = vtab.task_config("ckpt.safetensors", task, tmp_path / "data", s, Inputs())
    assert (cfg.train.steps, cfg.train.seed, cfg.optim.name, cfg.optim.momentum, cfg.optim.weight_decay) == \
        (10, 2, "sgd", 0.9, 0.0)
    assert cfg.data.hflip is False and cfg.data.crop == "whole"  # VTAB-1k: no augmentation, the whole image
    default = vtab.task_config("ckpt.safetensors", task, tmp_path / "data", vtab.Settings(), Inputs())
    assert (default.train.steps, default.optim.lr, default.train.batch_size, default.optim.warmup_steps) == \
        (2500, 0.01, 512, 500)  # Table 4's VTAB row, the fine-tuning recipe's batch and warm-up
    assert default.model.changes["image_size"] == (384, 384)  # the paper fine-tunes VTAB at 384
    accepted = vtab.task_config("c", TASKS["pets"], tmp_path, vtab.Settings(accept=("pets=4.0.0",)), Inputs())
    assert accepted.data.name == f"vtab:pets@4.0.0:{tmp_path}"
    with pytest.raises(DataError, match="TASK=\\[CONFIG/\\]VERSION"):
        vtab.Settings(accept=("pets",))


@pytest.mark.parametrize("given", [{}, {"lr": 0.03}, {"grid": (0.001, 0.01)}, {"image_size": None, "seed": 3},
                                   {"overrides": ("optim.weight_decay=0.1",), "accept": ("pets=4.0.0",)}])
def test_settings_copy_to_themselves_and_through_a_task_jobs_command_line(given, tmp_path):
    """A suite's settings, copied (as a second run compares them) or written into a task job's
    `vitlab vtab` command line (--launcher) and read back, are the same settings: the rate
    and the grid are passed only where set, so no job is refused for giving both."""
    from vitlab.cli import build_parser, parse
    from vitlab.cli.vtab import settings
    from vitlab.sweep.vtab import child_argv

    s = vtab.Settings(steps=10, **given)
    assert vtab.Settings(**vars(s)) == s
    argv = child_argv("ck.safetensors", tmp_path, tmp_path / "suite", s, TASKS["dtd"])
    assert settings(parse(build_parser(), list(argv))) == s
    assert vtab.task_config("ck", TASKS["dtd"], tmp_path, s, Inputs()).optim.lr == given.get("lr", vtab.VTAB_LR)


def test_tasks_train_with_the_source_runs_threads_and_workers(tmp_path):
    """As `vitlab finetune`: a vitlab run's checkpoint fine-tunes with the threads and data
    workers that run trained with (not the recipe's 0 and 0), and the plan line says so; an
    override given on the command line wins."""
    from vitlab.config import RunConfig

    run = tmp_path / "source"
    (run / "checkpoints").mkdir(parents=True)
    source = RunConfig().with_overrides({"train.threads": 1, "data.num_workers": 1})
    (run / "config.yaml").write_text(yaml.safe_dump(source.to_dict()))
    checkpoint = str(run / "checkpoints" / "last.safetensors")
    cfg = vtab.task_config(checkpoint, TASKS["dtd"], tmp_path / "data", vtab.Settings(), Inputs())
    assert (cfg.train.threads, cfg.data.num_workers) == (1, 1)
    line = vtab.threads_line(checkpoint, vtab.Settings(), Inputs())
    assert "1 compute thread and 1 data worker, as the source run trained" in line
    mine = vtab.Settings(overrides=("data.num_workers=0",))
    assert vtab.task_config(checkpoint, TASKS["dtd"], tmp_path / "data", mine, Inputs()).data.num_workers == 0
    assert "the recipe's" in vtab.threads_line("elsewhere.safetensors", vtab.Settings(), Inputs())
