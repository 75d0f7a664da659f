"""Each value of a run's config records the layer that set it (a typed Origin), config.yaml
holds the layers as data and shows them as comments, and a run folder reads them back in one
read of the file (config/provenance.py); two settings of one key that disagree are refused by
name, never resolved silently (a flag and a SECTION.KEY= override, --lr with --lr-sweep or
--lr-grid, an empty --lr-grid)."""

from __future__ import annotations

import builtins
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import vitlab
from conftest import assert_one_line_error, vitlab_cli
from vitlab.cli import main
from vitlab.config import ConfigError, RunConfig, load_recipe
from vitlab.config.provenance import (
    CHECKPOINT,
    COMMAND_LINE,
    DEFAULT,
    PLAN,
    SECTION,
    SWEEP,
    Layer,
    Origin,
    annotated_yaml,
    config_file,
    from_document,
    recipe,
)
from vitlab.train.recipe import Given, resolve
from vitlab.train.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]

TINY = ["--batch-size", "32", "model.depth=1", "model.hidden_size=16", "model.num_heads=2", "model.mlp_dim=32",
        "model.image_size=8", "model.patch_size=4", "train.threads=1"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A small checkpoint inside a vitlab run folder (RUN/checkpoints/), whose config sets threads."""
    run = tmp_path_factory.mktemp("src") / "run"
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/4", image_size=8, patch_size=4, in_channels=1, mean=(0.5,), std=(0.5,),
                                hidden_size=16, depth=1, num_heads=2, mlp_dim=32, num_classes=10)
    (run / "checkpoints").mkdir(parents=True)
    vitlab.save(model, run / "checkpoints" / "last.safetensors")
    RunFolder(run).write_config(load_recipe("digits").with_overrides({"train.threads": 1, "data.num_workers": 0}))
    return run / "checkpoints" / "last.safetensors"


def test_each_value_records_its_layer_and_config_yaml_shows_it():
    cfg = resolve(load_recipe("digits"), Given.of({"optim.lr": 0.01, "data.name": "digits"}, ["train.log_every=7"]),
                  {"train.steps": 9}, {"train.steps": PLAN})
    assert cfg.origin("optim.lr") == COMMAND_LINE and cfg.origin("train.log_every") == COMMAND_LINE
    assert cfg.origin("optim.warmup_steps") == recipe("digits") and cfg.origin("optim.betas") == DEFAULT
    assert cfg.origin("train.steps") == PLAN and cfg.origin("data.name") == COMMAND_LINE
    text = annotated_yaml(cfg.to_dict(), cfg.origins)
    assert "  lr: 0.01  # command line\n" in text and "  warmup_steps: 50  # recipe digits\n" in text
    assert "  steps: 9  # fine-tune plan\n" in text and "  eps: 1.0e-08  # default\n" in text
    document = yaml.safe_load(text)
    assert RunConfig.from_dict(document) == cfg  # plain YAML: the comments change nothing
    # The data: one entry per layer, with its keys; a key in none is the default.
    assert {"layer": "fine-tune plan", "keys": ["train.steps"]} in document[SECTION]
    assert {"layer": "recipe", "source": "digits", "keys": sorted(k for k, o in cfg.origins.items()
                                                                    if o == recipe("digits"))} in document[SECTION]
    assert from_document(document) == {k: o for k, o in cfg.origins.items() if o != DEFAULT}
    # A config file the user names is its own layer; a later change keeps the others' layers.
    other = resolve(load_recipe("digits"))
    assert other.origin("optim.lr") == recipe("digits")
    assert cfg.with_overrides({"optim.lr": 0.5}, SWEEP).origin("train.steps") == PLAN


def test_origins_are_typed_and_a_change_makes_a_new_config():
    cfg = load_recipe("digits")
    swept = cfg.with_overrides({"optim.lr": 0.5}, SWEEP)
    assert cfg.origin("optim.lr") == recipe("digits") and swept.origin("optim.lr") == SWEEP  # the first is unchanged
    marked = cfg.with_origins({"optim.lr": CHECKPOINT})
    assert marked is not cfg and marked == cfg and cfg.origin("optim.lr") == recipe("digits")
    assert str(config_file("a/b.yaml")) == "config file a/b.yaml" and str(PLAN) == "fine-tune plan"
    with pytest.raises(TypeError, match="Origin"):
        cfg.with_overrides({"optim.lr": 0.5}, "sweep")  # a free string is no layer
    with pytest.raises(ValueError, match="names its source"):
        Origin(Layer.RECIPE)
    assert RunConfig().with_overrides({"optim.lr": 0.5}).origin("optim.lr") == Origin(Layer.LIBRARY)


@pytest.mark.parametrize("section,problem", [
    ("nope", "provenance is text, not a list"),
    ([{"layer": "recipes", "source": "x", "keys": ["optim.lr"]}], "not a layer"),
    ([{"layer": "recipe", "keys": ["optim.lr"]}], "needs source"),
    ([{"layer": "sweep", "source": "x", "keys": ["optim.lr"]}], "takes no source"),
    ([{"layer": "sweep", "keys": "optim.lr"}], r"provenance\[0\].keys is text, not a list"),
    ([{"layer": ["sweep"], "keys": ["optim.lr"]}], r"provenance\[0\].layer is a list, not text"),
])
def test_a_damaged_provenance_section_is_named(section, problem):
    with pytest.raises(ConfigError, match=problem):
        from_document({"optim": {}, SECTION: section})


def test_a_fine_tunes_config_yaml_says_who_set_what_and_a_resume_keeps_it(source, tmp_path):
    out = tmp_path / "ft"
    assert main(["finetune", str(source), "--data", "digits", "--steps", "4", "--lr", "0.01", "--out", str(out),
                 "--quiet", "train.log_every=2"]) == 0
    text = (out / "config.yaml").read_text()
    for line in ("  lr: 0.01  # command line", "  momentum: 0.9  # recipe finetune", "  steps: 4  # command line",
                 "  threads: 1  # checkpoint", "  warmup_steps: 1  # fine-tune plan", "  name: digits  # command line",
                 "  # the network's other settings: the checkpoint's (model.checkpoint)"):
        assert line + "\n" in text, line
    assert f"  checkpoint: {source}  # command line\n" in text
    before = RunFolder(out).read_config()
    assert before.origins == from_document(yaml.safe_load(text)) and before.origin("optim.momentum") == recipe("finetune")
    assert main(["train", "--resume", str(out), "--steps", "6", "--quiet"]) == 0  # extended: the layers stay
    after = (out / "config.yaml").read_text()
    assert "  momentum: 0.9  # recipe finetune\n" in after and "  steps: 6  # command line\n" in after


def test_a_config_yaml_written_before_the_layers_resumes(tmp_path):
    run = tmp_path / "old"
    cfg = load_recipe("digits").with_overrides({"train.steps": 2, "train.batch_size": 32, "model.depth": 1,
                                                "model.hidden_size": 16, "model.mlp_dim": 32, "train.threads": 1})
    assert main(["train", "--config", "digits", "--out", str(run), "--steps", "2", "--quiet", *TINY[:2],
                 *[f"{k}={v}" for k, v in (("model.depth", 1), ("model.hidden_size", 16), ("model.mlp_dim", 32),
                                            ("train.threads", 1))]]) == 0
    (run / "config.yaml").write_text(yaml.safe_dump(RunFolder(run).read_config().to_dict()))  # as before: no comments
    assert RunFolder(run).read_config() == cfg.with_overrides({"data.num_workers": 1})
    assert main(["train", "--resume", str(run), "--steps", "3", "--quiet"]) == 0
    assert f"  lr: 0.003  # config file {run / 'config.yaml'}\n" in (run / "config.yaml").read_text()


def opens_of(path: Path, monkeypatch) -> list[str]:
    """Every open of `path` from here on (builtins.open and io.open, which pathlib uses)."""
    seen: list[str] = []
    real = builtins.open

    def counting(file, *args, **kwargs):
        if Path(str(file)) == path if isinstance(file, (str, Path)) else False:
            seen.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    return seen


def test_a_run_folder_reads_its_config_yaml_once_and_never_its_comments(source, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    assert main(["finetune", str(source), "--data", "digits", "--steps", "2", "--lr", "0.01", "--out", str(out),
                 "--quiet"]) == 0
    path = out / "config.yaml"
    opens = opens_of(path, monkeypatch)
    cfg = RunFolder(out).read_config()
    assert len(opens) == 1
    assert cfg.origin("optim.lr") == COMMAND_LINE and cfg.origin("train.threads") == CHECKPOINT
    # The comments are a view: a wrong one changes nothing; the section is what is read.
    text = path.read_text().replace("  lr: 0.01  # command line", "  lr: 0.01  # sweep")
    path.write_text(text)
    assert RunFolder(out).read_config().origin("optim.lr") == COMMAND_LINE


def previous_release_form(text: str) -> str:
    """config.yaml as the release before the provenance section wrote it: the same lines, each
    value's layer in a comment, and no section."""
    head, _, _ = text.partition("# Which layer set each value, as data")
    assert SECTION + ":" not in head
    return head


def test_a_run_folder_of_the_previous_release_resumes(source, tmp_path):
    """Its config.yaml has the layers in comments only: it reads as the same config, each value
    as set by that file (the comments are not read), resumes, and its next config.yaml has the
    section."""
    out = tmp_path / "old"
    assert main(["finetune", str(source), "--data", "digits", "--steps", "2", "--lr", "0.01", "--out", str(out),
                 "--quiet", "train.ckpt_every=2"]) == 0
    now = RunFolder(out).read_config()
    path = out / "config.yaml"
    path.write_text(previous_release_form(path.read_text()))
    old = RunFolder(out).read_config()
    assert old == now and set(old.origins.values()) == {config_file(path)}
    assert main(["train", "--resume", str(out), "--steps", "4", "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    again = from_document(yaml.safe_load(path.read_text()))
    assert again["train.steps"] == COMMAND_LINE and again["optim.lr"] == config_file(path)


@pytest.mark.parametrize("run", sorted(str(p.parent.relative_to(ROOT)) for p in
                                        (ROOT / "results" / "paper").glob("*/*/train/config.yaml"))[:2])
def test_a_committed_config_yaml_of_the_previous_release_reads(run, tmp_path):
    """A run folder the previous release wrote (committed evidence: layers in comments only)."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(ROOT / run / "config.yaml", folder / "config.yaml")
    cfg = RunFolder(folder).read_config()
    assert cfg == RunConfig.from_dict(yaml.safe_load((folder / "config.yaml").read_text()))
    assert set(cfg.origins.values()) == {config_file(folder / "config.yaml")}


@pytest.mark.parametrize("argv,named", [
    (["train", "--lr", "0.01", "optim.lr=0.02"], ("--lr", "optim.lr=0.02", "optim.lr")),
    (["train", "--steps", "5", "train.steps=7"], ("--steps", "train.steps=7")),
    (["train", "--epochs", "2", "train.epochs=3"], ("--epochs", "train.epochs=3")),
    (["train", "optim.lr=0.1", "optim.lr=0.2"], ("optim.lr=0.1", "optim.lr=0.2")),
    (["train", "--mixup", "0.2", "train.mixup=0.4"], ("--mixup", "train.mixup=0.4")),
    (["finetune", "SOURCE", "--data", "digits", "--lr", "0.01", "--lr-sweep"], ("--lr", "--lr-sweep")),
    (["finetune", "SOURCE", "--data", "digits", "optim.lr=0.01", "--lr-sweep"], ("optim.lr=0.01", "--lr-sweep")),
    (["finetune", "SOURCE", "--data", "digits", "--lr", "0.01", "--lr-grid", "0.1,0.3"], ("--lr", "--lr-grid")),
    (["finetune", "SOURCE", "--data", "digits", "--lr-grid", ""], ("--lr-grid", "''")),
    (["finetune", "SOURCE", "--data", "digits", "--lr-grid", ","], ("--lr-grid",)),
    (["finetune", "SOURCE", "--data", "digits", "--paper-resolution", "model.image_size=32"],
     ("--paper-resolution", "model.image_size=32")),
    (["vtab", "SOURCE", "--root", "ROOT", "--lr", "0.1", "--lr-grid", "0.01"], ("--lr", "--lr-grid")),
    (["vtab", "SOURCE", "--root", "ROOT", "--lr-grid", ""], ("--lr-grid",)),
    (["vtab", "SOURCE", "--root", "ROOT", "optim.lr=0.1"], ("optim.lr=0.1", "--lr")),
])
def test_two_settings_of_one_key_are_refused_naming_both(argv, named, source, tmp_path, capsys):
    argv = [str(source) if a == "SOURCE" else str(tmp_path) if a == "ROOT" else a for a in argv]
    code = main([*argv, "--out", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, argv[0], mentions=named)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_one_value_written_two_ways_is_no_conflict():
    cfg = resolve(load_recipe("digits"), Given.of({"optim.lr": 0.01}, ["optim.lr=1.0e-2"]))
    assert cfg.optim.lr == 0.01


def test_the_refusals_in_a_fresh_process(source, tmp_path):
    r = vitlab_cli("train", "--lr", "0.01", "optim.lr=0.02", "--out", str(tmp_path / "a"))
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=("--lr", "optim.lr=0.02"))
    r = vitlab_cli("finetune", str(source), "--data", "digits", "--lr", "0.01", "--lr-sweep", "--out", str(tmp_path / "b"))
    assert_one_line_error(r.returncode, r.stderr, "finetune", mentions=("--lr", "--lr-sweep"))
    r = vitlab_cli("finetune", str(source), "--data", "digits", "--lr-grid", "", "--out", str(tmp_path / "c"))
    assert_one_line_error(r.returncode, r.stderr, "finetune", mentions=("--lr-grid",))
