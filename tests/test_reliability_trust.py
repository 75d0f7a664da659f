"""Reliability of what vitlab reads back and reuses (issue 42): every JSON or YAML file it
reads back goes through one validating reader (files.documents); finished work (a VTAB
task's result, a sweep cell) is reused only when it is the same work, the checkpoint's
content and the resolved settings (files.identity); vtab's tables are the user's once
edited; the paper suite's --keep removes nothing but kept evidence."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import paper_evidence as evidence  # noqa: E402  (benchmarks/paper_evidence.py: on sys.path by conftest)
import vitlab
from conftest import ROOT, assert_one_line_error, perturb, tiny_model, tree_state, unchanged, vitlab_cli
from vitlab.checkpoints import hub
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.config import ConfigError, load_recipe
from vitlab.config.sweep import SweepSpec
from vitlab.data import DataError
from vitlab.data.vtab import TASKS
from vitlab.eval.real import read_real_labels
from vitlab.files import documents
from vitlab.sweep import cells as sweep_cells, load_folder
from vitlab.train import vtab
from vitlab.train.inputs import Inputs
from vitlab.train.run_folder import RunFolder, read_summary

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "30")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
RESULTS = ROOT / "results" / "paper"


def refused(capsys, argv, command, *mentions) -> str:
    return assert_one_line_error(main([str(a) for a in argv]), capsys.readouterr().err, command, mentions=mentions)


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


# One reader for every file read back ---------------------------------------------------------
_SPEC, _SCALE = load_folder(RESULTS / "pos-embed-at")
CELL = sweep_cells.expand(_SPEC, RESULTS / "pos-embed-at", _SCALE)[0]  # a committed cell of the paper suite

# file name -> (how vitlab reads it from the folder that holds it, the error class it may raise)
READERS = {
    "result.json": (lambda d: vtab.finished(TASKS["dtd"], d.parent, {"checkpoint": None, "settings": {}}), ConfigError),
    "summary.json": (lambda d: read_summary(d / "summary.json"), ConfigError),
    "config.yaml": (lambda d: RunFolder(d).read_config(), ConfigError),
    "recipe.yaml": (lambda d: load_recipe(str(d / "recipe.yaml")), ConfigError),
    "real.json": (lambda d: read_real_labels(d / "real.json", 2, 5), DataError),
    "config.json": (lambda d: hub.read_json_object(d / "config.json", "hf-hub:o/r"), CheckpointError),
    "sweep.json": (lambda d: load_folder(d), ConfigError),
    "cell.json": (lambda d: sweep_cells.check_record(CELL, d.parent), ConfigError),
}


def folder_of(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / {"result.json": "dtd", "cell.json": CELL.key}.get(name, ".")
    folder.mkdir(exist_ok=True)
    return folder


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                           max_leaves=20)
CONTENTS = (st.binary(max_size=200) | JSON_VALUES.map(lambda v: json.dumps(v).encode())
            | st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)  # 200,000 deep: the table below
            | st.integers(1, 3000).map(lambda n: b"{\"top1\": " * n + b"1" + b"}" * n))


@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(data=CONTENTS)
def test_any_bytes_read_back_load_or_are_the_readers_own_error(tmp_path, name, data):
    """Whatever a file read back holds (bytes, any JSON, nesting thousands deep), its reader
    returns, or raises its own error class: never a RecursionError, KeyError or TypeError."""
    folder = folder_of(tmp_path, name)
    (folder / name).write_bytes(data)
    read, error = READERS[name]
    try:
        read(folder)
    except error:
        pass


@pytest.mark.parametrize("name,text,words", [
    ("real.json", "[" * 200_000 + "]" * 200_000, "nested deeper than"),
    ("recipe.yaml", "a: " + "[" * 100_000 + "]" * 100_000, "not valid YAML"),
    ("recipe.yaml", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)), "too large"),
    ("result.json", '{"task": "dtd", "top1": "abc", "test_images": 200}', "top1 is text, not a number"),
    ("result.json", '{"task": "dtd", "top1": NaN, "test_images": 200}', "not a finite number"),
    ("result.json", '{"task": "dtd", "top1": 0.5', "not JSON"),
    ("result.json", '{"task": "dtd", "top1": 1.5, "test_images": 200}', "outside [0, 1]"),
    ("summary.json", '{"splits": {"test": {"top1": [1]}}}', "top1 is a list"),
    ("summary.json", b"\xff\xfe{}", "not UTF-8"),
])
def test_hostile_files_read_back_are_one_error_naming_them(tmp_path, name, text, words):
    folder = folder_of(tmp_path, name)
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    started = time.monotonic()
    with pytest.raises(READERS[name][1], match=re.escape(words)) as e:
        READERS[name][0](folder)
    assert str(path) in str(e.value) and time.monotonic() - started < 10  # an alias bomb is cut short, not expanded


def test_a_fifo_or_an_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "summary.json")
    with pytest.raises(ConfigError, match="FIFO"):
        read_summary(tmp_path / "summary.json")
    big = tmp_path / "real.json"
    with open(big, "wb") as f:
        f.truncate(documents.MAX_DOCUMENT_BYTES + 10)  # sparse: nothing is written to the disk
    with pytest.raises(DataError, match="larger than any"):
        read_real_labels(big, 1, 5)


def test_a_damaged_dataset_dict_json_is_one_line(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    from vitlab.data.foreign import load_saved

    images = [Image.new("RGB", (8, 8), (i, 0, 0)) for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]})}).save_to_disk(
        str(tmp_path / "eurosat"))
    assert len(load_saved(tmp_path / "eurosat", "x")["train"]) == 4
    for text, words in (("not json", "not JSON"), ('{"splits": ["../../etc"]}', "split"), ('{"splits": 3}', "not a list"),
                        ("[" * 100_000, "nested deeper")):
        (tmp_path / "eurosat" / "dataset_dict.json").write_text(text)
        with pytest.raises(DataError, match=words):
            load_saved(tmp_path / "eurosat", "x")
    (tmp_path / "eurosat" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (tmp_path / "eurosat" / "train" / "data-00000-of-00001.arrow").write_bytes(b"garbage")
    with pytest.raises(DataError, match="damaged save_to_disk folder"):  # the library's own error, one line too
        load_saved(tmp_path / "eurosat", "x")


# Finished work is reused only when it is the same work ---------------------------------------
def _stub_train(calls):
    def train(cfg, out, inputs):
        calls.append(out)
        return {"splits": {s: {"top1": 0.5, "count": 200} for s in cfg.data.eval_splits}}

    return train


CHANGES = {  # what a second run changes -> the words its refusal names
    "steps": (lambda c, s: (c, vtab.Settings(**{**vars(s), "steps": 7})), "train.steps"),
    "lr": (lambda c, s: (c, vtab.Settings(**{**vars(s), "lr": 0.03})), "optim.lr"),
    "lr grid": (lambda c, s: (c, vtab.Settings(**{**vars(s), "grid": (0.01, 0.1)})), "lr_grid"),
    "seed": (lambda c, s: (c, vtab.Settings(**{**vars(s), "seed": 5})), "train.seed"),
    "image size": (lambda c, s: (c, vtab.Settings(**{**vars(s), "image_size": 24})), "model.image_size"),
    "override": (lambda c, s: (c, vtab.Settings(**{**vars(s), "overrides": ("optim.weight_decay=0.1",)})),
                 "optim.weight_decay"),
    "another checkpoint": (lambda c, s: (c.parent / "other.safetensors", s), "another checkpoint"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_vtab_result_of_other_work_is_refused_by_name(tmp_path, ckpt, change):
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)]), seed=3), tmp_path / "other.safetensors")
    s, calls = vtab.Settings(steps=5, batch_size=8), []
    task, root, out = TASKS["dtd"], tmp_path / "data", tmp_path / "suite"
    first = vtab.run_task(str(ckpt), task, root, out, s, _stub_train(calls), Inputs(), log=lambda _: None)
    assert vtab.run_task(str(ckpt), task, root, out, vtab.Settings(**{**vars(s), "device": "cpu"}),
                         _stub_train(calls), Inputs(), log=lambda _: None) == first  # the same work: reused, nothing trains
    assert len(calls) == 1
    other, s2 = CHANGES[change][0](ckpt, s)
    with unchanged(tmp_path):
        with pytest.raises(ConfigError, match=re.escape(CHANGES[change][1])) as e:
            vtab.run_task(str(other), task, root, out, s2, _stub_train(calls), Inputs(), log=lambda _: None)
    assert "result of other work" in str(e.value) and len(calls) == 1


def test_a_checkpoint_replaced_under_the_same_name_is_other_work(tmp_path, ckpt):
    s, calls = vtab.Settings(steps=5), []
    vtab.run_task(str(ckpt), TASKS["dtd"], tmp_path, tmp_path / "suite", s, _stub_train(calls), Inputs(), log=lambda _: None)
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)]), seed=9), ckpt)
    with pytest.raises(ConfigError, match="another checkpoint"):
        vtab.collect(str(ckpt), tmp_path, tmp_path / "suite", s, Inputs())
    moved = tmp_path / "moved.safetensors"  # the same bytes by another name: the same work
    (tmp_path / "suite" / "dtd" / "result.json").unlink()
    vtab.run_task(str(ckpt), TASKS["dtd"], tmp_path, tmp_path / "suite", s, _stub_train(calls), Inputs(), log=lambda _: None)
    shutil.copyfile(ckpt, moved)
    assert set(vtab.collect(str(moved), tmp_path, tmp_path / "suite", s, Inputs())) == {"dtd"}


def test_a_result_without_an_identity_is_not_trusted(tmp_path, ckpt):
    (tmp_path / "suite" / "dtd").mkdir(parents=True)
    (tmp_path / "suite" / "dtd" / "result.json").write_text(json.dumps({"task": "dtd", "top1": 0.9, "test_images": 9}))
    with pytest.raises(ConfigError, match="older vitlab"):
        vtab.collect(str(ckpt), tmp_path, tmp_path / "suite", vtab.Settings(), Inputs())


def _dtd(root: Path) -> Path:
    """The built-in digits as VTAB's DTD: train/validation/test image folders, one per label."""
    import numpy as np
    from PIL import Image

    from vitlab.data.datasets import digits_arrays

    d = digits_arrays()
    images, labels = np.concatenate([d["train"][0], d["test"][0]]), np.concatenate([d["train"][1], d["test"][1]])
    for split, (a, b) in {"train": (0, 800), "validation": (800, 1000), "test": (1000, 1040)}.items():
        for i in range(a, b):
            (root / "dtd" / split / str(labels[i])).mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(root / "dtd" / split / str(labels[i]) / f"{i:05d}.png")
    return root


