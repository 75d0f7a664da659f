"""Few-shot linear evaluation (§4.1): closed-form regularised least squares on frozen features.

For each class count K, shots S and seed: draw S training examples per class, fit a linear
map from their (whitened) representations to {-1, 1}^K targets by L2-regularised least
squares, and classify the test set by the largest output. Accuracy is averaged over seeds.

The algebra. X is (N, D) (N examples, D features plus one constant bias column), Y is
(N, K) with +1 at the true class and -1 elsewhere, λ > 0:

    W = argmin ||X W - Y||^2 + λ ||W||^2 = (XᵀX + λI_D)⁻¹ Xᵀ Y          (primal, D x D)
                                         = Xᵀ (XXᵀ + λI_N)⁻¹ Y          (dual,   N x N)

The two agree by the push-through identity (XᵀX + λI)Xᵀ = Xᵀ(XXᵀ + λI). We invert the
smaller of the two Gram matrices: the primal when N >= D, the kernel (dual) form when there
are more features than examples (the usual few-shot case: 10 classes x 5 shots, 768 dims).
One symmetric eigendecomposition G = Q diag(e) Qᵀ of that Gram matrix serves every λ of
the grid: (G + λI)⁻¹ = Q diag(1 / (e + λ)) Qᵀ.

Like the reference evaluator (big_vision's fewshot_lsr), features are whitened with the
few-shot set's own mean and standard deviation, and the bias is a constant column of 100,
large so the bias is almost unregularised.

The protocol, by default big_vision's (big_vision/evaluators/fewshot_lsr.py and
configs/common_fewshot.py): for each seed one generator `default_rng(seed)` permutes every
class's examples of the whole training split (classes in index order), and S shots are the
first S of each permutation (so the 5-shot set holds the 1-shot one); λ is fixed at 2^10;
the images are resized to 256 x 256 and centre-cropped to 224 (`PREPROCESSING`: at a
model's resolution R, resized to R * 256 / 224). With the same features, `fewshot_eval`
gives big_vision's accuracies seed for seed. The result records the protocol.

Choosing λ instead (`l2="loo"`, a named alternative). The paper says the L2 strength is
picked from a grid but not how. "loo" chooses, per (shots, seed), the λ of the grid with
the smallest leave-one-out squared error on the few-shot training set itself, so the test
set never influences the choice. Ridge regression has LOO residuals in closed form:
with the hat matrix H = X (XᵀX + λI)⁻¹ Xᵀ and fitted values Ŷ = HY,

    y_i - ŷ_(-i) = (y_i - ŷ_i) / (1 - H_ii)

(exact for the linear fit; the whitening statistics still include the held-out point).
In the primal form H_ii = Σ_j (XQ)_ij² / (e_j + λ); in the dual form H = Q diag(e/(e+λ)) Qᵀ,
so H_ii = Σ_j Q_ij² e_j / (e_j + λ). At 1 shot the held-out example's class has no other
example, so LOO is pessimistic there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from vitlab.config.fields import ConfigError, number
from vitlab.data import DataError
from vitlab.data.transforms import model_transform
from vitlab.eval.features import extract_features

BIAS_CONSTANT = 100.0
BIG_VISION_L2 = 2.0**10  # configs/common_fewshot.py: l2_reg
# configs/common_fewshot.py: resize(256) | central_crop(224): the whole image squashed to
# 256 x 256, the centre 224 x 224 kept (224 / 256 of each side).
PREPROCESSING = {"crop_fraction": 224 / 256, "crop_mode": "squash"}
PREPROCESS = ("big_vision", "model")  # the protocol's resize and crop, or the checkpoint's own
# 2^-10 ... 2^20 in steps of 4x: wide enough for whitened features of any width.
L2_GRID: tuple[float, ...] = tuple(2.0**k for k in range(-10, 21, 2))


def targets(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """{-1, 1}^K targets: +1 at the true class."""
    return 2.0 * torch.nn.functional.one_hot(labels.long(), num_classes).double() - 1.0


@dataclass
class RidgeProblem:
    """A few-shot training set, whitened and eigendecomposed once for every λ."""

    mean: torch.Tensor  # (1, F)
    std: torch.Tensor  # (1, F)
    x: torch.Tensor  # (N, F+1), whitened, with the bias column
    y: torch.Tensor  # (N, K) in {-1, 1}
    eigs: torch.Tensor  # eigenvalues of the smaller Gram matrix
    q: torch.Tensor  # its eigenvectors
    primal: bool

    @classmethod
    def build(cls, feats: torch.Tensor, labels: torch.Tensor, num_classes: int) -> "RidgeProblem":
        f = feats.double()
        mean = f.mean(0, keepdim=True)
        std = f.std(0, unbiased=False, keepdim=True) + 1e-5
        x = cls._design(f, mean, std)
        y = targets(labels, num_classes)
        primal = x.shape[0] >= x.shape[1]
        gram = x.T @ x if primal else x @ x.T
        eigs, q = torch.linalg.eigh(gram)
        return cls(mean, std, x, y, eigs.clamp_min(0), q, primal)

    @staticmethod
    def _design(f: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        x = (f.double() - mean) / std
        return torch.cat([x, torch.full((x.shape[0], 1), BIAS_CONSTANT, dtype=x.dtype)], 1)

    def weights(self, l2: float) -> torch.Tensor:
        """(F+1, K) solution for one λ."""
        scale = 1.0 / (self.eigs + l2)
        if self.primal:  # Q diag(1/(e+λ)) Qᵀ XᵀY
            return (self.q * scale) @ (self.q.T @ (self.x.T @ self.y))
        # Xᵀ Q diag(1/(e+λ)) Qᵀ Y
        return (self.x.T @ self.q * scale) @ (self.q.T @ self.y)

    def loo_error(self, l2: float) -> float:
        """Mean squared leave-one-out residual (PRESS / (N K)) for one λ."""
        if self.primal:
            xq = self.x @ self.q  # (N, D)
            scale = 1.0 / (self.eigs + l2)
            fitted = (xq * scale) @ (xq.T @ self.y)
            h = (xq**2 * scale).sum(1)
        else:
            shrink = self.eigs / (self.eigs + l2)
            fitted = (self.q * shrink) @ (self.q.T @ self.y)
            h = (self.q**2 * shrink).sum(1)
        resid = (self.y - fitted) / (1.0 - h).clamp_min(1e-12)[:, None]
        return float((resid**2).mean())

    def predict(self, w: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        return (self._design(feats, self.mean, self.std) @ w).argmax(1)


def choose_l2(problem: RidgeProblem, grid: Sequence[float] = L2_GRID) -> float:
    """The grid's λ with the smallest leave-one-out error (ties: the larger λ)."""
    errors = [problem.loo_error(l2) for l2 in grid]
    best = min(errors)
    return max(l2 for l2, e in zip(grid, errors, strict=True) if e <= best * (1 + 1e-9))


