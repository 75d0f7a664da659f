"""Each value of a run's config records the layer that set it, and config.yaml shows it
(config/provenance.py); two settings of one key that disagree are refused by name, never
resolved silently (a flag and a SECTION.KEY= override, --lr with --lr-sweep or --lr-grid, an
empty --lr-grid)."""

from __future__ import annotations

import pytest
import torch
import yaml

import vitlab
from conftest import assert_one_line_error, vitlab_cli
from vitlab.cli import main
from vitlab.config import RunConfig, load_recipe
from vitlab.config.provenance import annotated_yaml, origins_in
from vitlab.train.recipe import resolve
from vitlab.train.run_folder import RunFolder

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
    cfg, _ = resolve("digits", {"lr": 0.01, "data": "digits"}, ["train.log_every=7"], {"train.steps": 9},
                     {"train.steps": "fine-tune plan"})
    assert cfg.origin("optim.lr") == "command line" and cfg.origin("train.log_every") == "command line"
    assert cfg.origin("optim.warmup_steps") == "recipe digits" and cfg.origin("optim.betas") == "default"
    assert cfg.origin("train.steps") == "fine-tune plan" and cfg.origin("data.name") == "command line"
    text = annotated_yaml(cfg)
    assert "  lr: 0.01  # command line\n" in text and "  warmup_steps: 50  # recipe digits\n" in text
    assert "  steps: 9  # fine-tune plan\n" in text and "  eps: 1.0e-08  # default\n" in text
    assert RunConfig.from_dict(yaml.safe_load(text)) == cfg  # plain YAML: the comments change nothing
    assert origins_in(text) == {**{k: "default" for k in origins_in(text)}, **cfg.origins}
    # A config file the user names is its own layer; a later change keeps the others' layers.
    other = resolve(None, {}, [], None)[0]
    assert other.origin("optim.lr") == "recipe digits"
    assert cfg.with_overrides({"optim.lr": 0.5}, "sweep").origin("train.steps") == "fine-tune plan"


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
    assert before.origins == {**before.origins, **origins_in(text)} and before.origin("optim.momentum") == "recipe finetune"
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
    cfg, _ = resolve("digits", {"lr": 0.01}, ["optim.lr=1.0e-2"])
    assert cfg.optim.lr == 0.01


def test_the_refusals_in_a_fresh_process(source, tmp_path):
    r = vitlab_cli("train", "--lr", "0.01", "optim.lr=0.02", "--out", str(tmp_path / "a"))
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=("--lr", "optim.lr=0.02"))
    r = vitlab_cli("finetune", str(source), "--data", "digits", "--lr", "0.01", "--lr-sweep", "--out", str(tmp_path / "b"))
    assert_one_line_error(r.returncode, r.stderr, "finetune", mentions=("--lr", "--lr-sweep"))
    r = vitlab_cli("finetune", str(source), "--data", "digits", "--lr-grid", "", "--out", str(tmp_path / "c"))
    assert_one_line_error(r.returncode, r.stderr, "finetune", mentions=("--lr-grid",))
