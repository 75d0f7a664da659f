"""Declared claims that the evidence proves were declared, and powered, before the run.

A sweep folder's sweep.json records, when its first cell is about to run, its declared
claims' digest and text, the time (UTC) and the git commit of the spec file that declares
them (`record`). The run refuses a spec whose claims differ from that file at HEAD (not
committed: nothing would prove what was declared), and a confirmatory claim whose planned
power is below 80% (`plan`, `check_power`).

Every report re-checks the record (`verify`): the recorded digest against the spec kept
beside it, the declaration time against the first cell's start, and, where the commit is in
this repository, the spec at that commit. A missing, incomplete or edited record makes the
claim "declared: unknown", never "before".

A claim's power analysis (`primary`: sd, sd_from, family, effect or margin): the chance that
the claim's seeds give the separated verdict at alpha/m (Holm's bar for the first of the
page's m confirmatory claims, the strictest it applies) when the true difference is the
stated effect (for "equal": 0, within the margin: TOST), from the s.d. of a pilot's or
earlier seeds' differences; stats.power computes it.
"""

from __future__ import annotations

import calendar
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec, claims_digest, declared_claims
from vitlab.files.documents import DocumentError, read_yaml
from vitlab.sweep import stats, timing

BEFORE, AFTER, UNKNOWN = "before the run", "after the run (post hoc)", "unknown"


def _git(folder: Path, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def spec_at(commit: str, spec_file: str, where: Path) -> Optional[str]:
    """The claims digest of `spec_file` (relative to the repository) at `commit`, or None
    when `where` is in no git repository that has it."""
    root = _git(where, "rev-parse", "--show-toplevel")
    text = _git(Path(root.strip()), "show", f"{commit}:{spec_file}") if root else None
    if text is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "spec.yaml").write_text(text)
        try:
            return claims_digest(SweepSpec.from_dict(read_yaml(Path(tmp) / "spec.yaml", dict, "sweep spec"),
                                                     Path(spec_file).stem))
        except (ConfigError, DocumentError):
            return "unreadable"


def committed(spec: SweepSpec, source: Optional[Path]) -> dict[str, Optional[str]]:
    """The commit that holds `source` with the claims `spec` declares: {commit, spec_file};
    both None when the file is in no git repository. Raises ConfigError when it is in one but
    its claims there differ (uncommitted, or not tracked)."""
    if source is None:
        return {"commit": None, "spec_file": None}
    path = source.resolve()
    root = _git(path.parent, "rev-parse", "--show-toplevel")
    if root is None:
        return {"commit": None, "spec_file": None}
    rel = path.relative_to(Path(root.strip()).resolve()).as_posix()
    head = (_git(path.parent, "rev-parse", "HEAD") or "").strip()
    if not head or spec_at(head, rel, path.parent) != claims_digest(spec):
        raise ConfigError(f"{source}: its declared claims are not committed (git HEAD {head[:12] or 'none'} holds other claims, "
                          "or not this file): commit the spec first, then run it")
    return {"commit": head, "spec_file": rel}


def record(spec: SweepSpec, old: Optional[dict[str, Any]], stamp: bool,
           source: Optional[Path] = None) -> dict[str, Any]:
    """sweep.json's `claims`: the earlier record when it holds the same digest; else a new one,
    with the time and commit only when `stamp` (no cell has started: a declaration made after
    results exist proves nothing)."""
    digest = claims_digest(spec)
    if old and old.get("digest") == digest and (not stamp or old.get("declared_at")):
        return old
    new: dict[str, Any] = {"digest": digest, "text": [c["claim"] for c in declared_claims(spec)]}
    if stamp and declared_claims(spec):
        new.update(declared="before the first cell ran", declared_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   **committed(spec, source))
    return new


def reads(claim: dict[str, Any], step: str) -> bool:
    """Whether a declared claim's metric reads a column of the after-step `step` (`init.shots.5.mean`)."""
    return any(w.startswith(f"{step}.") for w in str(claim.get("metric") or "").replace(" - ", " ").split())


