"""The kronecker preconditioner with both sides in full, from every row of an exact index, cached beside it.

Per LoRA matrix gradient G (rows x cols) the second moment is fitted as L (x) R, L = E[G G^T] / cols and R = E[G^T G]
/ rows (Shampoo's factors). A projected build can only take the wide side (the hidden or MLP width) as a diagonal,
since it transforms every token's factors before the sketch; an exact index can take it in full, and that ranks the
planted rows higher: a residual stream's features are correlated, and the diagonal throws that away (0.610 -> 0.680
mean recall@k at the final adapter over the tuning cases, bench/results/kronecker_wide.md). A side wider than
WIDE_MAX stays diagonal (its d x d factor would be d^2 floats per matrix).

The eigendecompositions do not depend on the damping, so they are computed once per index (one streamed pass, one
eigh per side) and kept next to it as a float32 .npy, read without pickle, with a JSON record of its checksum.
P q per matrix block Q is then m V_l diag(1 / (s_l + lambda/2)) V_l^T Q V_r diag(1 / (s_r + lambda/2)) V_r^T, m the
matrix's mean second moment, as the 64-row fit scales it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.atomic_files import sha256_file, write_text_atomic
from gradian.errors import GradientIndexError
from gradian.index.sizing import KRONECKER_WIDE_MAX as WIDE_MAX
from gradian.index.sizing import kronecker_side_floats
from gradian.index.store import Index, rows_per_chunk

SCHEME = "kronecker-full-v1"
CACHE_NAME = "kronecker-eigen.npy"
RECORD_NAME = "kronecker-eigen.json"


@dataclass(frozen=True)
class Side:
    """Where one side of a matrix's factor sits in the cache: ``width`` values, then width^2 vectors when full."""

    start: int
    width: int
    full: bool

    @property
    def size(self) -> int:
        """Floats this side takes in the cache."""
        return kronecker_side_floats(self.width, self.full)


@dataclass(frozen=True)
class MatrixFactor:
    """One LoRA matrix: where its gradient sits in a row, its shape, its mean second moment and its two sides."""

    offset: int
    shape: tuple[int, int]
    left: Side
    right: Side
    mean: float = 0.0


class KroneckerEigen:
    """Both sides' eigendecompositions of every LoRA matrix of one exact index (a read-only float32 mapping)."""

    def __init__(self, values: np.ndarray, matrices: tuple[MatrixFactor, ...], record: dict[str, Any]) -> None:
        self.values = values
        self.matrices = matrices
        self.record = record

    @property
    def mean_second_moment(self) -> float:
        """E[g^2] over every coordinate of every row: what damping_ratio scales."""
        return float(self.record["mean_second_moment"])

    def info(self) -> dict[str, Any]:
        """What a report's provenance records of the fit."""
        full = sum(side.full and side.width > min(m.shape) for m in self.matrices for side in (m.left, m.right))
        return {"scheme": SCHEME, "fit_rows": int(self.record["examples"]), "wide_max": WIDE_MAX,
                "full_wide_sides": int(full), "matrices": len(self.matrices)}

    def apply(self, queries: np.ndarray, damping: float) -> np.ndarray:
        """P q for every row of ``queries`` [Q, dim] (float64), damping lambda split between the two sides."""
        out = np.zeros_like(queries)
        for matrix in self.matrices:
            rows, cols = matrix.shape
            block = queries[:, matrix.offset:matrix.offset + rows * cols].reshape(-1, rows, cols)
            block = self._side(matrix.left, damping / 2, block.transpose(0, 2, 1)).transpose(0, 2, 1)
            block = self._side(matrix.right, damping / 2, block)
            out[:, matrix.offset:matrix.offset + rows * cols] = matrix.mean * block.reshape(queries.shape[0], -1)
        return out

    def _side(self, side: Side, damping: float, block: np.ndarray) -> np.ndarray:
        """``block`` [Q, other, width] times this side's (M + damping)^-1 on its last axis."""
        values = np.asarray(self.values[side.start:side.start + side.width], dtype=np.float64)
        inverse = _pseudo_inverse(values + damping)
        if not side.full:
            return block * inverse
        vectors = np.asarray(self.values[side.start + side.width:side.start + side.size],
                             dtype=np.float64).reshape(side.width, side.width)
        return ((block @ vectors) * inverse) @ vectors.T


