"""Each command docs/reproducing.md gives for a cell of the paper runs the protocol its row
names: the command is read from the page, parsed by vitlab's own argument parser and made
into the plan the command would run (cli.finetune.make_plan, cli.vtab.settings ->
train.vtab.task_config, the few-shot protocol record), and that plan is compared field by
field with the paper's Table 4 (written out here from the paper) and with the values the
page's protocol table states."""

from __future__ import annotations

import re
import shlex

import pytest

from conftest import ROOT, tiny_model
from vitlab.cli import build_parser, parse
from vitlab.train.finetune_choice import PLANNED

DOC = (ROOT / "docs" / "reproducing.md").read_text()
# The paper's Table 4 (Appendix B.1.1): steps and the learning-rate grid of each fine-tune.
PAPER_TABLE4 = {"imagenet": (20_000, (0.003, 0.01, 0.03, 0.06)), "cifar10": (10_000, (0.001, 0.003, 0.01, 0.03)),
                "cifar100": (10_000, (0.001, 0.003, 0.01, 0.03)), "pets": (500, (0.001, 0.003, 0.01, 0.03)),
                "flowers": (500, (0.001, 0.003, 0.01, 0.03)), "vtab": (2_500, (0.01,))}


def commands() -> dict[str, str]:
    """The first table's rows: cell -> the `vitlab ...` command in its second column."""
    rows = {}
    for line in DOC.split("\n## ", 1)[0].splitlines():
        cells = cells_of(line)
        if len(cells) == 3 and cells[1].startswith("`vitlab "):
            rows[cells[0]] = re.match(r"`([^`]+)`", cells[1]).group(1)
    return rows


