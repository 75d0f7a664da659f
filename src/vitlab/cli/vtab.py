"""VTAB-1k (the paper's Table 2 VTAB column, Fig. 2 and Table 9): every task fine-tuned on its
1,000 training examples (800 train + 200 val, taken as VTAB defines them: fixed slices of the
source order) with the paper's setting (2,500 steps at lr 0.01, SGD, batch 512, no
augmentation, 384 px; --image-size checkpoint keeps the checkpoint's own) and tested on its
full test split. The row, per-task top-1, the Natural / Specialized / Structured means and
the mean over the tasks, goes to OUT/vtab.md, vtab.json and vtab.csv. --lr-grid chooses the rate per task on the 200 val examples first
(train on the 800), then reruns the best on all 1,000.

Task data is read from ROOT, for each task TASK (caltech101, cifar100, dtd, ...: VTAB-1k's
tasks) the first of these that exists:
  ROOT/TASK/{train,validation,test}/LABEL/FILE   image folders, one per split and label,
                                                  files named in the source's record order
  ROOT/TASK/ with dataset_dict.json               a Hugging Face DatasetDict (save_to_disk)
  ROOT/SOURCE/[CONFIG/]VERSION/*.tfrecord-*       tfds's prepared data (ROOT may be
                                                  ~/tensorflow_datasets; read without TensorFlow)
docs/reproducing.md (VTAB-1k) says where to get each task's data. Of tfds data, the config
and version VTAB pins are read (retinopathy's btgraham-300,
pets 3.*.*, kitti 3.1.0, ...); --tfds-version TASK=[CONFIG/]VERSION accepts another, and the
task's result.json records which was read. A task without data is listed with where to put
it, and every mean says over how many of the tasks it is taken. Finished tasks are kept
(OUT/TASK/result.json, with the checkpoint's sha256 and the task's settings), an interrupted
one resumes: rerunning the command is always safe. A result of another checkpoint or other
settings is refused by name, never reported under this one: give another --out. A vtab.md,
vtab.json or vtab.csv that you wrote or edited is kept unless --force. --launcher slurm (or
submitit-local, or local with --jobs N) runs each task as its own job, as vitlab sweep does;
--report writes the row from what has finished.

examples:
  vitlab vtab ViT-B_16.npz --root ~/tensorflow_datasets --out runs/vtab-b16
  vitlab vtab ViT-B_16.npz --root ~/vtab --tasks cifar100,dtd,eurosat --steps 500
  vitlab vtab ViT-B_16.npz --root ~/vtab --lr-grid 0.001,0.01 --launcher slurm --slurm gpus_per_node=1
  vitlab vtab ViT-B_16.npz --root ~/vtab --out runs/vtab-b16 --report
"""

from __future__ import annotations

import argparse

from vitlab.cli.common import COUNT, FOLDER

WRITES = {"out": FOLDER}  # checked writable before any work (vitlab.cli.check_arguments)
RESUMABLE = True  # stopped, the same command continues from the last checkpoint
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "fine-tune a checkpoint on every VTAB-1k task and report them as one Table 9 row"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_device_argument

    p.add_argument("checkpoint", help="pretrained weights: any file vitlab.load reads, or a published name")
    p.add_argument("--root", required=True, metavar="DIR", help="where the tasks' data lies (the layouts above)")
    p.add_argument("--tasks", metavar="T,T,...", help="run only these tasks (default: all; the row shows all)")
    p.add_argument("--out", metavar="DIR", help="the suite folder (default runs/vtab-CHECKPOINT)")
    p.add_argument("--steps", type=COUNT, default=2500, help="fine-tuning steps per task (default 2,500, Table 4)")
    p.add_argument("--lr", type=float, help="learning rate (default 0.01, Table 4)")
    p.add_argument("--lr-grid", metavar="LR,LR,...", help="choose each task's rate from these on its 200 val examples")
    p.add_argument("--batch-size", type=COUNT, default=512)
    p.add_argument("--image-size", default="384", metavar="N", help="fine-tuning resolution (default 384; checkpoint)")
    p.add_argument("--tfds-version", action="append", default=[], metavar="TASK=[CONFIG/]VERSION", help="accept it")
    p.add_argument("--seed", type=int, default=0)
    add_device_argument(p)
    p.add_argument("--launcher", help="run each task as a job: local (with --jobs), slurm or submitit-local")
    p.add_argument("--jobs", type=COUNT, default=1, help="tasks side by side with --launcher local")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE", help="a submitit executor parameter")
    p.add_argument("--no-wait", action="store_true", help="submit the jobs and return (then --report)")
    p.add_argument("--report", action="store_true", help="run nothing: write the row of the finished tasks")
    p.add_argument("--force", action="store_true", help="replace vtab.md/.json/.csv even when edited (never a result)")
    p.add_argument("--quiet", action="store_true", help="print only each task's result and the row")
    p.add_argument("overrides", nargs="*", metavar="SECTION.KEY=VALUE", help="changes to every task's run")


def settings(args: argparse.Namespace):
    """The suite's vtab.Settings from the flags (a task job's command line gives back its suite's)."""
    from vitlab.cli.common import lr_rates
    from vitlab.train import vtab

    return vtab.Settings(steps=args.steps, lr=args.lr, batch_size=args.batch_size, grid=lr_rates(args.lr_grid),
                         image_size=vtab.image_size(args.image_size), seed=args.seed, device=args.device,
                         overrides=tuple(args.overrides), accept=tuple(args.tfds_version))


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from vitlab.cli.common import command_line, launcher_params
    from vitlab.data.vtab import TASKS, get_task
    from vitlab.sweep.vtab import launch
    from vitlab.train import recipe, vtab
    from vitlab.train.inputs import Inputs

    root, out = Path(args.root).expanduser(), Path(args.out or f"runs/vtab-{Path(args.checkpoint).stem}")
    tasks = [get_task(t) for t in args.tasks.split(",")] if args.tasks else list(TASKS.values())
    s, inputs = settings(args), Inputs()  # the one plan of every task, its arms and the row
    if args.launcher and not args.report:
        done = launch(args.checkpoint, root, out, tasks, s, inputs, launcher=args.launcher, jobs=args.jobs,
                      params=launcher_params(args.slurm), wait=not args.no_wait, force=args.force)
        if done is None:
            return 0
        failed = [r for r in done if r["status"] != "done"]
    if args.report or args.launcher:
        row, paths = vtab.report(args.checkpoint, root, out, s, inputs, args.force)
    else:
        row, paths = vtab.run_suite(args.checkpoint, root, out, tasks, s, lambda c, o, i: recipe.train(
            c, o, i, command=command_line(), quiet=args.quiet), inputs, force=args.force)
    print(vtab.markdown(row) + f"\nrow written to {paths['markdown']}, {paths['json'].name}, {paths['csv'].name}")
    if args.launcher and not args.report and failed:
        print(f"vitlab vtab: error: {len(failed)} task job(s) failed; see the vtab.log in their folders under {out}",
              file=sys.stderr)
        return 2
    return 0
