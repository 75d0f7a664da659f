"""The paper's few-shot evaluation, as big_vision runs it (evaluators/fewshot_lsr.py): for
each seed, draw S training images per class from the whole training split, map their
frozen representations (the pre-logits, or the pooled token) to {-1, 1}^K targets by
least squares with L2 strength 2^10, solved in closed form, and measure top-1 accuracy on
the test split, on images resized to 256 and centre-cropped to 224 (at the model's
resolution R: R * 256 / 224, then R). Accuracy is the mean over seeds, with the standard
deviation. The result records the protocol; named alternatives: --l2 loo (chosen per draw
by leave-one-out error on the few-shot examples), --pool N (draw from the first N images of
each class), --preprocess model (the checkpoint's own resize and crop). A split may be a part
of one, as tfds writes it (--train-split 'train[:65000]', 'train[10%:]'); --preset NAME takes
big_vision's splits for its datasets (imagenet: the shots from train[:65000], tested on val;
cifar100, pets, dtd, caltech, cars, uc_merced).

Features are extracted once and cached (keyed by the weights, the data and the
preprocessing; $VITLAB_CACHE/features, default ~/.cache/vitlab/features), so a second
sweep over shots and seeds reads them back; streaming (wds:) data with --pool stops reading
once every class is full.

examples:
  vitlab fewshot runs/cifar10/checkpoints/last.safetensors --data wds:../shared/data/cifar10
  vitlab fewshot runs/digits/checkpoints/last.safetensors --data digits --shots 1,5,10 --seeds 5 --json
  vitlab fewshot runs/digits/checkpoints/last.safetensors --data digits --l2 loo --pool 100
  vitlab fewshot runs/digits/checkpoints/last.safetensors --data digits --random-init 0 --out random.json
  vitlab fewshot runs/digits/checkpoints/last.safetensors --data digits --random-init 0-9 --out control.json
"""

from __future__ import annotations

import argparse
import math

from vitlab.cli.common import COUNT, COUNT_OR_ZERO, NEW_FILE

# big_vision's few-shot datasets (configs/common_fewshot.py): (training split the shots come
# from, test split), as tfds names them; vitlab's "val" is tfds's "validation". ImageNet's
# pool is the first 65,000 of tfds's (shuffled) train split: at least 30 of every class there.
PRESETS = {"imagenet": ("train[:65000]", "val"), "cifar100": ("train", "test"), "pets": ("train", "test"),
           "dtd": ("train", "test"), "caltech": ("train", "test"), "cars": ("train", "test"),
           "uc_merced": ("train[:1000]", "train[1000:]")}

WRITES = {"out": NEW_FILE}  # checked writable before any work (vitlab.cli.check_arguments)
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "few-shot linear accuracy of frozen features (closed-form least squares, §4.1)"


def add_arguments(p) -> None:
    from vitlab.cli.common import add_feature_arguments

    add_feature_arguments(p, "where the few-shot examples come from", "what accuracy is measured on", draws=True)
    p.add_argument("--shots", type=shot_counts, default="1,5,10,25", help="comma-separated shots per class (default 1,5,10,25)")
    p.add_argument("--seeds", type=COUNT, default=3, help="draws per shot count (default 3)")
    p.add_argument("--l2", default="1024", help="L2 strength (default 1024, big_vision's), or loo: leave-one-out")
    p.add_argument("--pool", type=COUNT_OR_ZERO, default=0, help="draw from the first N images per class (default 0: all)")
    p.add_argument("--preprocess", choices=("big_vision", "model"), default="big_vision", help="resize and crop (default big_vision)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="big_vision's splits for this dataset (imagenet: shots "
                   "from train[:65000], tested on val)")


def shot_counts(text: str) -> list[int]:
    """--shots: comma-separated counts, each at least 1 (COUNT)."""
    shots = [COUNT(s) for s in text.split(",") if s.strip()]
    if not shots:
        raise argparse.ArgumentTypeError("give shots per class separated by commas, such as 1,5,10,25")
    return shots


