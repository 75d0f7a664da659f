"""One set of class names: the checkpoint's, checked against the dataset's.

A classifier's output k is the checkpoint's class k, so every command labels its results
with the checkpoint's names (predict, serve, inspect and the ONNX metadata always did).
Measuring a checkpoint on a dataset (`vitlab eval`) compares its outputs with the dataset's
labels, so the two numberings must agree:

- the dataset's names are only numbers ("0", "1", ...: WebDataset shards without a
  classes.txt, digits) or absent: they are indices, and the checkpoint's names name them;
- the checkpoint has no names (or transformers' "LABEL_k" placeholders): the dataset's;
- both carry real names, the same ones in the same order: nothing to say;
- the same names in another order: an error. Every label would be compared with the wrong
  output, and the accuracy would be a number about nothing;
- other real names (a renamed class, another dataset of the same size): a warning naming
  the first differences; the results are labelled with the checkpoint's names.

docs/evaluation.md says the same for users.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

from vitlab.data import DataError


def only_numbers(names: Sequence[str]) -> bool:
    """Names that are the indices themselves: "0", "1", ... in order."""
    return all(str(n).strip() == str(i) for i, n in enumerate(names))


def real_names(names: Optional[Sequence[str]], num_classes: int) -> Optional[list[str]]:
    """A checkpoint's names when it carries one real name per class, else None."""
    names = list(names or [])
    if len(names) != num_classes or not names:
        return None
    if all(n in (f"class {i}", f"LABEL_{i}") for i, n in enumerate(names)):
        return None
    return [str(n) for n in names]


def class_names_for(model_names: Optional[Sequence[str]], num_classes: int, data_names: Sequence[str],
                    data: str = "the dataset") -> list[str]:
    """The names to label a checkpoint's results on a dataset with (see the module docstring).
    Raises DataError when both name the same classes in another order."""
    ours = real_names(model_names, num_classes)
    theirs = [str(n) for n in data_names]
    if ours is None:
        return theirs
    if not theirs or (only_numbers(theirs) and len(theirs) <= num_classes):
        return ours
    if theirs == ours:
        return ours
    if len(theirs) == len(ours) and sorted(theirs) == sorted(ours):
        moved = next(n for n, m in zip(theirs, ours, strict=True) if n != m)
        raise DataError(f"{data} numbers its classes in another order than the checkpoint ({moved!r} is class {theirs.index(moved)} "
                        f"there, {ours.index(moved)} in the checkpoint): give them in the checkpoint's order (classes.txt, data.classes)",
                        reason="class-order")
    differ = [f"{i}: {a!r} / {b!r}" for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b]  # names beyond the shorter list are counted apart
    warnings.warn(
        f"{data} names its classes differently from the checkpoint (class {', '.join(differ[:3])}"
        f"{', ...' if len(differ) > 3 else ''}, data / checkpoint); the results are labelled with the checkpoint's names",
        stacklevel=2,
    )
    return ours
