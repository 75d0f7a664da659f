"""The statistics of a sweep's report: pure functions of lists of numbers, no numpy or scipy.

    describe([0.36, 0.37, 0.35])          # mean, std, the 95% t interval of the mean
    paired({0: .37, 1: .38}, {0: .36, 1: .36})   # a - b paired by seed: interval and p-value
    verdict(diff, "higher")               # the rule of docs/paper-in-miniature.md
    holm([0.01, 0.04]), bh([...])         # p-values adjusted across a page's claims
    mde(std, n)                           # the effect a paired t-test finds 80% of the time

Intervals are Student-t intervals: mean ± t(0.975, n-1) · s/√n, with s the sample standard
deviation (n-1 in the denominator). A paired comparison is the t interval and the two-sided
t-test of the per-seed differences a_i - b_i (the paired t-test). The t distribution is
computed here from the regularized incomplete beta function (a continued fraction, as in
Numerical Recipes §6.4), so vitlab's library needs no scipy; the tests check it against
scipy.stats.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping, Optional, Sequence

from vitlab.config.sweep import EXPECT  # what a claim may expect: the spec's choices
from vitlab.spread import mean_std

LEVEL = 0.95
VERDICTS = ("Reproduced", "In direction", "Not shown", "Opposite")
# The claims tested against a margin m rather than 0: "equal" (|a - b| < m, two one-sided tests)
# and the one-sided "no higher" (a - b < +m: a no better than b, within m) and "no lower"
# (a - b > -m), the paper's "no better than" tested as it is said, with one bound only.
MARGINED = ("equal", "no higher", "no lower")
RULE = (
    "Verdict rule (vitlab.sweep.stats.verdict), from the 95% paired-t interval of the difference "
    "d = a - b over seeds, where the claim (the paper's, or your own) says a is higher (lower: the signs flip): "
    "**Reproduced** if the interval lies wholly on the claim's side of 0; "
    "**Opposite** if it lies wholly on the other side; "
    "**In direction** if it contains 0 and the mean difference has the claim's sign; "
    "**Not shown** if it contains 0 and the mean difference is 0 or of the other sign. "
    "Where the claim says a and b are equal within a stated margin m (equivalence, as two one-sided tests): "
    "**Reproduced** if the interval lies inside [-m, +m]; **Opposite** if it lies wholly outside it; "
    "**Not shown** otherwise (an interval that excludes 0 but lies inside the margin is equal within m). "
    "A claim's p is the test of its expectation: the paired t-test of d = 0 for a direction; for an equal claim, "
    "two one-sided tests against -m and +m while the mean is inside the margin, and the test against the "
    "nearer bound (a test against equivalence) once it is outside. "
    "Each verdict uses its Holm-adjusted p-value within its family (`p_holm`; the confirmatory claims, the "
    "exploratory claims and the secondary rows are three families): a Reproduced or Opposite whose p_holm is "
    "0.05 or more becomes In direction (Not shown for an equal claim or an Opposite), so that the chance that "
    "any verdict of a family is separated by chance alone is at most 5%. "
    "Fewer than 2 seeds: no verdict."
)
# The rule's sentence for the one-sided margin claims, added to a report's rule where it has one.
ONE_SIDED_RULE = (
    "Where the claim says a is no higher than b within m (\"no higher\", one-sided: a - b < +m; \"no lower\": "
    "a - b > -m, the signs flip): **Reproduced** if the interval's upper end lies below +m; **Opposite** if its "
    "lower end lies above +m; **Not shown** otherwise; its p is the one-sided test of the bound (doubled, so that "
    "p < 0.05 exactly when the 95% interval's end is on the claim's side), as for a direction."
)
ALPHA = 0.05
POWER = 0.8


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """The two-sided tail P(|T| >= |t|) of Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    tail = t_sf2(t, df) / 2.0
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on the cdf; exact to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = _bracket(lambda t: t_cdf(t, df) < p, 1.0, lambda hi: 1e-13 * max(1.0, hi))
    return (lo + hi) / 2.0