def run(args) -> int:
    import numpy as np

    from vitlab.analysis.inspection import random_draws
    from vitlab.cli import UsageError
    from vitlab.cli.common import feature_model, frozen_features, print_result
    from vitlab.eval.fewshot import fewshot_eval, parse_l2, protocol

    shots, l2 = _check(args), parse_l2(args.l2, "--l2")
    seeds = list(random_draws(args.random_init) or [None])
    results = []
    for seed in seeds:  # one model, or each random draw of a control in turn
        one = argparse.Namespace(**{**vars(args), "random_init": seed})
        model, fp = feature_model(one)
        (tr_x, tr_y), class_names = frozen_features(one, model, args.train_split, args.pool, 0, fp)
        if args.preset and class_names:
            short = [c for c, n in enumerate(np.bincount(tr_y, minlength=len(class_names))) if n < max(shots)]
            if short:  # big_vision's slice assumes tfds's shuffled order, which has every class early
                raise UsageError(f"--preset {args.preset}: the {args.train_split} pool holds fewer than {max(shots)} images of "
                                 f"{len(short)} of the {len(class_names)} classes (class {class_names[short[0]]} first): give the "
                                 "data in tfds's shuffled order, or --train-split")
        (te_x, te_y), _ = frozen_features(one, model, args.test_split, 0, args.test_limit, fp)
        try:
            results.append(fewshot_eval(tr_x, tr_y, te_x, te_y, shots=shots, seeds=args.seeds, l2=l2,
                                        num_classes=len(class_names) if class_names else None))
        except ValueError as e:
            raise UsageError(str(e)) from None
    result = results[0] if len(seeds) == 1 else pooled(results, seeds)
    result.update(checkpoint=args.checkpoint, model=model.config.name,
                  random_init=seeds[0] if len(seeds) == 1 else seeds, data=args.data,
                  train_split=args.train_split, test_split=args.test_split, pool_per_class=args.pool or "all",
                  num_train_pool=int(len(tr_y)), weights_sha256=fp,
                  protocol=protocol(args.pool, l2, model.config, args.preprocess))
    print_result(args, result, "few-shot linear accuracy", _print_table)
    return 0


def pooled(results: list[dict], seeds: list) -> dict:
    """A control over K random draws: per shot count the mean over draws of each draw's mean
    accuracy, their standard deviation, and `accuracy` the K draw means (so a sweep's report
    counts the draws' spread, findings.draw_std); each draw's own result under `draws`."""
    from vitlab.spread import mean_std

    out = {**results[0], "shots": {}}
    for s, first in results[0]["shots"].items():
        means = [r["shots"][s]["mean"] for r in results]
        mean, std = mean_std(means)
        out["shots"][s] = {**first, "mean": mean, "std": std, "accuracy": means}
    out["draws"] = [{"random_init": seed, "shots": {s: {"mean": v["mean"], "accuracy": v["accuracy"]}
                                                   for s, v in r["shots"].items()}}
                    for seed, r in zip(seeds, results, strict=True)]
    return out


def _check(args) -> list[int]:
    from vitlab.cli import UsageError

    if args.preset:
        if (args.train_split, args.test_split) != ("train", "test"):
            raise UsageError(f"--preset {args.preset} sets the splits ({', '.join(PRESETS[args.preset])}) and "
                             "--train-split/--test-split set them too: give one")
        args.train_split, args.test_split = PRESETS[args.preset]
    shots = args.shots
    if args.pool and args.pool < max(shots):
        raise UsageError(f"--pool {args.pool} is smaller than the largest shot count {max(shots)}; raise --pool")
    return shots


def _print_table(args, result: dict) -> None:
    print(f"{result['num_classes']} classes, {result['feature_dim']}-d features, "
          f"test {result['num_test']:,} images, {args.seeds} seed(s), L2: {result['l2']}")
    print(result["protocol"]["summary"])
    print(f"{'shots':>5}  {'accuracy':>16}  {'per seed':<24}  L2 per seed")
    for s, r in result["shots"].items():
        per = " ".join(f"{100 * a:.1f}" for a in r["accuracy"])
        lam = " ".join(f"2^{_log2(v)}" for v in r["l2"])
        cell = f"{100 * r['mean']:>7.2f} ± {100 * r['std']:<5.2f}%" if len(r["accuracy"]) > 1 else f"{100 * r['mean']:.2f}%"
        print(f"{s:>5}  {cell:>16}  {per:<24}  {lam}")  # one seed: no spread, and the % beside its number


def _log2(v: float) -> str:
    k = math.log2(v)
    return f"{k:.0f}" if abs(k - round(k)) < 1e-9 else f"{k:.2f}"
