"""Preconditioner statistics in stored space, accumulated in float64.

The build keeps only what the default (diagonal) preconditioner needs: each shard gets one float64 vector
``[count, sum (dim), sum_sq (dim)]``, and the index's ``stats.npy`` is those vectors summed in shard order, so a
resumed or distributed build that recomputes or gathers partials ends with the same bits as an uninterrupted
single process.

Per-block second-moment matrices (the ``block`` preconditioner) cost ``width^2`` floats per block per shard and
are useless to every other preconditioner, so they are not built with the index: ``Index.block_stats`` computes
them in one streamed pass when ``block`` is asked for and caches them next to the index (``BlockMomentAccumulator``,
vector ``[count, block matrices...]``). Indexes written before that carry the matrices in ``stats.npy`` itself
(the legacy layout of ``stats_length``), and are still read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradian.errors import GradientIndexError

# A block wider than this gets no second-moment matrix (2048^2 float64 is 32 MiB per block); exact gradients
# of a real model (r x d_in wide) are far past it.
MAX_BLOCK_WIDTH = 2048

# Columns cast to float64 at a time: a batch of wide rows (exact gradients of an 8B model are ~40M numbers)
# would otherwise be copied whole to float64 just to be summed.
_COLUMN_SLAB = 1 << 16


@dataclass(frozen=True)
class StatBlock:
    """One block of stored coordinates; ``has_matrix``: narrow enough for a second-moment matrix (block preconditioner)."""

    name: str
    offset: int
    width: int
    has_matrix: bool

    def to_dict(self) -> dict:
        """Plain dict for the manifest."""
        return {"name": self.name, "offset": self.offset, "width": self.width, "has_matrix": self.has_matrix}

    @classmethod
    def from_dict(cls, data: dict) -> StatBlock:
        """Inverse of to_dict."""
        return cls(str(data["name"]), int(data["offset"]), int(data["width"]), bool(data["has_matrix"]))


def plan_stat_blocks(segments: Iterable[tuple[str, int, int]], max_width: int = MAX_BLOCK_WIDTH) -> tuple[StatBlock, ...]:
    """StatBlocks for (name, offset, width) segments; matrices only for blocks no wider than max_width."""
    return tuple(StatBlock(name, offset, width, width <= max_width) for name, offset, width in segments)


def moments_length(dim: int) -> int:
    """Length of the float64 vector the build writes for an index of width ``dim``: count, sum, sum_sq."""
    return 1 + 2 * dim


def block_moments_length(blocks: Sequence[StatBlock]) -> int:
    """Length of the float64 vector of block matrices: count, then every narrow block's matrix."""
    return 1 + sum(b.width * b.width for b in blocks if b.has_matrix)


def stats_length(dim: int, blocks: Sequence[StatBlock]) -> int:
    """Length of a legacy stats vector that carries the block matrices after the moments."""
    return moments_length(dim) + block_moments_length(blocks) - 1


class StatsAccumulator:
    """Running float64 sums over stored rows: count, first and second moments per coordinate."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.count = 0
        self.sum = np.zeros(dim, dtype=np.float64)
        self.sum_sq = np.zeros(dim, dtype=np.float64)

    def add(self, rows: np.ndarray) -> None:
        """Accumulate a batch of rows (as decoded from storage, so stats match what scoring reads)."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"rows of shape {rows.shape} do not fit an index of width {self.dim}")
        self.count += rows.shape[0]
        for start in range(0, self.dim, _COLUMN_SLAB):
            part = np.asarray(rows[:, start:start + _COLUMN_SLAB], dtype=np.float64)
            self.sum[start:start + part.shape[1]] += part.sum(axis=0)
            self.sum_sq[start:start + part.shape[1]] += np.einsum("ij,ij->j", part, part)

    def to_vector(self) -> np.ndarray:
        """The flat float64 layout written to a stats file."""
        return np.concatenate([np.array([float(self.count)]), self.sum, self.sum_sq]).astype("<f8")


class BlockMomentAccumulator:
    """Running float64 sums of outer products of each narrow block's stored coordinates."""

    def __init__(self, blocks: Sequence[StatBlock]) -> None:
        self.blocks = tuple(b for b in blocks if b.has_matrix)
        self.count = 0
        self.matrices = {b.name: np.zeros((b.width, b.width), dtype=np.float64) for b in self.blocks}

    def add(self, rows: np.ndarray) -> None:
        """Accumulate a chunk of rows; only one block's columns are widened to float64 at a time."""
        rows = np.asarray(rows)
        self.count += rows.shape[0]
        for block in self.blocks:
            part = np.asarray(rows[:, block.offset:block.offset + block.width], dtype=np.float64)
            self.matrices[block.name] += part.T @ part

    def to_vector(self) -> np.ndarray:
        """``[count, matrices...]`` as float64, the layout of the block statistics file."""
        parts = [np.array([float(self.count)])] + [self.matrices[b.name].ravel() for b in self.blocks]
        return np.concatenate(parts).astype("<f8")


