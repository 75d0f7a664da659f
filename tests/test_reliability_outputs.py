"""Reliability of what vitlab writes (issue 23): user text never becomes a path out of the
folder it names (files.check_name, files.to_name, files.child); a command writes only new
files, files it wrote before (files.OutputFolder's manifest) or files named with --force;
sweeps are bounded, make a cell's folder only when the cell starts, and refuse bad specs in
one line. Every command that writes is walked against a folder or file of user data."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import assert_one_line_error, perturb, tiny_model, tree_state, unchanged
from vitlab.cli import build_parser, main
from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec
from vitlab.files import MANIFEST, OutputFolder, UnsafeNameError, check_name, child, to_name
from vitlab.sweep import cells as sweep_cells, runner

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
USER = b"the user's own file, not vitlab's\n"


def refused(capsys, argv, command, *mentions) -> str:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own refusals (a count's bound is its type)
        rc = e.code
    return assert_one_line_error(rc, capsys.readouterr().err, command, mentions=mentions)


# One rule for a name ----------------------------------------------------------------------
@pytest.mark.parametrize("text", ["..", ".", "", "  ", "a/b", "/etc/passwd", "a\\b", "x" * 121, "a\x00b", "a\nb",
                                  "-rf", "~root", "é" * 61])
def test_check_name_refuses_every_way_out(text):
    with pytest.raises(UnsafeNameError, match="not usable as a file or folder name"):
        check_name(text)


def test_check_name_takes_plain_names_and_refuses_non_text():
    for ok in ("seed-0", "ViT-B.16", "a..b", "résumé.png", "x" * 120):
        assert check_name(ok) == ok
    with pytest.raises(UnsafeNameError, match="must be text"):
        check_name(None)


@FUZZ
@given(st.text(max_size=300))
def test_any_text_becomes_a_name_that_stays_in_its_folder(tmp_path, text):
    name = to_name(text)
    assert check_name(name) == name and len(name.encode()) <= 80
    assert child(tmp_path, name).parent == tmp_path


def test_long_texts_keep_distinct_names():
    a, b = "v" * 200 + "1", "v" * 200 + "2"
    assert to_name(a) != to_name(b) and len(to_name(a)) <= 80


def test_child_refuses_a_link_that_leads_outside(tmp_path):
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path, tmp_path / "out" / "up")
    with pytest.raises(UnsafeNameError, match="leads outside"):
        child(tmp_path / "out", "up")


# A sweep never writes outside --out --------------------------------------------------------
def spec_file(tmp_path: Path, d: dict, name: str = "s.yaml") -> Path:
    """The spec beside the test's folder, so that the folder holds only what vitlab writes."""
    path = tmp_path.parent / f"{tmp_path.name}-{name}"
    path.write_text(yaml.safe_dump(d))
    return path


def test_an_axis_named_like_an_absolute_path_stays_inside_out(tmp_path, capsys):
    outside = tmp_path / "outside"
    spec = {"train": {"config": "no-such-recipe"}, "grid": {f"x.{outside}/abs": [1], "seed": ["../../up", "/abs"]}}
    out, path = tmp_path / "out", spec_file(tmp_path, spec)
    before = tree_state(tmp_path)
    assert main(["sweep", str(path), "--out", str(out)]) == 1  # each cell's train fails at once
    capsys.readouterr()
    assert not outside.exists() and not (tmp_path.parent / "up").exists()
    made = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} - set(before)
    assert made and all(m.startswith("out/") for m in made), made
    cells = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(cells) == 2 and cells[0].startswith("seed-abs_") and cells[1].startswith("seed-up_")
    assert all((out / c / "cell.json").is_file() and check_name(c) == c for c in cells)


