"""Streamed blame scoring: every training example against every regressed item, one index chunk at a time.

blame[i, q] = -(P q_q) . g_i (g_i / |g_i| with ``normalize``), positive = training on i pushed the model toward
failing item q. Memory is bounded in bytes, not rows (exact gradients of a real model are megabytes per row):

- the index is read ``chunk_bytes`` of float32 rows at a time (``attribution.chunk_mb``; at least one row), so
  the peak is about two chunks (the rows read and their float32 copy) however many rows the index has;
- no items x examples matrix of more than ``score_budget`` floats (default: ``chunk_bytes`` worth of float64)
  is ever held.

``mean``, ``harm`` and ``smooth_max``: pass 1 folds each chunk's scores into exact per-item moments; pass 2 rescores
each chunk, z-scores it per item and combines over items (``harm``: the mean of the positive parts; ``smooth_max``: a
soft maximum). When the whole score matrix fits the score budget, pass 2 reuses it instead of reading the index
again. ``rank_vote``: an item's ranks need its whole score column, so items are ranked in groups of
budget // n_examples per pass, then one more pass collects the top-k examples' per-item blame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from gradian.attribution.aggregation import (
    AGGREGATIONS,
    ITEM_WEIGHTS,
    RunningMoments,
    TopK,
    average_ranks,
    borda_score,
    harm_zscore,
    kurtosis_weights,
    mean_zscore,
    ranks_of,
    smooth_max_zscore,
)
from gradian.attribution.preconditioners import Preconditioner
from gradian.attribution.results import ExampleScores
from gradian.errors import GradientIndexError
from gradian.index.store import DEFAULT_CHUNK_BYTES, rows_per_chunk

if TYPE_CHECKING:
    from gradian.config import AttributionConfig

# (row offset, blame [rows, Q]) of each chunk, in order, from the first full read of the index
ItemSink = Callable[[int, np.ndarray], None]
# The aggregations computed from per-item z-scores (two passes, or one when the scores fit the budget)
Z_AGGREGATIONS = {"mean": mean_zscore, "harm": harm_zscore, "smooth_max": smooth_max_zscore}


class ItemBlameCollector:
    """An ItemSink keeping every example's per-item blame, for scores.csv: [examples, items] float64 in memory.

    That is examples x items x 8 bytes (100,000 examples x 20 items = 16 MB), which the score budget does not cover.
    """

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []

    def __call__(self, offset: int, blame: np.ndarray) -> None:
        self.blocks.append(np.array(blame, dtype=np.float64, copy=True))

    def matrix(self) -> np.ndarray | None:
        """The collected [examples, items] blame in dataset order, or None when nothing was scored."""
        return np.concatenate(self.blocks, axis=0) if self.blocks else None


@runtime_checkable
class ChunkSource(Protocol):
    """Rows of stored train gradients, in dataset order, readable in chunks (the gradient index is one)."""

    @property
    def ids(self) -> Sequence[str]: ...

    @property
    def dim(self) -> int: ...

    def __len__(self) -> int: ...

    def iter_chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]: ...


class ArraySource:
    """A ChunkSource over an in-memory (or memory-mapped) [n, dim] array."""

    def __init__(self, rows: np.ndarray, ids: Sequence[str] | None = None) -> None:
        self.rows = rows
        self._ids = tuple(ids) if ids is not None else tuple(f"row-{i:06d}" for i in range(rows.shape[0]))
        if len(self._ids) != rows.shape[0]:
            raise ValueError("ArraySource needs one id per row")

    @property
    def ids(self) -> tuple[str, ...]:
        """One id per row."""
        return self._ids

    @property
    def dim(self) -> int:
        """Width of one row."""
        return int(self.rows.shape[1])

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def iter_chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(row_offset, rows) for consecutive chunks of at most ``rows`` rows."""
        for start in range(0, self.rows.shape[0], rows):
            yield start, self.rows[start:start + rows]


