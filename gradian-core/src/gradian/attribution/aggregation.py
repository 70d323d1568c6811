"""Combining per-item blame into one score per example: streaming moments, z-scores, harm, smooth max, rank votes,
item weights, top-k."""

from __future__ import annotations

import numpy as np

AGGREGATIONS = ("mean", "harm", "smooth_max", "rank_vote")
ITEM_WEIGHTS = ("uniform", "kurtosis")
SMOOTH_MAX_TEMPERATURE = 2.0


class RunningMoments:
    """Per-column count, mean and sum of squared deviations over streamed row blocks (Chan et al.'s merge).

    The merge is exact in real arithmetic and stable in float64, so the final mean and std equal those of
    the whole column however the rows were chunked, up to float64 rounding.
    """

    def __init__(self, columns: int) -> None:
        self.count = 0
        self.mean = np.zeros(columns, dtype=np.float64)
        self.m2 = np.zeros(columns, dtype=np.float64)

    def update(self, block: np.ndarray) -> None:
        """Fold in a [rows, columns] block."""
        block = np.asarray(block, dtype=np.float64)
        rows = block.shape[0]
        if rows == 0:
            return
        block_mean = block.mean(axis=0)
        block_m2 = ((block - block_mean) ** 2).sum(axis=0)
        total = self.count + rows
        delta = block_mean - self.mean
        self.mean = self.mean + delta * (rows / total)
        self.m2 = self.m2 + block_m2 + delta**2 * (self.count * rows / total)
        self.count = total

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation per column (0 before any row)."""
        if self.count == 0:
            return np.zeros_like(self.mean)
        return np.sqrt(np.clip(self.m2 / self.count, 0.0, None))


def zscores(scores: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(scores - mean) / std per column; a column with no spread is all zeros, never NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    safe = np.where(std > 0, std, 1.0)
    z = (scores - mean) / safe
    z[:, ~(std > 0)] = 0.0
    return z


def kurtosis_weights(scores: np.ndarray) -> np.ndarray:
    """Each item's weight: the kurtosis E[z^4] of its blame standardized over every example (uniform if none has any)."""
    # A regression that training rows caused is carried by a few of them: its item's blame has a heavy tail (z of 12
    # to 15 on the span tuning case's poisoned capitals, kurtosis 70-170). An item the learning rate broke has no such
    # rows (kurtosis 7-18) and its most blamed rows are whatever shares its topic: under equal weights they filled
    # the report's ranking between the planted ones (span-0, format-0; bench/results/item_weights.md).
    scores = np.asarray(scores, dtype=np.float64)
    z = zscores(scores, scores.mean(axis=0), scores.std(axis=0))
    weights = (z**4).mean(axis=0)
    return weights if weights.sum() > 0 else np.ones(scores.shape[1])


def _item_average(values: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Each row's mean over items, weighted by ``weights`` (one per item) when given."""
    if weights is None:
        return values.mean(axis=1)
    return values @ (np.asarray(weights, dtype=np.float64) / float(np.sum(weights)))


def mean_zscore(scores: np.ndarray, mean: np.ndarray, std: np.ndarray,
                weights: np.ndarray | None = None) -> np.ndarray:
    """Each row's (weighted) mean over items of the item-standardized blame: the `mean` aggregation."""
    return _item_average(zscores(scores, mean, std), weights)


def harm_zscore(scores: np.ndarray, mean: np.ndarray, std: np.ndarray,
                weights: np.ndarray | None = None) -> np.ndarray:
    """Each row's (weighted) mean over items of the positive part of the standardized blame: the `harm` aggregation."""
    # What a row did to one regressed item is not offset by its help to another: a planted row that broke its own
    # item far more than any other row did can help other items as strongly, and the plain mean cancels the two.
    return _item_average(np.clip(zscores(scores, mean, std), 0.0, None), weights)


def smooth_max_zscore(scores: np.ndarray, mean: np.ndarray, std: np.ndarray, weights: np.ndarray | None = None,
                      temperature: float = SMOOTH_MAX_TEMPERATURE) -> np.ndarray:
    """Each row's soft maximum over items of the standardized blame, T log mean exp(z / T) (the mean weighted when
    ``weights`` are given): the `smooth_max` aggregation."""
    # A planted row that broke only its own item (z +30 there, below zero on items it helped) sinks under the mean;
    # the soft maximum keeps it, and unlike the max a row that pushes every item a little still outranks one
    # item's noise. It ranks the examples by default (attribution.ranking) but the clusters are not tested on it:
    # it also lifts clean rows about the same topic as an item regressed by the learning rate alone, and clusters
    # tested on it accused a clean one on the tuning clean control (bench/results/aggregation.md).
    # Shifted by each row's max so that a z of +30 cannot overflow.
    z = zscores(scores, mean, std)
    if weights is not None:  # an item of weight 0 counts for nothing, so it cannot set the shift either
        counted = np.asarray(weights) > 0
        z, weights = z[:, counted], np.asarray(weights)[counted]
    top = z.max(axis=1)
    return top + temperature * np.log(_item_average(np.exp((z - top[:, None]) / temperature), weights))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` with 1 = largest; tied values share the mean of their ranks."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    order = np.argsort(-values, kind="stable")
    sorted_values = values[order]
    # Runs of equal values get the average of the positions they span.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], n]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def borda_score(mean_rank: np.ndarray, n: int) -> np.ndarray:
    """Mean rank turned into a score in [0, 1], 1 = ranked first by every item: the `rank_vote` aggregation."""
    if n <= 1:
        return np.ones_like(np.asarray(mean_rank, dtype=np.float64))
    return 1.0 - (np.asarray(mean_rank, dtype=np.float64) - 1.0) / (n - 1)


def ranks_of(scores: np.ndarray) -> np.ndarray:
    """1-based strict ranks, 1 = highest score, ties broken by position (earlier first)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((np.arange(scores.shape[0]), -scores))
    ranks = np.empty(scores.shape[0], dtype=np.int64)
    ranks[order] = np.arange(1, scores.shape[0] + 1)
    return ranks


class TopK:
    """The exact k highest scores seen over streamed chunks, ties broken by position, with a payload row each."""

    def __init__(self, k: int, payload_width: int) -> None:
        self.k = k
        self.scores = np.empty(0, dtype=np.float64)
        self.positions = np.empty(0, dtype=np.int64)
        self.payload = np.empty((0, payload_width), dtype=np.float64)

    def update(self, scores: np.ndarray, positions: np.ndarray, payload: np.ndarray) -> None:
        """Offer a chunk's scores, their positions and one payload row per score."""
        scores = np.concatenate([self.scores, np.asarray(scores, dtype=np.float64)])
        positions = np.concatenate([self.positions, np.asarray(positions, dtype=np.int64)])
        payload = np.concatenate([self.payload, np.asarray(payload, dtype=np.float64)])
        keep = np.lexsort((positions, -scores))[: self.k]
        self.scores, self.positions, self.payload = scores[keep], positions[keep], payload[keep]
