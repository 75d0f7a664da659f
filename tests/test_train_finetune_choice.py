"""The recipe choice of `vitlab finetune` (train/finetune_choice.py): the arms, the configs
they train, the verdict and its noise, the compute they add up to, the thread policy."""

from __future__ import annotations

import json

import pytest

from vitlab.config import load_recipe
from vitlab.train import finetune_choice as choice
from vitlab.train.inputs import Inputs
from vitlab.train.recipe import Given

TABLE4 = (0.001, 0.003, 0.01, 0.03)


def test_auto_tries_both_recipes_and_a_named_one_only_itself():
    auto = choice.arms("auto", TABLE4)
    assert [(a.recipe.name, a.lr) for a in auto] == [("paper", r) for r in TABLE4] + [("adamw", 0.0003), ("adamw", 0.001)]
    assert [a.name for a in choice.arms("adamw", TABLE4)] == ["adamw-lr-0.0003", "adamw-lr-0.001"]
    assert [a.lr for a in choice.arms("paper", TABLE4, rates=(0.05, 0.1))] == [0.05, 0.1]  # --lr-grid
    assert len(choice.arms("auto", TABLE4, rates=(0.05,))) == 6  # a grid for one recipe cannot serve both


def test_a_recipe_changes_the_config_but_not_what_the_user_set():
    cfg = load_recipe("finetune").with_overrides({"train.steps": 200, "model.checkpoint": "source.safetensors"})
    adamw = choice.apply(cfg.with_overrides({"train.label_smoothing": 0.1}), choice.ADAMW, explicit=set())
    # No label smoothing: the probe head it starts from is fitted on plain labels (0.1 took a 2%
    # BiT of paper/data-size 1.2 points above its dev start at 0.0003 where 0 took it 3.7 above).
    assert (adamw.optim.name, adamw.optim.weight_decay, adamw.train.label_smoothing) == ("adamw", 0.05, 0.0)
    assert (adamw.data.crop, adamw.data.hflip, adamw.optim.warmup_steps) == ("whole", False, 50)  # 25% of 200
    paper = choice.apply(cfg, choice.PAPER, explicit=set())
    assert (paper.optim.name, paper.optim.warmup_steps, paper.data.crop_scale) == ("sgd", 10, (0.05, 1.0))
    kept = choice.apply(cfg.with_overrides({"train.label_smoothing": 0.3, "optim.warmup_steps": 7}), choice.ADAMW,
                        explicit={"train.label_smoothing", "optim.warmup_steps"})
    assert kept.train.label_smoothing == 0.3 and kept.optim.warmup_steps == 7 and kept.optim.name == "adamw"
    short = choice.sweep_config(cfg, choice.Arm(choice.ADAMW, 0.003), set(), steps=12)
    # A short arm is the run's first steps: it warms up as the 200-step run does (50 steps), for
    # all of its 12 (a share of the arm alone, 3 steps, took AdamW from a probe head's loss of
    # 1.3 to 9.9 at its second step in paper/data-size).
    assert (short.train.steps, short.optim.lr, short.optim.warmup_steps) == (12, 0.003, 12)
    paper_arm = choice.sweep_config(cfg, choice.Arm(choice.PAPER, 0.01), set(), steps=12)
    assert paper_arm.optim.warmup_steps == 10  # 5% of the 200-step run
    assert short.data.train_split == "train-minus-dev" and short.data.eval_splits == ("dev",)


def test_the_verdict_says_by_how_much_and_whether_it_is_noise():
    recipes = {"paper-lr-0.01": "paper", "paper-lr-0.03": "paper", "adamw-lr-0.001": "adamw"}
    lrs = {"paper-lr-0.01": "paper lr 0.01", "paper-lr-0.03": "paper lr 0.03", "adamw-lr-0.001": "adamw lr 0.001"}
    clear = choice.verdict({"paper-lr-0.01": 0.20, "paper-lr-0.03": 0.31, "adamw-lr-0.001": 0.80}, recipes, 144)
    assert clear["best"] == "adamw-lr-0.001" and clear["runner_up"] == "paper-lr-0.03"
    assert clear["margin"] == pytest.approx(0.49) and not clear["within_noise"]
    line = choice.verdict_line(clear, lrs)
    assert "recipe: adamw (lr 0.001) scored 80.0% on the 144 dev images" in line
    assert "paper's best (lr 0.03) 31.0%: adamw by 49.0 points, noise (2 standard errors)" in line
    close = choice.verdict({"paper-lr-0.01": 0.50, "paper-lr-0.03": 0.52, "adamw-lr-0.001": 0.51}, recipes, 100)
    assert close["recipe"] == "paper" and close["within_noise"]
    assert "within the noise, so the choice is uncertain" in choice.verdict_line(close, lrs)
    # A tie goes to the paper's recipe.
    assert choice.verdict({"paper-lr-0.01": 0.5, "adamw-lr-0.001": 0.5}, recipes, 100)["recipe"] == "paper"
    # Two standard errors of a difference of accuracies: wider on fewer images.
    assert choice.two_standard_errors(0.5, 0.5, 100) == pytest.approx(2 * (0.5 / 100) ** 0.5)
    assert choice.two_standard_errors(0.8, 0.8, 10_000) < choice.two_standard_errors(0.8, 0.8, 144)