def redone(spec: SweepSpec, claims: dict[str, Any], step: str) -> dict[str, Any]:
    """The record after the after-step `step` is recomputed on finished cells (`vitlab sweep
    --redo-after`): the step, its command now and the time, under `redone`; when a declared
    claim reads that step, the claims are post hoc from then on (their cells' results existed,
    and may have been read, before the step changed), the earlier declaration kept beside it."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = next(a.command for a in spec.after if a.name == step)
    entry: dict[str, Any] = {"step": step, "at": at, "command": command}
    new = {**claims, "redone": [*claims.get("redone", []), entry]}
    if any(reads(c, step) for c in declared_claims(spec)):
        entry["declared_before"] = claims.get("declared")
        new["declared"] = (f"after its results (post hoc): after-step {step}, which a claim reads, recomputed at {at} "
                           "with another command, on cells whose results existed")
    return new


def verify(spec: SweepSpec, claims: Optional[dict[str, Any]], folder: Path,
           cell_dirs: Iterable[Path]) -> dict[str, Any]:
    """When the claims were declared, as the evidence proves it: {status, at, commit, why}.
    status is BEFORE only when the record is complete, its digest is the spec's beside it, its
    time precedes the first cell's start and (where the commit is here) the spec at its commit
    declares the same claims; AFTER when the record says post hoc; else UNKNOWN, with why."""
    c = claims or {}
    out = {"status": UNKNOWN, "at": c.get("declared_at"), "commit": c.get("commit"), "why": ""}
    redone = [{"step": r.get("step"), "at": r.get("at")} for r in c.get("redone", []) if isinstance(r, dict)]
    if redone:  # after-steps recomputed on finished cells (redone)
        out["redone"] = redone
    said = str(c.get("declared") or "")
    if not c:
        return {**out, "why": "no declaration recorded (no sweep.json, or none in it)"}
    if c.get("digest") != claims_digest(spec):
        return {**out, "why": "the claims beside the record differ from its digest (edited after declaration)"}
    if said.startswith("after"):
        return {**out, "status": AFTER, "why": said}
    if not (c.get("declared_at") and c.get("commit")):
        return {**out, "why": "no declaration time and commit recorded"}
    try:
        at = calendar.timegm(time.strptime(c["declared_at"], "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return {**out, "why": f"declaration time {c['declared_at']!r} unreadable"}
    start = min((e["start"] for d in cell_dirs for e in timing.read(d)), default=None)
    if start is not None and at > start:
        return {**out, "status": AFTER, "why": "declared after the first cell started"}
    there = spec_at(str(c["commit"]), str(c.get("spec_file") or ""), folder)
    if there is not None and there != c["digest"]:
        return {**out, "why": f"the spec at commit {str(c['commit'])[:12]} declares other claims"}
    return {**out, "status": BEFORE, "why": "" if there else "commit not in this repository: not checked"}


def when_text(declared: Optional[dict[str, Any]]) -> str:
    """When claims were declared, as `verify` found it: "before the run (TIME, COMMIT)", "after
    the run (post hoc)" or "unknown (why)"."""
    d = declared or {}
    status = d.get("status") or UNKNOWN
    if status.startswith("before"):
        return f"before the run ({d.get('at')}, {str(d.get('commit'))[:10]})"
    if status.startswith("after"):
        redo = "; ".join(f"{r['step']} recomputed {str(r['at'])[:10]}" for r in d.get("redone") or [])
        return f"{status[:-1]}; {redo})" if redo and status.endswith(")") else status
    return f"unknown ({d.get('why') or 'no record'})"


def plan_text(p: Optional[dict[str, Any]]) -> str:
    """A claim's seeds and planned power (`plan`), or why it has none."""
    p = p or {}
    if p.get("power") is None:
        return f"{p.get('seeds', '-')}; {p.get('why') or 'no power analysis'}"
    return f"{p['seeds']}; {p['power']:.0%} at alpha 0.05/{round(stats.ALPHA / p['alpha'])}"


