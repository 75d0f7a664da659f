"""Every Table 3 row and Table 2's fine-tune as a shipped recipe, checked against the values
docs/reproducing.md quotes from the paper; `vitlab recipes` lists them with their row."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from conftest import ROOT
from vitlab.checkpoints.peers import variant_config
from vitlab.cli import main
from vitlab.config import load_recipe
from vitlab.config.recipes import list_recipes, weight_decay_reading
from vitlab.train import finetune
from vitlab.train.optim import build_optimizer

DOC = ROOT / "docs" / "reproducing.md"


def doc_table(heading: str) -> list[dict[str, str]]:
    """The Markdown table under `heading` in docs/reproducing.md, as dicts by column."""
    lines = DOC.read_text().split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [line for line in lines if line.startswith("|")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in r.strip("|").split("|")), strict=True)) for r in rows[2:]]


TABLE3 = doc_table("Table 3")
TABLE2 = doc_table("Table 2")


def test_every_table_recipe_is_quoted_in_the_docs():
    shipped = {r.name for r in list_recipes() if r.name.startswith(("table3-", "table2-"))}
    quoted = {row["recipe"] for row in TABLE3 + TABLE2}
    assert shipped == quoted
    assert len(TABLE3) == 24 and len(TABLE2) == 3


@pytest.mark.parametrize("row", TABLE3, ids=[r["recipe"] for r in TABLE3])
def test_table3_recipe_matches_the_paper(row):
    cfg = load_recipe(row["recipe"])
    o, t, m = cfg.optim, cfg.train, cfg.model
    assert m.name == row["model"]
    assert t.epochs == float(row["epochs"]) and t.steps == 0
    assert o.lr == float(row["base LR"]) and o.decay == row["decay"]
    assert o.weight_decay == float(row["weight decay"])
    assert o.clip_grad_norm == (0.0 if row["clip"] == "off" else float(row["clip"]))
    if row["dropout"] != "-":
        assert m.changes["dropout"] == float(row["dropout"])
        assert m.changes["representation_size"] == vitlab.get_config(m.name).hidden_size  # the pre-logits
    else:
        assert vitlab.get_config(m.name).kind == "bit"
    assert (o.name, o.betas, o.warmup_steps, t.batch_size) == ("adamw", (0.9, 0.999), 10_000, 4096)
    # the head starts at zero, as vision_transformer's models_vit.py and big_vision's vit.py start it
    assert variant_config(m.name, **m.changes).head_init == "zeros"
    assert 4096 % t.micro_batch_size == 0
    source = next(r.source for r in list_recipes() if r.name == row["recipe"])
    assert source.startswith("Table 3, row") and row["data"] in source


@pytest.mark.parametrize("row", TABLE2, ids=[r["recipe"] for r in TABLE2])
def test_table2_finetune_matches_the_paper(row):
    cfg = load_recipe(row["recipe"])
    o, t = cfg.optim, cfg.train
    assert cfg.model.changes["image_size"] == (int(row["resolution"]),) * 2
    assert t.ema == float(row["Polyak"]) and t.steps == int(row["steps"]) == finetune.TABLE4_STEPS["imagenet"]
    assert t.batch_size == int(row["batch"])
    assert tuple(float(v) for v in row["LR grid"].split(",")) == finetune.TABLE4_LRS["imagenet"]
    assert (o.name, o.momentum, o.weight_decay, o.decay, o.clip_grad_norm) == ("sgd", 0.9, 0.0, "cosine", 1.0)
    assert cfg.model.changes["representation_size"] is None


def test_each_recipe_says_how_it_reads_weight_decay_as_the_optimizer_does():
    """The header's words agree with what build_optimizer makes of the section."""
    model = vitlab.create_model("ViT-Ti/4", depth=1, num_classes=10)
    for r in list_recipes():
        if not r.name.startswith(("table3-", "table2-")):
            continue
        text = r.path.read_text()
        optim = load_recipe(r.name).optim
        opt = build_optimizer(model, optim)
        if optim.name == "adamw":
            # torch's AdamW: w <- w - lr * wd * w, apart from the gradient (decoupled, x lr).
            assert isinstance(opt, torch.optim.AdamW) and "decoupled and multiplied by the scheduled learning rate" in text
            assert r.reading == weight_decay_reading(optim) == "decoupled, x lr (AdamW)"
        else:
            assert optim.weight_decay == 0 and "Weight decay: none" in text and r.reading == "none"


def test_decoupled_decay_is_scaled_by_the_learning_rate():
    """One AdamW step on a zero gradient shrinks a matrix by exactly lr * wd."""
    lin = torch.nn.Linear(4, 4, bias=False)
    w0 = lin.weight.detach().clone()
    optim = load_recipe("table3-jft-vit-b32").optim
    opt = build_optimizer(lin, optim)
    lin.weight.grad = torch.zeros_like(lin.weight)
    opt.step()
    torch.testing.assert_close(lin.weight.detach(), w0 * (1 - optim.lr * optim.weight_decay))


def test_recipes_command_lists_rows(capsys):
    assert main(["recipes", "table3-jft-*", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 14 and all(r["source"].startswith("Table 3, row") for r in listed)
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "table2-finetune-imagenet-518" in out and "Table 2, ImageNet column (ViT-H/14)" in out
    assert main(["recipes", "nothing-*"]) == 2
    assert "no shipped recipe matches" in capsys.readouterr().err