@FUZZ
@given(st.dictionaries(st.text(min_size=1, max_size=40), st.lists(st.one_of(st.text(max_size=60), st.integers(),
                       st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=3), min_size=1, max_size=3))
def test_fuzzed_grids_give_cells_inside_out_or_one_config_error(tmp_path, grid):
    out = tmp_path / "out"
    with unchanged(tmp_path):
        try:
            spec = SweepSpec.from_dict({"train": {"config": "digits"}, "grid": grid}, "fuzz")
            cells = sweep_cells.expand(spec, out)
        except ConfigError:
            return
        assert len(cells) == sweep_cells.count(spec)
        for cell in cells:
            assert check_name(cell.key) == cell.key and child(out, cell.key).parent == out
            assert cell.steps[0].argv[-1] == str(out / cell.key / "train")


@pytest.mark.parametrize("spec, words", [
    ({"grid": [1, 2]}, "grid: give a mapping"),
    ({"grid": {"seed": "0 1"}}, "grid.seed: give a list"),
    ({"grid": {"seed": []}}, "grid.seed: give a list"),
    ({"train": ["steps", 3]}, "train: give a mapping"),
    ({"train": {"steps": float("nan")}}, "train.steps: nan is not a finite number"),
    ({"grid": {"optim.lr": [0.1, float("inf")]}}, "grid.optim.lr[1]: inf"),
    ({"grid": {1: [1]}}, "key 1 must be a non-empty text"),
    ({"after": ["fewshot"]}, "after: give a mapping"),
    ({"after": {"f": {"command": "fewshot 'x", "result": "f.json"}}}, "fix the quoting"),
    ({"after": {"f": {"command": "serve {checkpoint}", "result": "f.json"}}}, "other than serve"),
    ({"after": {"f": {"command": "fewshot {checkpoint}", "result": "../../f.json"}}}, "inside the cell folder"),
    ({"after": {"../f": {"command": "fewshot {checkpoint}", "result": "f.json"}}}, "after.../f.name"),
    ({"figures": [{"file": "../up.png", "x": "seed", "y": "top1"}]}, "figures[../up.png].file"),
    ({"figures": {"file": "a.png"}}, "figures: give a list"),
    ({"scale": "steps"}, "scale: give a list"),
    ({"name": "../../elsewhere"}, "sweep.name"),
])
def test_bad_spec_values_are_one_line(tmp_path, capsys, spec, words):
    d = {"train": {"config": "digits"}, "grid": {"seed": [0]}, **spec}
    with unchanged(tmp_path):
        refused(capsys, ["sweep", spec_file(tmp_path, d), "--out", tmp_path / "out"], "sweep", words)


@pytest.mark.parametrize("scale", ["nan", "inf", "-inf", "0", "-2"])
def test_scale_must_be_positive_and_finite(tmp_path, capsys, scale):
    d = {"train": {"config": "digits", "steps": 3}, "grid": {"seed": [0]}, "scale": ["steps"]}
    with unchanged(tmp_path):
        refused(capsys, ["sweep", spec_file(tmp_path, d), f"--scale={scale}", "--out", tmp_path / "o"], "sweep", "--scale")


def test_slurm_without_slurm_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch here
    d = {"train": {"config": "digits"}, "grid": {"seed": [0, 1]}}
    with unchanged(tmp_path):
        refused(capsys, ["sweep", spec_file(tmp_path, d), "--launcher", "slurm", "--out", tmp_path / "o"], "sweep",
                "sbatch", "--launcher local")


def test_a_million_cells_dry_run_answers_at_once_and_a_run_is_refused(tmp_path, capsys):
    d = {"train": {"config": "digits"}, "grid": {f"a{i}": list(range(10)) for i in range(6)}}
    path = spec_file(tmp_path, d)
    start = time.perf_counter()
    with unchanged(tmp_path):
        assert main(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "o")]) == 0
        assert "1,000,000 cell(s)" in capsys.readouterr().out
        refused(capsys, ["sweep", path, "--out", tmp_path / "o"], "sweep", "1,000,000 cells", "--max-cells 1000000")
    assert time.perf_counter() - start < 20


def test_max_cells_raises_the_limit(tmp_path, capsys):
    path = spec_file(tmp_path, {"train": {"config": "digits"}, "grid": {"a": list(range(6)), "b": [0, 1]}})
    refused(capsys, ["sweep", path, "--dry-run", "--max-cells", "0"], "sweep", "--max-cells", "at least 1")
    with pytest.raises(ConfigError, match="12 cells, more than the limit of 11"):
        sweep_cells.expand(SweepSpec.from_dict(yaml.safe_load(path.read_text()), "s"), tmp_path, max_cells=11)
    assert main(["sweep", str(path), "--dry-run", "--max-cells", "12", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.count("  vitlab train") == 12
    assert not (tmp_path / "o").exists()


def test_cell_folders_are_made_when_their_cell_starts(tmp_path, monkeypatch):
    spec = SweepSpec.from_dict({"train": {"config": "digits"}, "grid": {"seed": [0, 1, 2]}}, "s")
    out = tmp_path / "out"
    seen = []

    def fake_local(todo, jobs, threads, say, divergence="error"):
        seen.append(sorted(p.name for p in out.rglob("*")) if out.exists() else [])
        return [runner.run_cell(str(d), [], 0, record) for _, d, _, record in todo]

    monkeypatch.setattr(runner, "run_local", fake_local)
    runner.run(sweep_cells.expand(spec, out), spec, out, say=lambda s: None)
    assert seen == [[]]  # nothing on disk before the cells start
    assert sorted(p.name for p in out.iterdir()) == ["seed-0", "seed-1", "seed-2"]


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b""])
def test_a_damaged_cell_json_names_the_cell_and_the_fix(tmp_path, capsys, damage):
    d = {"train": {"config": "digits"}, "grid": {"seed": [0]}}
    out = tmp_path / "out"
    (out / "seed-0").mkdir(parents=True)
    (out / "seed-0" / "cell.json").write_bytes(damage)
    with unchanged(tmp_path):
        refused(capsys, ["sweep", spec_file(tmp_path, d), "--out", out], "sweep", "seed-0/cell.json is damaged",
                "delete the folder")


