"""`vitlab sweep`: the grid, the cells' commands, results.csv, the figures, resuming, and the
submitit launcher (through submitit's local executor). The runs are tiny ViTs on digits."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from vitlab.cli import main
from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec, load_sweep, shipped_sweeps
from vitlab.sweep import expand, run_sweep
from vitlab.sweep.cells import Cell, Step, flag_argv
from vitlab.sweep.results import cell_row, flatten, pareto_front

TINY = {
    "train": {"config": "digits", "steps": 4, "batch-size": 32, "ckpt-every": 2,
              "model.depth": 1, "model.hidden_size": 32, "train.threads": 1},
    "grid": {"seed": [0, 1]},
    "after": {"fewshot": {"command": "fewshot {checkpoint} --data digits --shots 2 --seeds 1 --pool 4 "
                                     "--test-limit 60 --no-cache --out {cell}/fewshot.json",
                          "result": "fewshot.json"}},
    "scale": ["steps"],
    "figures": [
        {"file": "top1.png", "kind": "bar", "x": "seed", "y": "test.top1"},
        {"file": "fewshot.png", "kind": "line", "x": "seed", "y": "fewshot.shots.2.mean"},
        {"file": "pareto.png", "kind": "pareto", "x": "steps", "y": "test.top1", "series": "seed"},
    ],
}


def spec_file(tmp_path: Path, d: dict = TINY) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


# The grid and its commands (no training) ----------------------------------------------------
def test_cells_are_the_product_of_the_axes_with_bundles_and_scale(tmp_path):
    spec = SweepSpec.from_dict({
        "train": {"config": "digits", "epochs": 2, "optim.lr": 0.001},
        "grid": {"model": ["ViT-C/4", "BiT-R26-C"],
                 "size": {"small": {"model.depth": 2, "model.layers": [1, 1]}, "big": {"epochs": 3}},
                 "seed": [0, 1, 2]},
        "scale": ["epochs"],
    }, "t")
    cells = expand(spec, tmp_path, scale=2)
    assert len(cells) == 2 * 2 * 3
    first = cells[0]
    assert first.key == "model-ViT-C-4_size-small_seed-0"
    assert first.labels == {"model": "ViT-C/4", "size": "small", "seed": 0}
    argv = first.steps[0].argv
    assert argv[:9] == ("train", "--config", "digits", "--epochs", "4", "--model", "ViT-C/4", "--seed", "0")
    assert "model.layers=[1, 1]" in argv and "optim.lr=0.001" in argv
    big = next(c for c in cells if c.labels["size"] == "big")
    assert big.settings["epochs"] == 6  # the bundle's 3, scaled by 2
    assert len({c.key for c in cells}) == len(cells)


def test_an_after_step_gets_the_cells_seed(tmp_path):
    spec = SweepSpec.from_dict({
        "train": {"config": "digits"}, "grid": {"seed": [3, 4]},
        "after": {"init": {"command": "inspect {checkpoint} --random-init {seed} --images digits --out {cell}/init",
                           "result": "init/analysis.json"}},
    }, "t")
    argvs = [c.steps[1].argv for c in expand(spec, tmp_path)]
    assert [a[a.index("--random-init") + 1] for a in argvs] == ["3", "4"]
    unseeded = SweepSpec.from_dict({**spec.to_dict(), "grid": {"model.depth": [1, 2]}}, "t")
    with pytest.raises(ConfigError, match="uses {seed}, but the spec sets no seed"):
        expand(unseeded, tmp_path)


def test_tags_label_a_cell_and_train_nothing(tmp_path):
    """Fig. 5's series: a bundle's `tag.family` names the family in results.csv and the
    figures; it never reaches the trainer's command line, nor the folder name."""
    spec = SweepSpec.from_dict({
        "train": {"config": "digits"},
        "grid": {"model": {"ViT-small": {"model.depth": 2, "tag.family": "ViT"},
                           "BiT-small": {"model": "BiT-R26-C", "tag.family": "BiT"}}},
    }, "t")
    vit, bit = expand(spec, tmp_path)
    assert vit.key == "model-ViT-small" and bit.key == "model-BiT-small"
    assert vit.labels == {"model": "ViT-small", "family": "ViT"} and bit.labels["family"] == "BiT"
    assert "family" not in " ".join(vit.steps[0].argv) and "tag.family" not in vit.settings
    assert "--model" in bit.steps[0].argv and "model.depth=2" in vit.steps[0].argv


