"""The statistics of a sweep's report: the t distribution against scipy.stats, the verdict
rule, arms and paired comparisons from rows, and `vitlab sweep --report DIR` rebuilding the
report from a folder's cells (tiny ViTs on digits)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

scipy_stats = pytest.importorskip("scipy.stats")
from scipy import special  # noqa: E402

from vitlab.cli import main  # noqa: E402
from vitlab.config import ConfigError  # noqa: E402
from vitlab.config.sweep import SweepSpec  # noqa: E402
from vitlab.sweep import findings, stats  # noqa: E402


@pytest.mark.parametrize("a,b,x", [(0.5, 0.5, 0.2), (2.5, 0.5, 0.3), (1.5, 0.5, 0.97), (10, 3, 0.6), (0.5, 20, 0.01)])
def test_betainc_matches_scipy(a, b, x):
    assert stats.betainc(a, b, x) == pytest.approx(special.betainc(a, b, x), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 19, 100])
def test_t_quantiles_and_tails_match_scipy(df):
    for p in (0.6, 0.9, 0.975, 0.995):
        assert stats.t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9)
    for t in (0.0, 0.3, 1.7, 2.5, -4.0, 12.0):
        assert stats.t_sf2(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-9, abs=1e-15)


def test_describe_and_paired_match_scipy():
    xs = [0.371, 0.382, 0.365, 0.390]
    d = stats.describe(xs)
    lo, hi = scipy_stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 4, scale=scipy_stats.sem(xs))
    assert (d["lo"], d["hi"]) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    assert d["std"] == pytest.approx(scipy_stats.tstd(xs))
    a = {0: 0.37, 1: 0.38, 2: 0.36, 3: 0.39}
    b = {3: 0.375, 0: 0.36, 1: 0.372, 2: 0.35}  # paired by key, not by order
    r = stats.paired(a, b)
    ref = scipy_stats.ttest_rel([a[k] for k in range(4)], [b[k] for k in range(4)])
    assert r["p"] == pytest.approx(ref.pvalue, rel=1e-9) and r["t"] == pytest.approx(ref.statistic, rel=1e-9)
    assert r["n"] == 4 and r["mean"] == pytest.approx(0.01075)
    assert stats.describe([1.0]) == {"n": 1, "mean": 1.0, "std": None, "lo": None, "hi": None}
    assert stats.paired({0: 1.0}, {1: 2.0})["n"] == 0
    # an accuracy's interval stops at its bounds; inside them the t interval is untouched
    wide = stats.describe([0.999, 1.0, 0.931])
    clipped = stats.describe([0.999, 1.0, 0.931], bounds=(0.0, 1.0))
    assert wide["hi"] > 1.0 and clipped["hi"] == 1.0 and clipped["lo"] == wide["lo"]
    assert stats.describe(xs, bounds=(0.0, 1.0)) == d


def test_slope_matches_scipy_linregress():
    xs = [11.2, 11.5, 11.9, 12.2, 11.3, 11.6, 12.0, 12.3]
    ys = [0.27, 0.30, 0.34, 0.35, 0.26, 0.31, 0.33, 0.36]
    r, ref = stats.slope(xs, ys), scipy_stats.linregress(xs, ys)
    assert r["slope"] == pytest.approx(ref.slope, rel=1e-10) and r["se"] == pytest.approx(ref.stderr, rel=1e-9)
    assert r["p"] == pytest.approx(ref.pvalue, rel=1e-8)
    half = scipy_stats.t.ppf(0.975, len(xs) - 2) * ref.stderr
    assert (r["lo"], r["hi"]) == (pytest.approx(ref.slope - half, rel=1e-9), pytest.approx(ref.slope + half, rel=1e-9))
    assert stats.slope([1, 2], [1, 2])["slope"] is None and stats.slope([1, 1, 1], [1, 2, 3])["slope"] is None


def test_slopes_per_family_from_rows():
    spec = SweepSpec.from_dict({**SPEC, "report": {"slopes": [{"x": "flops", "y": "test.top1", "by": "family"}]}}, "t")
    rows = [{"status": "done", "family": f, "flops": 10.0 ** k, "test.top1": 0.2 + g * k}
            for f, g in (("ViT", 0.05), ("BiT", 0.02)) for k in (1, 2, 3, 4)]
    got = {s["group"]: s for s in findings.build(spec, rows)["slopes"]}
    assert got["ViT"]["slope"] == pytest.approx(0.05) and got["BiT"]["slope"] == pytest.approx(0.02)
    assert "| test.top1 (points) | log10 flops | ViT | 4 | +5.00 |" in findings.slopes_table({"slopes": list(got.values())})


@pytest.mark.parametrize("lo,hi,mean,expect,margin,want", [
    (0.01, 0.03, 0.02, "higher", 0, "Reproduced"),
    (-0.01, 0.03, 0.01, "higher", 0, "In direction"),
    (-0.03, 0.01, -0.01, "higher", 0, "Not shown"),
    (-0.03, -0.01, -0.02, "higher", 0, "Opposite"),
    (-0.03, -0.01, -0.02, "lower", 0, "Reproduced"),
    (0.0, 0.02, 0.01, "higher", 0, "In direction"),  # touching 0 is not separated
    (-0.005, 0.004, 0.0, "equal", 0.01, "Reproduced"),
    (-0.02, 0.004, 0.0, "equal", 0.01, "Not shown"),
    (0.001, 0.004, 0.002, "equal", 0.01, "Reproduced"),  # excludes 0, inside the margin: equal within it
    (-0.0088, -0.0052, -0.007, "equal", 0.01, "Reproduced"),  # cls-gap at 7e-4, 5-shot: no longer Opposite
    (0.012, 0.02, 0.016, "equal", 0.01, "Opposite"),  # wholly outside the margin
    (-0.02, -0.011, -0.015, "equal", 0.01, "Opposite"),
    (0.005, 0.02, 0.012, "equal", 0.01, "Not shown"),  # straddles the margin
    (None, None, 0.02, "higher", 0, None),
])
def test_the_verdict_rule(lo, hi, mean, expect, margin, want):
    assert stats.verdict({"lo": lo, "hi": hi, "mean": mean}, expect, margin) == want


def test_a_verdict_holm_does_not_carry_is_downgraded():
    d = {"lo": 0.01, "hi": 0.03, "mean": 0.02}
    assert stats.verdict(d, "higher", p_adjusted=0.01) == "Reproduced"
    assert stats.verdict(d, "higher", p_adjusted=0.2) == "In direction"
    assert stats.verdict(d, "lower", p_adjusted=0.2) == "Not shown"  # an Opposite not carried
    assert stats.verdict({"lo": -0.005, "hi": 0.004, "mean": 0.0}, "equal", 0.01, p_adjusted=0.3) == "Not shown"


def _simulate(true: float, sd: float, n: int, runs: int, seed: int) -> dict[str, int]:
    import random

    rng, counts = random.Random(seed), {}
    for _ in range(runs):
        diffs = {i: rng.gauss(true, sd) for i in range(n)}
        v = stats.verdict(stats.paired(diffs, {i: 0.0 for i in range(n)}), "equal", 1.0)
        counts[v] = counts.get(v, 0) + 1
    return counts


def test_equivalence_known_answer_by_simulation():
    """A true 0.5-point difference under a 1-point margin: with enough seeds Reproduced
    (the interval shrinks inside ±1), never Opposite; the old rule called it Opposite more
    often the more seeds there were."""
    few, many = _simulate(0.5, 0.5, 4, 400, 0), _simulate(0.5, 0.5, 30, 400, 1)
    assert "Opposite" not in few and "Opposite" not in many
    assert many.get("Reproduced", 0) >= 0.95 * 400 and few.get("Reproduced", 0) < many["Reproduced"]
    assert _simulate(2.0, 0.5, 30, 200, 2).get("Opposite", 0) >= 0.95 * 200  # a true 2 points is outside


def test_claim_p_matches_the_interval_rule_and_scipy():
    diff = stats.paired({i: v for i, v in enumerate([0.4, 0.6, 0.55, 0.3, 0.5])}, {i: 0.0 for i in range(5)})
    p = stats.claim_p(diff, "equal", 1.0)
    se = diff["std"] / math.sqrt(5)
    ref = 2 * max(scipy_stats.t.sf((diff["mean"] + 1) / se, 4), scipy_stats.t.sf((1 - diff["mean"]) / se, 4))
    assert p == pytest.approx(ref, rel=1e-9) and (p < 0.05) == (stats.verdict(diff, "equal", 1.0) == "Reproduced")
    assert stats.claim_p(diff, "higher") == diff["p"]
    out = stats.paired({i: v for i, v in enumerate([2.4, 2.6, 2.5])}, {i: 0.0 for i in range(3)})
    assert (stats.claim_p(out, "equal", 1.0) < 0.05) and stats.verdict(out, "equal", 1.0) == "Opposite"


def test_holm_and_bh_by_hand():
    ps = [0.01, 0.04, 0.03, 0.005, None, 0.2]
    # by hand: sorted .005 .01 .03 .04 .2 (m=5); Holm 5p, 4p, 3p, 2p, p with a running max
    assert stats.holm(ps) == pytest.approx([0.04, 0.09, 0.09, 0.025, None, 0.2])
    # BH: m p / rank with a running min from the top: .2, .05, .05, .025, .0125
    assert stats.bh(ps) == pytest.approx([0.025, 0.05, 0.05, 0.025, None, 0.2])


def test_mde_matches_the_noncentral_t_power():
    """At the MDE the paired t-test's power (noncentral t, scipy) is close to 80%."""
    std, n = 0.02, 4
    d = stats.mde(std, n)
    crit = scipy_stats.t.ppf(0.975, n - 1)
    power = scipy_stats.nct.sf(crit, n - 1, d / (std / math.sqrt(n)))
    assert 0.75 < power < 0.85 and stats.mde(std, 1) is None


