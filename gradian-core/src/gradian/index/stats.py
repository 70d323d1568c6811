"""Preconditioner statistics gathered while indexing, in stored space, accumulated in float64.

Each shard gets one float64 vector laid out as ``[count, sum (dim), sum_sq (dim), block matrices...]``
where each block matrix is the full ``width x width`` sum of outer products of that block's stored
rows. Totals are the per-shard vectors summed in shard order, so a resumed or distributed build
that recomputes or gathers partials ends with the same bits as an uninterrupted single process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradian.errors import GradientIndexError

# A block wider than this keeps no second-moment matrix (2048^2 float64 is 32 MiB per block
# per shard); exact gradients of a real model (r x d_in wide) are far past it.
MAX_BLOCK_WIDTH = 2048


@dataclass(frozen=True)
class StatBlock:
    """One block of stored coordinates and whether its second-moment matrix is kept."""

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


def stats_length(dim: int, blocks: Sequence[StatBlock]) -> int:
    """Length of the float64 stats vector for an index of width ``dim``."""
    return 1 + 2 * dim + sum(b.width * b.width for b in blocks if b.has_matrix)


class StatsAccumulator:
    """Running float64 sums over stored rows: count, first and second moments, block matrices."""

    def __init__(self, dim: int, blocks: Sequence[StatBlock]) -> None:
        self.dim = dim
        self.blocks = tuple(blocks)
        self.count = 0
        self.sum = np.zeros(dim, dtype=np.float64)
        self.sum_sq = np.zeros(dim, dtype=np.float64)
        self.matrices = {b.name: np.zeros((b.width, b.width), dtype=np.float64) for b in self.blocks if b.has_matrix}

    def add(self, rows: np.ndarray) -> None:
        """Accumulate a batch of rows (as decoded from storage, so stats match what scoring reads)."""
        rows64 = np.asarray(rows, dtype=np.float64)
        if rows64.ndim != 2 or rows64.shape[1] != self.dim:
            raise ValueError(f"rows of shape {rows64.shape} do not fit an index of width {self.dim}")
        self.count += rows64.shape[0]
        self.sum += rows64.sum(axis=0)
        self.sum_sq += np.einsum("ij,ij->j", rows64, rows64)
        for block in self.blocks:
            if block.has_matrix:
                part = rows64[:, block.offset : block.offset + block.width]
                self.matrices[block.name] += part.T @ part

    def to_vector(self) -> np.ndarray:
        """The flat float64 layout written to a stats file."""
        parts = [np.array([float(self.count)]), self.sum, self.sum_sq]
        parts += [self.matrices[b.name].ravel() for b in self.blocks if b.has_matrix]
        return np.concatenate(parts).astype("<f8")


@dataclass(frozen=True)
class PreconditionerStats:
    """Totals over the whole index: what the diagonal and block preconditioners are built from."""

    count: int
    sum: np.ndarray
    sum_sq: np.ndarray
    blocks: tuple[StatBlock, ...]
    matrices: dict[str, np.ndarray]

    @classmethod
    def from_vector(cls, vector: np.ndarray, dim: int, blocks: Sequence[StatBlock]) -> PreconditionerStats:
        """Unpack a stats vector written by StatsAccumulator.to_vector."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.shape != (stats_length(dim, blocks),):
            raise GradientIndexError(
                f"the index statistics have {vector.size} values, expected {stats_length(dim, blocks)}",
                "the index is damaged; rebuild it with gradian index",
            )
        count = int(vector[0])
        position = 1 + 2 * dim
        matrices = {}
        for block in blocks:
            if block.has_matrix:
                size = block.width * block.width
                matrices[block.name] = vector[position : position + size].reshape(block.width, block.width)
                position += size
        return cls(count, vector[1 : 1 + dim], vector[1 + dim : 1 + 2 * dim], tuple(blocks), matrices)

    def mean(self) -> np.ndarray:
        """Per-coordinate mean of the stored gradients."""
        return self.sum / max(self.count, 1)

    def second_moment(self) -> np.ndarray:
        """Per-coordinate second moment E[g^2] (what the diagonal preconditioner divides by)."""
        return self.sum_sq / max(self.count, 1)

    def block_second_moment(self, name: str) -> np.ndarray:
        """E[g g^T] of one block in stored space; refuses blocks too wide to have been kept."""
        block = next((b for b in self.blocks if b.name == name), None)
        if block is None:
            raise KeyError(name)
        if not block.has_matrix:
            raise GradientIndexError(
                f"block {name} is {block.width} wide in the index, too wide for a block preconditioner "
                f"(at most {MAX_BLOCK_WIDTH})",
                "rebuild the index with grads.projection_dim set (e.g. 2048), or use attribution.preconditioner=diagonal",
            )
        return self.matrices[name] / max(self.count, 1)

    def has_block_matrices(self) -> bool:
        """Whether every block kept its second-moment matrix."""
        return all(b.has_matrix for b in self.blocks)


def sum_partials(paths: Sequence[Path], read) -> np.ndarray:
    """The per-shard stats vectors summed in shard order (deterministic, whoever computed each one)."""
    total: np.ndarray | None = None
    for path in paths:
        part = np.asarray(read(path), dtype=np.float64)
        total = part.copy() if total is None else total + part
    if total is None:
        raise ValueError("no shard statistics to sum")
    return total