def test_flags_and_overrides_as_a_command_line():
    argv = flag_argv({"model": "ViT-C/4", "bf16": True, "compile": False, "train-fraction": 0.1,
                      "model.layers": [2, 2], "data.name": "cifar10:../shared/data/cifar10"})
    assert argv == ["--model", "ViT-C/4", "--bf16", "--train-fraction", "0.1",
                    "model.layers=[2, 2]", "data.name=cifar10:../shared/data/cifar10"]


@pytest.mark.parametrize("bad, match", [
    ({"grid": {"seed": []}}, "grid.seed"),
    ({"grid": {"size": {"a": 1}}}, "bundle"),
    ({"train": {"out": "x"}}, "train.out"),
    ({"scale": ["epochs"]}, "scale: epochs"),
    ({"figures": [{"file": "a.png", "kind": "pie", "x": "a", "y": "b"}]}, "kind"),
    ({"figures": [{"file": "a.jpg", "x": "a", "y": "b"}]}, ".png"),
    ({"after": {"x": {"command": "info"}}}, "result"),
    ({"grids": {}}, "unknown key"),
    ({"grid": {"model": {"ViT-64x4": {"model.depth": 4}, "BiT-14w8": {"model": "BiT-R26-C"}}},
      "report": {"compare": [{"axis": "model", "a": "ViT-C/4", "b": "BiT-14w8"}]}}, "'ViT-C/4' is not a value of grid.model"),
])
def test_bad_specs_name_the_problem(bad, match):
    with pytest.raises(ConfigError, match=match):
        SweepSpec.from_dict(bad, "bad")


def test_shipped_specs_load_and_expand(tmp_path):
    names = shipped_sweeps()
    assert names, "configs/paper holds the paper's experiments"
    for name in names:
        spec, path = load_sweep(name)
        cells = expand(spec, tmp_path)
        assert cells and all(c.steps[0].argv[0] == "train" for c in cells)
        assert spec.figures, f"{name} draws no figure"
        assert path.read_text().startswith("#"), f"{name} is headed by the command that runs it"


