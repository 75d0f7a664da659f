"""What every config dataclass shares: one check per field, one unknown-key check.

A field declares its rule where it is defined (`lr: float = setting(1e-3, above=0)`); the
dataclass's `__post_init__` calls `check_fields(self)`, which checks each field's type from
its annotation and then its rule, and fails on the first bad one with a message that names
that field alone. This runs however the config is built: from Python, from a recipe file,
from command-line overrides, from a checkpoint's metadata.

Values read from text (YAML recipes, `key=value` overrides) may arrive as strings where a
number is meant (YAML 1.1 reads `1e-3` as a string); `from_text` converts those before the
check. Values built in Python are taken as they are: `num_classes="10"` is an error.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import os
import re
import typing
from dataclasses import MISSING, field, fields
from functools import lru_cache
from typing import Any, Callable, Optional, Union

from vitlab import suggest


class Reasoned(Exception):
    """An error with a `reason`: why, as a short code that callers and tests branch on; the
    message is for people. ConfigError, DataError and CheckpointError are ones."""

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.reason = reason


class ConfigError(Reasoned, ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """Bounds and choices of one field; `check` is a function for anything else."""

    above: Optional[float] = None  # value > above
    at_least: Optional[float] = None  # value >= at_least
    below: Optional[float] = None  # value < below
    at_most: Optional[float] = None  # value <= at_most
    one_of: Optional[tuple] = None
    check: Optional[Callable[[Any], Optional[str]]] = None  # returns what is wrong, or None
    hint: str = ""  # appended to the message: what the field means, or a usual value


def setting(default: Any = MISSING, *, default_factory: Any = MISSING, **rule: Any) -> Any:
    """A dataclass field with a rule: `setting(0.0, at_least=0)`, `setting("adamw", one_of=(...))`."""
    if "one_of" in rule:
        rule["one_of"] = tuple(rule["one_of"])
    return field(default=default, default_factory=default_factory, metadata={"rule": Rule(**rule)})


@lru_cache(maxsize=None)
def hints(cls: type) -> dict[str, Any]:
    """Each field's type, by name (read once per class)."""
    return typing.get_type_hints(cls)


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return _describe(inner[0]) + " or null"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            plural = {bool: "flags", int: "whole numbers", float: "numbers", str: "strings"}.get(args[0], "values")
            return f"a list of {plural}"
        return f"a list of {len(args)} values"
    return {bool: f"a switch ({SWITCH_WORDS})", int: "a whole number", float: "a number", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def check_type(value: Any, hint: Any, label: str) -> Any:
    """`value` as the annotated type (list -> tuple, 3 -> 3.0), or a ConfigError naming `label`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_type(value, inner[0], label)
    if value is None:
        raise ConfigError(f"{label} cannot be null: give {_describe(hint)}, or leave the key out for its default")
    bad = ConfigError(f"{label}={value!r} is not {_describe(hint)}")
    if hint in (bool, str):
        if not isinstance(value, hint):
            raise bad
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or hint is int and isinstance(value, float) \
                and not value.is_integer():
            raise bad
        if hint is float:
            return float(number(value, label))
        if isinstance(value, float) and abs(value) > 2**53:  # 1e30 would become 1000000000000000019884624838656
            raise ConfigError(f"{label}={value!r} is too large to be an exact whole number; write it out in digits")
        return int(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(check_type(v, args[0], f"{label}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{label}={list(value)!r} needs {len(args)} values, got {len(value)}")
        return tuple(check_type(v, a, f"{label}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin in (dict, typing.Mapping, collections.abc.Mapping) or hint is dict:
        if not isinstance(value, dict):
            raise bad
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls: Any = hint  # a config section's dataclass
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value) if hasattr(cls, "from_dict") else cls(**check_keys(cls, value, label))
        raise bad
    return value


def _apply_rule(value: Any, rule: Rule, label: str) -> None:
    if value is None:
        return
    hint = f" ({rule.hint})" if rule.hint else ""
    if rule.one_of is not None and value not in rule.one_of:
        near = suggest.hint(str(value), [str(c) for c in rule.one_of]) if isinstance(value, str) else ""
        raise ConfigError(f"{label}={value!r} is not one of {', '.join(repr(c) for c in rule.one_of)}{hint}{near}")
    _check_range(value, rule, label)
    if rule.check is not None:
        problem = rule.check(value)
        if problem:
            raise ConfigError(f"{label}={value!r}: {problem}{hint}")


def _check_range(value: Any, rule: Rule, label: str) -> None:
    hint = f" ({rule.hint})" if rule.hint else ""
    for bound, ok, words in ((rule.above, lambda v, b: v > b, "must be > {}"), (rule.at_least, lambda v, b: v >= b, "must be >= {}"),
                             (rule.below, lambda v, b: v < b, "must be < {}"), (rule.at_most, lambda v, b: v <= b, "must be <= {}")):
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{label} {words.format(bound if isinstance(bound, int) else f'{bound:g}')}, got {value!r}{hint}")


# A seed is what every generator it seeds takes (numpy's legacy one stops below 2**32).
SEED_RANGE: dict[str, Any] = {"at_least": 0, "at_most": 2**32 - 1}  # number()'s bounds (Any: spread into its keywords)
_WHOLE = re.compile(r"[+-]?[0-9]+")


def is_digits(text: str) -> bool:
    """True for text of ASCII digits only: what int() reads as written. (str.isdigit is also
    true for "²" and other digits int() refuses.)"""
    return bool(re.fullmatch(r"[0-9]+", text))
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def number(value: Any, label: str, *, whole: bool = False, hint: str = "", **bounds: float) -> Any:
    """The one check of a number a user gives (a flag, a setting, a spec, an environment
    variable, a file read back): `value` as text of ASCII digits (no `inf`, `nan`, `²` or `1_0`)
    or as a number (not a bool), finite, whole where `whole`, and within `bounds` (Rule's
    above/at_least/below/at_most); else one ConfigError naming `label`, what it got and what it takes."""
    limits: dict[str, Any] = bounds  # Rule's bounds (typed Any: spread among its other keywords)
    rule = Rule(**limits, hint=hint)
    kind = "a whole number" if whole else "a number"
    text = value.strip() if isinstance(value, str) else None
    if text is not None and _WHOLE.fullmatch(text):
        n: Any = int(text)
    elif text is not None and not whole and _DECIMAL.fullmatch(text):
        n = float(text)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        n = value
    elif text is not None and text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
        n = float(text)
    else:
        raise ConfigError(f"{label}={value!r} is not {kind}: give one in digits{f' ({hint})' if hint else ''}")
    if isinstance(n, float) and not math.isfinite(n):
        raise ConfigError(f"{label}={value!r} is not a finite number{f' ({hint})' if hint else ''}")
    if whole and isinstance(n, float):
        if not n.is_integer():
            raise ConfigError(f"{label}={value!r} is not {kind}{f' ({hint})' if hint else ''}")
        n = int(n)
    _check_range(n, rule, label)
    return n


def bounded(count: int, bound: int, label: str, what: str, fix: str) -> int:
    """The one check of an expansion (a range of seeds, a brace pattern's shards): its `count`
    of `what`, known before anything is built, at most `bound`; else one ConfigError."""
    if count > bound:
        raise ConfigError(f"{label} makes {count:,} {what}, more than the {bound:,} vitlab expands: {fix}")
    return count


def check_fields(obj: Any, section: str = "") -> None:
    """Check (and normalise) every field of a frozen dataclass instance in place."""
    types = hints(type(obj))  # type: ignore[arg-type]  # a class is hashable; mypy's lru_cache check misses it
    for f in fields(obj):
        label = f"{section}.{f.name}" if section else f.name
        value = check_type(getattr(obj, f.name), types[f.name], label)
        rule = f.metadata.get("rule")
        if rule is not None:
            _apply_rule(value, rule, label)
        object.__setattr__(obj, f.name, value)


def check_keys(cls: type, d: dict[str, Any], section: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The one unknown-key check: fail on a key that is not a field of `cls` (or in `extra`)."""
    if not isinstance(d, dict):
        raise ConfigError(f"the {section or 'config'} section must be a mapping of keys to values, got {d!r}")
    known = list(dict.fromkeys([f.name for f in fields(cls)] + list(extra)))
    unknown = [k for k in d if k not in known]
    if unknown:
        where = f"{section}." if section else ""
        if not known:
            raise ConfigError(f"unknown key {where}{unknown[0]}: the {section or 'config'} section takes no keys here",
                              reason="unknown-key")
        if len(unknown) == 1:
            raise ConfigError(suggest.unknown("key", where + str(unknown[0]), [where + k for k in known],
                                              f"valid {section + ' ' if section else ''}keys: {', '.join(known)}",
                                              keys=True), reason="unknown-key")
        raise ConfigError(f"unknown keys {', '.join(where + str(k) for k in unknown)}; "
                          f"valid {section + ' ' if section else ''}keys: {', '.join(known)}", reason="unknown-key")
    return dict(d)


# A switch (a boolean setting or environment flag) is one of these words, in any case, and nothing else:
# "maybe", "2" or "flase" is refused, never read as on or off.
SWITCHES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
SWITCH_WORDS = "1/0, true/false, yes/no or on/off"


def _switch_word(value: Any) -> Optional[bool]:
    """True or False for a switch word (or 0/1 as a number), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return SWITCHES.get(value.strip().lower()) if isinstance(value, str) else None


def switch(value: Any, label: str) -> bool:
    """A switch's value, or a ConfigError naming `label` and the words it takes."""
    on = _switch_word(value)
    if on is None:
        raise ConfigError(f"{label}={value!r} is not a switch: give {SWITCH_WORDS}")
    return on


def env_switch(name: str, default: bool = False) -> bool:
    """The switch in environment variable `name`; unset or empty is `default`."""
    text = os.environ.get(name, "")
    return default if not text.strip() else switch(text, name)


def from_text(value: Any, hint: Any) -> Any:
    """A value read from text, converted where its field wants a number or a flag."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return from_text(value, [a for a in args if a is not type(None)][0])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and value is not None and not isinstance(value, (list, tuple)):
        value = [value]  # one value where a list is meant: data.eval_splits=test
    if hint is bool and not isinstance(value, bool) and _switch_word(value) is not None:
        return _switch_word(value)  # a switch word, or YAML's 1 and 0
    if not isinstance(value, str):
        if origin is tuple and isinstance(value, (list, tuple)):
            inner = args[0] if len(args) == 2 and args[1] is Ellipsis else None
            return [from_text(v, inner if inner is not None else (args[i] if i < len(args) else Any)) for i, v in enumerate(value)]
        return value
    text = value.strip()
    try:
        if hint is float:
            return float(text)
        if hint is int:
            try:
                return int(text)  # exact, however long
            except ValueError:
                number = float(text)  # 1e3; a float past 2**53 is left for check_type to refuse as inexact
            return int(number) if number.is_integer() and abs(number) <= 2**53 else number
    except ValueError:
        return value
    return value


def section_from_text(cls: type, d: Optional[dict[str, Any]], section: str) -> Any:
    """A config section read from text: keys checked, values converted, then built (and checked)."""
    d = check_keys(cls, d or {}, section)
    types = hints(cls)
    return cls(**{k: from_text(v, types[k]) for k, v in d.items()})


def plain(value: Any) -> Any:
    """`value` as YAML and JSON write it: a config dataclass as a dict of its fields, a
    mapping as a dict, a tuple or list as a list, each inside converted too."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, collections.abc.Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