SPEC = {
    "train": {"config": "digits", "steps": 4},
    "grid": {"model.pos_embed": ["none", "learned"], "lr": [0.001, 0.01], "seed": [0, 1, 2]},
    "report": {"metrics": ["test.top1", "fewshot.shots.5.mean"],
               "compare": [{"claim": "an embedding helps", "axis": "model.pos_embed", "a": "learned", "b": "none"}]},
}


def rows():
    out = []
    for pe, bonus in (("none", 0.0), ("learned", 0.02)):
        for lr in (0.001, 0.01):
            for seed in range(3):
                top1 = 0.30 + bonus + 0.01 * seed + (0.05 if lr == 0.01 else 0.0)
                draws = [0.20 + bonus + 0.01 * seed + d for d in (-0.01, 0.0, 0.01)]
                out.append({"model.pos_embed": pe, "lr": lr, "seed": seed, "status": "done", "test.top1": top1,
                            "fewshot.shots.5.mean": sum(draws) / 3, "fewshot.shots.5.accuracy": draws})
    out.append({"model.pos_embed": "none", "lr": 0.1, "seed": 0, "status": "missing"})
    return out


def test_arms_and_paired_comparisons_from_rows():
    spec = SweepSpec.from_dict(SPEC, "t")
    report = findings.build(spec, rows())
    assert report["finished"] == 12 and len(report["arms"]) == 4
    arm = next(a for a in report["arms"] if a["arm"] == {"model.pos_embed": "learned", "lr": "0.01"})
    top1 = arm["metrics"]["test.top1"]
    assert top1["n"] == 3 and top1["mean"] == pytest.approx(0.38) and top1["std"] == pytest.approx(0.01)
    assert arm["metrics"]["fewshot.shots.5.mean"]["draw_std"] == pytest.approx(0.01)
    assert "draw_std" not in top1
    comps = report["comparisons"]
    assert len(comps) == 4  # 2 learning rates x 2 metrics
    for c in comps:  # learned - none is exactly +0.02 for every seed: separated
        assert c["mean"] == pytest.approx(0.02) and c["n"] == 3 and c["verdict"] == "Reproduced" and c["p"] < 1e-6
    md = findings.markdown(report, list(spec.report.metrics))
    assert "| model.pos_embed=learned, lr=0.01 | 3 | 38.0 | 1.0 |" in md
    assert stats.RULE in md and "+2.0" in md