def test_vitlab_vtab_never_reports_another_checkpoints_results_in_a_fresh_process(tmp_path, ckpt):
    """The issue's example: a second `vitlab vtab` into the same folder with another checkpoint
    and other settings, and its --report, are refused; the first run's files stay as they were."""
    root, out = _dtd(tmp_path / "vtab"), tmp_path / "suite"
    other = tmp_path / "other.safetensors"
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)]), seed=3), other)
    args = ["--root", str(root), "--out", str(out), "--tasks", "dtd", "--batch-size", "8", "--quiet",
            "--image-size", "16", "data.num_workers=0"]
    r = vitlab_cli("vtab", str(ckpt), *args, "--steps", "2", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    before = tree_state(tmp_path)
    for extra in (["--steps", "3"], ["--steps", "2", "--report"]):
        r = vitlab_cli("vtab", str(other), *args, *extra)
        assert_one_line_error(r.returncode, r.stderr, "vtab", mentions=("result of other work", "another checkpoint"))
    assert tree_state(tmp_path) == before
    r = vitlab_cli("vtab", str(ckpt), *args, "--steps", "2", "--report")  # the same work: its row
    assert r.returncode == 0 and "row written to" in r.stdout, r.stderr[-2000:]


# A sweep cell finished with other settings is never tabulated -------------------------------
def _finished_sweep(tmp_path: Path, seeds=(0, 1)) -> tuple[Path, Path]:
    d = {"name": "s", "train": {"config": "digits", "steps": 4}, "grid": {"seed": list(seeds)},
         "report": {"metrics": ["test.top1"]}}
    spec = tmp_path.parent / f"{tmp_path.name}-s.yaml"
    spec.write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    for cell in sweep_cells.expand(SweepSpec.from_dict(d, "s"), out):
        (out / cell.key / "train").mkdir(parents=True)
        (out / cell.key / "cell.json").write_text(json.dumps(sweep_cells.identity(cell)))
        (out / cell.key / "train" / "summary.json").write_text(json.dumps(
            {"steps": 4, "splits": {"test": {"top1": 0.25, "count": 100}}}))
    return spec, out


@pytest.mark.parametrize("edit,words", [
    (lambda r: r["settings"].update(steps=40), "settings"),
    (lambda r: r["settings"].update({"model.checkpoint": "x.safetensors"}), "settings"),
    (lambda r: r.update(after=[["fewshot", "fewshot {checkpoint}", "f.json"]]), "after"),
    (lambda r: r["labels"].update(seed=9), "labels"),
    (lambda r: r.update(checkpoint={"model.checkpoint": "0" * 64}), "checkpoint"),
])
def test_a_sweep_report_refuses_a_cell_finished_with_other_settings(tmp_path, capsys, edit, words):
    spec, out = _finished_sweep(tmp_path)
    assert main(["sweep", str(spec), "--out", str(out), "--report"]) == 0  # the cells' own work: tabulated
    assert "2 of 2 cells finished" in capsys.readouterr().out
    record = out / "seed-1" / "cell.json"
    d = json.loads(record.read_text())
    edit(d)
    record.write_text(json.dumps(d))
    with unchanged(tmp_path):
        refused(capsys, ["sweep", spec, "--out", out, "--report"], "sweep", "seed-1", f"other {words}", "another --out")


def test_a_sweep_cell_whose_checkpoint_was_replaced_is_other_work(tmp_path, capsys, ckpt):
    spec, out = _finished_sweep(tmp_path, seeds=(0,))
    d = yaml.safe_load(spec.read_text())
    d["train"]["model.checkpoint"] = str(ckpt)
    spec.write_text(yaml.safe_dump(d))
    cell = sweep_cells.expand(SweepSpec.from_dict(d, "s"), out)[0]
    assert sweep_cells.identity(cell)["checkpoint"]["model.checkpoint"]  # the file's sha256 is part of the record
    (out / cell.key / "cell.json").write_text(json.dumps(sweep_cells.identity(cell)))
    assert main(["sweep", str(spec), "--out", str(out), "--report"]) == 0
    capsys.readouterr()
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)]), seed=4), ckpt)
    refused(capsys, ["sweep", spec, "--out", out, "--report"], "sweep", "other checkpoint")