def fewshot_config(config, preprocess: str = "big_vision"):
    """The model's preprocessing with the protocol's resize and centre crop (PREPROCESSING),
    or ("model") the model's own."""
    return config.replace(**PREPROCESSING) if preprocess == "big_vision" else config


def parse_l2(text: str, flag: str = "l2") -> Union[float, str]:
    """An L2 strength as written ("1024", "2e3") or "loo"; anything else is refused (DataError)."""
    if text == "loo":
        return "loo"
    try:
        return float(number(text, flag, above=0))
    except ConfigError:
        raise DataError(f"{flag} {text!r}: give a positive finite L2 strength (default 1024, big_vision's) or loo") from None


def protocol(pool: int, l2: Union[float, str], config, preprocess: str = "big_vision") -> dict:
    """How a result was measured (`config`: the model's), and whether that is big_vision's
    protocol throughout: for the result file."""
    config, big_vision_crop = fewshot_config(config, preprocess), preprocess == "big_vision"
    size = config.image_size[0]
    used = {"pool": f"first {pool} per class" if pool else "whole training split",
            "l2": "leave-one-out over a grid" if l2 == "loo" else float(l2),
            "preprocessing": (f"resize {int(size / config.crop_fraction)} -> centre crop {size}" if big_vision_crop
                              else "the checkpoint's own"),
            "draws": "per seed, a permutation of each class (big_vision's)"}
    used["big_vision"] = not pool and used["l2"] == BIG_VISION_L2 and big_vision_crop
    used["summary"] = (f"{'' if used['big_vision'] else 'not '}big_vision's protocol: shots from the {used['pool']}, "
                       f"{used['preprocessing']}")
    return used


