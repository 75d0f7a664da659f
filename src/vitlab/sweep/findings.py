"""A sweep's statistics: per arm and per compared pair, as report.json and report.md.

An *arm* is the set of finished cells that differ only in the report's `pair_by` axis (the
seed). Per arm and metric: n, mean, std and the 95% t interval of the mean. A metric that is
the mean of several few-shot draws (`fewshot.shots.5.mean`, with the draws in
`fewshot.shots.5.accuracy`) also gets `draw_std`, the mean over the arm's cells of the
standard deviation between draws: the draw noise is folded into the arm's interval because
each cell's value is its draws' mean, so the spread over seeds carries it (a cell's variance
is the seed variance plus the draw variance / draws), and `draw_std` says how much of it
there is.

A comparison pairs cells of `axis` = a and = b that agree on every other axis but pair_by,
one comparison per combination of those other axes (kept to `where`), and gives the
paired-by-seed difference a - b (stats.paired) with the verdict rule (stats.verdict). A
comparison without an axis pairs two results columns of the same cells, per arm.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional

from vitlab.config.fields import is_digits
from vitlab.config.sweep import CompareSpec, SweepSpec, claims_digest, declared_claims
from vitlab.files import atomic_write_text
from vitlab.sweep import declare, stats, timing
from vitlab.sweep.results import value
from vitlab.tables import markdown_table


def _done(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "done"]


def _context(row: dict[str, Any], axes: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple((a, str(row.get(a))) for a in axes)


def _draws(row: dict[str, Any], metric: str) -> Optional[list[float]]:
    if not metric.endswith(".mean"):
        return None
    draws = row.get(metric[: -len(".mean")] + ".accuracy")
    return [float(v) for v in draws] if isinstance(draws, list) and len(draws) > 1 else None


def arms(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per arm: its axis values, the seeds, and per metric describe() (+ draw_std)."""
    pair_by = spec.report.pair_by
    axes = [a for a in spec.grid if a != pair_by]
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for row in _done(rows):
        grouped.setdefault(_context(row, axes), []).append(row)
    out = []
    for context, cells in grouped.items():
        entry: dict[str, Any] = {"arm": dict(context), "seeds": [c.get(pair_by) for c in cells], "metrics": {}}
        for metric in spec.report.metrics:
            values = [v for v in (value(c, metric) for c in cells) if v is not None]
            if not values:
                continue
            bounded = percent(metric) and " - " not in metric  # accuracies stay in [0, 1]; a difference need not
            d = stats.describe(values, bounds=(0.0, 1.0) if bounded else None)
            stds = [stats.describe(draws)["std"] for row in cells if (draws := _draws(row, metric))]
            if stds:  # the mean over the arm's cells of the spread between their few-shot draws
                d["draw_std"] = sum(stds) / len(stds)
            entry["metrics"][metric] = d
        out.append(entry)
    return out


def _entry(c: Any, context: dict[str, Any], metric: str, diff: dict[str, Any]) -> dict[str, Any]:
    margin = getattr(c, "margin", 0.0)
    return {"claim": c.claim, "axis": getattr(c, "axis", "") or getattr(c, "by", ""), "a": c.a, "b": c.b,
            "expect": c.expect, "margin": margin, "context": context, "metric": metric, **diff,
            "p_claim": stats.claim_p(diff, c.expect, margin), "mde": None,
            "primary": _is_primary(c, context, metric), "verdict": stats.verdict(diff, c.expect, margin)}


def _is_primary(c: Any, context: dict[str, Any], metric: str) -> bool:
    """The row a declared claim rests on: its metric (a slope's y) in its context."""
    p = c.primary
    if not p:
        return False
    if hasattr(c, "logx"):  # a slope comparison has one row
        return p["metric"] == c.y
    return p["metric"] == metric and all(str(context.get(k)) == str(v) for k, v in (p.get("where") or {}).items())


def _side(row: dict[str, Any], c: CompareSpec) -> Optional[str]:
    v = str(row.get(c.axis))
    return "a" if v == str(c.a) else "b" if v == str(c.b) else None