def plan(spec: SweepSpec, claim: dict[str, Any]) -> dict[str, Any]:
    """A declared claim's power analysis: {confirmatory, seeds, alpha, power, mde, needs, why}.
    A claim is confirmatory when it is not marked exploratory and states its analysis (sd,
    sd_from, family and effect, or margin for "equal"); `why` says what it lacks."""
    values = spec.grid.get(spec.report.pair_by)  # the seeds
    n, equal = len(values) if isinstance(values, (list, dict)) else 1, claim["expect"] in stats.MARGINED
    effect = claim["margin"] if equal else claim.get("effect")
    out: dict[str, Any] = {"confirmatory": False, "seeds": n, "alpha": None, "power": None, "mde": None,
                           "needs": None, "why": ""}
    lacking = [k for k in ("sd", "sd_from", "family") if not claim.get(k)] + ([] if effect else
                                                                              ["margin" if equal else "effect"])
    if lacking:
        why = "marked exploratory" if claim.get("exploratory") else "no power analysis"
        return {**out, "why": f"{why} ({', '.join(lacking)} not stated)"}
    alpha, sd, bound = stats.ALPHA / int(claim["family"]), float(claim["sd"]), float(effect or 0.0)
    power = stats.power(n, sd, 0.0 if equal else bound, claim["expect"], bound, alpha) if n >= 2 else 0.0
    out.update(alpha=alpha, power=power, mde=stats.mde(sd, n, alpha, expect=claim["expect"]),
               needs=stats.seeds_for(sd, bound, claim["expect"], bound, alpha))
    if claim.get("exploratory"):  # run at the power it has, which the plan still states
        return {**out, "why": f"marked exploratory, planned power {power:.0%}"}
    if power < stats.POWER:
        return {**out, "why": f"planned power {power:.0%} < {stats.POWER:.0%}"}
    return {**out, "confirmatory": True}


def check_power(spec: SweepSpec) -> None:
    """Refuse a run whose declared claim states a power analysis (any of sd, sd_from, family)
    that is incomplete or plans below 80% power, unless it is marked exploratory. A claim that
    states none runs, and is reported in the exploratory family ("no power analysis"): only a
    plan of 80% or more makes a claim confirmatory."""
    for claim in declared_claims(spec):
        p = plan(spec, claim)
        if p["confirmatory"] or claim.get("exploratory") or not any(claim.get(k) for k in ("sd", "sd_from", "family")):
            continue
        if p["power"] is None:
            fix = "complete its power analysis (primary: sd, sd_from, family and effect) or mark it exploratory: true"
        else:
            fix = (f"at alpha {p['alpha']:.4g} it needs {p['needs'] or 'more than 200'} seeds; add seeds, "
                   "or mark it exploratory: true")
        raise ConfigError(f"{spec.name}: claim {claim['claim']!r} with {p['seeds']} seed(s): {p['why']}; {fix}")


def plan_lines(spec: SweepSpec) -> list[str]:
    """The power analysis in words, one line per declared claim (`vitlab sweep --dry-run`)."""
    lines = []
    for claim in declared_claims(spec):
        p = plan(spec, claim)
        if p["power"] is None:
            lines.append(f"claim {claim['claim']!r}: exploratory ({p['why']})")
            continue
        lines.append(f"claim {claim['claim']!r}: {p['seeds']} seeds, planned power {p['power']:.1%} at "
                     f"{'margin' if claim['expect'] in stats.MARGINED else 'effect'} "
                     f"{claim['margin'] if claim['expect'] in stats.MARGINED else claim['effect']:g} "
                     f"(s.d. {float(claim['sd']):g}, alpha 0.05/{claim['family']}); 80% needs {p['needs']} seeds; "
                     f"MDE at 80%: {p['mde']:.3g}" + ("" if p["confirmatory"] else f" -- {p['why']}"))
    return lines