def kronecker_eigen(index: Index, chunk_bytes: int) -> KroneckerEigen:
    """The index's full Kronecker eigendecompositions: from the cache beside it, else fitted (and cached if it can be)."""
    if index.manifest.projection is not None or index.whitening() is not None:
        raise GradientIndexError("the kronecker preconditioner's full wide side needs an exact index, and this one "
                                 "stores sketched rows", "set attribution.kronecker_wide auto or diagonal")
    matrices = _layout(index)
    cached = _read_cache(index, matrices)
    if cached is not None:
        return cached
    directory = index.path if os.access(index.path, os.W_OK) else None
    if directory is not None:
        _remove_dead_partials(directory)
    handle, partial = tempfile.mkstemp(prefix=f"{CACHE_NAME}.{os.getpid()}.", suffix=".partial", dir=directory)
    os.close(handle)
    try:
        values = _allocated(Path(partial), sum(m.left.size + m.right.size for m in matrices))
        totals = _accumulate(index, matrices, values, chunk_bytes)
        matrices = _decompose(values, matrices, totals, index.num_examples)
        values.flush()
        del values
        record = {"scheme": SCHEME, "index_id": index.index_id, "examples": index.num_examples,
                  "wide_max": WIDE_MAX, "mean_second_moment": sum(totals) / (index.num_examples * index.dim),
                  "means": [m.mean for m in matrices]}
        if directory is None:  # a read-only index: mapped from the temporary file, gone when unmapped
            mapped = np.load(partial, mmap_mode="r", allow_pickle=False)
            return KroneckerEigen(mapped, matrices, record)
        os.replace(partial, index.path / CACHE_NAME)
        record["sha256"] = sha256_file(index.path / CACHE_NAME)
        write_text_atomic(index.path / RECORD_NAME, json.dumps(record, sort_keys=True) + "\n")
    finally:
        Path(partial).unlink(missing_ok=True)
    return KroneckerEigen(np.load(index.path / CACHE_NAME, mmap_mode="r", allow_pickle=False), matrices, record)


def dead_partials(directory: Path) -> list[Path]:
    """The half-written fits in an index dir whose process no longer runs (a SIGKILL skips the cleanup)."""
    dead = []
    for path in sorted(directory.glob(f"{CACHE_NAME}.*.partial")):
        pid = path.name.removeprefix(CACHE_NAME + ".").split(".")[0]
        if pid.isdigit() and not _running(int(pid)) and not path.is_symlink():
            dead.append(path)
    return dead


def _remove_dead_partials(directory: Path) -> None:
    """Remove the half-written fits of processes that no longer run: 1.2 GB each."""
    for path in dead_partials(directory):
        path.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        pass
    return True


def _allocated(path: Path, size: int) -> np.ndarray:
    """A float32 .npy of ``size`` zeros mapped for writing, its blocks reserved first: a mapping of a sparse file
    that runs out of disk kills the process, where a refused reservation is an error that can be explained."""
    values = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(size,))
    try:
        with path.open("r+b") as handle:
            os.posix_fallocate(handle.fileno(), 0, path.stat().st_size)
    except OSError as error:
        del values
        raise GradientIndexError(f"no room for the kronecker fit's {size * 4 / 1e9:.1f} GB cache in {path.parent}: "
                                 f"{error.strerror}", "free disk space there (gradian cache list / prune), or set "
                                 "attribution.kronecker_wide diagonal") from None
    return values


def _layout(index: Index) -> tuple[MatrixFactor, ...]:
    """Where each matrix's two sides go in the cache, in the index's block order."""
    cursor, matrices = 0, []
    for block in index.blocks:
        rows, cols = (int(n) for n in block.stored_shape)
        left = Side(cursor, rows, rows <= WIDE_MAX)
        right = Side(cursor + left.size, cols, cols <= WIDE_MAX)
        cursor = right.start + right.size
        matrices.append(MatrixFactor(int(block.offset), (rows, cols), left, right))
    return tuple(matrices)


