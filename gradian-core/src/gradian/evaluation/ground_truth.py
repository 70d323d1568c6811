"""Scoring a ranking against rows known to be planted: recall@k, average precision, first hit, cluster ranks.

The demo, `gradian inject` and the accuracy benchmarks know which training rows were planted. Each ranks rows (a
report's top examples, or a whole blame vector) and clusters, and scores the ranking here, so a recall@k in one of
them means what it means in the others.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PlantedRanking:
    """Where the planted rows stand in a ranking of training rows, best first."""

    hit_ranks: tuple[int, ...]  # the 1-based ranks of the planted rows listed, ascending
    planted: int  # how many rows were planted, listed or not
    listed: int  # how many rows the ranking holds (a report lists only its top examples)

    def hits_at(self, k: int) -> int:
        """How many planted rows are among the first ``k``."""
        return bisect_right(self.hit_ranks, k)

    @property
    def first_hit_rank(self) -> int | None:
        """The rank of the first planted row listed, or None."""
        return self.hit_ranks[0] if self.hit_ranks else None

    def average_precision(self) -> float:
        """Area under the precision-recall curve over the listed rows (NaN when none of them is planted)."""
        hits = np.zeros(self.listed, dtype=np.float64)
        hits[np.asarray(self.hit_ranks, dtype=np.int64) - 1] = 1.0
        if hits.sum() == 0:
            return float("nan")
        precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
        return float((precision * hits).sum() / hits.sum())


def rank_planted(ranked: Sequence[Hashable], planted: Collection[Hashable]) -> PlantedRanking:
    """Where ``planted`` rows stand in ``ranked`` (example ids or row positions, best first)."""
    wanted = set(planted)
    hits = tuple(rank for rank, row in enumerate(ranked, start=1) if row in wanted)
    return PlantedRanking(hit_ranks=hits, planted=len(wanted), listed=len(ranked))


def cluster_ranks(ranked: Sequence[str], planted: Sequence[str]) -> tuple[int | None, ...]:
    """Each planted cluster's 1-based rank among the ``ranked`` cluster names (None: not ranked)."""
    position = {name: rank for rank, name in enumerate(ranked, start=1)}
    return tuple(position.get(name) for name in planted)


def clusters_by_mean_blame(blame: np.ndarray, sources: Sequence[str]) -> list[str]:
    """Every row's cluster name, once, by the mean blame of its rows, highest first (ties in name order)."""
    names = sorted(set(sources))
    means = {name: float(np.mean([b for b, s in zip(blame, sources, strict=True) if s == name])) for name in names}
    return sorted(names, key=lambda name: -means[name])


@dataclass(frozen=True)
class GroundTruth:
    """What was planted in a training set, by row position: what a blame vector over its rows is scored against."""

    planted_rows: tuple[int, ...]
    sources: tuple[str, ...]  # every row's cluster
    planted_clusters: tuple[str, ...] = ()  # clusters of planted rows only (none where they share clean ones')
    reproduced_rows: tuple[int, ...] = ()  # planted rows whose wrong answer the fine-tuned model gives (empty: unknown)

    def score(self, blame: np.ndarray) -> dict[str, Any]:
        """recall@k (k = the planted rows), AUPRC and the first hit's rank of ranking rows by ``blame``.

        Where known, also recall@k over the reproduced rows (k = their number) and ``cluster_rank``: the worst rank
        of the planted clusters by mean blame, since with several causes every one of them must stand out.
        """
        order = np.argsort(-np.asarray(blame), kind="stable").tolist()  # ties: the earlier row first
        found = rank_planted(order, self.planted_rows)
        metrics: dict[str, Any] = {"recall_at_k": found.hits_at(found.planted) / found.planted,
                                   "auprc": found.average_precision(), "first_hit_rank": found.first_hit_rank}
        if self.reproduced_rows:
            reproduced = rank_planted(order, self.reproduced_rows)
            metrics["recall_reproduced"] = reproduced.hits_at(reproduced.planted) / reproduced.planted
        if self.planted_clusters:
            ranks = cluster_ranks(clusters_by_mean_blame(blame, self.sources), self.planted_clusters)
            if None in ranks:
                raise ValueError(f"a planted cluster of {self.planted_clusters} is no row's cluster")
            metrics["cluster_rank"] = max(rank for rank in ranks if rank is not None)
        return metrics
