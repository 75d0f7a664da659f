"""Recipes: every shipped file loads, the paper's optimiser/schedule/weight-decay groups, bad keys."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import vitlab
from vitlab.config import ConfigError, OptimConfig, RunConfig, load_recipe, parse_override
from vitlab.train.optim import build_optimizer, lr_at, param_groups

CONFIGS = Path(vitlab.__file__).parent / "configs"


def test_every_shipped_recipe_loads_and_says_how_to_run_it():
    names = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert {"digits", "fashion-mnist", "cifar10", "finetune", "vit-pretrain-imagenet21k", "vit-pretrain-imagenet"} <= set(names)
    for name in names:
        cfg = load_recipe(name)
        text = (CONFIGS / f"{name}.yaml").read_text()
        assert text.startswith("#") and "Runs with:" in text, name
        assert "Measured:" in text or "Not run here" in text, name
        assert RunConfig.from_dict(cfg.to_dict()) == cfg  # the resolved form reads back the same


def small_model(**kw):
    return vitlab.create_model("ViT-Ti/4", depth=2, num_classes=10, **kw)


def test_pretraining_recipe_is_the_papers():
    cfg = load_recipe("vit-pretrain-imagenet21k")
    o, t, m = cfg.optim, cfg.train, cfg.model
    assert (o.name, o.betas, o.weight_decay, o.clip_grad_norm) == ("adamw", (0.9, 0.999), 0.03, 0.0)
    assert (o.warmup_steps, o.decay, o.lr) == (10_000, "linear", 1e-3)
    assert t.batch_size == 4096 and 4096 % t.micro_batch_size == 0  # accumulation reaches 4096
    assert m.changes["dropout"] == 0.1 and m.changes["representation_size"] == 768
    opt = build_optimizer(small_model(representation_size=192), o)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.999)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.03 and no_decay["weight_decay"] == 0.0


def test_weight_decay_only_on_matrices():
    model = small_model(representation_size=192)
    decay, no_decay = param_groups(model, 0.1)
    assert "patch_embed.proj.weight" in decay["names"] and "blocks.0.attn.qkv.weight" in decay["names"]
    assert "pre_logits.weight" in decay["names"] and "head.weight" in decay["names"]
    for name in ("cls_token", "pos_embed.pos_embedding", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "head.bias"):
        assert name in no_decay["names"], name
    assert all(p.ndim >= 2 for p in decay["params"])
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == total
    rel = vitlab.create_model("ViT-Ti/4", depth=1, pos_embed="relative", num_classes=10)
    assert "blocks.0.attn.rel_embedding" in param_groups(rel, 0.1)[1]["names"]


def test_finetuning_recipe_is_the_papers():
    cfg = load_recipe("finetune")
    o, t = cfg.optim, cfg.train
    assert (o.name, o.momentum, o.weight_decay, o.decay, o.clip_grad_norm) == ("sgd", 0.9, 0.0, "cosine", 1.0)
    assert t.batch_size == 512 and t.steps == 0  # 0: Table 4's count per dataset
    assert cfg.model.changes["representation_size"] is None
    opt = build_optimizer(small_model(), o)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    from vitlab.data import paper_dataset
    from vitlab.train.finetune import TABLE4_LRS, TABLE4_STEPS

    assert TABLE4_STEPS["cifar10"] == 10_000 and TABLE4_STEPS["imagenet"] == 20_000 and TABLE4_STEPS["pets"] == 500
    assert TABLE4_LRS["cifar100"] == (0.001, 0.003, 0.01, 0.03)
    # By the declared name or the contents, not by a word in the path.
    assert paper_dataset("cifar100:/x") == "cifar100" and paper_dataset("imagefolder:/data/oxford-pets") is None
    assert paper_dataset("digits") is None and paper_dataset("fashion-mnist") is None


def test_schedule_warmup_then_cosine_or_linear():
    cos = OptimConfig(lr=1.0, warmup_steps=10, decay="cosine")
    assert lr_at(0, 110, cos) == pytest.approx(0.1) and lr_at(9, 110, cos) == pytest.approx(1.0)
    assert lr_at(60, 110, cos) == pytest.approx(0.5)  # half-way through the decay
    assert lr_at(110, 110, cos) == pytest.approx(0.0, abs=1e-12)
    lin = OptimConfig(lr=2.0, warmup_steps=0, decay="linear", end_lr=0.5)
    assert [lr_at(s, 4, lin) for s in range(5)] == pytest.approx([2.0, 1.625, 1.25, 0.875, 0.5])
    const = OptimConfig(lr=0.3, decay="constant", warmup_steps=2)
    assert [lr_at(s, 10, const) for s in (0, 1, 5)] == pytest.approx([0.15, 0.3, 0.3])
    values = [lr_at(s, 100, cos) for s in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(values)) and not any(math.isnan(v) for v in values)


def test_bad_key_names_the_near_one_or_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.lrr'; did you mean optim\.lr\?"):
        RunConfig().with_overrides({"optim.lrr": 0.1})
    with pytest.raises(ConfigError, match=r"'train\.lrr'; did you mean optim\.lr\?"):  # a key of another section
        RunConfig().with_overrides({"train.lrr": 0.1})
    with pytest.raises(ConfigError, match=r"did you mean model\.dropout\?") as e:
        RunConfig().with_overrides({"model.dropot": 0.1})
    assert e.value.reason == "unknown-key"
    with pytest.raises(ConfigError, match=r"model\.zzzz'; valid model keys:.*dropout") as e:
        RunConfig().with_overrides({"model.zzzz": 0.1})
    assert str(e.value).count(" name,") == 1  # the model section's `name` is listed once
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stepz: 10\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*did you mean train\.steps\?"):
        load_recipe(str(bad))
    with pytest.raises(ConfigError, match="`vitlab recipes` lists them"):
        load_recipe("no-such-recipe")
    with pytest.raises(ConfigError, match="optim.lr='fast' is not a number"):
        RunConfig().with_overrides({"optim.lr": "fast"})
    # YAML 1.1 reads 1e-3 as a string; the field's type turns it into the number.
    assert RunConfig().with_overrides(dict([parse_override("optim.lr=1e-3")])).optim.lr == 0.001
    assert RunConfig().with_overrides(dict([parse_override("data.name=1e3")])).data.name == "1e3"
    assert parse_override("data.crop_scale=[0.5, 1]") == ("data.crop_scale", [0.5, 1])


def test_cli_reports_a_bad_override_in_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "vitlab", "train", "--out", str(tmp_path / "run"), "optim.weight_decai=0.1"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2
    assert "optim.weight_decai" in r.stderr and "weight_decay" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_hybrid_stem_change_is_written_and_read_back_as_plain_yaml():
    """`model.resnet={layers: [1]}` is checked into a ResNetConfig; the run's config.yaml must
    still be plain YAML that loads into the same run."""
    cfg = RunConfig.from_dict({"model": {"name": "R8+ViT-C/4", "resnet": {"layers": [1]}}})
    text = yaml.safe_dump(cfg.to_dict())
    assert yaml.safe_load(text)["model"]["resnet"]["layers"] == [1]
    again = RunConfig.from_dict(yaml.safe_load(text))
    assert again.model.changes["resnet"] == cfg.model.changes["resnet"]
    assert again.model.changes["resnet"].layers == (1,)


def test_a_recipe_with_unknown_keys_in_two_sections_names_every_one():
    from vitlab.config import ConfigError, RunConfig

    bad = {"model": {"nme": "ViT-Ti/4", "dpth": 3}, "train": {"stepz": 3}, "optim": {"lr": 0.1}}
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(bad)
    assert e.value.reason == "unknown-key"
    assert all(f"{typo} (did you mean {key}?)" in str(e.value) for typo, key in
               [("model.nme", "model.name"), ("model.dpth", "model.depth"), ("train.stepz", "train.steps")])
    with pytest.raises(ConfigError, match=r"stepz'; did you mean train.steps\?"):
        RunConfig.from_dict({"train": {"stepz": 3}})  # one alone: the section's own check, its valid keys listed
