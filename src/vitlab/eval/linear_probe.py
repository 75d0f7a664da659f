"""Linear probe and k-NN on frozen features (the full training set).

Logistic regression: multinomial, L2-penalised, on features standardised with the training
set's mean and std, fitted full-batch with torch's L-BFGS (no extra dependency, runs the
same on CPU and GPU). The objective is scikit-learn's:

    min_W,b   C * Σ_i CE(softmax(x_i W + b), y_i)  +  ½ ||W||²      (bias unpenalised)

so `C` means what it means there (larger C, weaker penalty); the tests check the two agree.

k-NN: cosine similarity between L2-normalised features, majority vote of the k nearest
training examples (ties go to the class with the larger summed similarity).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from vitlab.eval.features import extract_features


def scaling(train: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The training features' (mean, std) per feature, the standardisation the probe fits on."""
    return train.mean(0), train.std(0, unbiased=False) + 1e-6


def fit_logistic(
    feats: np.ndarray, labels: np.ndarray, num_classes: int, C: float = 1.0, max_iter: int = 500, tol: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (F, K), b (K,)) minimising the objective above, on the given (already scaled) features."""
    x = torch.as_tensor(feats, dtype=torch.float64)
    y = torch.as_tensor(labels, dtype=torch.long)
    w = torch.zeros(x.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=tol,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = C * F.cross_entropy(x @ w + b, y, reduction="sum") + 0.5 * (w**2).sum()
        loss.backward()
        return loss

    # A few hundred tiny steps: thread hand-offs cost more than they save (16x slower measured
    # on a busy 2-core machine), so small problems run on one thread.
    threads = torch.get_num_threads()
    if x.numel() * num_classes < 5_000_000:
        torch.set_num_threads(1)
    try:
        opt.step(closure)
    finally:
        torch.set_num_threads(threads)
    return w.detach(), b.detach()


def logistic_probe(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    C: float = 1.0,
    max_iter: int = 500,
) -> dict:
    """Top-1 test accuracy of logistic regression on standardised frozen features."""
    k = int(max(train_labels.max(), test_labels.max())) + 1
    tr, te = torch.as_tensor(train_feats, dtype=torch.float64), torch.as_tensor(test_feats, dtype=torch.float64)
    mean, std = scaling(tr)
    tr, te = (tr - mean) / std, (te - mean) / std
    w, b = fit_logistic(tr.numpy(), train_labels, k, C, max_iter)
    train_acc = float(((tr @ w + b).argmax(1).numpy() == train_labels).mean())
    test_acc = float(((te @ w + b).argmax(1).numpy() == test_labels).mean())
    return {"C": C, "train_accuracy": train_acc, "test_accuracy": test_acc}


def knn_accuracy(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    k: int = 20,
    chunk: int = 1024,
) -> float:
    """Top-1 accuracy of a cosine-similarity k-NN majority vote."""
    tr = F.normalize(torch.as_tensor(train_feats, dtype=torch.float32), dim=1)
    te = F.normalize(torch.as_tensor(test_feats, dtype=torch.float32), dim=1)
    ytr = torch.as_tensor(train_labels, dtype=torch.long)
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    k = min(k, len(ytr))
    correct = 0
    for start in range(0, len(te), chunk):
        sims, idx = (te[start : start + chunk] @ tr.T).topk(k, dim=1)  # (b, k)
        votes = F.one_hot(ytr[idx], num_classes).float()  # (b, k, K)
        # Counts decide; summed similarity (< k <= counts' resolution of 1) only breaks ties.
        score = votes.sum(1) + (votes * sims[..., None]).sum(1) / (k + 1)
        pred = score.argmax(1).numpy()
        correct += int((pred == test_labels[start : start + chunk]).sum())
    return correct / len(te)


def linear_probe_from_data(model: torch.nn.Module, train, test, *, C: float = 1.0, batch_size: int = 128,
                           max_iter: int = 500) -> dict:
    """`logistic_probe` on the frozen representation of `model` (features.extract_features)
    for any two datasets or DataLoaders (torch, torchvision, Hugging Face, vitlab)."""
    tr_x, tr_y = extract_features(model, train, batch_size=batch_size)
    te_x, te_y = extract_features(model, test, batch_size=batch_size)
    return logistic_probe(tr_x, tr_y, te_x, te_y, C=C, max_iter=max_iter)