def protocol() -> dict[str, str]:
    """The protocol table: parameter -> vitlab's value as the page states it."""
    table = DOC.split("## Every protocol parameter against upstream", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in table.splitlines()[2:]:
        cells = cells_of(line)
        if len(cells) == 5 and cells[0] not in ("parameter", "---"):
            out[cells[0]] = cells[1]
    return out


def cells_of(line: str) -> list[str]:
    """A Markdown table row's cells (a `\\|` inside a cell is part of it)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*\.?\d*", text)]


COMMANDS, PROTOCOL = commands(), protocol()


def argv(command: str, checkpoint: str, **fill: str) -> list[str]:
    """The command's arguments with its placeholders filled (CKPT, D, DIR, ROW, ...)."""
    words = shlex.split(command)[1:]
    names = {"CKPT": checkpoint, **fill}
    return [names.get(w, w) for w in words]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import vitlab

    path = tmp_path_factory.mktemp("repro") / "vit.safetensors"
    vitlab.save(tiny_model(class_names=[str(i) for i in range(10)]), path)
    return str(path)


def test_the_page_lists_the_commands_checked_here():
    assert {"Table 2 / 5, CIFAR, Pets, Flowers", "Table 2's ImageNet column (mean ± std of 3)",
            "Table 2's VTAB column, Table 9", "Fig. 3, 4, 6: linear few-shot on ImageNet"} <= set(COMMANDS)


def check_finetune_plan(plan, row: str, resolution: int) -> None:
    """A fine-tune plan against Table 4's row and the protocol table's fine-tune rows."""
    cfg = plan.config
    o, t, d = cfg.optim, cfg.train, cfg.data
    steps, grid = PAPER_TABLE4[row]
    assert t.steps == steps, row
    assert [a.lr for a in plan.arms] == list(grid), row
    assert all(a.recipe is PLANNED for a in plan.arms), row  # the plan's own (SGD) recipe at each rate: no AdamW arm
    assert plan.sweep_steps is None  # --lr-sweep: every rate trained for the whole run
    # "fine-tune optimiser": SGD momentum 0.9, cosine, no weight decay, clip 1
    optimiser = PROTOCOL["fine-tune optimiser"]
    assert "SGD momentum 0.9" in optimiser and "cosine" in optimiser and "no weight decay" in optimiser
    assert (o.name, o.momentum, o.decay, o.weight_decay, o.clip_grad_norm) == ("sgd", 0.9, "cosine", 0.0,
                                                                                numbers(optimiser.split("clip")[1])[0])
    assert t.batch_size == numbers(PROTOCOL["fine-tune global batch"])[0] == 512
    assert o.warmup_steps == numbers(PROTOCOL["fine-tune warm-up"])[0] == 500
    crop = PROTOCOL["training crop (pretraining, `vitlab finetune`)"]
    area = [v / 100 for v in numbers(crop.split("area")[1])[:2]]
    assert d.crop == "inception" and tuple(d.crop_scale) == tuple(area) == (0.05, 1.0)
    assert tuple(d.crop_ratio) == pytest.approx((3 / 4, 4 / 3)) and "3/4-4/3" in crop and d.hflip and "flip" in crop
    assert cfg.model.head_start == "zeros" and cfg.model.changes["image_size"] == (resolution, resolution)


@pytest.mark.parametrize("row", ["cifar10", "cifar100", "pets", "flowers"])
def test_table2_and_5_fine_tunes_run_table4(row, checkpoint, tmp_path):
    from vitlab.cli.finetune import make_plan

    command = COMMANDS["Table 2 / 5, CIFAR, Pets, Flowers"]
    args = parse(build_parser(), argv(command, checkpoint, D="digits", ROW=row) + ["--out", str(tmp_path / "o")])
    check_finetune_plan(make_plan(args), row, 384)


def test_table2_imagenet_fine_tune_runs_table4(checkpoint, tmp_path):
    from vitlab.cli.finetune import make_plan

    command = COMMANDS["Table 2's ImageNet column (mean ± std of 3)"]
    words = argv(command, checkpoint, **{"imagefolder:DIR": "digits"}) + ["--out", str(tmp_path / "o")]
    args = parse(build_parser(), words)
    plan = make_plan(args)
    check_finetune_plan(plan, "imagenet", 512)
    assert plan.config.train.ema == 0.9999 and args.repeats == 3


def test_the_vtab_command_runs_the_vtab_protocol(checkpoint, tmp_path):
    from vitlab.cli.vtab import settings
    from vitlab.data.vtab import TASKS
    from vitlab.train import vtab
    from vitlab.train.inputs import Inputs

    args = parse(build_parser(), argv(COMMANDS["Table 2's VTAB column, Table 9"], checkpoint, DIR=str(tmp_path)))
    s = settings(args)
    steps, rate, batch, warmup = numbers(PROTOCOL["VTAB steps, rate, batch, warm-up"])
    resolution = numbers(PROTOCOL["VTAB resolution"])[0]
    geometry = PROTOCOL["VTAB training geometry"]
    inputs = Inputs()
    for task in TASKS.values():
        cfg = vtab.task_config(checkpoint, task, tmp_path, s, inputs)
        o, t, d = cfg.optim, cfg.train, cfg.data
        assert (t.steps, o.lr, t.batch_size, o.warmup_steps) == (steps, rate, batch, warmup)
        assert (t.steps, (o.lr,)) == PAPER_TABLE4["vtab"]
        assert (o.name, o.momentum, o.weight_decay, o.decay, o.clip_grad_norm) == ("sgd", 0.9, 0.0, "cosine", 1.0)
        assert cfg.model.changes["image_size"] == (resolution, resolution) == (384, 384)
        assert "`data.crop=whole`" in geometry and "no flip" in geometry and d.crop == "whole" and not d.hflip
        assert d.train_split == "train" and d.eval_splits == ("test",)


def test_the_fewshot_command_runs_big_visions_protocol(checkpoint, tmp_path):
    import vitlab
    from vitlab.cli.fewshot import PRESETS, _check
    from vitlab.eval.fewshot import BIG_VISION_L2, parse_l2, protocol as record

    args = parse(build_parser(), argv(COMMANDS["Fig. 3, 4, 6: linear few-shot on ImageNet"], checkpoint,
                                      **{"wds:PATTERN": "digits"}))
    _check(args)
    assert (args.train_split, args.test_split) == PRESETS["imagenet"] == ("train[:65000]", "val")
    assert "`--preset imagenet` is big_vision's `train[:65000]` pool" in PROTOCOL["few-shot pool"]
    l2 = parse_l2(args.l2)
    assert l2 == BIG_VISION_L2 == 2.0 ** numbers(PROTOCOL["few-shot L2"].split("^")[1])[0]
    config = vitlab.load(checkpoint).config.replace(image_size=224)  # the protocol at the paper's 224
    used = record(args.pool, l2, config, args.preprocess)
    resize, crop = numbers(PROTOCOL["few-shot preprocessing"])[:2]
    assert used["preprocessing"] == f"resize {resize:g} -> centre crop {crop:g}" == "resize 256 -> centre crop 224"
    assert used["big_vision"] and used["pool"] == "whole training split"


def test_the_imagenet_eval_command_runs_at_384(checkpoint):
    args = parse(build_parser(), argv(COMMANDS["Table 2 / 5, ImageNet and ImageNet ReaL"], checkpoint,
                                      **{"imagenet-val:DIR": "digits"}))
    assert args.image_size == 384 and args.real == "real.json"