def test_bad_report_sections_name_the_problem():
    for bad, match in [({"compare": [{"axis": "seed", "a": 1, "b": 1}]}, "two different values"),
                       ({"compare": [{"axis": "x", "a": 1, "b": 2, "expect": "bigger"}]}, "expect"),
                       ({"metric": ["x"]}, "unknown key")]:
        with pytest.raises(ConfigError, match=match):
            SweepSpec.from_dict({**SPEC, "report": bad}, "t")


TINY = {
    "train": {"config": "digits", "steps": 3, "batch-size": 32, "model.depth": 1, "model.hidden_size": 32,
              "train.threads": 1},
    "grid": {"model.pos_embed": ["none", "learned"], "seed": [0, 1]},
    "report": {"compare": [{"axis": "model.pos_embed", "a": "learned", "b": "none", "claim": "c"}]},
}


def test_report_dir_rebuilds_the_report_from_the_cells(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--jobs", "2", "--threads", "1"]) == 0
    first = (out / "report.md").read_text()
    data = json.loads((out / "report.json").read_text())
    assert data["finished"] == 4 and len(data["comparisons"]) == 1
    c = data["comparisons"][0]
    assert c["n"] == 2 and c["verdict"] in stats.VERDICTS and not math.isnan(c["p"])
    (out / "report.md").unlink()
    (out / "results.csv").unlink()
    assert main(["sweep", "--report", str(out)]) == 0
    assert (out / "report.md").read_text() == first and (out / "results.csv").exists()


def test_report_dir_without_a_spec_says_what_to_do(tmp_path, capsys):
    assert main(["sweep", "--report", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "no sweep.json" in err and "Traceback" not in err
    assert main(["sweep"]) != 0
    assert "name a sweep spec" in capsys.readouterr().err


def test_curve_figures_draw_reference_lines(tmp_path):
    from vitlab.config.sweep import FigureSpec
    from vitlab.sweep import draw
    from vitlab.sweep.results import references

    fig = FigureSpec(file="d.png", kind="curve", y="inspect.mean", series="seed",
                     references={"uniform attention": "inspect.uniform", "random init": "init.mean"})
    rows = [{"status": "done", "seed": s, "inspect.mean": [15.0 + s, 16.0], "inspect.uniform": 16.55,
             "init.mean": [16.3 + s, 16.5]} for s in (0, 1)]
    assert references(rows, fig) == {"uniform attention": 16.55, "random init": [16.8, 16.5]}
    path = draw(fig, rows, tmp_path)
    assert path.exists() and path.stat().st_size > 1000
    with pytest.raises(ConfigError, match="references"):
        FigureSpec(file="d.png", kind="curve", y="m", references=["x"])


COMPUTE = {
    "train": {"config": "digits", "steps": 4},
    "grid": {"model": {"ViT": {"tag.family": "ViT"}, "hybrid": {"tag.family": "hybrid"}}, "steps": [50, 100, 200, 400],
             "seed": [0, 1, 2]},
    "report": {"metrics": ["test.top1"],
               "compare": [{"claim": "hybrid ahead at equal compute", "axis": "model", "a": "hybrid", "b": "ViT",
                            "at": "compute.train_flops", "along": "steps"}],
               "slopes": [{"x": "compute.train_flops", "y": "test.top1", "by": "family", "a": "ViT", "b": "hybrid",
                           "claim": "ViT's slope is steeper"}]},
}


def compute_rows():
    """ViT: top-1 linear in log10(FLOPs) (slope 0.05 + 0.01 x seed); the hybrid costs 1.7x per
    step and sits exactly 0.01 above the ViT's line of the same seed, with a flatter slope."""
    out = []
    for seed in range(3):
        g = 0.05 + 0.01 * seed
        for steps in (50, 100, 200, 400):
            vit, hyb = steps * 1e9, steps * 1.7e9
            out.append({"model": "ViT", "family": "ViT", "steps": steps, "seed": seed, "status": "done",
                        "compute.train_flops": vit, "test.top1": 0.2 + g * math.log10(vit / 1e10)})
            # the hybrid's own line: through the ViT line + 0.01 at 50 steps, half the slope
            x0 = math.log10(50 * 1.7e9 / 1e10)
            out.append({"model": "hybrid", "family": "hybrid", "steps": steps, "seed": seed, "status": "done",
                        "compute.train_flops": hyb,
                        "test.top1": 0.21 + g * x0 + g / 2 * (math.log10(hyb / 1e10) - x0)})
    return out


def test_a_comparison_at_equal_compute_interpolates_b_in_log_compute():
    spec = SweepSpec.from_dict(COMPUTE, "t")
    comps = findings.build(spec, compute_rows())["comparisons"]
    at = [c for c in comps if c["claim"] == "hybrid ahead at equal compute"]
    # the hybrid at 400 steps costs more than the ViT's 400 steps: outside its range, left out
    assert [c["context"]["steps of hybrid"] for c in at] == ["50", "100", "200"]
    first = at[0]
    assert first["n"] == 3 and first["diffs"] == pytest.approx([0.01, 0.01, 0.01]) and first["verdict"] == "Reproduced"
    # later budgets: the hybrid's flatter line falls below the ViT's, by (g/2) log10(2) per doubling
    for c, k in zip(at[1:], (1, 2), strict=True):
        want = [0.01 - (0.05 + 0.01 * s) / 2 * k * math.log10(2) for s in range(3)]
        assert c["diffs"] == pytest.approx(want)
    assert "steps of hybrid=50, ViT at equal=compute.train_flops" in findings.comparisons_table({"comparisons": at})


def test_slopes_compared_paired_by_seed():
    spec = SweepSpec.from_dict(COMPUTE, "t")
    comp = next(c for c in findings.build(spec, compute_rows())["comparisons"] if c["claim"] == "ViT's slope is steeper")
    assert comp["diffs"] == pytest.approx([(0.05 + 0.01 * s) / 2 for s in range(3)])
    assert comp["verdict"] == "Reproduced" and comp["metric"] == "test.top1 per decade of compute.train_flops"


def test_a_difference_of_two_columns_is_a_metric_and_is_not_clipped():
    spec = SweepSpec.from_dict({**SPEC, "report": {"metrics": ["fewshot.shots.5.mean - init.shots.5.mean"]}}, "t")
    rs = [{**r, "init.shots.5.mean": 0.5} for r in rows() if r["status"] == "done"]
    arm = findings.build(spec, rs)["arms"][0]["metrics"]["fewshot.shots.5.mean - init.shots.5.mean"]
    assert arm["mean"] == pytest.approx(0.21 - 0.5) and arm["lo"] < arm["mean"] < arm["hi"] < 0


def test_bad_equal_compute_and_slope_comparisons_name_the_problem():
    for report, match in [({"compare": [{"axis": "model", "a": "ViT", "b": "hybrid", "at": "compute.train_flops"}]}, "go together"),
                          ({"compare": [{"axis": "model", "a": "ViT", "b": "hybrid", "at": "f", "along": "epochs"}]},
                           "not a grid axis"),
                          ({"slopes": [{"x": "f", "y": "test.top1", "a": "ViT", "b": "BiT"}]}, "give `by`")]:
        with pytest.raises(ConfigError, match=match):
            SweepSpec.from_dict({**COMPUTE, "report": report}, "t")


DISTANCE = {
    "train": {"config": "digits"},
    "grid": {"model": ["ViT", "hybrid"], "seed": [0, 1, 2]},
    "report": {"metrics": ["inspect.min[0]"], "compare": [
        {"claim": "first layer nearer than at init", "a": "inspect.min[0]", "b": "init.min[0]", "expect": "lower"},
        {"claim": "last above first", "a": "inspect.min[-1]", "b": "inspect.min[0]", "expect": "higher"},
        {"claim": "ViT nearer", "axis": "model", "a": "ViT", "b": "hybrid", "expect": "lower"}]},
}


def distance_rows():
    out = []
    for model, first in (("ViT", 14.0), ("hybrid", 16.0)):
        for seed in range(3):
            out.append({"model": model, "seed": seed, "status": "done", "inspect.min": [first + 0.1 * seed, 16.0, 17.0],
                        "init.min": [16.5, 16.5, 16.5]})
    return out


def test_list_entries_are_columns_and_two_columns_of_the_same_cells_compare():
    spec = SweepSpec.from_dict(DISTANCE, "t")
    report = findings.build(spec, distance_rows())
    vit = next(a for a in report["arms"] if a["arm"] == {"model": "ViT"})
    assert vit["metrics"]["inspect.min[0]"]["mean"] == pytest.approx(14.1)
    comps = {(c["claim"], tuple(c["context"].items())): c for c in report["comparisons"]}
    near = comps[("first layer nearer than at init", (("model", "ViT"),))]
    assert near["diffs"] == pytest.approx([-2.5, -2.4, -2.3]) and near["verdict"] == "Reproduced"
    assert near["metric"] == "inspect.min[0]"
    last = comps[("last above first", (("model", "hybrid"),))]
    assert last["diffs"] == pytest.approx([1.0, 0.9, 0.8]) and last["verdict"] == "Reproduced"
    across = comps[("ViT nearer", ())]
    assert across["diffs"] == pytest.approx([-2.0, -2.0, -2.0]) and across["verdict"] == "Reproduced"
    # an entry past the list's end, or of a column that is not a list, is missing, not an error
    from vitlab.sweep.results import value
    row = distance_rows()[0]
    assert value(row, "inspect.min[3]") is None and value(row, "inspect.min[-4]") is None
    assert value({"x": 0.5}, "x[0]") is None and value(row, "inspect.min[-1]") == 17.0


def test_a_comparison_of_columns_refuses_what_needs_an_axis():
    for bad, match in [({"a": "x", "b": "x"}, "two different results columns"),
                       ({"a": "x", "b": "y", "where": {"model": "ViT"}}, "need an axis")]:
        with pytest.raises(ConfigError, match=match):
            SweepSpec.from_dict({**DISTANCE, "report": {"compare": [bad]}}, "t")


def test_best_against_best_selects_on_dev_never_test():
    spec = SweepSpec.from_dict({**SPEC, "report": {"compare": [
        {"claim": "equal at each one's best rate", "axis": "model.pos_embed", "a": "learned", "b": "none",
         "expect": "equal", "margin": 0.05, "best": "lr", "by": "dev.top1",
         "primary": {"metric": "test.top1", "selection": "the best rate by dev top-1"}}]}}, "t")
    data = rows()
    for r in data:  # dev prefers 0.001 for learned, 0.01 for none
        if r["status"] == "done":
            r["dev.top1"] = 0.5 + (0.1 if (r["lr"] == 0.001) == (r["model.pos_embed"] == "learned") else 0.0)
    report = findings.build(spec, data)
    row = report["comparisons"][0]
    assert row["context"] == {"lr of learned (best by dev.top1)": "0.001", "lr of none": "0.01"}
    assert row["mean"] == pytest.approx(0.02 - 0.05) and row["primary"] and report["claims"][0]["row"] == 0
    for r in data:
        r.pop("dev.top1", None)
    assert findings.build(spec, data)["claims"][0]["row"] is None  # no dev score: not run, never another row
    with pytest.raises(ConfigError, match="never on test"):
        SweepSpec.from_dict({**SPEC, "report": {"compare": [{"axis": "model.pos_embed", "a": "learned", "b": "none",
                                                             "best": "lr", "by": "test.top1"}]}}, "t")


def _git(repo, *args):
    import subprocess

    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": __import__("os").environ["PATH"]})


POWERED = {"metric": "test.top1", "selection": "none", "effect": 0.05, "sd": 0.01, "sd_from": "a pilot", "family": 1}


def declared_spec(tmp_path, primary=None, commit=True):
    """A spec with one declared claim in a git repository of its own (committed unless not)."""
    d = {**SPEC, "report": {**SPEC["report"], "compare": [{**SPEC["report"]["compare"][0], "primary": primary or POWERED}]}}
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    path = repo / "t.yaml"
    path.write_text(yaml.safe_dump(d))
    _git(repo, "init", "-q")
    if commit:
        _git(repo, "add", "t.yaml")
        _git(repo, "commit", "-qm", "declare")
    return SweepSpec.from_dict(d, "t"), path


def test_a_declaration_records_time_and_commit_and_reports_verify_it(tmp_path):
    from vitlab.config.sweep import claims_digest
    from vitlab.sweep import claims_declared, declare, expand, save_spec

    spec, path = declared_spec(tmp_path)
    out = path.parent / "sweep"  # in the spec's repository, as results/paper is: its commit is checked
    save_spec(spec, out, 1.0, path, stamp=True)
    record = json.loads((out / "sweep.json").read_text())["claims"]
    assert record["digest"] == claims_digest(spec) and record["text"] == ["an embedding helps"]
    assert record["commit"] and record["spec_file"] == "t.yaml" and record["declared_at"].endswith("Z")
    cells = expand(spec, out)
    got = claims_declared(spec, out, cells)
    assert got["status"] == declare.BEFORE and got["commit"] == record["commit"], got
    report = findings.build(spec, rows(), got)
    assert f"| an embedding helps | before the run ({record['declared_at']}, {record['commit'][:10]}) |" in \
        findings.claims_table([report])
    # the record edited (the spec inside sweep.json changed, its digest not): unknown, never before
    kept = json.loads((out / "sweep.json").read_text())
    edited = json.loads(json.dumps(kept))
    edited["spec"]["report"]["compare"][0]["expect"] = "lower"
    (out / "sweep.json").write_text(json.dumps(edited))
    from vitlab.sweep import load_folder
    changed, _ = load_folder(out)
    got = claims_declared(changed, out, cells)
    assert got["status"] == declare.UNKNOWN and "differ from its digest" in got["why"]
    assert "| an embedding helps | unknown (" in findings.claims_table([findings.build(changed, rows(), got)])
    # a digest rewritten to match the edit: the spec at the recorded commit declares other claims
    edited["claims"]["digest"] = claims_digest(changed)
    (out / "sweep.json").write_text(json.dumps(edited))
    assert claims_declared(changed, out, cells)["status"] == declare.UNKNOWN
    # no record at all, or one without time and commit (an older sweep.json): unknown
    (out / "sweep.json").unlink()
    assert claims_declared(spec, out, cells)["status"] == declare.UNKNOWN
    (out / "sweep.json").write_text(json.dumps({**kept, "claims": {k: kept["claims"][k] for k in ("digest", "text", "declared")}}))
    assert "no declaration time and commit" in claims_declared(spec, out, cells)["why"]
    # declared after the first cell started: post hoc
    (out / "sweep.json").write_text(json.dumps(kept))
    (out / cells[0].key).mkdir(parents=True)
    (out / cells[0].key / "timing.json").write_text(json.dumps({"steps": [{"step": "train", "start": 1.0, "seconds": 2.0}]}))
    assert claims_declared(spec, out, cells)["status"] == declare.AFTER


def test_a_run_refuses_uncommitted_claims(tmp_path):
    from vitlab.sweep import declare

    spec, path = declared_spec(tmp_path, commit=False)
    with pytest.raises(ConfigError, match="not committed"):
        declare.committed(spec, path)
    _git(path.parent, "add", "t.yaml")
    _git(path.parent, "commit", "-qm", "declare")
    assert declare.committed(spec, path)["commit"]
    d = yaml.safe_load(path.read_text())
    d["report"]["compare"][0]["primary"]["effect"] = 0.02  # an edit to the claim, not committed
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match="not committed"):
        declare.committed(SweepSpec.from_dict(d, "t"), path)
    assert declare.committed(spec, None) == {"commit": None, "spec_file": None}  # no file: nothing to prove


def test_claims_cannot_change_after_results_exist(tmp_path):
    from vitlab.sweep import check_claims, expand, save_spec

    spec, path = declared_spec(tmp_path)
    save_spec(spec, tmp_path, 1.0, path, stamp=True)
    changed = SweepSpec.from_dict({**spec.to_dict(), "report": {**spec.to_dict()["report"], "compare": [
        {**spec.to_dict()["report"]["compare"][0], "expect": "equal", "margin": 0.01}]}}, "t")
    check_claims(changed, tmp_path, expand(changed, tmp_path))  # no results yet: the spec may change
    cell = expand(spec, tmp_path)[0]
    (tmp_path / cell.key).mkdir()
    (tmp_path / cell.key / "cell.json").write_text("{}")
    check_claims(spec, tmp_path, expand(spec, tmp_path))
    with pytest.raises(ConfigError, match="declared before its run"):
        check_claims(changed, tmp_path, expand(changed, tmp_path))


@pytest.mark.parametrize("n,sd,effect,alpha", [(3, 1.0, 2.0, 0.05 / 18), (5, 0.355, 1.0, 0.025), (8, 1.2, 1.0, 0.05),
                                               (16, 1.0, 0.5, 0.01), (2, 1.0, 0.3, 0.001), (40, 2.0, 1.0, 0.05 / 6)])
def test_power_of_a_direction_is_the_noncentral_t_tail(n, sd, effect, alpha):
    crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    want = scipy_stats.nct.sf(crit, n - 1, effect / (sd / math.sqrt(n)))
    assert stats.power(n, sd, effect, "higher", alpha=alpha) == pytest.approx(want, abs=1e-5)
    assert stats.power(n, sd, effect, "lower", alpha=alpha) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("n,sd,margin,alpha", [(16, 1.0, 1.0, 0.025), (8, 1.2, 1.0, 0.05), (30, 2.05, 1.0, 0.05)])
def test_power_of_an_equal_claim_is_tost_by_simulation(n, sd, margin, alpha):
    """Simulated: the share of draws whose claim p (stats.claim_p, TOST) passes alpha."""
    np = pytest.importorskip("numpy")
    d = np.random.default_rng(0).normal(0.0, sd, (100_000, n))
    mean, se = d.mean(1), d.std(1, ddof=1) / math.sqrt(n)
    crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    hits = ((mean - crit * se > -margin) & (mean + crit * se < margin)).mean()
    assert stats.power(n, sd, 0.0, "equal", margin, alpha) == pytest.approx(hits, abs=0.005)
    # the same rule as the claim's p: p < alpha exactly when both one-sided tests pass
    row = stats.paired(dict(enumerate(d[0] + 0.1)), dict(enumerate([0.0] * n)))
    p = stats.claim_p(row, "equal", margin)
    inside = row["mean"] - crit * row["std"] / math.sqrt(n) > -margin and row["mean"] + crit * row["std"] / math.sqrt(n) < margin
    assert (p < alpha) == inside


def test_mde_is_the_effect_at_80_percent_power_at_the_verdicts_alpha():
    for n, std, alpha in ((4, 0.02, 0.05), (3, 0.355, 0.05 / 18), (8, 1.0, 0.05 / 18)):
        d = stats.mde(std, n, alpha)
        crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
        assert scipy_stats.nct.sf(crit, n - 1, d / (std / math.sqrt(n))) == pytest.approx(0.8, abs=1e-4)
    assert stats.mde(0.355, 3, 0.05 / 18) == pytest.approx(4.93, abs=0.01)  # the local-heads number
    assert stats.mde(1.0, 1) is None
    m = stats.mde(1.0, 16, 0.05, expect="equal")  # TOST: the margin found equal 80% of the time at d = 0
    assert stats.power(16, 1.0, 0.0, "equal", m, 0.05) == pytest.approx(0.8, abs=1e-4)
    assert stats.seeds_for(0.355, 1.0, "lower", alpha=0.025) == 4


def test_a_confirmatory_claim_under_80_percent_power_is_refused(tmp_path):
    from vitlab.sweep import declare

    weak = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {**SPEC["report"]["compare"][0], "primary": {**POWERED, "sd": 0.05}}]}}, "t")
    with pytest.raises(ConfigError, match=r"power \d+% < 80%.*needs \d+ seeds"):
        declare.check_power(weak)
    partial = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {**SPEC["report"]["compare"][0], "primary": {"metric": "test.top1", "selection": "none", "sd": 0.01}}]}}, "t")
    with pytest.raises(ConfigError, match="complete its power analysis"):
        declare.check_power(partial)
    bare = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {**SPEC["report"]["compare"][0], "primary": {"metric": "test.top1", "selection": "none"}}]}}, "t")
    declare.check_power(bare)  # no plan stated: it runs, and can only be exploratory
    assert findings.build(bare, rows(), {"status": "before the run"})["claims"][0]["family"] == "exploratory claims"
    for ok in ({**POWERED, "sd": 0.05, "exploratory": True}, POWERED):
        declare.check_power(SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
            {**SPEC["report"]["compare"][0], "primary": ok}]}}, "t"))
    spec = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {**SPEC["report"]["compare"][0], "primary": POWERED}]}}, "t")
    plan = declare.plan(spec, findings.declared_claims(spec)[0])
    assert plan["confirmatory"] and plan["seeds"] == 3 and plan["power"] == pytest.approx(
        stats.power(3, 0.01, 0.05, "higher", alpha=0.05))
    # families: confirmatory only with a plan and a proven declaration; Holm within each family
    report = findings.build(spec, rows(), {"status": "before the run"})
    assert report["claims"][0]["family"] == "confirmatory claims"
    assert report["comparisons"][0]["family"].startswith("confirmatory claims")
    assert findings.build(spec, rows(), None)["claims"][0]["family"] == "exploratory claims"