def leading_rows(source: ChunkSource, count: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """The first ``count`` rows of ``source`` as float32 (the target when there is no eval set)."""
    taken: list[np.ndarray] = []
    have = 0
    for _, chunk in source.iter_chunks(min(rows_per_chunk(chunk_bytes, source.dim), max(count, 1))):
        taken.append(np.asarray(chunk[: count - have], dtype=np.float32))
        have += taken[-1].shape[0]
        if have >= count:
            break
    if not taken:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(taken, axis=0)


def item_blame(chunk: np.ndarray, preconditioned_queries: np.ndarray, *, normalize: bool = False) -> np.ndarray:
    """Blame [rows, Q] of a chunk of train gradients [rows, dim] against preconditioned queries [Q, dim]."""
    rows = np.asarray(chunk)
    if rows.dtype == np.float64:
        blame = -(rows @ np.asarray(preconditioned_queries, dtype=np.float64).T)
    else:
        # One float32 GEMM with the chunk uncopied: a float64 copy would double the chunk's memory and take
        # several times as long; the per-item statistics downstream are float64.
        rows = np.asarray(rows, dtype=np.float32)
        blame = -(rows @ np.asarray(preconditioned_queries, dtype=np.float32).T).astype(np.float64)
    if normalize:
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))
        has_norm = norms > 0
        blame = np.where(has_norm[:, None], blame / np.where(has_norm, norms, 1.0)[:, None], 0.0)
    return blame


def score_examples(source: ChunkSource, queries: np.ndarray, *, preconditioner: Preconditioner | None = None,
                   item_ids: Sequence[str] | None = None, normalize: bool = False, aggregation: str = "mean",
                   top_k: int = 20, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   score_budget: int | None = None, item_sink: ItemSink | None = None) -> ExampleScores:
    """Score every example of ``source`` against the query gradients [Q, dim] and aggregate over items.

    ``queries`` are raw query gradients when ``preconditioner`` is given, else already preconditioned.
    ``chunk_bytes`` bounds the float32 rows read at once; ``score_budget`` the float64 scores held at once.
    ``item_sink`` sees every chunk's per-item blame once (the first read of the index), in dataset order.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {', '.join(AGGREGATIONS)}")
    if chunk_bytes < 1 or top_k < 1:
        raise ValueError("chunk_bytes and top_k must be positive")
    pq = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    if preconditioner is not None:
        pq = preconditioner.apply(pq)
    n_items = pq.shape[0]
    if n_items == 0:
        raise ValueError("score_examples needs at least one query vector")
    item_ids = tuple(item_ids) if item_ids is not None else tuple(f"item-{q:04d}" for q in range(n_items))
    if len(item_ids) != n_items:
        raise ValueError("item_ids needs one id per query vector")
    n = len(source)
    if n == 0:
        raise GradientIndexError("the gradient index has no rows", "build it from a non-empty training set")
    budget = score_budget if score_budget is not None else max(chunk_bytes // 8, n_items)
    scorer = _ChunkScorer(source, pq, normalize, rows_per_chunk(chunk_bytes, pq.shape[1]), item_sink)
    k = min(top_k, n)
    if aggregation in Z_AGGREGATIONS:
        return _score_zscored(scorer, item_ids, k, budget, aggregation)
    return _score_rank_vote(scorer, item_ids, k, budget)


def score_with_config(source: ChunkSource, queries: np.ndarray, config: AttributionConfig, *,
                      preconditioner: Preconditioner | None = None, item_ids: Sequence[str] | None = None,
                      item_sink: ItemSink | None = None) -> ExampleScores:
    """``score_examples`` with normalize, aggregation, top_k and chunk_mb from an ``AttributionConfig``."""
    return score_examples(source, queries, preconditioner=preconditioner, item_ids=item_ids,
                          normalize=config.normalize, aggregation=config.aggregation, top_k=config.top_k,
                          chunk_bytes=config.chunk_bytes, item_sink=item_sink)


def ranked_with_config(item_blame: np.ndarray, scores: ExampleScores, columns: Sequence[int],
                       config: AttributionConfig, *, other_blame: bool = False) -> ExampleScores:
    """``scores`` ranked again by ``attribution.ranking``, from the held blame of its items (``columns`` of
    ``item_blame``): the report's ranking, while clusters and causes keep the blame of ``attribution.aggregation``.
    ``other_blame``: ``item_blame`` is not what ``scores`` was aggregated from, so it is ranked again in any case."""
    if config.ranking == scores.aggregation and config.item_weights == "uniform" and not other_blame:
        return scores
    picked = np.asarray(item_blame, dtype=np.float64)[:, list(columns)]
    ranked = rescore_items(picked, scores.ids, scores.item_ids, range(len(scores.item_ids)),
                           aggregation=config.ranking, normalize=config.normalize, top_k=config.top_k,
                           item_weights=config.item_weights)
    return dataclasses.replace(ranked, passes=scores.passes)  # no further read of the index


def rescore_items(item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str], columns: Sequence[int], *,
                  aggregation: str = "mean", normalize: bool = False, top_k: int = 20,
                  item_weights: str = "uniform") -> ExampleScores:
    """``score_examples`` over a subset of the items from their held per-item blame [examples, items]: no index read.

    ``item_weights`` ``kurtosis`` weighs each item by how few examples carry its blame (aggregation.kurtosis_weights).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {', '.join(AGGREGATIONS)}")
    if item_weights not in ITEM_WEIGHTS:
        raise ValueError(f"unknown item weights {item_weights!r}; expected one of {', '.join(ITEM_WEIGHTS)}")
    picked = np.asarray(item_blame, dtype=np.float64)[:, list(columns)]
    weights = kurtosis_weights(picked) if item_weights == "kurtosis" else None
    scorer = _HeldScorer(picked, tuple(ids), normalize)
    kept = tuple(item_ids[c] for c in columns)
    k, budget = min(top_k, len(ids)), max(picked.size, 1)
    if aggregation in Z_AGGREGATIONS:
        scores = _score_zscored(scorer, kept, k, budget, aggregation, weights)  # type: ignore[arg-type]
    else:
        scores = _score_rank_vote(scorer, kept, k, budget, weights)  # type: ignore[arg-type]
    return dataclasses.replace(scores, item_weights=item_weights)


