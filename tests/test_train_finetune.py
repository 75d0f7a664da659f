"""The fine-tuning defaults fitted to the checkpoint and the data (train/finetune.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitlab.config import load_recipe
from vitlab.train import finetune, finetune_choice as choice
from vitlab.train.inputs import Inputs
from vitlab.train.recipe import Given


def plan(ck, data: str = "digits", values: Any = None, overrides: tuple = (), **settings) -> finetune.Plan:
    """finetune.plan of these settings ({"optim.lr": 0.01}, SECTION.KEY=VALUE), on a plan of its own."""
    return finetune.plan(finetune.Settings(str(ck), data, Given.of(values or {}, overrides), **settings), Inputs())


def test_defaults_scale_to_a_small_training_set():
    cfg = load_recipe("finetune").with_overrides({"train.steps": 500})
    fitted = finetune.fit_defaults(cfg, 1_293, explicit=set())
    t, o = fitted.config.train, fitted.config.optim
    # The recipe's global batch is kept, as micro-batches of at most a quarter of the data.
    assert t.batch_size == 512 and t.micro_batch_size == 256 and 1_293 // 256 >= finetune.MIN_STEPS_PER_EPOCH
    assert o.warmup_steps == 25 <= 0.05 * t.steps  # the recipe's 500 would be the whole run
    assert fitted.quick_sweep_steps == 25 == choice.arm_steps(500) and o.lr == cfg.optim.lr  # one quick share
    text = " | ".join(fitted.notes)
    assert "warm-up 25 steps: 5% of the 500" in text and "as 2 micro-batches of 256" in text and "quick sweep" in text
    # Flowers (Table 4: 500 steps, batch 512) on its 2,040 training images, minus the 10% dev split:
    # vision_transformer's protocol, batch 512 and warm-up 500, kept.
    flowers = finetune.fit_defaults(cfg, 1_836, explicit=set(), table4_steps=finetune.TABLE4_STEPS["flowers"])
    assert (flowers.config.train.batch_size, flowers.config.optim.warmup_steps) == (512, 500)
    assert flowers.config.train.micro_batch_size == 256
    # 500 steps with the recipe's log line every 50 would draw a 10-point curve: every 25, 20 points.
    assert t.log_every == 25 and "a log line every 25 steps: 20 points on the learning curve" in text
    short = finetune.fit_defaults(load_recipe("finetune").with_overrides({"train.steps": 20}), 1_293, explicit=set())
    assert short.config.train.log_every == 1  # a 20-step fine-tune logs (and draws) every step
    assert "a log line every step: 20 points on the learning curve" in " ".join(short.notes)
    assert short.config.optim.warmup_steps == 1 and "warm-up 1 step: 5% of the 20" in " ".join(short.notes)  # one step
    kept = finetune.fit_defaults(load_recipe("finetune").with_overrides({"train.steps": 20}), 1_293, {"train.log_every"})
    assert kept.config.train.log_every == 50
    tiny = finetune.fit_defaults(cfg, 300, explicit=set())  # fewer images than one batch: a smaller batch
    assert tiny.config.train.batch_size == 64 and "more than the 300 training images" in " ".join(tiny.notes)


def test_defaults_leave_large_data_and_explicit_choices_alone():
    cfg = load_recipe("finetune").with_overrides({"train.steps": 10_000})
    big = finetune.fit_defaults(cfg, 50_000, explicit=set())
    assert big.config.train.batch_size == 512 and big.config.optim.warmup_steps == 500  # the paper's own numbers
    assert big.quick_sweep_steps is None and any("--lr-sweep picks it" in n for n in big.notes)
    small = cfg.with_overrides({"train.steps": 100, "train.batch_size": 1024, "optim.warmup_steps": 80})
    kept = finetune.fit_defaults(small, 300, explicit={"train.batch_size", "optim.warmup_steps", "optim.lr", "train.log_every"})
    assert kept.config == small and kept.quick_sweep_steps is None
    assert finetune.fit_defaults(small, 300, set(), lr_sweep_asked=True).quick_sweep_steps is None


def test_resolution_notes_and_the_papers_step_up():
    assert finetune.paper_step_up((224, 224), 16) == 384
    assert finetune.paper_step_up((32, 32), 4) == 56 and finetune.paper_step_up((16, 16), 4) == 28
    assert "the checkpoint's own" in finetune.resolution_note((32, 32), explicit=False)
    assert finetune.resolution_note((48, 48), explicit=True) == "resolution 48x48 (--image-size)"
    stepped = finetune.resolution_note((384, 384), explicit=True, stepped_from=(224, 224))
    assert stepped.startswith("resolution 384x384: the paper's step up from the checkpoint's 224x224 (--paper-resolution")


def test_paper_resolution_steps_up_a_bit_checkpoint(tmp_path):
    """A BiT ResNet has no patch grid (its config no total_stride, which planning read and
    raised AttributeError on): it takes any size, so the paper's step up rounds to the pixel."""
    import torch

    import vitlab

    torch.manual_seed(0)
    model = vitlab.create_model("BiT-R50x1", image_size=32, stem="cifar", layers=(1, 1, 1, 1), base_width=16, gn_groups=4,
                                num_classes=10)
    vitlab.save(model, tmp_path / "bit.safetensors")
    planned = plan(tmp_path / "bit.safetensors", paper_resolution=True, out=tmp_path / "ft", choose="paper")
    assert planned.config.model.changes["image_size"] == (55, 55)  # round(32 * 384 / 224)


