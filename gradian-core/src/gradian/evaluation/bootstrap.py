"""Paired bootstrap: resampled means of per-item scores, and the confidence interval of a mean difference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Resample indices are drawn in chunks of about this many numbers so 10,000 x 100,000 items never
# allocates gigabytes; the chunk layout depends only on n, so the same seed gives the same interval.
_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class DeltaInterval:
    """mean(after) - mean(before) with its percentile bootstrap interval."""

    delta: float
    low: float
    high: float
    confidence: float
    samples: int
    seed: int

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of zero."""
        return self.low > 0.0 or self.high < 0.0


def paired_bootstrap(before: Sequence[float] | np.ndarray, after: Sequence[float] | np.ndarray, *,
                     samples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> DeltaInterval:
    """Percentile CI of mean(after - before), resampling items (pairs) with replacement."""
    before_arr = np.asarray(before, dtype=np.float64)
    after_arr = np.asarray(after, dtype=np.float64)
    if before_arr.shape != after_arr.shape or before_arr.ndim != 1:
        raise ValueError("paired_bootstrap needs two 1-D score arrays of equal length")
    n = before_arr.shape[0]
    if n == 0:
        raise ValueError("paired_bootstrap needs at least one item")
    if samples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("paired_bootstrap needs samples >= 1 and 0 < confidence < 1")
    diffs = after_arr - before_arr
    (means,) = resampled_means([diffs], samples=samples, seed=seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return DeltaInterval(delta=float(diffs.mean()), low=float(low), high=float(high),
                         confidence=float(confidence), samples=int(samples), seed=int(seed))


def resampled_means(columns: Sequence[np.ndarray], *, samples: int, seed: int) -> list[np.ndarray]:
    """Each 1-D column's mean over the same ``samples`` resamplings of its items, drawn with replacement from ``seed``.

    The columns share every resample, so statistics of several of them (a ratio of two means) keep their correlation.
    """
    n = columns[0].shape[0]
    rng = np.random.default_rng(seed)
    means = [np.empty(samples, dtype=np.float64) for _ in columns]
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        for column, out in zip(columns, means, strict=True):
            out[start:stop] = column[idx].mean(axis=1)
    return means