def test_a_grid_label_is_never_overwritten_by_a_result_of_its_name(tmp_path):
    """A `model` axis labels its cells ViT-64x4, BiT-14w8, ...; train's summary.json also has a
    `model` (the model's description). The arms and compared pairs are found by the label,
    so it stays, and the summary's value goes under train.model."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "summary.json").write_text(json.dumps(
        {"model": "ViT-C/4 (custom: width 64)", "steps": 4, "splits": {"test": {"top1": 0.5}}}))
    (tmp_path / "fewshot.json").write_text(json.dumps({"seed": 7, "shots": {"5": {"mean": 0.3}}}))
    cell = Cell("model-ViT-64x4_seed-0", {"model": "ViT-64x4", "seed": 0}, {},
                (Step("train", ("train",), "train/summary.json"), Step("fewshot", ("fewshot",), "fewshot.json")))
    row = cell_row(cell, tmp_path)
    assert row["model"] == "ViT-64x4" and row["train.model"] == "ViT-C/4 (custom: width 64)"
    assert row["seed"] == 0 and row["fewshot.seed"] == 7 and row["test.top1"] == 0.5 and row["steps"] == 4
    assert row["fewshot.shots.5.mean"] == 0.3 and row["status"] == "done"


def test_flatten_and_pareto_front():
    # `maps` is inspect's position similarity: a map per position, too deep for a column.
    flat = flatten({"a": {"b": 1, "per_class": {"x": 1}}, "c": [1.0, 2.0], "t": [[1, 3], [2, 2]], "s": "x",
                    "maps": [[[0.5, 1.0], [1.0, 0.5]]]})
    assert flat == {"a.b": 1, "c": [1.0, 2.0], "t": [2.0, 2.0], "s": "x"}
    points = [(1, 0.5), (2, 0.4), (3, 0.7), (3, 0.6), (5, 0.7), (8, 0.9)]
    assert pareto_front(points) == [(1, 0.5), (3, 0.7), (8, 0.9)]


# Running -------------------------------------------------------------------------------------
def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_runs_skips_resumes_and_plots(tmp_path, capsys):
    spec = spec_file(tmp_path)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--jobs", "2"]) == 0
    rows = _rows(out)
    assert [r["seed"] for r in rows] == ["0", "1"] and all(r["status"] == "done" for r in rows)
    assert all(0 <= float(r["test.top1"]) <= 1 and float(r["fewshot.shots.2.mean"]) >= 0 for r in rows)
    assert rows[0]["steps"] == "4"
    for fig in ("top1.png", "fewshot.png", "pareto.png"):
        assert (out / fig).stat().st_size > 1000
    # Each step's wall time is kept with the cell; the report sums them and gives the sweep's.
    entries = {c: json.loads((out / c / "timing.json").read_text())["steps"] for c in ("seed-0", "seed-1")}
    assert all([e["step"] for e in steps] == ["train", "fewshot"] for steps in entries.values())
    assert all(e["exit_code"] == 0 and e["seconds"] > 0 and "cores" in e["machine"] for s in entries.values() for e in s)
    time = json.loads((out / "report.json").read_text())["time"]
    seconds = [e["seconds"] for steps in entries.values() for e in steps]
    assert max(seconds) - 0.1 <= time["wall_s"] <= sum(seconds) + 0.1 and time["side_by_side"] in (1, 2)
    assert time["train_s"] == pytest.approx(sum(s[0]["seconds"] for s in entries.values()), abs=0.1)
    assert "Time: " in (out / "report.md").read_text()
    # Rerun: nothing to do.
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out)]) == 0
    assert "2 finished, 0 to run" in capsys.readouterr().out

    # Interrupt cell seed-1 after its step-2 checkpoint: drop what came after.
    cell = out / "seed-1"
    ckpts = cell / "train" / "checkpoints"
    final = load_file(str(ckpts / "step-00000004.safetensors"))
    for p in [*ckpts.glob("step-00000004*"), ckpts / "last.safetensors", cell / "train" / "summary.json",
              cell / "fewshot.json"]:
        p.unlink()
    shutil.copy(ckpts / "step-00000002.safetensors", ckpts / "last.safetensors")
    assert main(["sweep", str(spec), "--out", str(out)]) == 0
    assert "1 finished, 1 to run" in capsys.readouterr().out
    assert "resuming" in (cell / "train.log").read_text() and "from step 2" in (cell / "train.log").read_text()
    resumed = load_file(str(ckpts / "step-00000004.safetensors"))
    assert all((resumed[k] == final[k]).all() for k in final)  # exact resume on the CPU
    assert all(r["status"] == "done" for r in _rows(out))
    steps = [e["step"] for e in json.loads((cell / "timing.json").read_text())["steps"]]
    assert steps == ["train", "fewshot", "train", "fewshot"]  # the resumed steps are added, the done ones kept
    assert len(json.loads((out / "seed-0" / "timing.json").read_text())["steps"]) == 2


def test_a_changed_spec_never_reuses_a_cell(tmp_path):
    spec = SweepSpec.from_dict(TINY, "tiny")
    out = tmp_path / "out"
    from vitlab.sweep.runner import prepare

    cell = expand(spec, out)[0]
    prepare(cell, spec, out)
    changed = SweepSpec.from_dict({**TINY, "train": {**TINY["train"], "model.depth": 2}}, "tiny")
    with pytest.raises(ConfigError, match="other settings"):
        prepare(expand(changed, out)[0], changed, out)


def test_a_failing_cell_is_reported_with_its_log(tmp_path, capsys):
    bad = {**TINY, "train": {**TINY["train"], "model.hidden_size": 30}, "after": {}, "grid": {"seed": [0]}}
    out = tmp_path / "out"
    assert main(["sweep", str(spec_file(tmp_path, bad)), "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAILED at train" in text and "num_heads" in text  # the trainer's one-line error, from the log
    assert _rows(out)[0]["status"] == "missing"


@pytest.mark.slow
def test_submitit_local_executor_runs_the_cells(tmp_path):
    pytest.importorskip("submitit")
    d = {**TINY, "grid": {"seed": [3]}, "after": {}, "figures": [TINY["figures"][0]]}
    spec = SweepSpec.from_dict(d, "tiny")
    out = tmp_path / "out"
    summary = run_sweep(spec, out, launcher="submitit-local", params={"timeout_min": 10}, threads=1, say=lambda s: None)
    assert summary["finished"] == 1 and not summary["failed"]
    assert (out / "submitit").is_dir()
    assert json.loads((out / "seed-3" / "train" / "summary.json").read_text())["steps"] == 4
    assert (out / "top1.png").exists()


def test_the_sweeps_time_is_the_union_of_its_steps(tmp_path):
    """Wall time: the intervals in which some step ran (two side by side count once, a night
    between a stop and a resume not at all); training and after-steps summed apart."""
    from vitlab.sweep import timing

    def cell(name, *steps):
        d = tmp_path / name
        d.mkdir()
        (d / "timing.json").write_text(json.dumps({"steps": [
            {"step": s, "start": a, "seconds": n, "machine": "CPU X (2 cores)"} for s, a, n in steps]}))
        return d

    a = cell("a", ("train", 0, 100), ("fewshot", 100, 10))
    b = cell("b", ("train", 50, 100), ("fewshot", 150, 10))
    c = cell("c", ("train", 86_400, 30))  # resumed the next day
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "timing.json").write_text("{not json")  # unreadable: no entries, no error
    t = timing.summary([a, b, c, tmp_path / "d", tmp_path / "missing"])
    assert t == {"wall_s": 190.0, "side_by_side": 2, "train_s": 230.0, "after_s": 20.0, "machines": ["CPU X (2 cores)"]}
    assert timing.summary([tmp_path / "d"]) is None
    assert "3 minutes of wall time on CPU X (2 cores), at most 2 step(s) side by side" in timing.sentence(t)


def test_shipped_confirmatory_claims_are_powered():
    """A shipped spec's confirmatory claim plans 80% or more at its stated effect (vitlab sweep
    refuses it otherwise); an exploratory one may state a lower power (paper/data-size's does)."""
    from vitlab.config.sweep import declared_claims
    from vitlab.sweep import declare, stats

    planned = 0
    for name in shipped_sweeps():
        spec, _ = load_sweep(name)
        declare.check_power(spec)
        for claim in declared_claims(spec):
            p = declare.plan(spec, claim)
            if p["power"] is not None and p["confirmatory"]:
                planned += 1
                assert p["power"] >= stats.POWER and p["seeds"] >= p["needs"]
    assert planned >= 2  # paper/local-heads and paper/table8


# Random-init controls: K draws, and a step recomputed on finished cells -----------------------
def _control(command: str, **step) -> dict:
    return {**TINY, "after": {"init": {"command": command, "result": "init.json", **step}}}


@pytest.mark.parametrize("value, ok", [("{seed}", False), ("7", False), ("{seed}00-{seed}04", True), ("0-19", True),
                                       ("{seed}-{seed}", False)])
def test_a_random_init_control_of_one_draw_is_refused_unless_it_says_why(tmp_path, capsys, value, ok):
    from vitlab.config.sweep import check_controls

    command = f"fewshot {{checkpoint}} --random-init {value} --data digits --out {{cell}}/init.json"
    spec = SweepSpec.from_dict(_control(command), "t")  # a spec's own checks pass: a run refuses it
    if ok:
        check_controls(spec)
        with pytest.raises(ConfigError, match="init.single_draw: this step draws [0-9]+; remove single_draw"):
            check_controls(SweepSpec.from_dict(_control(command, single_draw="because"), "t"))
        return
    with pytest.raises(ConfigError, match=r"after.init: a random-init control of one draw .* average K draws"):
        check_controls(spec)
    check_controls(SweepSpec.from_dict(_control(command, single_draw="a whole fine-tune a draw"), "t"))
    check_controls(SweepSpec.from_dict(_control(command.replace(f"--random-init {value}", f"--random-init={value}"),
                                                single_draw="why"), "t"))
    # vitlab sweep refuses it in one line, before any cell is made
    out = tmp_path / "out"
    assert main(["sweep", str(spec_file(tmp_path, _control(command))), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert "a random-init control of one draw" in err and len(err.splitlines()) == 1
    assert not any(out.glob("seed-*"))


def test_shipped_controls_draw_k_times_or_say_why():
    from vitlab.config.sweep import check_controls

    for name in shipped_sweeps():
        check_controls(load_sweep(name)[0])
    cls_gap = {s.name: s for s in load_sweep("paper/cls-gap")[0].after}
    assert "--random-init {seed}00-{seed}04" in cls_gap["init"].command and not cls_gap["init"].single_draw


def _finished(spec: SweepSpec, out: Path) -> list[Cell]:
    """Cells made finished by hand (no training): cell.json, the train summary, a few-shot
    result, the old control's result, and a checkpoint of the recipe's shape."""
    import shape_checkpoints  # benchmarks/ (on sys.path by conftest)
    from vitlab.run_layout import RunLayout
    from vitlab.sweep.runner import prepare

    cells = expand(spec, out)
    for cell in cells:
        d = prepare(cell, spec, out)
        (d / "train").mkdir()
        (d / "train" / "summary.json").write_text(json.dumps({"steps": 4, "splits": {"test": {"top1": 0.5}}}))
        (d / "fewshot.json").write_text(json.dumps({"shots": {"2": {"mean": 0.5}}}))
        (d / "init.json").write_text(json.dumps({"shots": {"2": {"mean": 0.1}}, "random_init": 9}))
        shape_checkpoints.stand_in(Path("digits"), RunLayout(d / "train").last)
    return cells


REDO = {**TINY, "grid": {"arm": {"x": {"tag.k": 1}, "y": {"tag.k": 2}}, "seed": [0]}, "figures": [],
        "after": {"fewshot": {"command": "fewshot {checkpoint} --data digits --out {cell}/fewshot.json", "result": "fewshot.json"},
                  "init": {"command": "fewshot {checkpoint} --random-init {seed} --data digits --shots 2 --seeds 1 --pool 4 "
                                      "--test-limit 60 --no-cache --out {cell}/init.json",
                           "result": "init.json", "single_draw": "the old design"}},
        "report": {"metrics": ["init.shots.2.mean"], "compare": [
            {"claim": "x above y net", "axis": "arm", "a": "x", "b": "y", "expect": "higher",
             "primary": {"metric": "fewshot.shots.2.mean - init.shots.2.mean", "selection": "none"}}]}}


@pytest.mark.slow
def test_redo_after_recomputes_one_step_of_finished_cells_and_makes_its_claims_post_hoc(tmp_path, capsys):
    from vitlab.sweep import claims_declared, declare

    out = tmp_path / "out"
    old = SweepSpec.from_dict(REDO, "redo")
    cells = _finished(old, out)
    new_init = {**REDO["after"]["init"], "command": REDO["after"]["init"]["command"].replace("{seed}", "{seed}00-{seed}01")}
    new_init.pop("single_draw")
    spec = SweepSpec.from_dict({**REDO, "after": {**REDO["after"], "init": new_init}}, "redo")
    with pytest.raises(ConfigError, match="other after"):  # without --redo-after the changed step is refused
        run_sweep(spec, out, say=lambda s: None)
    with pytest.raises(ConfigError, match="no after-step 'nope'"):
        run_sweep(spec, out, redo="nope", say=lambda s: None)
    kept = {c.key: (out / c.key / "fewshot.json").read_text() for c in cells}

    said: list[str] = []
    summary = run_sweep(spec, out, redo="init", threads=1, say=said.append)
    assert not summary["failed"] and "0 finished, 2 to run" in said[0]
    for cell in cells:
        d = out / cell.key
        result = json.loads((d / "init.json").read_text())
        assert result["random_init"] == [0, 1] and len(result["shots"]["2"]["accuracy"]) == 2  # K = 2 draws
        assert (d / "fewshot.json").read_text() == kept[cell.key]  # the other steps are not run again
        assert json.loads((d / "cell.json").read_text())["after"][1][1] == new_init["command"]
        assert [e["step"] for e in json.loads((d / "timing.json").read_text())["steps"]] == ["init"]
    claims = json.loads((out / "sweep.json").read_text())["claims"]
    assert claims["declared"].startswith("after its results (post hoc): after-step init")
    assert [r["step"] for r in claims["redone"]] == ["init"] and "{seed}00-{seed}01" in claims["redone"][0]["command"]
    declared = claims_declared(spec, out, cells)
    assert declared["status"] == declare.AFTER
    assert declare.when_text(declared) == f"after the run (post hoc; init recomputed {claims['redone'][0]['at'][:10]})"
    report = json.loads((out / "report.json").read_text())
    assert report["claims"][0]["family"] == "exploratory claims"

    # Again: every cell records the new command, so nothing runs and nothing is recorded.
    said.clear()
    run_sweep(spec, out, redo="init", threads=1, say=said.append)
    assert "2 finished, 0 to run" in said[0]
    assert len(json.loads((out / "sweep.json").read_text())["claims"]["redone"]) == 1


def test_redo_after_refuses_unfinished_cells_and_other_changes(tmp_path):
    out = tmp_path / "out"
    old = SweepSpec.from_dict(REDO, "redo")
    cells = _finished(old, out)
    changed = SweepSpec.from_dict({**REDO, "train": {**REDO["train"], "model.depth": 2}}, "redo")
    with pytest.raises(ConfigError, match="other settings"):
        run_sweep(changed, out, redo="init", say=lambda s: None)
    (out / cells[0].key / "train" / "summary.json").unlink()
    with pytest.raises(ConfigError, match=r"--redo-after init: cell arm=x, k=1, seed=0 is not finished \(train\)"):
        run_sweep(old, out, redo="init", say=lambda s: None)
    assert json.loads((out / cells[1].key / "init.json").read_text())["random_init"] == 9  # nothing changed
    assert main(["sweep", "--report", str(out), "--redo-after", "init"]) != 0  # --report runs nothing
    assert json.loads((out / cells[1].key / "init.json").read_text())["random_init"] == 9
