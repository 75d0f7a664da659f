"""The one "did you mean" of vitlab: every closed set a user types (commands, model names,
recipes, config keys, dataset kinds, formats, precisions) is refused through `unknown`, which
names the nearest choices instead of listing them all; and timm's training flags, which a
timm user types from habit, are answered with vitlab's own.

Nothing of vitlab is imported here, so that every layer may use it.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Iterable

# Beyond this many choices the whole list is not printed: it hides the near one (a model name
# among 29, a key among 39); the message points to where the list is.
LIST_AT_MOST = 12


def close(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices nearest to `word` (ignoring case, "_" against "-"), best first."""
    unique = list(dict.fromkeys(str(c) for c in choices))

    def key(text: str) -> str:
        return text.lower().replace("_", "-")

    by_key: dict[str, str] = {}
    for c in unique:
        by_key.setdefault(key(c), c)
    found = difflib.get_close_matches(key(str(word)), list(by_key), n=n, cutoff=0.6)
    score = [difflib.SequenceMatcher(None, key(str(word)), k).ratio() for k in found]
    # Only the near ones: a choice well behind the best is not what was meant.
    return [by_key[k] for k, r in zip(found, score, strict=True) if r >= score[0] - 0.08]


def close_key(key: str, keys: Iterable[str]) -> list[str]:
    """The "section.key" names nearest to `key`, in its own section or another: `train.lrr`
    -> `optim.lr` (a key put in the wrong section is the likeliest slip)."""
    keys = list(dict.fromkeys(keys))

    def score(candidate: str) -> float:  # the key's own name decides; a shared section says nothing
        return difflib.SequenceMatcher(None, key.rpartition(".")[2].lower(), candidate.rpartition(".")[2].lower()).ratio()

    ranked = sorted(((score(k), k) for k in keys), key=lambda p: -p[0])
    if not ranked or ranked[0][0] < 0.7:
        return []
    near = [k for s, k in ranked[:3] if s >= ranked[0][0] - 0.08]
    own = [k for k in near if k.partition(".")[0] == key.partition(".")[0]]
    return own or near  # `model.nme` is model.name, not data.name


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def unknown(what: str, word: str, choices: Iterable[str], listed_by: str = "", keys: bool = False) -> str:
    """One line refusing `word`: "unknown model 'ViT-B/61'; did you mean ViT-B/16?". With no
    near choice, the choices themselves (each once), or where to find them when there are many
    (`listed_by`, e.g. "`vitlab models` lists them"). `keys`: the choices are "section.key"
    names, and a key of another section counts as near (close_key)."""
    unique = list(dict.fromkeys(str(c) for c in choices))
    near = close_key(word, unique) if keys else close(word, unique)
    head = f"unknown {what} {word!r}"
    if near:
        more = f" ({listed_by})" if listed_by else ""
        return f"{head}; did you mean {_either(near)}?{more}"
    if len(unique) > LIST_AT_MOST and listed_by:
        return f"{head}; {listed_by}"
    return f"{head}; known: {', '.join(unique)}"


def hint(word: str, choices: Iterable[str]) -> str:
    """"; did you mean X?" for a message that says the rest itself, or ""."""
    near = close(word, choices)
    return f"; did you mean {_either(near)}?" if near else ""