def test_a_declared_claim_names_its_row_and_is_one_of_a_kind():
    base = {"axis": "model.pos_embed", "a": "learned", "b": "none", "claim": "an embedding helps"}
    with pytest.raises(ConfigError, match="metric and selection required"):
        SweepSpec.from_dict({**SPEC, "report": {"compare": [{**base, "primary": {"metric": "test.top1"}}]}}, "t")
    with pytest.raises(ConfigError, match=r"primary\.effect must be > 0"):
        SweepSpec.from_dict({**SPEC, "report": {"compare": [
            {**base, "primary": {"metric": "test.top1", "selection": "none", "effect": -1}}]}}, "t")
    twice = {**base, "primary": {"metric": "test.top1", "selection": "none"}}
    with pytest.raises(ConfigError, match="share a claim text"):
        SweepSpec.from_dict({**SPEC, "report": {"compare": [twice, {**twice, "a": "none", "b": "learned"}]}}, "t")


def test_an_equal_claim_states_its_margin_and_the_power_of_the_test_its_verdict_uses():
    """report.md's claims table and sentence name an equivalence claim's margin and TOST, its MDE
    is TOST's at the verdict's Holm bar (not a t-test's at 0.05), and the power the seeds had at
    the margin is the one stats.power gives there."""
    spec = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {"claim": "no better (within 1 point)", "axis": "model.pos_embed", "a": "learned", "b": "none",
         "expect": "equal", "margin": 0.01, "primary": {"metric": "test.top1", "selection": "none"}},
        {"claim": "helps", "axis": "model.pos_embed", "a": "learned", "b": "none"}]}}, "t")
    noisy = [{**r, "test.top1": r["test.top1"] + 0.006 * (r["seed"] - 1) ** 2} if r["model.pos_embed"] == "learned"
             and "test.top1" in r else r for r in rows()]
    report = findings.build(spec, noisy)
    c = report["comparisons"][report["claims"][0]["row"]]
    assert c["std"] > 0 and c["alpha_first"] < 0.05  # the claim's rows (one per rate) share its family's Holm bar
    assert c["mde"] == pytest.approx(stats.mde(c["std"], c["n"], c["alpha_first"], expect="equal"))
    power = stats.power(c["n"], c["std"], 0.0, "equal", 0.01, c["alpha_first"])
    table = findings.claims_table([report])
    assert "learned - none within ±1.0 (TOST)" in table and f"power at ±1.0 points: {power:.0%}" in table
    sentence = findings.sentences(report)
    assert "(within ±1.0 points;" in sentence and "(TOST: the margin)" in sentence
    assert f"power at ±1.0 points: {power:.0%}" in sentence
    assert "learned - none > 0" in findings.comparisons_table(report)  # a direction's row says its side