class _HeldScorer:
    """The scorer interface over blame already in memory: one chunk, no passes over the index."""

    def __init__(self, blame: np.ndarray, ids: tuple[str, ...], normalize: bool) -> None:
        self.blame, self.ids, self.normalize = blame, ids, normalize
        self.n, self.passes = blame.shape[0], 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        yield 0, self.blame


class _ChunkScorer:
    """Reads the source chunk by chunk, checks layout and finiteness, yields (offset, blame [rows, Q])."""

    def __init__(self, source: ChunkSource, pq: np.ndarray, normalize: bool, chunk_rows: int,
                 sink: ItemSink | None = None) -> None:
        self.source, self.pq, self.normalize, self.chunk_rows = source, pq, normalize, chunk_rows
        self.sink = sink
        self.n = len(source)
        self.ids = tuple(source.ids)
        self.passes = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        self.passes += 1
        expected = 0
        for offset, chunk in self.source.iter_chunks(self.chunk_rows):
            if offset != expected:
                raise GradientIndexError(f"the index yielded rows from {offset}, expected {expected}",
                                         "the index is inconsistent; rebuild it")
            if chunk.ndim != 2 or chunk.shape[1] != self.pq.shape[1]:
                raise GradientIndexError(
                    f"index rows are {chunk.shape[-1]} wide and the query gradients {self.pq.shape[1]}",
                    "query gradients must go through the same capture path and projection as the index",
                )
            blame = item_blame(chunk, self.pq, normalize=self.normalize)
            if not np.all(np.isfinite(blame)):
                bad = offset + int(np.flatnonzero(~np.all(np.isfinite(blame), axis=1))[0])
                raise GradientIndexError(
                    f"index row {bad} ({self.ids[bad]}) holds non-finite gradient values",
                    "rebuild the index with grads.storage_dtype float32; NaN or inf usually means an fp16 overflow",
                )
            if self.sink is not None and self.passes == 1:  # later passes re-read the same rows
                self.sink(offset, blame)
            yield offset, blame
            expected = offset + chunk.shape[0]
        if expected != self.n:
            raise GradientIndexError(f"the index yielded {expected} rows and lists {self.n} ids",
                                     "the index is inconsistent; rebuild it")


