"""Statistics of measurements: one definition for the trace summaries, the live page, ``gfdit bench`` and the
benchmarks, so the same latencies give the same p95 everywhere.

Percentiles are numpy's default: the sorted values sit at positions 0 .. n-1 and the q-th percentile is read
at position q/100 * (n-1), interpolating linearly between the two closest values (the median of an even
count is the mean of the middle two).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def percentile(values: Sequence[float] | Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of the values; ValueError when there are none."""
    xs = np.asarray(list(values), dtype=np.float64)
    if xs.size == 0:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} is outside [0, 100]")
    return float(np.percentile(xs, q))


def median(values: Sequence[float] | Iterable[float]) -> float:
    """The 50th percentile; ValueError when there are no values."""
    return percentile(values, 50)


def mean(values: Sequence[float] | Iterable[float]) -> float:
    """The arithmetic mean; ValueError when there are no values."""
    xs = np.asarray(list(values), dtype=np.float64)
    if xs.size == 0:
        raise ValueError("mean of no values")
    return float(xs.mean())


def summary(values: Sequence[float] | Iterable[float], quantiles: Sequence[float] = (50, 95, 99)) -> dict:
    """{"count", "mean", "p<q>" for each q, "max"}; every statistic None when there are no values."""
    xs = list(values)
    out: dict = {"count": len(xs), "mean": mean(xs) if xs else None}
    for q in quantiles:
        out[f"p{q:g}"] = percentile(xs, q) if xs else None
    out["max"] = float(max(xs)) if xs else None
    return out