def sample_shots(labels: np.ndarray, shots: int, seed: int, classes: Sequence[int]) -> np.ndarray:
    """Indices of `shots` examples per class, drawn without replacement with `seed`: the first
    `shots` of a permutation of each class's examples, classes in order, as big_vision draws."""
    rng = np.random.default_rng(seed)
    picked = []
    for c in classes:
        where = np.flatnonzero(labels == c)
        if len(where) < shots:
            raise ValueError(
                f"class {c} has only {len(where)} training examples, {shots} shots need {shots}; "
                "lower --shots or raise --pool"
            )
        picked.append(rng.permutation(where)[:shots])
    return np.concatenate(picked)


def fewshot_eval(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    shots: Sequence[int] = (1, 5, 10, 25),
    seeds: int = 3,
    l2: Union[float, str] = BIG_VISION_L2,
    l2_grid: Sequence[float] = L2_GRID,
    num_classes: Optional[int] = None,
) -> dict:
    """Few-shot accuracy per shot count: {"shots": {S: {mean, std, accuracy[], l2[]}}, ...}.

    Seeds 0..seeds-1 draw the examples from all of the training features given; `l2` fixes
    λ (big_vision's 2^10 by default), or "loo" chooses it per draw by leave-one-out.
    """
    if l2 != "loo" and (isinstance(l2, str) or l2 is None or not l2 > 0):
        raise ValueError(f"l2={l2!r}: give a positive L2 strength (big_vision's is 1024) or 'loo'")
    fixed = None if isinstance(l2, str) else l2  # λ, or None ("loo"): chosen per draw by leave-one-out
    classes = sorted(set(int(c) for c in train_labels))
    k = num_classes or (max(classes + [int(test_labels.max())]) + 1)
    tr_x, tr_y = torch.from_numpy(np.asarray(train_feats)), torch.from_numpy(np.asarray(train_labels))
    te_x, te_y = torch.from_numpy(np.asarray(test_feats)), torch.from_numpy(np.asarray(test_labels))
    out: dict = {
        "num_classes": k,
        "feature_dim": int(tr_x.shape[1]),
        "num_test": int(len(te_y)),
        "seeds": seeds,
        "l2": "leave-one-out over grid" if fixed is None else fixed,
        "shots": {},
    }
    for s in shots:
        accs, l2s = [], []
        for seed in range(seeds):
            idx = torch.from_numpy(sample_shots(train_labels, s, seed, classes))
            problem = RidgeProblem.build(tr_x[idx], tr_y[idx], k)
            lam = fixed if fixed is not None else choose_l2(problem, l2_grid)
            pred = problem.predict(problem.weights(lam), te_x)
            accs.append(float((pred == te_y).double().mean()))
            l2s.append(lam)
        out["shots"][int(s)] = {
            "mean": float(np.mean(accs)),
            "std": float(np.std(accs)),
            "accuracy": accs,
            "l2": l2s,
        }
    return out


def fewshot_from_data(model: torch.nn.Module, train, test, *, batch_size: int = 128,
                      max_per_class: Optional[int] = None, preprocess: str = "big_vision", **options) -> dict:
    """`vitlab fewshot`'s protocol on the frozen representation of `model` (features.
    extract_features) for any two datasets or DataLoaders (torch, torchvision, Hugging Face,
    vitlab): raw images resized and centre-cropped as the command line does (`preprocess`:
    "big_vision", 256 -> 224 at 224 px, or "model", the checkpoint's own; float tensors are
    taken as already preprocessed), the shots drawn from the whole training set as big_vision
    draws them (`max_per_class`: from the first images of each class instead). The result
    records the pool and, for a model with a config, the protocol (`protocol`), as the
    command's result file does; `options` go to `fewshot_eval` (shots, seeds, l2)."""
    if preprocess not in PREPROCESS:
        raise ValueError(f"preprocess={preprocess!r}: use one of {', '.join(PREPROCESS)}")
    config = getattr(model, "config", None)
    transform = model_transform(fewshot_config(config, preprocess)) if config is not None else None

    def through(data):  # a vitlab dataset is read through the protocol's transform, not the one it was opened with
        return data.view(transform) if transform is not None and hasattr(data, "view") else data

    tr_x, tr_y = extract_features(model, through(train), batch_size=batch_size, max_per_class=max_per_class,
                                  transform=transform)
    te_x, te_y = extract_features(model, through(test), batch_size=batch_size, transform=transform)
    result = fewshot_eval(tr_x, tr_y, te_x, te_y, **options)
    result["pool_per_class"] = max_per_class or "all"
    if config is not None:
        result["protocol"] = protocol(max_per_class or 0, options.get("l2", BIG_VISION_L2), config, preprocess)
    return result
