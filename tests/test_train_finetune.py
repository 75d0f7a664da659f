"""The fine-tuning defaults fitted to the checkpoint and the data (train/finetune.py)."""

from __future__ import annotations

from vitlab.config import load_recipe
from vitlab.train import finetune


def test_defaults_scale_to_a_small_training_set():
    cfg = load_recipe("finetune").with_overrides({"train.steps": 500})
    fitted = finetune.fit_defaults(cfg, 1_293, explicit=set())
    t, o = fitted.config.train, fitted.config.optim
    # The recipe's global batch is kept, as micro-batches of at most a quarter of the data.
    assert t.batch_size == 512 and t.micro_batch_size == 256 and 1_293 // 256 >= finetune.MIN_STEPS_PER_EPOCH
    assert o.warmup_steps == 25 <= 0.05 * t.steps  # the recipe's 500 would be the whole run
    assert fitted.quick_sweep_steps == 50 and o.lr == cfg.optim.lr
    text = " | ".join(fitted.notes)
    assert "warm-up 25 steps: 5% of the 500" in text and "as 2 micro-batches of 256" in text and "quick sweep" in text
    # Flowers (Table 4: 500 steps, batch 512) on its 2,040 training images, minus the 10% dev split:
    # vision_transformer's protocol, batch 512 and warm-up 500, kept.
    flowers = finetune.fit_defaults(cfg, 1_836, explicit=set(), table4_steps=finetune.TABLE4_STEPS["flowers"])
    assert (flowers.config.train.batch_size, flowers.config.optim.warmup_steps) == (512, 500)
    assert flowers.config.train.micro_batch_size == 256
    tiny = finetune.fit_defaults(cfg, 300, explicit=set())  # fewer images than one batch: a smaller batch
    assert tiny.config.train.batch_size == 64 and "more than the 300 training images" in " ".join(tiny.notes)


def test_defaults_leave_large_data_and_explicit_choices_alone():
    cfg = load_recipe("finetune").with_overrides({"train.steps": 10_000})
    big = finetune.fit_defaults(cfg, 50_000, explicit=set())
    assert big.config.train.batch_size == 512 and big.config.optim.warmup_steps == 500  # the paper's own numbers
    assert big.quick_sweep_steps is None and any("--lr-sweep picks it" in n for n in big.notes)
    small = cfg.with_overrides({"train.steps": 100, "train.batch_size": 1024, "optim.warmup_steps": 80})
    kept = finetune.fit_defaults(small, 300, explicit={"train.batch_size", "optim.warmup_steps", "optim.lr"})
    assert kept.config == small and kept.quick_sweep_steps is None
    assert finetune.fit_defaults(small, 300, set(), lr_sweep_asked=True).quick_sweep_steps is None


def test_resolution_notes_and_the_papers_step_up():
    assert finetune.paper_step_up((224, 224), 16) == 384
    assert finetune.paper_step_up((32, 32), 4) == 56 and finetune.paper_step_up((16, 16), 4) == 28
    assert "the checkpoint's own" in finetune.resolution_note((32, 32), explicit=False)
    assert finetune.resolution_note((48, 48), explicit=True) == "resolution 48x48 (--image-size)"


def test_the_edge_of_the_grid_is_named():
    grid = (0.001, 0.003, 0.01, 0.03)
    assert "largest" in finetune.edge_note(grid, 0.03) and "0.09" in finetune.edge_note(grid, 0.03)
    assert "smallest" in finetune.edge_note(grid, 0.001)
    assert finetune.edge_note(grid, 0.01) == ""


def test_a_sweep_that_cannot_tell_the_rates_apart_says_so():
    # 21 vs 20 of 144 dev images (the transfer table's digits sweep): one image apart.
    close = {0.001: 14 / 144, 0.003: 11 / 144, 0.01: 21 / 144, 0.03: 20 / 144}
    note = finetune.noise_note(close, 144)
    assert "within sampling noise" in note and "14.6%" in note and "13.9%" in note
    # 900 vs 600 of 1,000 (a CIFAR-sized dev split): far apart.
    assert finetune.noise_note({0.001: 0.6, 0.003: 0.9, 0.01: 0.5}, 1000) == ""
    # The same gap of 3 points is noise on 100 images and a real difference on 10,000.
    assert finetune.noise_note({0.01: 0.80, 0.03: 0.83}, 100) != ""
    assert finetune.noise_note({0.01: 0.80, 0.03: 0.83}, 10_000) == ""
    assert finetune.noise_note({0.01: 0.5}, 100) == ""


def test_recipe_paper_keeps_the_papers_protocol_and_auto_chooses(tmp_path):
    import torch

    import vitlab

    torch.manual_seed(0)
    ck = tmp_path / "ck.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=16, patch_size=4, in_channels=1, mean=(0.5,), std=(0.5,),
                                    hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5), ck)
    paper = finetune.plan(str(ck), "digits", choose="paper")
    assert paper.config.optim.name == "sgd" and paper.arms == [] and paper.sweep and paper.sweep_steps == 50
    assert any("a quick sweep first, Table 4's grid" in n for n in paper.notes)
    auto = finetune.plan(str(ck), "digits")
    assert [a.name for a in auto.arms][::4] == ["paper-lr-0.001", "adamw-lr-0.0003"] and auto.sweep_steps == 25
    fixed = finetune.plan(str(ck), "digits", options={"lr": 0.002}, choose="adamw")
    assert fixed.config.optim.name == "adamw" and fixed.config.optim.lr == 0.002 and not fixed.sweep
    assert fixed.config.optim.warmup_steps == 125 and fixed.config.train.label_smoothing == 0.1  # 25% of 500
    given = finetune.plan(str(ck), "digits", options={"lr": 0.01})
    assert given.config.optim.name == "sgd" and not given.sweep
    assert any("as --lr was given: no sweep chooses" in n for n in given.notes)
    by_epochs = finetune.plan(str(ck), "digits", options={"epochs": 2.0, "batch_size": 64})
    assert by_epochs.config.train.steps == 44 and by_epochs.sweep_steps == 10  # 2 x (1,437 // 64); at least 10 an arm
    # Another recipe (Table 2's) is followed as it is: no choice unless asked for.
    table2 = finetune.plan(str(ck), "digits", recipe="table2-finetune-imagenet-384", options={"steps": 40})
    assert table2.arms == [] and table2.config.optim.name == "sgd"
    assert finetune.plan(str(ck), "digits", recipe="table2-finetune-imagenet-384", options={"steps": 40},
                         choose="auto").arms
    # --table4 declares the dataset, and with it the paper's dev split.
    assert finetune.plan(str(ck), "digits", table4="cifar10", options={"steps": 40}).config.data.dev_fraction == 0.02