def compare_at(spec: SweepSpec, c: CompareSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`compare` at equal `c.at` (CompareSpec.at): each a cell against the same seed's b cells,
    interpolated in log10(at) along `c.along`; one comparison per value of along (a's)."""
    pair_by = spec.report.pair_by
    others = [a for a in spec.grid if a not in (pair_by, c.axis, c.along)]
    b_rows: dict[tuple, list[tuple[float, dict[str, Any]]]] = {}  # each row with its log10(at)
    a_rows: dict[tuple, dict[str, tuple[float, dict[str, Any]]]] = {}
    for row in _done(rows):
        x = value(row, c.at)
        if x is None or x <= 0 or not all(str(row.get(k)) == str(v) for k, v in c.where.items()):
            continue
        side, context, seed = _side(row, c), _context(row, others), str(row.get(pair_by))
        if side == "b":
            b_rows.setdefault((context, seed), []).append((math.log10(x), row))
        elif side == "a":
            a_rows.setdefault((context, str(row.get(c.along))), {})[seed] = (math.log10(x), row)
    out = []
    for (context, where), by_seed in a_rows.items():
        for metric in c.metrics or spec.report.metrics:
            a, b = {}, {}
            for seed, (log_at, row) in by_seed.items():
                curve = [(log_x, y) for log_x, r in b_rows.get((context, seed), []) if (y := value(r, metric)) is not None]
                ya = value(row, metric)
                yb = stats.interpolate(curve, log_at)
                if ya is not None and yb is not None:
                    a[seed], b[seed] = ya, yb
            if a:
                label = {**dict(context), f"{c.along} of {c.a}": where, f"{c.b} at equal": c.at}
                out.append(_entry(c, label, metric, stats.paired(a, b)))
    return out


def compare_columns(spec: SweepSpec, c: CompareSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A compare without an axis: column a against column b of the same cells, per arm,
    paired by seed (the metric is named by a, whose units the difference has)."""
    pair_by = spec.report.pair_by
    per_arm: dict[tuple, tuple[dict[str, float], dict[str, float]]] = {}
    for row in _done(rows):
        ya, yb = value(row, str(c.a)), value(row, str(c.b))
        if ya is not None and yb is not None:
            a, b = per_arm.setdefault(_context(row, [x for x in spec.grid if x != pair_by]), ({}, {}))
            a[str(row.get(pair_by))], b[str(row.get(pair_by))] = ya, yb
    return [_entry(c, dict(context), str(c.a), stats.paired(a, b)) for context, (a, b) in per_arm.items()]


def _best(rows: list[dict[str, Any]], axis: str, by: str) -> Optional[str]:
    """The value of `axis` whose cells' mean of `by` is highest (None when no cell has `by`)."""
    means: dict[str, list[float]] = {}
    for row in rows:
        v = value(row, by)
        if v is not None:
            means.setdefault(str(row.get(axis)), []).append(v)
    return max(means, key=lambda k: sum(means[k]) / len(means[k])) if means else None


def compare_best(spec: SweepSpec, c: CompareSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best against best (CompareSpec.best): per side the value of `c.best` picked by the mean
    of the dev column `c.by`, then that side's cells paired by seed with the other's."""
    keep = [r for r in _done(rows) if _side(r, c)]
    chosen = {side: _best([r for r in keep if _side(r, c) == side], c.best, c.by) for side in ("a", "b")}
    if None in chosen.values():
        return []
    label = ((f"{c.best} of {c.a} (best by {c.by})", chosen["a"]), (f"{c.best} of {c.b}", chosen["b"]))
    return _paired(spec, c, {label: {s: [r for r in keep if _side(r, c) == s and str(r.get(c.best)) == chosen[s]] for s in "ab"}})


def _paired(spec: SweepSpec, c: Any, groups: dict[tuple, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per context (its rows of side a and of side b) and metric, the paired-by-seed difference
    a - b of the seeds both sides have the metric for (a later row of a seed over an earlier)."""
    out = []
    for context, both in groups.items():
        for metric in c.metrics or spec.report.metrics:
            a, b = ({str(r.get(spec.report.pair_by)): y for r in both[s] if (y := value(r, metric)) is not None} for s in "ab")
            if a and b:
                out.append(_entry(c, dict(context), metric, stats.paired(a, b)))
    return out


def compare(spec: SweepSpec, c: CompareSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paired differences of one compared pair, per context and metric, with verdicts."""
    if c.best:
        return compare_best(spec, c, rows)
    if c.at:
        return compare_at(spec, c, rows)
    if not c.axis:
        return compare_columns(spec, c, rows)
    pair_by = spec.report.pair_by
    others = [a for a in spec.grid if a not in (pair_by, c.axis)]
    keep = [r for r in _done(rows) if all(str(r.get(k)) == str(v) for k, v in c.where.items())]
    sides: dict[tuple, dict[str, dict[Any, dict]]] = {}
    for row in keep:
        side = _side(row, c)
        if side:  # one row per seed and side: the last
            sides.setdefault(_context(row, others), {"a": {}, "b": {}})[side][str(row.get(pair_by))] = row
    return _paired(spec, c, {context: {s: list(both[s].values()) for s in "ab"} for context, both in sides.items()})


def slopes(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each report.slopes line per group: every finished cell with both numbers is a point."""
    out, seen = [], set()
    for f in spec.report.slopes:
        if (f.x, f.y, f.by, f.logx) in seen:  # two compared pairs of one fit (a slope per model size)
            continue
        seen.add((f.x, f.y, f.by, f.logx))
        for label, (xs, ys) in _points(f, rows, f.by).items():
            out.append({"x": f.x, "y": f.y, "by": f.by, "group": label, "logx": f.logx, **stats.slope(xs, ys)})
    return out


def _points(f: Any, rows: list[dict[str, Any]], key: str, only: Optional[str] = None, missing: Any = ""
            ) -> dict[str, tuple[list[float], list[float]]]:
    """The (x, y) points of slope line `f` (x as log10 x with logx), every finished cell with
    both numbers one, grouped by its value of column `key` (`missing` where it has none; no
    key: "all"); with `only`, of the cells whose `f.by` is that group alone."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for row in _done(rows):
        x, y = value(row, f.x), value(row, f.y)
        if (only is not None and str(row.get(f.by)) != only) or x is None or y is None or (f.logx and x <= 0):
            continue
        xs, ys = groups.setdefault(str(row.get(key, missing)) if key else "all", ([], []))
        xs.append(math.log10(x) if f.logx else x)
        ys.append(y)
    return groups


def slope_comparisons(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each report.slopes line with groups a and b: per seed, the slope of a's cells and of
    b's, their difference paired by seed (stats.paired) and the verdict."""
    out = []
    pair_by = spec.report.pair_by
    for f in spec.report.slopes:
        if f.a is None:
            continue
        per = {side: _points(f, rows, pair_by, str(group), None) for side, group in (("a", f.a), ("b", f.b))}  # per seed
        fits = {side: {seed: stats.slope(*pts)["slope"] for seed, pts in d.items()} for side, d in per.items()}
        a = {k: v for k, v in fits["a"].items() if v is not None}
        b = {k: v for k, v in fits["b"].items() if v is not None}
        if a and b:
            metric = f"{f.y} per decade of {f.x}" if f.logx else f"{f.y} per unit of {f.x}"
            out.append(_entry(f, {}, metric, stats.paired(a, b)))
    return out


FAMILIES = ("confirmatory claims", "exploratory claims", "secondary rows")


def claims(spec: SweepSpec, comparisons: list[dict[str, Any]], declared: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's declared claims, each with the index of its row in `comparisons`, or None:
    a claim whose row the evidence cannot give (a control or dev score not run) is "not run
    since declared", never replaced by another row. Each has its power analysis (`plan`,
    declare.plan) and its family: confirmatory when the plan reaches 80% power and the
    evidence proves it was declared before the run, exploratory otherwise (with why)."""
    out = []
    for claim in declared_claims(spec):
        rows = [i for i, c in enumerate(comparisons) if c["primary"] and c["claim"] == claim["claim"]]
        plan = declare.plan(spec, claim)
        before = str(declared.get("status", "")).startswith("before")
        family = FAMILIES[0] if plan["confirmatory"] and before else FAMILIES[1]
        why = plan["why"] or ("" if before else f"declared: {declared.get('status') or 'unknown'}")
        out.append({**claim, "row": rows[0] if rows else None, "spec": spec.name, "plan": plan, "family": family,
                    "exploratory_why": why if family == FAMILIES[1] else ""})
        for i in rows:
            comparisons[i]["family_kind"] = family
    return out


def adjust(reports: list[dict[str, Any]], family: str) -> None:
    """Holm and Benjamini-Hochberg adjusted p-values (`p_holm`, `p_bh`) within each family of
    all `reports` (the page): the confirmatory claims, the exploratory claims and the secondary
    rows apart; each verdict is then the rule's with its p_holm (stats.verdict), and each row's
    MDE is at the bar its verdict needs (80% power at alpha/m, Holm's first step). In place."""
    for kind in FAMILIES:
        rows = [c for r in reports for c in r["comparisons"] if c.get("family_kind", FAMILIES[2]) == kind]
        ps = [c["p_claim"] for c in rows]
        bar = stats.ALPHA / max(1, sum(p is not None for p in ps))
        for c, ph, pb in zip(rows, stats.holm(ps), stats.bh(ps), strict=True):
            c.update(p_holm=ph, p_bh=pb, family=f"{kind} of {family}", alpha_first=bar,
                     mde=stats.mde(c.get("std"), c.get("n") or 0, bar, expect=c["expect"]),
                     verdict_unadjusted=stats.verdict(c, c["expect"], c["margin"]),
                     verdict=stats.verdict(c, c["expect"], c["margin"], ph))


def build(spec: SweepSpec, rows: list[dict[str, Any]], declared: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The statistics of a sweep's rows; `declared` says when its claims were declared, as the
    evidence proves it (declare.verify; None: unknown)."""
    comparisons = [x for c in spec.report.compare for x in compare(spec, c, rows)] + slope_comparisons(spec, rows)
    report = {
        "sweep": spec.name, "level": stats.LEVEL, "interval": "Student t over seeds (pair_by), two-sided",
        "pair_by": spec.report.pair_by, "rule": stats.rule([c.expect for c in spec.report.compare] + [c.expect for c in spec.report.slopes]),
        "cells": len(rows), "finished": len(_done(rows)),
        "arms": arms(spec, rows), "comparisons": comparisons, "slopes": slopes(spec, rows),
        "claims": claims(spec, comparisons, declared or {}), "claims_digest": claims_digest(spec),
        "claims_declared": declared or {"status": declare.UNKNOWN, "why": "not given"},
    }
    adjust([report], f"sweep {spec.name}")
    return report


# Markdown -----------------------------------------------------------------------------------
def percent(metric: str) -> bool:
    """Accuracies (0-1): printed in %, their intervals clipped to [0, 1]; anything else as it is."""
    last = metric.split(".")[-2 if metric.endswith(".mean") else -1]
    # head_probe.start.SPLIT: a fine-tune's top-1 with its probe head at step 0 (train/probe_head.py)
    return any(w in metric for w in ("top1", "top5", "accuracy", "fewshot", "shots", "head_probe.start")) or \
        is_digits(last)


def fmt(value: Optional[float], metric: str, digits: int = 1, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if not percent(metric):
        return f"{value:+.3g}" if signed else f"{value:.3g}"
    return f"{100 * value:+.{digits}f}" if signed else f"{100 * value:.{digits}f}"


def _interval(d: dict[str, Any], metric: str, signed: bool = False) -> str:
    if d.get("lo") is None:
        return "-"
    return f"[{fmt(d['lo'], metric, signed=signed)}, {fmt(d['hi'], metric, signed=signed)}]"


def _label(context: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in context.items()) or "-"


def _table(columns: list[str], rows: Iterable[list[Any]]) -> str:
    return markdown_table(columns, rows).rstrip("\n")  # a block of report.md's lines


def arms_table(report: dict[str, Any], metric: str) -> str:
    unit = " (%)" if percent(metric) else ""
    return _table(["arm", "n", f"{metric}{unit}: mean", "std", "95% interval", "few-shot draw std"],
                  ([_label(arm["arm"]), d["n"], fmt(d["mean"], metric), fmt(d["std"], metric), _interval(d, metric),
                    fmt(d.get("draw_std"), metric)] for arm in report["arms"] if (d := arm["metrics"].get(metric))))


def p_text(p: Optional[float]) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def comparisons_table(report: dict[str, Any], metrics: Optional[list[str]] = None, secondary: bool = False) -> str:
    """Every compared row (or the secondary ones: not a declared claim's), with p and p_holm."""
    rows = [c for c in report["comparisons"]
            if not (metrics and c["metric"] not in metrics) and not (secondary and c.get("primary"))]
    return _table(["claim", "where", "metric", "a - b: tested", "n", "mean diff", "95% interval", "p", "p_holm", "verdict"],
                  ([c["claim"] or "-", _label(c["context"]), _metric(c["metric"]), tested(c), c["n"],
                    fmt(c["mean"], c["metric"], signed=True), _interval(c, c["metric"], signed=True),
                    p_text(c["p_claim"]), p_text(c.get("p_holm")), c["verdict"] or "too few seeds"] for c in rows))


def _metric(metric: str) -> str:
    return f"{metric} (points)" if percent(metric) else metric  # a difference of accuracies is in points


def tested(c: dict[str, Any]) -> str:
    """What a row's verdict tests, margin included: "a - b > 0", "a - b < 0", "a - b within ±m (TOST)"."""
    pair, m = f"{c['a']} - {c['b']}", fmt(c["margin"], c["metric"])
    if c["expect"] == "equal":
        return f"{pair} within ±{m} (TOST)"
    if c["expect"] in stats.MARGINED:
        return f"{pair} {'< +' if c['expect'] == 'no higher' else '> -'}{m} (one-sided)"
    return f"{pair} {'>' if c['expect'] == 'higher' else '<'} 0"


def _bound(claim: dict[str, Any]) -> Optional[float]:
    return claim["margin"] if claim["expect"] in stats.MARGINED else claim.get("effect")


def _mde_text(c: dict[str, Any], claim: dict[str, Any]) -> str:
    """The MDE of the test the verdict uses (80% power at its Holm bar alpha/m; for "equal" the
    TOST margin), flagged where it exceeds the margin or the declared effect."""
    bound, word = _bound(claim), "margin" if claim["expect"] in stats.MARGINED else "effect"
    return fmt(c.get("mde"), c["metric"]) + (f" (above {word})" if c.get("mde") is not None and bound and c["mde"] > bound
                                             else "")


def _power_text(c: dict[str, Any], claim: dict[str, Any]) -> str:
    """The power the seeds had at the margin (TOST) or the declared effect, at the verdict's bar
    and the observed s.d.: an equal verdict is no stronger than it ("" without a bound or s.d.)."""
    equal, bound = claim["expect"] in stats.MARGINED, _bound(claim)
    if not bound or (c.get("n") or 0) < 2 or not (c.get("std") or 0) > 0 or c.get("alpha_first") is None:
        return ""
    power = stats.power(c["n"], c["std"], 0.0 if equal else bound, claim["expect"], bound, c["alpha_first"])
    unit = " points" if percent(c["metric"]) else ""
    sign = {"equal": "±", "no higher": "+", "no lower": "-"}.get(claim["expect"], "")
    return f"power at {sign}{fmt(bound, c['metric'])}{unit}: {power:.0%}"


MDE_COLUMN = "MDE (80% at alpha/m; equal: TOST margin); power at the margin or effect"


def claims_table(reports: list[dict[str, Any]]) -> str:
    """The declared claims of every report, one table per family (confirmatory, then
    exploratory: findings.FAMILIES): when the evidence proves they were declared, the seeds
    and planned power, the one row's statistics, p, Holm and BH p-values within the family,
    the MDE at the verdict's bar (80% power at alpha/m) and the verdict."""
    parts = []
    for family in FAMILIES[:2]:
        rows = [(r, cl) for r in reports for cl in r.get("claims", []) if cl.get("family") == family]
        if not rows:
            continue
        ps = [r["comparisons"][cl["row"]] for r, cl in rows if cl["row"] is not None]
        m = sum(c.get("p_claim") is not None for c in ps)
        table = []
        for r, claim in rows:
            head = [r["sweep"], claim["claim"], declare.when_text(r.get("claims_declared")),
                    declare.plan_text(claim.get("plan"))]
            if claim["row"] is None:
                table.append([*head, claim["metric"], f"{claim['a']} - {claim['b']}", *["-"] * 7, "not run since declared"])
                continue
            c = r["comparisons"][claim["row"]]
            mt = c["metric"]
            table.append([*head, f"{_label(c['context'])}; {_metric(mt)}", tested(c), c["n"],
                          fmt(c["mean"], mt, signed=True), _interval(c, mt, signed=True), p_text(c["p_claim"]),
                          p_text(c["p_holm"]), p_text(c["p_bh"]),
                          "; ".join(filter(None, (_mde_text(c, claim), _power_text(c, claim)))), c["verdict"] or "too few seeds"])
        parts += [f"**{family.capitalize()}** ({m} with a p-value: Holm across them, the first at alpha 0.05/{max(m, 1)})",
                  "", _table(["spec", "claim", "declared", "seeds; planned power", "where, metric", "a - b: tested", "n",
                              "mean diff", "95% interval", "p", "p_holm", "p_bh", MDE_COLUMN, "verdict"], table),
                  ""]
    return "\n".join(parts).rstrip("\n")


def sentences(report: dict[str, Any]) -> str:
    """A verdict sentence per declared claim, written from its statistics alone."""
    out = []
    for claim in report.get("claims", []):
        if claim["row"] is None:
            out.append(f"- *{claim['claim']}*: not run since declared (its primary row, {claim['metric']}, needs "
                       f"cells this evidence lacks; selection: {claim['selection']}).")
            continue
        c = report["comparisons"][claim["row"]]
        m, unit = c["metric"], " points" if percent(c["metric"]) else ""
        side = (f"within ±{fmt(claim['margin'], m)}{unit}" if claim["expect"] == "equal" else
                f"{c['a']} - {c['b']} {'< +' if claim['expect'] == 'no higher' else '> -'}{fmt(claim['margin'], m)}{unit}"
                if claim["expect"] in stats.MARGINED else f"{c['a']} {claim['expect']} than {c['b']}")
        out.append(f"- *{claim['claim']}* ({side}; {_label(c['context'])}; {m}): {c['a']} - {c['b']} = "
                   f"{fmt(c['mean'], m, signed=True)}{unit} {_interval(c, m, signed=True)} over {c['n']} seeds, "
                   f"p {p_text(c['p_claim'])}, p_holm {p_text(c['p_holm'])}: **{c['verdict'] or 'too few seeds'}**"
                   f"{'' if c['verdict'] == c['verdict_unadjusted'] else ' (' + str(c['verdict_unadjusted']) + ' before Holm)'}."
                   f" Detectable at 80% power at alpha 0.05/{round(stats.ALPHA / c['alpha_first'])}"
                   f"{' (TOST: the margin)' if claim['expect'] == 'equal' else ''}: {fmt(c.get('mde'), m)}{unit}"
                   f"{'; ' + power if (power := _power_text(c, claim)) else ''}.")
    return "\n".join(out)


def slopes_table(report: dict[str, Any]) -> str:
    return _table(["y", "against", "group", "points", "slope per decade", "95% interval", "p (slope = 0)"],
                  ([_metric(s["y"]), f"log10 {s['x']}" if s["logx"] else s["x"], s["group"], s["n"],
                    fmt(s["slope"], s["y"], 2, signed=True), _interval({"lo": s["lo"], "hi": s["hi"]}, s["y"], signed=True),
                    p_text(s["p"])] for s in report.get("slopes", [])))


def markdown(report: dict[str, Any], metrics: list[str]) -> str:
    parts = [f"# Sweep {report['sweep']}: statistics", "",
             f"{report['finished']} of {report['cells']} cells finished. Intervals: 95%, {report['interval']}.", ""]
    if "time" in report:
        parts += [f"Time: {timing.sentence(report['time'])}", ""]
    for metric in metrics:
        parts += [f"## {metric}", "", arms_table(report, metric), ""]
    if report.get("claims"):
        parts += ["## Declared claims", "", f"Adjusted across the {report['comparisons'][0]['family'].split(' of ', 1)[1]}"
                  if report["comparisons"] else "", "", claims_table([report]), "", sentences(report), ""]
    if report["comparisons"]:
        parts += ["## Compared pairs (a - b, paired by " + report["pair_by"] + ")", "", comparisons_table(report), ""]
    if report.get("slopes"):
        parts += ["## Fitted slopes", "", slopes_table(report), ""]
    parts += [report["rule"], ""]
    return "\n".join(parts)


def write(spec: SweepSpec, rows: list[dict[str, Any]], out: Path,
          built: Optional[dict[str, Any]] = None) -> tuple[Path, Path]:
    """report.json and report.md: the statistics (`built`, when adjusted across a page), and
    the time the cells' steps took."""
    report = {**(built or build(spec, rows)), "time": timing.summary(out / r["cell"] for r in rows)}
    js, md = out / "report.json", out / "report.md"
    atomic_write_text(js, json.dumps(report, indent=2, default=str))
    atomic_write_text(md, markdown(report, list(spec.report.metrics)))
    return js, md