@dataclass(frozen=True)
class PreconditionerStats:
    """Totals over the whole index: what the diagonal (and, once computed, block) preconditioners are built from."""

    count: int
    sum: np.ndarray
    sum_sq: np.ndarray
    blocks: tuple[StatBlock, ...]
    matrices: dict[str, np.ndarray] = field(default_factory=dict)  # empty unless block statistics were asked for

    @classmethod
    def from_vector(cls, vector: np.ndarray, dim: int, blocks: Sequence[StatBlock]) -> PreconditionerStats:
        """The moments of a stats vector: the build's layout, or a legacy one whose trailing matrices are left unread."""
        vector = np.asarray(vector)  # a memory map stays one: a legacy file's matrices are never read here
        if vector.ndim != 1 or vector.shape[0] not in (moments_length(dim), stats_length(dim, blocks)):
            raise GradientIndexError(
                f"the index statistics have {vector.size} values, expected {moments_length(dim)}",
                "the index is damaged; rebuild it with gradian index",
            )
        return cls(int(vector[0]), np.array(vector[1:1 + dim], dtype=np.float64),
                   np.array(vector[1 + dim:1 + 2 * dim], dtype=np.float64), tuple(blocks))

    def with_block_vector(self, vector: np.ndarray) -> PreconditionerStats:
        """A copy that also holds the block matrices of a ``BlockMomentAccumulator`` vector over the same rows."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.shape != (block_moments_length(self.blocks),) or int(vector[0]) != self.count:
            raise GradientIndexError(
                f"the block statistics have {vector.size} values over {int(vector[0]) if vector.size else 0} rows, "
                f"expected {block_moments_length(self.blocks)} over {self.count}",
                "delete the block-stats files in the index directory; they are recomputed on the next run",
            )
        matrices, position = {}, 1
        for block in self.blocks:
            if block.has_matrix:
                size = block.width * block.width
                matrices[block.name] = vector[position:position + size].reshape(block.width, block.width)
                position += size
        return PreconditionerStats(self.count, self.sum, self.sum_sq, self.blocks, matrices)

    def mean(self) -> np.ndarray:
        """Per-coordinate mean of the stored gradients."""
        return self.sum / max(self.count, 1)

    def second_moment(self) -> np.ndarray:
        """Per-coordinate second moment E[g^2] (what the diagonal preconditioner divides by)."""
        return self.sum_sq / max(self.count, 1)

    def block_second_moment(self, name: str) -> np.ndarray:
        """E[g g^T] of one block in stored space; refuses blocks too wide to have one."""
        block = next((b for b in self.blocks if b.name == name), None)
        if block is None:
            raise KeyError(name)
        if not block.has_matrix:
            raise GradientIndexError(
                f"block {name} is {block.width} wide in the index, too wide for a block preconditioner "
                f"(at most {MAX_BLOCK_WIDTH})",
                "rebuild the index with grads.projection_dim set (e.g. 2048), or use attribution.preconditioner=diagonal",
            )
        if name not in self.matrices:
            raise ValueError(f"these statistics hold no block matrices; read them with Index.block_stats() ({name})")
        return self.matrices[name] / max(self.count, 1)

    def has_block_matrices(self) -> bool:
        """Whether every block is narrow enough to have a second-moment matrix (a block preconditioner can be fit)."""
        return all(b.has_matrix for b in self.blocks)


def legacy_block_vector(vector: np.ndarray, dim: int) -> np.ndarray | None:
    """The block matrices a legacy stats vector carries after its moments, as a block-statistics vector (else None)."""
    if vector.shape[0] <= moments_length(dim):
        return None
    return np.concatenate([np.asarray(vector[:1], dtype=np.float64), np.asarray(vector[moments_length(dim):], dtype=np.float64)])


def sum_partials(paths: Sequence[Path], read) -> np.ndarray:
    """The per-shard stats vectors summed in shard order (deterministic, whoever computed each one)."""
    total: np.ndarray | None = None
    for path in paths:
        part = np.asarray(read(path), dtype=np.float64)
        total = part.copy() if total is None else total + part
    if total is None:
        raise ValueError("no shard statistics to sum")
    return total
