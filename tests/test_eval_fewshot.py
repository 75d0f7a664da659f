"""Few-shot closed-form least squares (§4.1), the linear probe, k-NN and the feature cache."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import tiny_model
from vitlab.config import ViTConfig
from vitlab.eval import features as feats_mod
from vitlab.eval.fewshot import L2_GRID, RidgeProblem, choose_l2, fewshot_eval, sample_shots
from vitlab.eval.linear_probe import fit_logistic, knn_accuracy, logistic_probe
from vitlab.models.vit import VisionTransformer


def ridge_solve(x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """The reference: W = argmin ||xW - y||² + l2 ||W||², in whichever form inverts the smaller
    matrix (RidgeProblem's eigendecomposed solver is checked against it).

    x: (N, D), y: (N, K) -> (D, K). No whitening, no bias: the bare algebra.
    """
    x, y = x.double(), y.double()
    n, d = x.shape
    if n >= d:  # primal: (XᵀX + λI)⁻¹ XᵀY
        return torch.linalg.solve(x.T @ x + l2 * torch.eye(d, dtype=x.dtype), x.T @ y)
    # dual (kernel) form: Xᵀ (XXᵀ + λI)⁻¹ Y
    return x.T @ torch.linalg.solve(x @ x.T + l2 * torch.eye(n, dtype=x.dtype), y)


def problem(n, d, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, k, generator=g, dtype=torch.float64)


# The solver ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(40, 6), (6, 40)], ids=["examples>features", "features>examples"])
@pytest.mark.parametrize("l2", [1e-3, 0.5, 30.0])
def test_ridge_against_direct_least_squares(n, d, l2):
    x, y = problem(n, d)
    w = ridge_solve(x, y, l2)
    # Ridge = ordinary least squares on the augmented system [X; sqrt(λ) I] W = [Y; 0].
    a = torch.cat([x, l2**0.5 * torch.eye(d, dtype=x.dtype)])
    b = torch.cat([y, torch.zeros(d, y.shape[1], dtype=x.dtype)])
    torch.testing.assert_close(w, torch.linalg.lstsq(a, b, driver="gelsd").solution, rtol=1e-8, atol=1e-10)
    # And the explicit normal equations, whichever shape.
    normal = torch.linalg.inv(x.T @ x + l2 * torch.eye(d, dtype=x.dtype)) @ x.T @ y
    torch.testing.assert_close(w, normal, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("n,f", [(60, 5), (12, 80)], ids=["primal", "dual"])
def test_eigendecomposed_problem_matches_plain_solve_and_loo(n, f):
    x, _ = problem(n, f, seed=1)
    labels = torch.arange(n) % 4
    p = RidgeProblem.build(x, labels, 4)
    assert p.primal == (n >= f + 1)
    for l2 in (0.01, 1.0, 100.0):
        torch.testing.assert_close(p.weights(l2), ridge_solve(p.x, p.y, l2), rtol=1e-7, atol=1e-9)
        # Leave-one-out in closed form against refitting without each example.
        brute = []
        for i in range(n):
            keep = torch.arange(n) != i
            w = ridge_solve(p.x[keep], p.y[keep], l2)
            brute.append(((p.y[i] - p.x[i] @ w) ** 2).mean())
        assert p.loo_error(l2) == pytest.approx(float(torch.stack(brute).mean()), rel=1e-7)


def test_whitening_and_bias_follow_the_reference():
    x, _ = problem(10, 4, seed=2)
    x = x * 7 + 3
    p = RidgeProblem.build(x, torch.arange(10) % 2, 2)
    np.testing.assert_allclose(p.x[:, :4].mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(p.x[:, 4], 100.0)
    assert set(p.y.unique().tolist()) == {-1.0, 1.0} and (p.y.sum(1) == 0).all()


def test_targets_any_class_count():
    p = RidgeProblem.build(torch.randn(14, 3), torch.arange(14) % 7, 7)
    assert p.y.shape == (14, 7) and (p.y == 1).sum() == 14


# The evaluation ---------------------------------------------------------------------------------
def clusters(k, d, per_class, spread, seed):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 3
    y = np.repeat(np.arange(k), per_class)
    x = centres[y] + spread * rng.normal(size=(len(y), d))
    return x.astype(np.float32), y


@pytest.mark.parametrize("k,d", [(5, 6), (7, 300)])  # 5 clusters in 3-D mask each other under least squares
def test_fewshot_on_separable_clusters(k, d):
    tr_x, tr_y = clusters(k, d, 30, 0.3, 0)
    te_x, te_y = clusters(k, d, 20, 0.3, 0)  # same centres (same seed), fresh noise below
    te_x = te_x + 0.3 * np.random.default_rng(9).normal(size=te_x.shape).astype(np.float32)
    res = fewshot_eval(tr_x, tr_y, te_x, te_y, shots=(1, 5), seeds=3, l2="loo")
    assert res["num_classes"] == k and res["feature_dim"] == d
    assert res["shots"][5]["mean"] > 0.95
    assert len(res["shots"][1]["accuracy"]) == 3 and all(l2 in L2_GRID for l2 in res["shots"][1]["l2"])


def test_fewshot_on_noise_is_near_chance():
    rng = np.random.default_rng(0)
    tr_x, tr_y = rng.normal(size=(400, 20)), np.repeat(np.arange(4), 100)
    te_x, te_y = rng.normal(size=(2000, 20)), rng.integers(0, 4, 2000)
    res = fewshot_eval(tr_x, tr_y, te_x, te_y, shots=(10,), seeds=3, l2=1.0)
    assert abs(res["shots"][10]["mean"] - 0.25) < 0.05
    assert res["shots"][10]["l2"] == [1.0, 1.0, 1.0]


def test_sampling_is_seeded_and_checks_pool():
    labels = np.repeat(np.arange(3), 10)
    a, b = sample_shots(labels, 4, 0, range(3)), sample_shots(labels, 4, 0, range(3))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, sample_shots(labels, 4, 1, range(3)))
    assert (np.bincount(labels[a]) == 4).all()
    with pytest.raises(ValueError, match="only 10 training examples"):
        sample_shots(labels, 11, 0, range(3))


def big_vision_fewshot_lsr(x_train, y_train, x_test, y_test, num_classes, shots, seeds, l2=2.0**10):
    """big_vision's evaluators/fewshot_lsr.py in NumPy, written from its source: per seed one
    generator permutes each class's indices (classes 0..K-1), the S shots are the first S of
    each; whitening by the shots' mean and std (+1e-5), a bias column of 100, {-1, 1}
    targets, (XᵀX + λI)⁻¹XᵀY or Xᵀ(XXᵀ + λI)⁻¹Y through eigh, argmax on the test set.
    Returns {shots: [accuracy per seed]}."""
    out = {s: [] for s in shots}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        class_indices = [rng.permutation(np.where(y_train == c)[0]) for c in range(num_classes)]
        for s in shots:
            idx = np.concatenate([ind[:s] for ind in class_indices])
            x, y = x_train[idx].astype(np.float64), y_train[idx]
            mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + 1e-5
            x = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
            t = 2.0 * np.eye(num_classes)[y] - 1.0
            if x.shape[0] >= x.shape[1]:
                eigs, q = np.linalg.eigh(x.T @ x)
                lhs, rhs = q, q.T @ (x.T @ t)
            else:
                eigs, q = np.linalg.eigh(x @ x.T)
                lhs, rhs = x.T @ q, q.T @ t
            w = (lhs * (1.0 / (eigs + l2))[None]) @ rhs
            xt = np.pad((x_test - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
            out[s].append(float(np.mean(np.argmax(xt @ w, 1) == y_test)))
    return out


@pytest.mark.parametrize("d", [12, 200])  # primal (more shots than features at 25 shots) and dual
def test_default_is_big_vision_seed_for_seed(d):
    """The default protocol equals big_vision's fewshot_lsr for every shot count and seed:
    the whole training set as the pool, one permutation per class and seed, λ = 2^10."""
    k, rng = 6, np.random.default_rng(d)
    tr_x, tr_y = clusters(k, d, 40, 2.5, 1)
    tr_x = tr_x + 2 * d**0.5 / 4 * rng.normal(size=tr_x.shape).astype(np.float32)  # overlapping clusters
    order = rng.permutation(len(tr_y))  # classes interleaved, as a real training split is
    tr_x, tr_y = tr_x[order], tr_y[order]
    te_x, te_y = clusters(k, d, 30, 2.5, 1)
    te_x = te_x + 2 * d**0.5 / 4 * rng.normal(size=te_x.shape).astype(np.float32)
    shots = (1, 5, 10, 25)
    res = fewshot_eval(tr_x, tr_y, te_x, te_y, shots=shots, seeds=5)
    want = big_vision_fewshot_lsr(tr_x, tr_y, te_x, te_y, k, shots, 5)
    for s in shots:
        assert res["shots"][s]["accuracy"] == pytest.approx(want[s], abs=1e-12), s
        assert res["shots"][s]["l2"] == [1024.0] * 5
    assert res["l2"] == 1024.0
    assert len(set(want[5])) > 1 and 0.3 < np.mean(want[5]) < 0.99  # seeds draw different sets; not trivial
    # Leave-one-out is a named alternative, and gives other numbers.
    loo = fewshot_eval(tr_x, tr_y, te_x, te_y, shots=(5,), seeds=5, l2="loo")
    assert loo["l2"] == "leave-one-out over grid" and loo["shots"][5]["l2"] != [1024.0] * 5


def test_loo_prefers_strong_regularisation_for_noise():
    rng = np.random.default_rng(0)
    p = RidgeProblem.build(torch.from_numpy(rng.normal(size=(20, 50))), torch.from_numpy(rng.integers(0, 2, 20)), 2)
    assert choose_l2(p) >= 2.0**10


# Linear probe and k-NN ---------------------------------------------------------------------------
@pytest.mark.slow
def test_logistic_matches_sklearn():
    sklearn = pytest.importorskip("sklearn.linear_model")
    x, y = clusters(3, 5, 40, 2.0, 3)
    x = (x - x.mean(0)) / x.std(0)
    w, b = fit_logistic(x, y, 3, C=0.5)
    ref = sklearn.LogisticRegression(C=0.5, tol=1e-10, max_iter=10000).fit(x, y)
    np.testing.assert_allclose(w.numpy().T, ref.coef_, atol=1e-4)
    # sklearn's multinomial intercepts are defined up to a shared constant.
    np.testing.assert_allclose(b.numpy() - b.numpy().mean(), ref.intercept_ - ref.intercept_.mean(), atol=1e-4)
    res = logistic_probe(x, y, x, y, C=0.5)
    assert res["train_accuracy"] == pytest.approx(ref.score(x, y))


def test_knn_known_answer():
    tr = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [-1, 0]], dtype=np.float32)
    ytr = np.array([0, 0, 1, 1, 2])
    te = np.array([[1, 0.05], [0.05, 1], [-1, 0.1]], dtype=np.float32)
    assert knn_accuracy(tr, ytr, te, np.array([0, 1, 2]), k=1) == 1.0
    # k=3: the third query's nearest is class 2, then two of class 1: the majority wins.
    assert knn_accuracy(tr, ytr, te, np.array([0, 1, 1]), k=3) == 1.0
    assert knn_accuracy(tr, ytr, te, np.array([0, 1, 2]), k=3) == pytest.approx(2 / 3)


# Features and the cache ------------------------------------------------------------------------
class Counting(torch.utils.data.Dataset):
    def __init__(self, n=12, k=3):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 8, 8, generator=g)
        self.labels = [i % k for i in range(n)]
        self.class_names = [str(i) for i in range(k)]
        self.reads = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i], self.labels[i]


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n=100, k=3):
        self.n, self.k, self.reads = n, k, 0

    def __iter__(self):
        for i in range(self.n):
            self.reads += 1
            yield torch.full((3, 8, 8), float(i)), i % self.k


def small_model(seed=0):
    torch.manual_seed(seed)
    cfg = ViTConfig(image_size=8, patch_size=4, hidden_size=16, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    return VisionTransformer(cfg).eval()


def test_features_are_the_pre_logits():
    model, data = small_model(), Counting()
    f, y = feats_mod.extract_features(model, data, batch_size=5)
    assert f.shape == (12, 16) and list(y) == data.labels
    ref = model(data.x, return_intermediates=True)["pre_logits"]
    np.testing.assert_allclose(f, ref.detach().numpy(), atol=1e-5)


def test_caps_per_class_and_streaming_stops_early():
    model = small_model()
    data = Counting()
    _, y = feats_mod.extract_features(model, data, max_per_class=2)
    assert list(y) == [0, 1, 2, 0, 1, 2] and data.reads == 6  # labels known: the rest never read
    stream = Stream()
    _, y = feats_mod.extract_features(model, stream, max_per_class=4, num_classes=3)
    assert np.bincount(y).tolist() == [4, 4, 4] and stream.reads == 12
    _, y = feats_mod.extract_features(model, Stream(), limit=7)
    assert len(y) == 7


def test_cache_hits_and_misses(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    model, data = small_model(), Counting()
    spec = {"data": "counting", "split": "train"}
    f1, _ = feats_mod.cached_features(model, data, spec, batch_size=4)
    reads = data.reads
    f2, _ = feats_mod.cached_features(model, data, spec, batch_size=4)
    assert data.reads == reads  # read back, not recomputed
    np.testing.assert_array_equal(f1, f2)
    assert len(list((tmp_path / "features").glob("*.npz"))) == 1
    # Another split, another cap, or other weights: new entries.
    feats_mod.cached_features(model, data, {**spec, "split": "test"})
    feats_mod.cached_features(model, data, spec, max_per_class=2)
    other = small_model(seed=1)
    assert feats_mod.model_fingerprint(other) != feats_mod.model_fingerprint(model)
    feats_mod.cached_features(other, data, spec)
    assert len(list((tmp_path / "features").glob("*.npz"))) == 4


# The commands ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digit_ckpts(tmp_path_factory):
    import vitlab

    root = tmp_path_factory.mktemp("fewshot")
    model = tiny_model(class_names=[str(i) for i in range(10)])
    vitlab.save(model, root / "model.safetensors")
    vitlab.save(model, root / "model.npz", format="npz")
    return root


@pytest.mark.slow
def test_fewshot_command_and_cache(digit_ckpts, tmp_path, monkeypatch, capsys):
    import json

    from vitlab.cli import main

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    args = ["--data", "digits", "--shots", "1,5", "--seeds", "2", "--pool", "20"]
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *args, "--out", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr()
    assert "features cached" in out.err and "shots" in out.out
    res = json.loads((tmp_path / "a.json").read_text())
    assert set(res["shots"]) == {"1", "5"} and res["num_test"] == 360 and res["num_train_pool"] == 200
    assert 0.1 < res["shots"]["5"]["mean"] <= 1.0  # random tiny ViT features still beat chance (0.1)
    # The same weights from the official .npz format: the same accuracies; features from the cache
    # when the config matches, recomputed (and equal) when it does not.
    assert main(["fewshot", str(digit_ckpts / "model.npz"), *args, "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    for s in ("1", "5"):
        np.testing.assert_allclose(other["shots"][s]["accuracy"], res["shots"][s]["accuracy"], atol=1 / 360 + 1e-9)
    # A sweep on cached features reads them back.
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *args[:2], *args[4:], "--shots", "2", "--json"]) == 0
    assert "from cache" in capsys.readouterr().err
    # One seed: the mean with its % beside it (no empty spread column between them).
    one_seed = [a if a != "2" else "1" for a in args]  # (--seeds given once: twice, with two values, is refused)
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *one_seed]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("5 "))
    assert re.match(r"^\s+5\s+\d+\.\d\d%\s", row), row
    # A random init of the same shape is a different model.
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *args, "--random-init", "3", "--json"]) == 0
    rnd = json.loads(capsys.readouterr().out)
    assert rnd["weights_sha256"] != res["weights_sha256"] and rnd["random_init"] == 3
    # A control over K draws (3-5): the mean of each draw's mean, the draw means as its accuracies
    # (their spread is the control's noise, which a sweep's interval then carries), each draw kept.
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *args, "--random-init", "3-5", "--json"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    means = [d["shots"]["5"]["mean"] for d in pooled["draws"]]
    assert pooled["random_init"] == [3, 4, 5] and [d["random_init"] for d in pooled["draws"]] == [3, 4, 5]
    assert means[0] == rnd["shots"]["5"]["mean"] and pooled["shots"]["5"]["accuracy"] == means
    assert pooled["shots"]["5"]["mean"] == pytest.approx(sum(means) / 3) and len(set(means)) > 1
    assert main(["fewshot", str(digit_ckpts / "model.safetensors"), *args, "--random-init", "5-3"]) != 0
    assert "range of seeds" in capsys.readouterr().err


def test_fewshot_command_default_is_big_vision_and_recorded(digit_ckpts, tmp_path, monkeypatch, capsys):
    import json

    from vitlab.cli import main
    from vitlab.data import open_dataset
    from vitlab.data.transforms import eval_transform

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    ck = str(digit_ckpts / "model.safetensors")
    assert main(["fewshot", ck, "--data", "digits", "--shots", "1,5", "--seeds", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    train = open_dataset("digits", "train", eval_transform(16))
    assert res["num_train_pool"] == len(train) and res["pool_per_class"] == "all"  # the whole split
    assert res["l2"] == 1024.0 and res["protocol"] == {
        "pool": "whole training split", "l2": 1024.0, "preprocessing": "resize 18 -> centre crop 16",
        "draws": "per seed, a permutation of each class (big_vision's)", "big_vision": True,
        "summary": "big_vision's protocol: shots from the whole training split, resize 18 -> centre crop 16"}
    assert main(["fewshot", ck, "--data", "digits", "--shots", "5", "--seeds", "2", "--l2", "loo", "--pool", "20",
                 "--preprocess", "model"]) == 0
    out = capsys.readouterr().out
    assert "not big_vision's protocol: shots from the first 20 per class, the checkpoint's own" in out


def test_fewshot_from_data_is_the_commands_protocol_and_records_it(digit_ckpts, tmp_path, monkeypatch, capsys):
    """The library call on the user's own dataset objects runs the command line's protocol
    (big_vision's resize 18 -> centre crop 16 at this model's 16 px, not its own squash) and
    returns the same result and record, seed for seed; preprocess="model" is the other."""
    import json

    import vitlab
    from vitlab.cli import main
    from vitlab.data import open_dataset
    from vitlab.eval.fewshot import fewshot_from_data

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    ck = str(digit_ckpts / "model.safetensors")
    assert main(["fewshot", ck, "--data", "digits", "--shots", "1,5", "--seeds", "2", "--json"]) == 0
    command = json.loads(capsys.readouterr().out)
    model = vitlab.load(ck)

    class Digits(torch.utils.data.Dataset):  # a user's own dataset of PIL images
        def __init__(self, split):
            self.images = open_dataset("digits", split, lambda image: image)
            self.labels = self.images.labels

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return self.images[i]

    raw = Digits
    api = fewshot_from_data(model, raw("train"), raw("test"), shots=(1, 5), seeds=2)
    assert api["protocol"] == command["protocol"] and api["protocol"]["preprocessing"] == "resize 18 -> centre crop 16"
    for s in (1, 5):
        assert api["shots"][s]["accuracy"] == pytest.approx(command["shots"][str(s)]["accuracy"], abs=1e-12)
    own = fewshot_from_data(model, raw("train"), raw("test"), shots=(5,), seeds=2, preprocess="model")
    assert own["protocol"]["preprocessing"] == "the checkpoint's own" and not own["protocol"]["big_vision"]
    assert own["shots"][5]["accuracy"] != api["shots"][5]["accuracy"]  # another crop, other features


def test_split_slices_as_tfds_writes_them_and_the_imagenet_preset(digit_ckpts, tmp_path, monkeypatch, capsys):
    """`train[:N]`, `train[P%:]`, `test[-N:]` cut the stored order as tfds does; a bad slice is
    one line. --preset imagenet takes big_vision's train[:65000] pool and the val split, and
    refuses a pool whose order leaves classes short (big_vision's slice assumes tfds's order)."""
    import json

    from vitlab.cli import main
    from vitlab.data import DataError, open_dataset

    whole = open_dataset("digits", "train", lambda image: image)
    n = len(whole)
    assert open_dataset("digits", "train[:100]", lambda image: image).labels.tolist() == whole.labels[:100].tolist()
    assert len(open_dataset("digits", "train[10%:]", lambda image: image)) == n - round(n / 10)
    assert open_dataset("digits", "test[-50:]", lambda image: image).labels.tolist() == \
        open_dataset("digits", "test", lambda image: image).labels[-50:].tolist()
    for bad, says in (("train[:99999]", "runs past its end"), ("train[5:3]", "give START below STOP"),
                      ("dev[:10]", "slice a stored split"), ("train[a:]", "NAME[START:STOP]")):
        with pytest.raises(DataError, match=re.escape(says)) as e:
            open_dataset("digits", bad, lambda image: image)
        assert "\n" not in str(e.value)
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    ck = str(digit_ckpts / "model.safetensors")
    assert main(["fewshot", ck, "--data", "digits", "--train-split", "train[:300]", "--shots", "5", "--seeds", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_train_pool"] == 300
    assert main(["fewshot", ck, "--data", "digits", "--preset", "imagenet", "--shots", "5", "--seeds", "1"]) == 2
    err = capsys.readouterr().err  # digits' 1,437 train images: train[:65000] runs past the split's end
    assert "'train[:65000]': the split holds 1,437" in err.strip().splitlines()[-1]
    assert main(["fewshot", ck, "--data", "digits", "--preset", "uc_merced", "--shots", "5", "--seeds", "1",
                 "--json"]) == 0  # train[:1000] / train[1000:]
    res = json.loads(capsys.readouterr().out)
    assert (res["train_split"], res["test_split"], res["num_train_pool"], res["num_test"]) == \
        ("train[:1000]", "train[1000:]", 1000, n - 1000)
    assert main(["fewshot", ck, "--data", "digits", "--preset", "imagenet", "--train-split", "train[:10]"]) == 2
    assert "--preset imagenet sets the splits" in capsys.readouterr().err


def test_a_preset_pool_short_of_classes_is_refused(digit_ckpts, tmp_path, monkeypatch, capsys):
    """An image folder lists its images class by class: big_vision's train[:N] of it holds the
    first classes only. The preset says why in one line instead of a class count error."""
    from PIL import Image

    from vitlab.cli import fewshot as command, main

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(command.PRESETS, "imagenet", ("train[:12]", "val"))  # 65,000 scaled to this folder
    for split in ("train", "val"):
        for c in range(3):
            (tmp_path / "f" / split / f"c{c}").mkdir(parents=True)
            for i in range(6):
                Image.new("RGB", (16, 16), (40 * c, 7 * i, 0)).save(tmp_path / "f" / split / f"c{c}" / f"{i}.png")
    ck = str(digit_ckpts / "model.safetensors")
    assert main(["fewshot", ck, "--data", f"imagefolder:{tmp_path / 'f'}", "--preset", "imagenet", "--shots", "2",
                 "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # (after the "extracting features" line)
    assert "2 images of 1 of the 3 classes" in last and "(class c2 first)" in last
    assert "tfds's shuffled order" in last and "Traceback" not in err


def test_fewshot_command_errors(digit_ckpts, capsys):
    from vitlab.cli import main

    ck = str(digit_ckpts / "model.safetensors")
    assert main(["fewshot", ck, "--data", "digits", "--shots", "1,x"]) == 2
    assert "--shots" in capsys.readouterr().err
    assert main(["fewshot", ck, "--data", "digits", "--shots", "25", "--pool", "10"]) == 2
    assert "raise --pool" in capsys.readouterr().err
    assert main(["fewshot", ck, "--data", "digits", "--l2", "-1"]) == 2
    assert "--l2 '-1': give a positive finite L2" in capsys.readouterr().err
    assert main(["fewshot", ck, "--data", "nosuchdata"]) == 2
    assert "unknown dataset" in capsys.readouterr().err


@pytest.mark.slow
def test_linear_probe_command(digit_ckpts, tmp_path, monkeypatch, capsys):
    import json

    from vitlab.cli import main

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    for name in ("model.safetensors", "model.npz"):
        assert (
            main(
                [
                    "linear-probe",
                    str(digit_ckpts / name),
                    "--data",
                    "digits",
                    "--max-per-class",
                    "40",
                    "--k",
                    "5",
                    "--json",
                ]
            )
            == 0
        )
        res = json.loads(capsys.readouterr().out)
        assert res["num_train"] == 400 and res["num_test"] == 360
        assert 0.2 < res["logistic"]["test_accuracy"] <= 1.0 and 0.2 < res["knn"]["test_accuracy"] <= 1.0
