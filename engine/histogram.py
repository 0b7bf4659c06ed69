"""A fixed-bucket histogram of plain counts, cheap to observe from engine threads and read by /metrics."""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Counts at one instant. `upper_bounds` ascending (the last bucket, +Inf, is implied);
    `bucket_counts[i]`: observations <= upper_bounds[i] and > the previous bound (not cumulative),
    with one extra entry for the +Inf bucket. `sum` is in the observed unit (seconds here)."""

    upper_bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = (0,)
    sum: float = 0.0

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.bucket_counts)


class BucketHistogram:
    """Observations counted into fixed buckets; thread-safe (a lock around a few int updates).

    `upper_bounds` must be strictly ascending and finite; raises ValueError otherwise.
    """

    def __init__(self, upper_bounds: tuple[float, ...]) -> None:
        if not all(math.isfinite(b) for b in upper_bounds) or any(
            b >= c for b, c in itertools.pairwise(upper_bounds)
        ):
            raise ValueError("histogram bounds must be finite and strictly ascending")
        self.upper_bounds = upper_bounds
        self._counts = [0] * (len(upper_bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Count one observation of `value` (in the histogram's unit)."""
        idx = bisect.bisect_left(self.upper_bounds, value)
        with self._lock:
            self._counts[idx] += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        """The counts now (a copy)."""
        with self._lock:
            return HistogramSnapshot(self.upper_bounds, tuple(self._counts), self._sum)