def test_the_edge_of_the_grid_is_named():
    grid = (0.001, 0.003, 0.01, 0.03)
    assert "largest" in choice.edge_note(grid, 0.03) and "0.09" in choice.edge_note(grid, 0.03)
    assert "smallest" in choice.edge_note(grid, 0.001)
    assert choice.edge_note(grid, 0.01) == ""


def rate_verdict(scores: dict[float, float], dev_count: int) -> dict:
    """The one verdict of a sweep of rates alone (the paper's protocol: the plan's own recipe)."""
    arms = [choice.Arm(choice.PLANNED, lr) for lr in scores]
    return choice.verdict({a.name: scores[a.lr] for a in arms}, {a.name: "" for a in arms}, dev_count)


def test_a_sweep_that_cannot_tell_the_rates_apart_says_so():
    # 21 vs 20 of 144 dev images (the transfer table's digits sweep): one image apart.
    close = rate_verdict({0.001: 14 / 144, 0.003: 11 / 144, 0.01: 21 / 144, 0.03: 20 / 144}, 144)
    line = choice.verdict_line(close, {f"lr-{lr:g}": f"lr {lr:g}" for lr in (0.001, 0.003, 0.01, 0.03)})
    assert close["within_noise"] and close["best"] == "lr-0.01" and close["runner_up"] == "lr-0.03"
    assert "within the noise" in line and "14.6%" in line and "13.9%" in line and "the next best, lr 0.03" in line
    # 900 vs 600 of 1,000 (a CIFAR-sized dev split): far apart.
    assert not rate_verdict({0.001: 0.6, 0.003: 0.9, 0.01: 0.5}, 1000)["within_noise"]
    # The same gap of 3 points is noise on 100 images and a real difference on 10,000.
    assert rate_verdict({0.01: 0.80, 0.03: 0.83}, 100)["within_noise"]
    assert not rate_verdict({0.01: 0.80, 0.03: 0.83}, 10_000)["within_noise"]
    assert "within_noise" not in rate_verdict({0.01: 0.5}, 100)


def test_recipe_paper_keeps_the_papers_protocol_and_auto_chooses(tmp_path):
    import torch

    import vitlab

    torch.manual_seed(0)
    ck = tmp_path / "ck.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=16, patch_size=4, in_channels=1, mean=(0.5,), std=(0.5,),
                                    hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5), ck)
    paper = plan(ck, choose="paper")
    assert paper.config.optim.name == "sgd" and paper.arms and paper.sweep_steps == 25  # the same quick share
    assert [a.name for a in paper.arms] == ["lr-0.001", "lr-0.003", "lr-0.01", "lr-0.03"]  # the rate alone
    assert any("a quick sweep first, Table 4's grid" in n for n in paper.notes)
    auto = plan(ck)
    assert [a.name for a in auto.arms][::4] == ["paper-lr-0.001", "adamw-lr-0.0003"] and auto.sweep_steps == 25
    fixed = plan(ck, values={"optim.lr": 0.002}, choose="adamw")
    assert fixed.config.optim.name == "adamw" and fixed.config.optim.lr == 0.002 and not fixed.arms
    assert fixed.config.optim.warmup_steps == 125 and fixed.config.train.label_smoothing == 0.0  # 25% of 500
    given = plan(ck, overrides=("optim.lr=0.01",))
    assert given.config.optim.name == "sgd" and not given.arms
    assert any("as --lr was given: no sweep chooses" in n for n in given.notes)
    by_epochs = plan(ck, values={"train.epochs": 2.0, "train.steps": 0, "train.batch_size": 64})
    assert by_epochs.config.train.steps == 44 and by_epochs.sweep_steps == 10  # 2 x (1,437 // 64); at least 10 an arm
    # Another recipe (Table 2's) is followed as it is: no choice unless asked for.
    table2 = plan(ck, values={"train.steps": 40}, recipe="table2-finetune-imagenet-384")
    assert all(a.recipe is choice.PLANNED for a in table2.arms) and table2.config.optim.name == "sgd"  # its rate alone
    assert plan(ck, values={"train.steps": 40}, recipe="table2-finetune-imagenet-384", choose="auto").arms
    # --table4 declares the dataset, and with it the paper's dev split.
    assert plan(ck, values={"train.steps": 40}, table4="cifar10").config.data.dev_fraction == 0.02


