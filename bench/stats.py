"""Percentiles of latency samples, one definition for every benchmark."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least `p` (0..1) of the samples at or
    below it; NaN without samples."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


def latency_summary(values_ms: Iterable[float]) -> dict[str, float | int]:
    """n, p50, p95, p99 and max of a set of latencies in ms (empty: just n = 0)."""
    lat = sorted(values_ms)
    if not lat:
        return {"n": 0}
    return {"n": len(lat), "p50_ms": statistics.median(lat), "p95_ms": percentile(lat, 0.95),
            "p99_ms": percentile(lat, 0.99), "max_ms": lat[-1]}
