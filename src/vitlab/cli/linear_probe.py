"""Fit a multinomial logistic regression (L2-penalised, standardised features, full-batch
L-BFGS; `--C` as in scikit-learn) on the frozen representations of the whole training
split and report test accuracy, together with cosine k-NN accuracy. Features are cached
like `vitlab fewshot`'s (the same cache entries are shared when the caps agree).

examples:
  vitlab linear-probe runs/cifar10/checkpoints/last.safetensors --data wds:../shared/data/cifar10
  vitlab linear-probe runs/digits/checkpoints/last.safetensors --data digits --C 0.1 --k 10 --json
"""

from __future__ import annotations

from vitlab.cli.common import COUNT, COUNT_OR_ZERO, NEW_FILE, flag_number

WRITES = {"out": NEW_FILE}  # checked writable before any work (vitlab.cli.check_arguments)
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "logistic-regression and k-NN accuracy of frozen features (full training set)"


def add_arguments(p) -> None:
    from vitlab.cli.common import add_feature_arguments

    add_feature_arguments(p, "the images the probes are fitted on", "what accuracy is measured on")
    p.add_argument("--C", type=flag_number(above=0), default=1.0, help="inverse L2 strength of the logistic regression (default 1.0)")
    p.add_argument("--k", type=COUNT, default=20, help="neighbours of the k-NN vote (default 20)")
    p.add_argument("--max-per-class", type=COUNT_OR_ZERO, default=0, help="training images per class (default 0: all)")
    p.add_argument("--max-iter", type=COUNT, default=500, help="L-BFGS iterations (default 500)")


def run(args) -> int:
    from vitlab.cli.common import feature_model, frozen_features, print_result
    from vitlab.eval.linear_probe import knn_accuracy, logistic_probe

    model, fp = feature_model(args)
    (tr_x, tr_y), _ = frozen_features(args, model, args.train_split, args.max_per_class, 0, fp)
    (te_x, te_y), _ = frozen_features(args, model, args.test_split, 0, args.test_limit, fp)
    probe = logistic_probe(tr_x, tr_y, te_x, te_y, C=args.C, max_iter=args.max_iter)
    knn = knn_accuracy(tr_x, tr_y, te_x, te_y, k=args.k)
    result = {"checkpoint": args.checkpoint, "model": model.config.name, "random_init": args.random_init, "data": args.data,
              "num_train": int(len(tr_y)), "num_test": int(len(te_y)), "feature_dim": int(tr_x.shape[1]), "logistic": probe,
              "knn": {"k": args.k, "test_accuracy": knn}, "weights_sha256": fp}
    print_result(args, result, "linear probe", _print_table)
    return 0


def _print_table(args, result: dict) -> None:
    probe, knn = result["logistic"], result["knn"]["test_accuracy"]
    print(f"train {result['num_train']:,} images, test {result['num_test']:,}, {result['feature_dim']}-d features")
    print(f"logistic regression (C={args.C})  test {100 * probe['test_accuracy']:.2f}%  "
          f"(train {100 * probe['train_accuracy']:.2f}%)")
    print(f"{args.k}-NN (cosine)                 test {100 * knn:.2f}%")