def count_reads(monkeypatch) -> dict[str, Any]:
    """Counters of what a command reads, patched where every module finds it: checkpoint files
    (io.read) and their headers (io.read_metadata), recipes (load_recipe), each run folder's
    config.yaml (RunFolder.read_config), the data sources' files (digits' arrays, each tfds
    TFRecord file indexed), dataset opens by split, and the probe head's fits (their image counts)."""
    import sys
    from collections import Counter

    from vitlab.checkpoints import io
    from vitlab.config import load_recipe
    from vitlab.data import datasets, open as data_open, vtab_sources
    from vitlab.train import probe_head
    from vitlab.train.run_folder import RunFolder

    seen: dict[str, Any] = {k: Counter() for k in ("checkpoint", "header", "recipe", "config.yaml", "source", "opens",
                                                     "opened")}
    seen["fits"] = []
    read, header, open_dataset, digits, examples, fitted, read_config = (
        io.read, io.read_metadata, data_open.open_dataset, datasets.digits_arrays, vtab_sources.Records,
        probe_head.fitted, RunFolder.read_config)

    def counted_open(spec, split, *args, **kwargs):
        seen["opens"][split] += 1
        seen["opened"][spec, split] += 1
        return open_dataset(spec, split, *args, **kwargs)

    def counted(name: str, real: Any) -> Any:
        return lambda *a, **k: seen[name].update([str(a[0])]) or real(*a, **k)

    monkeypatch.setattr(io, "read", counted("checkpoint", read))
    monkeypatch.setattr(io, "read_metadata", counted("header", header))
    for module in list(sys.modules.values()):  # every module that holds the name
        for name, real, patched in (("open_dataset", open_dataset, counted_open),
                                    ("load_recipe", load_recipe, counted("recipe", load_recipe))):
            if getattr(module, name, None) is real:
                monkeypatch.setattr(module, name, patched)
    monkeypatch.setattr(datasets, "digits_arrays", lambda *a: seen["source"].update(["digits.npz"]) or digits(*a))
    monkeypatch.setattr(vtab_sources, "Records",
                        lambda files: seen["source"].update(str(f) for f in files) or examples(files))
    monkeypatch.setattr(probe_head, "fitted", lambda model, images, *a: seen["fits"].append(len(images)) or fitted(model, images, *a))
    monkeypatch.setattr(RunFolder, "read_config", lambda self: seen["config.yaml"].update([str(self.path)]) or read_config(self))
    return seen


READS = ("checkpoint", "header", "recipe", "config.yaml", "source")  # each read once per command, whatever it runs


def reads_table(commands: dict[str, dict[str, Any]]) -> str:
    """The counting tests' table (the issue's "Must show"): for each command, how many times it
    read each thing (the most any one file was read, and how many files there were)."""
    from vitlab.tables import markdown_table

    def cell(c: Any) -> str:
        times = "once" if max(c.values(), default=0) == 1 else f"{max(c.values(), default=0)} times"
        return times + (f" each, {len(c)} files" if len(c) > 1 else "")

    return markdown_table(["read", *commands], [[r, *(cell(seen[r]) for seen in commands.values())] for r in READS])


TABLE: dict[str, dict[str, Any]] = {}  # the counting tests' counts so far, each test printing them (pytest -s)


def source_run(tmp_path) -> Path:
    """A tiny network's checkpoint in a vitlab run folder (RUN/checkpoints/, RUN/config.yaml), as
    `vitlab train` leaves it: what a fine-tune usually starts from."""
    import torch

    import vitlab
    from vitlab.config import load_recipe
    from vitlab.train.run_folder import RunFolder

    torch.manual_seed(0)
    run = tmp_path / "source"
    ck = run / "checkpoints" / "last.safetensors"
    ck.parent.mkdir(parents=True)
    vitlab.save(vitlab.create_model("ViT-Ti/4", image_size=8, patch_size=4, in_channels=1, mean=(0.5,), std=(0.5,),
                                    hidden_size=16, depth=1, num_heads=2, mlp_dim=32, num_classes=5), ck)
    RunFolder(run).write_config(load_recipe("digits").with_overrides({"train.threads": 1}))
    return ck