# timm's train.py flags -> what vitlab calls the same thing (its flags or config keys).
TIMM_FLAGS = {
    "-b": "--batch-size",
    "--img-size": "--image-size",
    "--input-size": "--image-size",
    "--opt": "optim.name=adamw (or adam, sgd)",
    "--weight-decay": "optim.weight_decay=0.05",
    "--warmup-epochs": "--warmup-steps",
    "--sched": "optim.decay=cosine (or linear, constant)",
    "--smoothing": "--label-smoothing",
    "--drop": "model.dropout=0.1",
    "--aa": "--randaugment N M (or --autoaugment POLICY)",
    "--reprob": "--random-erasing P",
    "--model-ema": "--ema [DECAY]",
    "--model-ema-decay": "--ema DECAY",
    "--amp": "--bf16 (or --fp16 on a CUDA GPU)",
    "-j": "--workers",
    "--pretrained": "vitlab finetune CHECKPOINT",
    "--initial-checkpoint": "vitlab finetune CHECKPOINT",
    "--num-classes": "model.num_classes=N (the data sets it)",
    "--output": "--out",
    "--output-dir": "--out",
    "--grad-accum-steps": "--micro-batch-size",
    "--clip-grad": "optim.clip_grad_norm=1.0",
    "--warmup-lr": "optim.lr (warm-up starts at 0)",
    "--min-lr": "optim.end_lr",
}


# Choices that belong to another command: where a user finds them.
ELSEWHERE = {"onnx": "ONNX is written by `vitlab export --format onnx`",
             "torch-export": "a torch.export program is written by `vitlab export --format torch-export`",
             "int8": "an int8 serving copy is made by `vitlab.deploy.save_int8` or served with --precision int8"}


def argument_hint(message: str, options: Iterable[str]) -> str:
    """What to add to argparse's error `message`: for "invalid choice: 'trian' (choose from
    ...)" the near choice; for "unrecognized arguments: --img-size 224" vitlab's flag for a
    timm one, or the near one among this command's `options`."""
    if "invalid choice: " in message:
        word = message.split("invalid choice: ", 1)[1].split(" (choose from", 1)[0].strip("'\"")
        choices = [c.strip(" '\")") for c in message.split("(choose from", 1)[-1].split(",")]
        return hint(word, choices) or (f"; {ELSEWHERE[word]}" if word in ELSEWHERE and word not in choices else "")
    if "unrecognized arguments: " not in message:
        return ""
    notes = []
    flags = [f for f in message.split("unrecognized arguments: ", 1)[1].split() if f.startswith("-")]
    for flag in flags:
        name = flag.split("=", 1)[0]
        theirs = TIMM_FLAGS.get(name)  # vitlab's spelling of a timm training flag
        near = close(name, [o for o in options if o.startswith("--")], n=1)
        if theirs:
            notes.append(f"timm's {name} is {theirs} here")
        elif near:  # one flag: "did you mean --batch-size?"; several: each named
            notes.append(f"{name + ': ' if len(flags) > 1 else ''}did you mean {near[0]}?")
    return "; " + "; ".join(notes) if notes else ""


class _StoreOnce(argparse._StoreAction):
    """A single-valued flag: given twice with different values it is refused (argparse would
    keep the last one without a word); the same value twice is the same fact. An empty or blank
    value is refused too: no flag takes "" to mean its default."""

    def __call__(self, parser, namespace, values, option_string=None):
        if isinstance(values, str) and not values.strip():  # `--model ''` would fall back to the default without a word
            raise argparse.ArgumentError(self, f"an empty value ({values!r}): give one"
                                               f"{', or leave the flag out' if option_string else ''}")
        given = getattr(parser, "_given", None)
        if given is not None:
            if self.dest in given and given[self.dest][1] != values:
                before, _ = given[self.dest]
                raise argparse.ArgumentError(self, f"given twice with different values ({before} and {option_string} "
                                                   f"{values!r}): give it once")
            given[self.dest] = (f"{option_string} {values!r}", values)
        super().__call__(parser, namespace, values, option_string)


class SuggestingParser(argparse.ArgumentParser):
    """argparse, with the near command, choice or flag (argument_hint) added to its errors, and
    each error one line, as every other refusal is: the usage block argparse prints first
    would bury it; `--help` is named instead. A single-valued flag given twice with different
    values is refused (_StoreOnce)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        self._given: dict = {}  # dest -> (how it was given, its value), for this parse
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        hint = argument_hint(message, self._option_string_actions)
        self.exit(2, f"{self.prog}: error: {message}{hint} ({self.prog} --help lists the options)\n")