# Every command that writes, against a user's files ------------------------------------------
WRITERS = {  # (command, output argument) -> the test below that walks it
    ("train", "out"): "run_folder", ("finetune", "out"): "run_folder", ("sweep", "out"): "sweep",
    ("eval", "out"): "eval", ("fewshot", "out"): "single_file", ("linear-probe", "out"): "single_file",
    ("predict", "csv"): "single_file", ("predict", "attention"): "overlays", ("inspect", "out"): "inspect",
    ("export", "out"): "single_file", ("convert", "dst"): "single_file", ("push", "folder"): "push",
    ("bench", "out"): "bench", ("vtab", "out"): "vtab", ("eval", "predictions"): "single_file",
}
OUTPUT_ARGUMENTS = ("out", "csv", "attention", "folder", "dst", "predictions")


def test_the_walk_covers_every_command_that_writes():
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    found = {(name, a.dest) for name, p in sub.choices.items() for a in p._actions if a.dest in OUTPUT_ARGUMENTS}
    assert found == set(WRITERS), f"a writer without a user-data test: {found ^ set(WRITERS)}"


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)])), path)
    return path


@pytest.fixture
def image(tmp_path):
    from PIL import Image

    path = tmp_path / "x.png"
    Image.new("RGB", (16, 16), (10, 200, 30)).save(path)
    return path


@pytest.mark.parametrize("argv", [
    ["predict", "{ckpt}", "{image}", "--csv", "{mine}"],
    ["eval", "{ckpt}", "--data", "digits", "--predictions", "{mine}"],
    ["fewshot", "{ckpt}", "--data", "digits", "--out", "{mine}"],
    ["linear-probe", "{ckpt}", "--data", "digits", "--out", "{mine}"],
    ["export", "{ckpt}", "--format", "torch-export", "--out", "{mine}"],
    ["convert", "{ckpt}", "{mine}", "--to", "vitlab"],
])
def test_single_file_outputs_never_replace_a_users_file(tmp_path, capsys, ckpt, image, argv):
    mine = tmp_path / "mine.out"
    mine.write_bytes(USER)
    words = {"{ckpt}": str(ckpt), "{image}": str(image), "{mine}": str(mine)}
    with unchanged(tmp_path):
        refused(capsys, [words.get(a, a) for a in argv], argv[0], str(mine), "--force")


def test_predict_csv_with_force_replaces_the_file(tmp_path, capsys, ckpt, image):
    mine = tmp_path / "p.csv"
    mine.write_bytes(USER)
    assert main(["predict", str(ckpt), str(image), "--csv", str(mine), "--force"]) == 0
    assert mine.read_text().startswith("image,")


def test_predict_overlays_keep_a_users_png_and_replace_their_own(tmp_path, capsys, ckpt, image):
    overlays = tmp_path / "overlays"
    overlays.mkdir()
    (overlays / "0000_x_rollout.png").write_bytes(USER)
    with unchanged(tmp_path):
        refused(capsys, ["predict", ckpt, image, "--attention", overlays], "predict", "0000_x_rollout.png", "--force")
    fresh = tmp_path / "fresh"
    for _ in range(2):  # the second run replaces what the first wrote
        assert main(["predict", str(ckpt), str(image), "--attention", str(fresh)]) == 0
    assert sorted(p.name for p in fresh.iterdir()) == [MANIFEST, "0000_x_rollout.png"]


def test_inspect_keeps_a_users_report_files(tmp_path, capsys, ckpt, image):
    out = tmp_path / "report"
    out.mkdir()
    for name in ("index.html", "filters.png"):
        (out / name).write_bytes(USER)
    with unchanged(tmp_path):
        refused(capsys, ["inspect", ckpt, "--images", image, "--out", out, "--num-images", "1"], "inspect",
                "index.html", "--force")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "notes.txt").write_bytes(USER)
    for _ in range(2):
        assert main(["inspect", str(ckpt), "--images", str(image), "--out", str(fresh), "--num-images", "1"]) == 0
    capsys.readouterr()
    assert (fresh / "notes.txt").read_bytes() == USER and (fresh / "index.html").stat().st_size > 1000
    (fresh / "analysis.json").write_text("{}")  # the user edits a file inspect wrote: it is theirs now
    refused(capsys, ["inspect", ckpt, "--images", image, "--out", fresh, "--num-images", "1"], "inspect", "analysis.json")