def test_a_default_fine_tune_reads_its_checkpoint_once_and_each_split_once(tmp_path, monkeypatch):
    """The plan is made once per command and carries what it read: a default fine-tune (the
    six-arm recipe sweep, the final run) repeated twice reads the checkpoint file once (its
    header once), the recipe once, the source run's config.yaml once, the data source's file
    once (dev and train-minus-dev are selections of the one opened train split), and fits the
    probe head once per split (train-minus-dev for the AdamW arms, train for the final runs).
    Before issue 41: 16 checkpoint reads and 19 dataset opens; before issue 55, the header twice
    (format detection, then the reader) and the recipe twice without --steps."""
    from vitlab.train import repeats

    ck = source_run(tmp_path)
    seen = count_reads(monkeypatch)
    planned = plan(ck, values={"train.steps": 20, "train.batch_size": 32}, overrides=("train.threads=1",),
                   out=tmp_path / "ft")
    assert len(planned.arms) == 6 and planned.sweep_steps == 10  # the default: both recipes, a quick sweep
    result = repeats.repeat(planned, 2, lambda p: finetune.run(p, quiet=True), log=lambda _: None)
    assert result["runs"][1]["lr"] == result["best_lr"]
    TABLE["vitlab finetune (6 arms, 2 repeats)"] = seen
    print("\n" + reads_table(TABLE))
    assert seen["checkpoint"] == {str(ck): 1} and seen["header"] == {str(ck): 1}
    assert seen["recipe"] == {"finetune": 1} and seen["config.yaml"] == {str(ck.parent.parent): 1}
    assert seen["opens"] == {"train": 1, "test": 1} and seen["source"] == {"digits.npz": 1}
    assert sorted(seen["fits"]) == [1_293, 1_437]  # one fit per split, however many runs start from it
    second = json.loads((tmp_path / "ft" / "seed-1" / "summary.json").read_text())
    if result["best_recipe"] == "adamw":  # its head is the first final run's, and no forward pass is counted twice
        assert second["head_probe"]["shared_with_earlier_run"] and "forward_images" not in second["compute"]


def test_a_vtab_row_on_tfds_data_reads_everything_once(tfds_root, tmp_path, monkeypatch):
    """`vitlab vtab`'s tasks and their grid arms share one plan, and so does the row: three
    tasks of tfds data (two of them dSprites, one source) with a two-rate grid (nine runs), and
    the row after them, read the checkpoint file once (its header once), the recipe once, the
    source run's config.yaml once, each TFRecord file of each source once, and open each split
    of each task once (VTAB's own: train800val200, train800, val200, test). Before (8e29570,
    measured the same way): the header twice, the recipe 14 times, config.yaml twice
    (the command made the row on a plan of its own), each TFRecord file up to 8 times."""
    from vitlab.data.vtab import TASKS
    from vitlab.train import recipe, vtab

    ck, (root, _) = source_run(tmp_path), tfds_root
    tasks = [TASKS["dsprites_location"], TASKS["dsprites_orientation"], TASKS["smallnorb_azimuth"]]
    seen = count_reads(monkeypatch)
    s = vtab.Settings(steps=2, batch_size=4, grid=(0.001, 0.01), image_size=8, overrides=("train.threads=1",))
    row, _ = vtab.run_suite(str(ck), root, tmp_path / "out", tasks, s, lambda c, o, i: recipe.train(c, o, i, quiet=True),
                            Inputs(), log=lambda _: None)
    assert row["mean"]["tasks"] == 3
    TABLE["vitlab vtab (3 tfds tasks x 3 runs, the row)"] = seen
    assert seen["checkpoint"] == {str(ck): 1} and seen["header"] == {str(ck): 1}
    assert seen["recipe"] == {"finetune": 1} and seen["config.yaml"] == {str(ck.parent.parent): 1}
    shards = sorted(str(f) for f in root.rglob("*.tfrecord*") if f.parts[-3] in ("dsprites", "smallnorb"))
    assert sorted(seen["source"]) == shards and set(seen["source"].values()) == {1}, seen["source"]
    assert len(seen["opened"]) == 12 and set(seen["opened"].values()) == {1}, seen["opened"]  # 3 tasks x 4 splits
    print("\n" + reads_table(TABLE))