def test_results_without_a_cell_json_and_damaged_results_are_refused(tmp_path, capsys):
    spec, out = _finished_sweep(tmp_path)
    (out / "seed-0" / "train" / "summary.json").write_text('{"splits": {"test": {"top1": "high"}}}')
    refused(capsys, ["sweep", spec, "--out", out, "--report"], "sweep", "summary.json", "top1 is text")
    (out / "seed-0" / "train" / "summary.json").write_text('{"splits": {"test": {"top1": 0.5}}}')
    (out / "seed-1" / "cell.json").unlink()
    refused(capsys, ["sweep", spec, "--out", out, "--report"], "sweep", "no cell.json")


def test_a_sweep_report_in_a_fresh_process_refuses_a_changed_cell(tmp_path):
    spec, out = _finished_sweep(tmp_path)
    d = yaml.safe_load(spec.read_text())
    d["train"]["steps"] = 8  # the spec changed after its cells finished
    spec.write_text(yaml.safe_dump(d))
    r = vitlab_cli("sweep", str(spec), "--out", str(out), "--report")
    assert_one_line_error(r.returncode, r.stderr, "sweep", mentions=("run with other settings",))
    assert not (out / "results.csv").exists()


# vtab's tables belong to the user once edited ---------------------------------------------
def test_vtab_report_keeps_an_edited_table_unless_forced(tmp_path, capsys, ckpt):
    out, root = tmp_path / "suite", tmp_path / "no-data"
    s, argv = vtab.Settings(steps=5), ["vtab", str(ckpt), "--root", str(root), "--out", str(out), "--steps", "5"]
    vtab.run_task(str(ckpt), TASKS["dtd"], root, out, s, _stub_train([]), Inputs(), log=lambda _: None)
    assert main([*argv, "--report"]) == 0  # vtab's own tables, rewritten from the task's result
    assert main([*argv, "--report"]) == 0
    capsys.readouterr()
    for table in vtab.TABLES:
        edited = (out / table).read_bytes() + b"\nmy note\n"
        (out / table).write_bytes(edited)
        with unchanged(tmp_path):
            refused(capsys, [*argv, "--report"], "vtab", table, "--force")
        assert main([*argv, "--report", "--force"]) == 0 and (out / table).read_bytes() != edited
    capsys.readouterr()