def _accumulate(index: Index, matrices: tuple[MatrixFactor, ...], values: np.ndarray, chunk_bytes: int) -> list[float]:
    """Sum G G^T and G^T G (or their diagonals) of every row into the vectors' slots; each matrix's sum of squares."""
    totals = [0.0] * len(matrices)
    for _, chunk in index.iter_chunks(rows_per_chunk(chunk_bytes, index.dim)):
        for number, matrix in enumerate(matrices):
            rows, cols = matrix.shape
            block = chunk[:, matrix.offset:matrix.offset + rows * cols].reshape(-1, rows, cols)
            totals[number] += float(np.square(block, dtype=np.float64).sum())
            _add_gram(values, matrix.left, block.transpose(0, 2, 1))
            _add_gram(values, matrix.right, block)
    return totals


def _add_gram(values: np.ndarray, side: Side, block: np.ndarray) -> None:
    """Add sum over rows and the other axis of x x^T for the last axis of ``block`` [n, other, width]."""
    flat = block.reshape(-1, side.width)
    if side.full:
        start = side.start + side.width
        values[start:start + side.width ** 2] += (flat.T @ flat).ravel()
    else:
        values[side.start:side.start + side.width] += np.square(flat).sum(axis=0)


def _decompose(values: np.ndarray, matrices: tuple[MatrixFactor, ...], totals: list[float],
               examples: int) -> tuple[MatrixFactor, ...]:
    """Each summed side scaled to its second moment and, when full, replaced in place by its eigendecomposition."""
    out = []
    for matrix, total in zip(matrices, totals, strict=True):
        rows, cols = matrix.shape
        for side, other in ((matrix.left, cols), (matrix.right, rows)):
            if not side.full:
                values[side.start:side.start + side.width] /= examples * other
                continue
            start = side.start + side.width
            gram = np.asarray(values[start:start + side.width ** 2], dtype=np.float64).reshape(side.width, side.width)
            eigenvalues, eigenvectors = np.linalg.eigh((gram + gram.T) / (2 * examples * other))
            values[side.start:side.start + side.width] = np.clip(eigenvalues, 0.0, None)  # PSD; negatives are rounding
            values[start:start + side.width ** 2] = eigenvectors.ravel()
        out.append(MatrixFactor(matrix.offset, matrix.shape, matrix.left, matrix.right,
                                mean=total / (examples * rows * cols)))
    return tuple(out)


def _read_cache(index: Index, matrices: tuple[MatrixFactor, ...]) -> KroneckerEigen | None:
    """The cached decomposition when its record names this index and its checksum holds; None otherwise."""
    try:
        record = json.loads((index.path / RECORD_NAME).read_text())
        if (record.get("scheme") != SCHEME or record.get("index_id") != index.index_id
                or record.get("wide_max") != WIDE_MAX or len(record.get("means", ())) != len(matrices)
                or record.get("sha256") != sha256_file(index.path / CACHE_NAME)):
            return None
        values = np.load(index.path / CACHE_NAME, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if values.dtype != np.float32 or values.shape != (sum(m.left.size + m.right.size for m in matrices),):
        return None
    matrices = tuple(MatrixFactor(m.offset, m.shape, m.left, m.right, mean=float(mean))
                     for m, mean in zip(matrices, record["means"], strict=True))
    return KroneckerEigen(values, matrices, record)


def _pseudo_inverse(values: np.ndarray) -> np.ndarray:
    """1 / v where v is above rounding noise, else 0: a direction no row touched and no damping carries nothing."""
    tolerance = max(float(values.max(initial=0.0)), 0.0) * values.size * np.finfo(np.float64).eps
    out = np.zeros_like(values)
    kept = values > tolerance
    out[kept] = 1.0 / values[kept]
    return out
