"""The mean and sample standard deviation of a list of numbers, in one place: Table 2's
"mean ± std over three fine-tuning runs" (train/repeats.py), a sweep arm's statistics
(sweep/stats.describe, which adds the t interval) and the spread drawn in a sweep's figures
(analysis/sweep_plots.py) all read it from here.

The standard deviation is the sample one (n - 1 in the denominator): the spread a further
seed would show, not that of the seeds at hand; one value has none (None).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional


def mean_std(values: Iterable[float]) -> tuple[float, Optional[float]]:
    """(mean, sample std); std is None for a single value. Raises ValueError for none."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_std needs at least one value")
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