def test_task_jobs_writing_the_tables_together_each_find_the_others(tmp_path, ckpt):
    out, root, s = tmp_path / "suite", tmp_path / "no-data", vtab.Settings(steps=5)
    vtab.run_task(str(ckpt), TASKS["dtd"], root, out, s, _stub_train([]), Inputs(), log=lambda _: None)
    errors = []

    def writer():
        try:
            for _ in range(15):
                vtab.report(str(ckpt), root, out, s, Inputs())
        except Exception as e:  # noqa: BLE001 - the test reports any failure of a writer
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# The paper suite's --keep removes nothing but kept evidence -----------------------------------
def _paper_suite():
    spec = importlib.util.spec_from_file_location("paper_suite", ROOT / "benchmarks" / "paper_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _live_sweep(folder: Path) -> Path:
    """A copy of committed evidence dressed as a live sweep: checkpoints, logs and a notes file."""
    shutil.copytree(RESULTS / "pos-embed-at", folder)
    cell = next(p for p in folder.iterdir() if (p / "cell.json").exists())
    (cell / "train" / "checkpoints").mkdir()
    (cell / "train" / "checkpoints" / "last.safetensors").write_bytes(b"\0" * 100)
    (cell / "train.log").write_text("a log")
    (folder / "notes.md").write_text("the user's notes")
    return folder


@pytest.mark.parametrize("where", ["same folder", "inside the sweep", "around the sweep", "a live sweep",
                                   "a user's folder", "a damaged sweep.json"])
def test_keep_refuses_every_folder_that_is_not_kept_evidence(tmp_path, where):
    suite = _paper_suite()
    src = _live_sweep(tmp_path / "runs" / "pos-embed-at")
    dest = {"same folder": src, "inside the sweep": src / "kept", "around the sweep": tmp_path / "runs",
            "a live sweep": _live_sweep(tmp_path / "other" / "pos-embed-at"),
            "a user's folder": tmp_path / "mine" / "pos-embed-at",
            "a damaged sweep.json": tmp_path / "damaged" / "pos-embed-at"}[where]
    if where == "a user's folder":
        dest.mkdir(parents=True)
        (dest / "thesis.tex").write_text("chapter 1")
    if where == "a damaged sweep.json":
        shutil.copytree(RESULTS / "pos-embed-at", dest)
        (dest / "sweep.json").write_text("{")
    with unchanged(tmp_path):
        with pytest.raises(SystemExit, match="paper_suite: "):
            suite.replace_evidence(src, dest)
        with pytest.raises(SystemExit, match="paper_suite: "):
            suite.main(["--only", "pos-embed-at", "--out", str(src.parent), "--keep",
                        str(dest.parent if where != "around the sweep" else dest)])


def test_keep_replaces_kept_evidence_even_of_an_older_grid(tmp_path):
    suite = _paper_suite()
    src = _live_sweep(tmp_path / "runs" / "pos-embed-at")
    dest = tmp_path / "kept" / "pos-embed-at"
    shutil.copytree(RESULTS / "pos-embed", dest)  # another grid's evidence: every file of it is evidence
    suite.replace_evidence(src, dest)
    assert not (dest / "notes.md").exists() and not list(dest.rglob("*.safetensors"))
    assert evidence.load(dest)[1] == evidence.load(RESULTS / "pos-embed-at")[1]
    assert (src / "notes.md").exists() and list(src.rglob("last.safetensors"))  # the sweep itself untouched
    suite.replace_evidence(src, dest)  # and again: kept evidence replaced by kept evidence
    assert sorted(p.name for p in dest.parent.iterdir()) == ["pos-embed-at"]  # no staging folders left