@pytest.mark.parametrize("n,sd,margin,alpha", [(16, 1.0, 1.0, 0.025), (8, 1.2, 1.0, 0.05 / 18), (5, 0.5, 0.5, 0.05)])
def test_a_no_better_claim_is_tested_one_sided_against_its_margin(n, sd, margin, alpha):
    """ "no higher" (a - b < +m, the paper's "no better than") passes on the interval's upper end
    alone: its p (claim_p) is below 0.05 exactly when that end is below +m, its power is the
    simulated share of draws that pass, and it is above TOST's, which needs both ends."""
    np = pytest.importorskip("numpy")
    d = np.random.default_rng(1).normal(0.0, sd, (100_000, n))
    mean, se = d.mean(1), d.std(1, ddof=1) / math.sqrt(n)
    crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    hits = (mean + crit * se < margin).mean()
    power = stats.power(n, sd, 0.0, "no higher", margin, alpha)
    assert power == pytest.approx(hits, abs=0.005) and power > stats.power(n, sd, 0.0, "equal", margin, alpha)
    assert stats.power(n, sd, 0.0, "no lower", margin, alpha) == pytest.approx(power)
    for row in (stats.paired(dict(enumerate(x)), dict(enumerate([0.0] * n))) for x in d[:200] + 0.3 * margin):
        p = stats.claim_p(row, "no higher", margin)
        assert (p < 0.05) == (row["hi"] < margin) == (stats.verdict(row, "no higher", margin) == "Reproduced")
        flipped = {**row, "mean": -row["mean"], "lo": -row["hi"], "hi": -row["lo"]}
        assert stats.claim_p(flipped, "no lower", margin) == pytest.approx(p)
        assert stats.verdict(flipped, "no lower", margin) == stats.verdict(row, "no higher", margin)
    above = {"n": 4, "mean": 3.0, "std": 0.1, "lo": 2.8, "hi": 3.2}
    assert stats.verdict(above, "no higher", 1.0) == "Opposite"
    assert stats.verdict(above, "no higher", 1.0, p_adjusted=0.2) == "Not shown"  # a margin claim is never "In direction"
    m = stats.mde(sd, n, alpha, expect="no higher")  # the margin found no higher 80% of the time at d = 0
    assert stats.power(n, sd, 0.0, "no higher", m, alpha) == pytest.approx(0.8, abs=1e-4)


def test_a_report_states_the_one_sided_rule_only_where_a_claim_is_one_sided():
    one_sided = SweepSpec.from_dict({**SPEC, "report": {**SPEC["report"], "compare": [
        {"claim": "learned no better than none (within 1 point)", "axis": "model.pos_embed", "a": "learned",
         "b": "none", "expect": "no higher", "margin": 0.01}]}}, "t")
    report = findings.build(one_sided, rows())
    assert report["rule"] == stats.RULE + " " + stats.ONE_SIDED_RULE
    assert "learned - none < +1.0 (one-sided)" in findings.comparisons_table(report)
    assert findings.build(SweepSpec.from_dict(SPEC, "t"), rows())["rule"] == stats.RULE