def _score_zscored(scorer: _ChunkScorer, item_ids: tuple[str, ...], k: int, budget: int,
                   aggregation: str = "mean", weights: np.ndarray | None = None) -> ExampleScores:
    n_items = len(item_ids)
    moments = RunningMoments(n_items)
    held: list[tuple[int, np.ndarray]] | None = []
    held_size = 0
    for offset, blame in scorer:
        moments.update(blame)
        held_size += blame.size
        if held is not None and held_size <= budget:
            held.append((offset, blame))
        else:
            held = None
    mean, std = moments.mean, moments.std
    aggregated = np.empty(scorer.n, dtype=np.float64)
    top = TopK(k, n_items)
    for offset, blame in (held if held is not None else scorer):
        chunk_scores = Z_AGGREGATIONS[aggregation](blame, mean, std, weights)
        aggregated[offset:offset + blame.shape[0]] = chunk_scores
        top.update(chunk_scores, np.arange(offset, offset + blame.shape[0]), blame)
    return ExampleScores(ids=scorer.ids, blame=aggregated, ranks=ranks_of(aggregated), item_ids=item_ids,
                         item_mean=mean, item_std=std, top_positions=top.positions, top_item_blame=top.payload,
                         aggregation=aggregation, normalize=scorer.normalize, passes=scorer.passes)


def _score_rank_vote(scorer: _ChunkScorer, item_ids: tuple[str, ...], k: int, budget: int,
                     weights: np.ndarray | None = None) -> ExampleScores:
    n, n_items = scorer.n, len(item_ids)
    # each item's ranks count this many times over in the mean rank: 1 each unless weighted
    scale = np.ones(n_items) if weights is None else np.asarray(weights) * (n_items / float(np.sum(weights)))
    group = max(1, min(n_items, budget // n))
    moments = RunningMoments(n_items)
    rank_sum = np.zeros(n, dtype=np.float64)
    columns = np.empty((n, group), dtype=np.float64)
    for first in range(0, n_items, group):
        wanted = slice(first, min(first + group, n_items))
        width = wanted.stop - wanted.start
        for offset, blame in scorer:
            if first == 0:
                moments.update(blame)
            columns[offset:offset + blame.shape[0], :width] = blame[:, wanted]
        for column in range(width):
            rank_sum += scale[wanted.start + column] * average_ranks(columns[:, column])
    aggregated = borda_score(rank_sum / n_items, n)
    ranks = ranks_of(aggregated)
    top_positions = np.argsort(ranks, kind="stable")[:k]
    if group >= n_items:
        payload = columns[top_positions]
    else:  # one more read: only now is it known which rows are the top-k
        payload = np.empty((k, n_items), dtype=np.float64)
        for offset, blame in scorer:
            inside = (top_positions >= offset) & (top_positions < offset + blame.shape[0])
            payload[inside] = blame[top_positions[inside] - offset]
    return ExampleScores(ids=scorer.ids, blame=aggregated, ranks=ranks, item_ids=item_ids,
                         item_mean=moments.mean, item_std=moments.std, top_positions=top_positions,
                         top_item_blame=payload, aggregation="rank_vote", normalize=scorer.normalize,
                         passes=scorer.passes)