def _bracket(below: Callable[[float], bool], hi: float, tol: Callable[[float], float]) -> tuple[float, float]:
    """(lo, hi) around the x >= 0 where `below(x)` turns false: `hi` doubled until below(hi) is
    false, then the interval halved until it is narrower than tol(hi) (t_ppf's and mde's search)."""
    lo = 0.0
    while below(hi):
        lo, hi = hi, hi * 2.0
    while hi - lo >= tol(hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if below(mid) else (lo, mid)
    return lo, hi


def describe(values: Sequence[float], level: float = LEVEL,
             bounds: Optional[tuple[float, float]] = None) -> dict[str, Any]:
    """n, mean, sample std and the t interval of the mean (lo, hi: None with fewer than 2).

    `bounds` (an accuracy's (0, 1)) clips the interval: the t interval knows no bound, and a
    mean of values inside one cannot leave it (three seeds at 99.9, 100, 93 otherwise read
    "[65, 121]%")."""
    n = len(values)
    mean, std = mean_std(values) if n else (None, None)
    if mean is None or std is None:  # fewer than 2 values: no spread, no interval
        return {"n": n, "mean": mean, "std": None, "lo": None, "hi": None}
    half = t_ppf(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return {"n": n, "mean": mean, "std": std, "lo": lo, "hi": hi}


def paired(a: Mapping[Any, float], b: Mapping[Any, float], level: float = LEVEL) -> dict[str, Any]:
    """a - b over the keys (seeds) both have: the differences' mean, std, t interval, the
    paired t statistic and its two-sided p-value (None with fewer than 2 pairs)."""
    keys = [k for k in a if k in b]
    diffs = [float(a[k]) - float(b[k]) for k in keys]
    out = {**describe(diffs, level), "pairs": keys, "diffs": diffs, "t": None, "p": None}
    if out["n"] >= 2:
        if out["std"] == 0:
            out["t"], out["p"] = (0.0, 1.0) if out["mean"] == 0 else (math.copysign(math.inf, out["mean"]), 0.0)
        else:
            out["t"] = out["mean"] / (out["std"] / math.sqrt(out["n"]))
            out["p"] = t_sf2(out["t"], out["n"] - 1)
    return out


def claim_p(diff: Mapping[str, Any], expect: str, margin: float = 0.0) -> Optional[float]:
    """The p-value whose < 0.05 the interval rule's separated verdicts stand for: the paired
    t-test of d = 0 for a direction; for "equal within m", the two one-sided tests of d <= -m
    and d >= +m (2 x the larger one-sided p: < 0.05 exactly when the 95% interval lies inside
    ±m) when the mean is inside the margin, and the test of the nearer bound when it is
    outside (< 0.05 exactly when the interval lies wholly outside ±m)."""
    n, mean, std = diff.get("n") or 0, diff.get("mean"), diff.get("std")
    if n < 2 or mean is None or std is None:
        return None
    if expect not in MARGINED:
        return diff.get("p")
    se = std / math.sqrt(n)
    if expect != "equal":  # one bound: the t-test of d = +m ("no higher"; -m for "no lower")
        inside = margin - (mean if expect == "no higher" else -mean)
        return (0.0 if inside > 0 else 1.0) if se == 0 else t_sf2(inside / se, n - 1)
    if se == 0:
        return 0.0 if abs(mean) != margin else 1.0
    if abs(mean) <= margin:
        worst = min((mean + margin) / se, (margin - mean) / se)  # the nearer bound's t
        return min(1.0, 2.0 * (1.0 - t_cdf(worst, n - 1)))
    return t_sf2((abs(mean) - margin) / se, n - 1)


def verdict(diff: Mapping[str, Any], expect: str, margin: float = 0.0,
            p_adjusted: Optional[float] = None) -> Optional[str]:
    """The rule (RULE) applied to a `paired` result; None with fewer than 2 pairs. With
    `p_adjusted` (the claim's Holm p), a separated verdict it does not carry is downgraded."""
    if expect not in EXPECT:
        raise ValueError(f"expect must be one of {', '.join(EXPECT)}, got {expect!r}")
    lo, hi, mean = diff.get("lo"), diff.get("hi"), diff.get("mean")
    if lo is None or hi is None or mean is None:
        return None
    if expect in ("no higher", "no lower"):
        near, far = (hi, lo) if expect == "no higher" else (-lo, -hi)  # the claim's end first
        found = "Reproduced" if near < margin else "Opposite" if far > margin else "Not shown"
    elif expect == "equal":
        if -margin <= lo and hi <= margin:
            found = "Reproduced"
        else:
            found = "Opposite" if lo > margin or hi < -margin else "Not shown"
    else:
        sign = 1.0 if expect == "higher" else -1.0
        if sign * lo > 0 and sign * hi > 0:
            found = "Reproduced"
        elif sign * lo < 0 and sign * hi < 0:
            found = "Opposite"
        else:
            found = "In direction" if sign * mean > 0 else "Not shown"
    if p_adjusted is None or p_adjusted < ALPHA or found not in ("Reproduced", "Opposite"):
        return found
    return "In direction" if found == "Reproduced" and expect not in MARGINED else "Not shown"


def holm(ps: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (None stays None): sorted ascending, the i-th
    (from 0) is max over j <= i of (m - j) p_(j), capped at 1."""
    order = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out: list[Optional[float]] = [None] * len(ps)
    running, m = 0.0, len(order)
    for j, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def bh(ps: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Benjamini-Hochberg adjusted p-values (the false discovery rate; None stays None):
    sorted ascending, the k-th (from 1) is min over j >= k of m p_(j) / j, capped at 1."""
    order = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out: list[Optional[float]] = [None] * len(ps)
    running, m = 1.0, len(order)
    for k in range(m, 0, -1):
        p, i = order[k - 1]
        running = min(running, m * p / k)
        out[i] = running
    return out


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def power(n: int, sd: float, effect: float, expect: str, margin: float = 0.0, alpha: float = ALPHA,
          steps: int = 100) -> float:
    """The probability that n seeds give the separated verdict (Reproduced) at `alpha`, the bar
    the verdict's p must pass (Holm: alpha/m for the first of m claims), when the per-seed
    differences are normal with standard deviation `sd` and a true mean `effect` in the claim's
    direction (for "equal", the true difference, usually 0, and `margin` the bound; for "no
    higher" the true a - b and for "no lower" b - a, usually 0, against the one bound `margin`).

    The rule separates a direction when t = mean/(s/sqrt n) passes c = t(1 - alpha/2, n-1) on the
    claim's side, and "equal within m" when both one-sided tests of TOST pass c (the claim's p,
    2 x the larger one-sided p, is below alpha). Given the sample s.d. s, the mean is normal, so
    each case is a normal probability; it is integrated over s (s^2 (n-1)/sd^2 is chi-square
    with n-1 degrees of freedom) by Simpson's rule in u = sqrt(chi-square), whose density is
    smooth at 0 for every n >= 2. For a direction this is the noncentral t's tail."""
    if n < 2 or not sd > 0:
        raise ValueError(f"power needs n >= 2 seeds and a positive s.d., got n={n}, sd={sd}")
    df = n - 1
    c, se = t_ppf(1.0 - alpha / 2.0, df), sd / math.sqrt(n)
    top = math.sqrt(df + 14.0 * math.sqrt(2.0 * df) + 40.0)
    norm = math.log(2.0) - (df / 2.0) * math.log(2.0) - math.lgamma(df / 2.0)

    def given(u: float) -> float:  # the chance of the verdict given s = sd * u / sqrt(df)
        half = c * sd * u / math.sqrt(df) / math.sqrt(n)  # the interval's half-width at this s
        if expect == "equal":
            return max(0.0, _phi((margin - half - effect) / se) - _phi((-margin + half - effect) / se))
        if expect in MARGINED:  # one bound: the interval's end on the claim's side inside it
            return _phi((margin - half - effect) / se)
        return _phi((effect - half) / se)

    def simpson(a: float, b: float, k: int) -> float:
        h, total = (b - a) / k, 0.0
        for i in range(k + 1):
            u = a + i * h
            density = (math.exp(norm) if df == 1 else 0.0) if u == 0 else math.exp(norm + (df - 1) * math.log(u) - u * u / 2)
            total += (1 if i in (0, k) else 4 if i % 2 else 2) * density * given(u)
        return total * h / 3.0

    # The verdict's chance is all but 0 past u = (bound / se + 8) * sqrt(df) / c: a step that
    # may sit far inside the density's range (few seeds, a strict alpha), integrated on its own
    # finer piece.
    turn = min(top, ((margin if expect in MARGINED else abs(effect)) / se + 8.0) * math.sqrt(df) / c)
    cuts = [0.0, turn, top] if 0 < turn < top else [0.0, top]
    return min(1.0, sum(simpson(a, b, steps) for a, b in itertools.pairwise(cuts)))


def mde(std: Optional[float], n: int, alpha: float = ALPHA, goal: float = POWER,
        expect: str = "higher") -> Optional[float]:
    """The minimum detectable effect at n seeds: the true difference (for "equal", "no higher"
    and "no lower": the margin, at a true difference of 0) that `power` separates with probability `goal` at `alpha` (the
    bar of the claim's verdict), given the s.d. of the per-seed differences."""
    if std is None or not std > 0 or n < 2:
        return None
    return _bracket(lambda m: power(n, std, 0.0 if expect in MARGINED else m, expect, m, alpha) < goal, std, lambda hi: 1e-7 * hi)[1]


def seeds_for(sd: float, effect: float, expect: str, margin: float = 0.0, alpha: float = ALPHA,
              goal: float = POWER, most: int = 200) -> Optional[int]:
    """The fewest seeds whose power reaches `goal` (None: more than `most`)."""
    for n in range(2, most + 1):
        if power(n, sd, 0.0 if expect in MARGINED else effect, expect, margin, alpha) >= goal:
            return n
    return None


def interpolate(points: list[tuple[float, float]], x: float) -> Optional[float]:
    """y at x on the broken line through (x, y) points; None outside their range."""
    pts = sorted(points)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1]  # a single point, at exactly x


def rule(expects: Sequence[str]) -> str:
    """The verdict rule a report states: RULE, and ONE_SIDED_RULE where a claim is one-sided."""
    return RULE + (" " + ONE_SIDED_RULE if {"no higher", "no lower"} & set(expects) else "")


def slope(xs: Sequence[float], ys: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """Least-squares line y = a + b x: the slope b, its standard error, its t interval (n-2
    degrees of freedom) and the two-sided p-value of b = 0 (None with fewer than 3 points)."""
    x, y = [float(v) for v in xs], [float(v) for v in ys]
    n = len(x)
    out: dict[str, Any] = {"n": n, "slope": None, "intercept": None, "se": None, "lo": None, "hi": None, "p": None}
    if n < 3:
        return out
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    if sxx == 0:
        return out
    b = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx
    a = my - b * mx
    resid = sum((v - a - b * u) ** 2 for u, v in zip(x, y, strict=True))
    se = math.sqrt(resid / (n - 2) / sxx)
    half = t_ppf(0.5 + level / 2.0, n - 2) * se
    p = (0.0 if b else 1.0) if se == 0 else t_sf2(b / se, n - 2)
    out.update(slope=b, intercept=a, se=se, lo=b - half, hi=b + half, p=p)
    return out