def test_push_folder_keeps_a_users_readme(tmp_path, capsys, ckpt):
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "README.md").write_bytes(USER)
    (folder / "pytorch_model.bin").write_bytes(USER)
    with unchanged(tmp_path):
        refused(capsys, ["push", ckpt, "--repo", "me/x", "--folder", folder], "push", "README.md", "--force")
    (folder / "pytorch_model.bin").unlink()
    assert main(["push", str(ckpt), "--repo", "me/x", "--folder", str(folder), "--force"]) == 0
    assert (folder / "README.md").read_bytes() != USER
    assert main(["push", str(ckpt), "--repo", "me/x", "--folder", str(folder)]) == 0  # its own files now


def test_eval_keeps_a_users_results(tmp_path, capsys, ckpt):
    out = tmp_path / "ev"
    out.mkdir()
    (out / "eval-test.json").write_bytes(USER)
    argv = ["eval", str(ckpt), "--data", "digits", "--out", str(out)]
    with unchanged(tmp_path):
        refused(capsys, argv, "eval", "eval-test.json", "--force")
    assert main([*argv, "--force"]) == 0 and main(argv) == 0
    assert json.loads((out / "eval-test.json").read_text())["top1"] >= 0


def test_a_sweep_keeps_a_users_results_csv(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_bytes(USER)
    d = {"train": {"config": "digits"}, "grid": {"seed": [0]}}
    with unchanged(tmp_path):
        line = refused(capsys, ["sweep", spec_file(tmp_path, d), "--out", out], "sweep", "results.csv")
    assert "--force" not in line
    spec = SweepSpec.from_dict(d, "s")  # a folder holding this sweep's cells is the sweep's, from before manifests too
    runner.prepare(sweep_cells.expand(spec, out)[0], spec, out)
    assert main(["sweep", str(spec_file(tmp_path, d)), "--out", str(out), "--report"]) == 0
    assert (out / "results.csv").read_text().startswith("seed,cell,status")


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_a_run_folder_is_never_a_users_folder(tmp_path, capsys, ckpt, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_bytes(USER)
    argv = ["train", "--config", "digits"] if command == "train" else ["finetune", "--from", ckpt, "--data", "digits"]
    with unchanged(tmp_path):
        refused(capsys, [*argv, "--steps", "1", "--out", out], command, "not a vitlab run folder", "new --out")


def test_vtab_keeps_a_users_tables(tmp_path, capsys, ckpt):
    out = tmp_path / "suite"
    out.mkdir()
    (out / "vtab.md").write_bytes(USER)
    with unchanged(tmp_path):
        line = refused(capsys, ["vtab", ckpt, "--root", tmp_path / "no-data", "--out", out], "vtab", "vtab.md")
    assert "--force" in line  # a user's (or an edited) table is replaced only when asked
    assert main(["vtab", str(ckpt), "--root", str(tmp_path / "no-data"), "--out", str(out), "--quiet", "--force"]) == 0
    assert (out / "vtab.md").read_bytes() != USER
    fresh = tmp_path / "fresh"
    for _ in range(2):  # no task has data here: the row is written, then rewritten
        assert main(["vtab", str(ckpt), "--root", str(tmp_path / "no-data"), "--out", str(fresh), "--quiet"]) == 0
    assert (fresh / "vtab.json").is_file()


def test_bench_names_one_file_inside_out(tmp_path, capsys):
    with unchanged(tmp_path):
        refused(capsys, ["bench", "--model", "ViT-Ti/16", "--out", tmp_path, "--name", "../up"], "bench", "--name")


def test_output_folder_treats_a_damaged_manifest_as_no_claim(tmp_path):
    (tmp_path / "index.html").write_bytes(USER)
    (tmp_path / MANIFEST).write_text("[not a manifest")
    with pytest.raises(FileExistsError, match="index.html"):
        OutputFolder(tmp_path, "inspect").claim(["index.html"])


@FUZZ
@given(names=st.lists(st.sampled_from(["index.html", "a.png", "b.json", "c.csv"]), unique=True, max_size=4),
       mine=st.lists(st.sampled_from(["index.html", "a.png", "b.json", "c.csv", "notes.txt"]), unique=True, max_size=5),
       edit=st.booleans())
def test_fuzzed_output_folders_never_lose_a_users_file(tmp_path_factory, names, mine, edit):
    folder = tmp_path_factory.mktemp("outputs")
    first = OutputFolder(folder, "test")
    first.claim(names)
    for n in names:
        first.path(n).write_text("vitlab's")
    first.record()
    for n in mine:  # the user adds files, or overwrites one vitlab wrote
        if n not in names or edit:
            (folder / n).write_bytes(USER)
    user = {n for n in mine if n not in names or edit}
    again = OutputFolder(folder, "test")
    if user & set(names):
        with pytest.raises(FileExistsError):
            again.claim(names)
    else:
        again.claim(names)  # only vitlab's own files stand in the way: allowed
    assert all((folder / n).read_bytes() == USER for n in user)