def test_sweep_compute_adds_up():
    part = {"forward_gflops": 0.05, "images_seen": 640, "train_flops": 96e9, "wall_s": 2.0, "cpu_s": 3.0, "gpu_s": 0.0,
            "device": "cpu (1 thread)"}
    total = choice.summed_compute([{"compute": part}, {"compute": {**part, "images_seen": 1280, "train_flops": 192e9}}])
    assert total["images_seen"] == 1920 and total["train_flops"] == pytest.approx(288e9) and total["cpu_s"] == 6.0
    assert total["device"] == "cpu (1 thread)"


def test_threads_come_from_the_source_run(tmp_path):
    run = tmp_path / "src"
    (run / "checkpoints").mkdir(parents=True)
    source_cfg = load_recipe("cifar10")  # 1 thread, 1 data worker
    (run / "config.yaml").write_text(json.dumps(source_cfg.to_dict()))  # JSON is YAML
    cfg = load_recipe("finetune")
    changes, line = choice.thread_policy(cfg, str(run / "checkpoints" / "last.safetensors"), explicit=set(), inputs=Inputs())
    assert changes == {"train.threads": 1, "data.num_workers": 1}
    assert line.startswith("threads: 1 compute thread and 1 data worker, as the source run trained (")
    kept, line = choice.thread_policy(cfg, str(run / "checkpoints" / "last.safetensors"), explicit={"train.threads"}, inputs=Inputs())
    assert kept == {"data.num_workers": 1}
    elsewhere, line = choice.thread_policy(cfg, str(tmp_path / "model.safetensors"), explicit=set(), inputs=Inputs())
    assert elsewhere == {"train.threads": 0, "data.num_workers": 0}
    assert "one compute thread per core and 0 data workers, the recipe's (the source is not a vitlab run)" in line
    (run / "config.yaml").write_text("model: [")  # damaged: treated as no source run
    assert Inputs().source_config(str(run / "checkpoints" / "last.safetensors")) is None


def test_repeats_reuse_the_chosen_recipe_not_only_its_rate(tmp_path):
    import torch

    import vitlab
    from vitlab.train import finetune, repeats

    torch.manual_seed(0)
    ck = tmp_path / "ck.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=16, patch_size=4, in_channels=1, mean=(0.5,), std=(0.5,),
                                    hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5), ck)
    plan = finetune.plan(finetune.Settings(str(ck), "digits", Given.of({"train.steps": 40}), out=tmp_path / "ft"), Inputs())
    seen = []

    def fake(p):  # the first run sweeps and picks AdamW at 0.003; the others must train that
        seen.append((bool(p.arms), p.config.optim.name, p.config.optim.lr, p.config.optim.weight_decay, p.config.data.crop))
        final = {"splits": {"test": {"top1": 0.5}}}
        return {"best_recipe": "adamw", "best_lr": 0.003, "final": final} if p.arms else final

    repeats.repeat(plan, 3, fake, log=lambda _: None)
    assert seen[0][0] and seen[1:] == [(False, "adamw", 0.003, 0.05, "whole")] * 2


def test_a_diverging_arm_loses_the_sweep_and_says_so(tmp_path):
    """In a sweep cell a diverging loss stops a run (TrainingDiverged); in a rate sweep it is the
    answer to the question asked (this rate is too high), so the arm is out of the choice and
    the others decide. A sweep whose every arm diverges stops."""
    from vitlab.train.report import TrainingDiverged

    cfg = load_recipe("finetune").with_overrides({"train.steps": 100, "model.checkpoint": "source.safetensors"})
    arms = choice.arms("adamw", TABLE4)
    trained = []

    def train(c, out, _notes=()):
        if c.optim.lr == 0.001:
            raise TrainingDiverged("the training loss went from 1.424 at step 1 to 4.81 at step 7")
        trained.append((out.name, c.optim.lr))
        return {"splits": {"dev": {"top1": 0.55, "count": 6000}, "test": {"top1": 0.6}}}

    said = []
    result = choice.choose(cfg, tmp_path, arms, 10, set(), train, said.append)
    assert trained == [("adamw-lr-0.0003", 0.0003), ("final", 0.0003)] and result["best_lr"] == 0.0003
    (hot,) = [a for a in result["arms"] if a["lr"] == 0.001]
    assert hot["dev_top1"] is None and "4.81" in hot["diverged"]
    assert "sweep: adamw lr 0.001 -> diverged, out of the choice" in said
    with pytest.raises(TrainingDiverged):
        choice.choose(cfg, tmp_path / "all", [choice.Arm(choice.ADAMW, 0.001)], 10, set(), train, said.append)