def test_random_start_is_the_checkpoints_network_with_untrained_weights(tiny_checkpoint, tmp_path):
    """`vitlab finetune --random-init SEED`, the control arm of a transfer score: the same
    network and classes, the seed's weights (the same for the same seed), none of the source's."""
    import pytest
    import torch

    import vitlab
    from vitlab.config import ConfigError

    first = finetune.random_start(str(tiny_checkpoint), 3, tmp_path / "runs" / "scratch")
    again = finetune.random_start(str(tiny_checkpoint), 3, tmp_path / "again" / "scratch")
    other = finetune.random_start(str(tiny_checkpoint), 4, tmp_path / "other" / "scratch")
    assert first == str(tmp_path / "runs" / "scratch.random-init-3.safetensors")
    source, a, b, c = (vitlab.load(p) for p in (tiny_checkpoint, first, again, other))
    assert a.config == source.config and a.class_names == source.class_names
    sa, ss, sc, K = a.state_dict(), source.state_dict(), c.state_dict(), "patch_embed.proj.weight"
    assert all(torch.equal(sa[k], v) for k, v in b.state_dict().items())
    assert not torch.equal(sa[K], ss[K]) and not torch.equal(sa[K], sc[K])
    with pytest.raises(ConfigError, match="no such checkpoint"):
        finetune.random_start(str(tmp_path / "absent.safetensors"), 0, tmp_path / "x")



def test_the_docs_and_help_say_the_batch_rule_the_program_follows():
    """docs/training.md's fine-tune transcript is quoted from a real run (test_docs.py does not
    compare its lines), so its batch plan line and training line are held here to what
    fit_defaults plans for the same 1,437 digits, and `finetune --help`'s batch rule to the
    recipe's batch and the micro-batches the program runs."""
    import re
    from pathlib import Path

    from vitlab.cli import finetune as cli

    cfg = load_recipe("finetune").with_overrides({"train.steps": 100})
    doc = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    start = doc.index("$ vitlab finetune runs/digits/checkpoints/last.safetensors --data digits")
    transcript = doc[start:doc.index("```", start)]
    images = [int(n.replace(",", "")) for n in re.findall(r"on digits: ([\d,]+) images", transcript)]
    assert images[-1] == 1_437, images  # the plan is fitted to the whole training set, and the final run trains on it
    fitted = finetune.fit_defaults(cfg, 1_437, explicit=set())
    batch_note = next(note for note in fitted.notes if note.startswith("batch "))
    assert f"  {batch_note}\n" in transcript, f"the doc's batch line is not the program's: {batch_note}"
    t = fitted.config.train
    for n in images:  # the sweep's runs (training set minus dev) and the final run: the same batch
        line = re.search(rf"on digits: {n:,} images, 10 classes, (\d+) steps of (\d+) \((\d+) per epoch\)", transcript)
        assert line and (int(line.group(2)), int(line.group(3))) == (t.batch_size, n // t.batch_size), line.group(0)
    micro = t.micro_batch_size
    assert f"the recipe's {cfg.train.batch_size}" in cli.__doc__
    assert f"{cfg.train.batch_size} as {cfg.train.batch_size // micro} x {micro} on {1_437:,}" in cli.__doc__


def test_vtab_with_a_launcher_checks_and_makes_the_row_on_one_plan(tfds_root, tmp_path, monkeypatch, capsys):
    """`vitlab vtab --launcher` checks the finished tasks' results before it submits the rest
    (sweep/vtab.launch) and makes the row after them on the command's one plan: the source
    run's config.yaml and the recipe read once. Before, the launcher made a plan of its own and
    read each twice."""
    from vitlab.cli import main

    ck, (root, _) = source_run(tmp_path), tfds_root
    argv = ["vtab", str(ck), "--root", str(root), "--out", str(tmp_path / "out"), "--tasks", "smallnorb_azimuth",
            "--steps", "2", "--batch-size", "4", "--image-size", "8", "--quiet", "train.threads=1"]
    assert main(argv) == 0  # the task run here; the launcher finds it finished
    seen = count_reads(monkeypatch)
    assert main([*argv, "--launcher", "local"]) == 0 and "1 finished, 0 to run as jobs" in capsys.readouterr().out
    TABLE["vitlab vtab --launcher (a finished task checked, the row)"] = seen
    assert seen["recipe"] == {"finetune": 1} and seen["config.yaml"] == {str(ck.parent.parent): 1}, seen
