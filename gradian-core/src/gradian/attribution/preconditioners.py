"""Preconditioners fitted from index statistics and applied to the query side: blame_i = -(P q) . g_i.

Every P here is symmetric (diagonal, block-diagonal of symmetric inverses, or per LoRA matrix a Kronecker product
of symmetric factors), so (P q) . g == q . (P g) and
the index is streamed untouched. Coordinates with no signal (zero second moment and no damping) get a zero
multiplier, the pseudo-inverse, so a zero or constant column never turns into NaN or inf.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.errors import GradianError, GradientIndexError, RunDirError

if TYPE_CHECKING:
    from gradian.attribution.kronecker_eigen import KroneckerEigen
    from gradian.config import AttributionConfig
    from gradian.grads.whitening import MomentAccumulator

PRECONDITIONERS = ("none", "diagonal", "kronecker", "block", "adam")
KRONECKER_WIDE = ("auto", "full", "diagonal")  # the wide side of the kronecker fit: full where the index is exact
DEFAULT_ADAM_EPS = 1e-8


@dataclass(frozen=True, eq=False)
class BlockMoment:
    """One LoRA block's slice of the stored vector and its second-moment matrix E[g g^T] (None when too big)."""

    name: str
    offset: int
    size: int
    matrix: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class IndexStatistics:
    """What the index knows about its train gradients: width, per-coordinate E[g^2], per-block E[g g^T]."""

    dim: int
    second_moment: np.ndarray | None = None
    blocks: tuple[BlockMoment, ...] = ()
    projected: bool = False  # stored vectors are a random projection, not the LoRA gradients themselves
    whitening: Mapping[str, Any] | None = None  # how rows and queries were scaled before the sketch, if they were
    # The kronecker kind's input: a function returning the second moments of a seeded sample of stored exact rows
    # (a MomentAccumulator; None when the rows are not exact), and where each LoRA matrix sits in a row.
    sample_moments: Callable[[], MomentAccumulator | None] | None = None
    matrices: tuple[tuple[int, tuple[int, int]], ...] = ()
    # The full kronecker fit's input: both sides' eigendecompositions over every row (exact indexes only).
    kronecker_eigen: Callable[[], KroneckerEigen] | None = None


@dataclass(frozen=True, eq=False)
class Preconditioner:
    """A fitted P; ``apply(queries)`` returns P q for each row; ``knobs`` is what the manifest records."""

    kind: str
    dim: int
    knobs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    scale: np.ndarray | None = None  # diagonal kinds: P = diag(scale)
    block_inverses: tuple[tuple[int, int, np.ndarray], ...] = ()  # block kind: (start, stop, (C_b + l I)^-1)
    # kronecker kind: (offset, (rows, cols), left, right) per matrix, P = left (x) right; a side is a symmetric
    # matrix or a vector (a diagonal).
    matrix_factors: tuple[tuple[int, tuple[int, int], np.ndarray, np.ndarray], ...] = ()
    eigen: KroneckerEigen | None = None  # kronecker kind with a full wide side: P applied through the eigenbases

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", MappingProxyType(dict(self.knobs)))
        if self.scale is not None:
            scale = np.array(self.scale, dtype=np.float64, copy=True)
            scale.setflags(write=False)
            object.__setattr__(self, "scale", scale)

    def apply(self, queries: np.ndarray) -> np.ndarray:
        """P q for every row of ``queries`` [Q, dim], as float64 [Q, dim]."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
        if q.shape[1] != self.dim:
            raise GradientIndexError(
                f"query gradients are {q.shape[1]} wide and the preconditioner {self.dim}",
                "query gradients must go through the same capture path and projection as the index",
            )
        if self.kind == "none":
            return q.copy()
        if self.scale is not None:
            return q * self.scale
        if self.eigen is not None:
            return self.eigen.apply(q, float(self.knobs["damping"]))
        if self.matrix_factors:
            return _kronecker_apply(q, self.matrix_factors)
        out = np.zeros_like(q)
        for start, stop, inverse in self.block_inverses:
            out[:, start:stop] = q[:, start:stop] @ inverse  # inverse is symmetric: (P q)^T = q^T P
        return out


def fit_preconditioner(kind: str, stats: IndexStatistics, *, damping: float | None = None,
                       damping_ratio: float = 0.1, adam_exp_avg_sq: np.ndarray | None = None,
                       adam_eps: float = DEFAULT_ADAM_EPS, kronecker_wide: str = "diagonal") -> Preconditioner:
    """The preconditioner ``kind`` (none | diagonal | kronecker | block | adam) fitted from the index statistics."""
    if kind == "kronecker":
        _check_kronecker_wide(kronecker_wide, stats)
    if stats.whitening is not None:
        return _applied_at_capture(kind, stats)
    if kind == "none":
        return Preconditioner(kind="none", dim=stats.dim, knobs={"kind": "none"})
    if kind == "diagonal":
        if stats.second_moment is None:
            raise GradientIndexError("the index has no per-coordinate second moments, which the diagonal "
                                     "preconditioner needs", "rebuild the index with `gradian index`")
        return diagonal_preconditioner(stats.second_moment, damping=damping, damping_ratio=damping_ratio)
    if kind == "kronecker":
        return kronecker_preconditioner(stats, damping=damping, damping_ratio=damping_ratio, wide=kronecker_wide)
    if kind == "block":
        return block_preconditioner(stats.blocks, stats.dim, damping=damping, damping_ratio=damping_ratio)
    if kind == "adam":
        if adam_exp_avg_sq is None:
            raise _adam_unavailable(stats)
        return adam_preconditioner(adam_exp_avg_sq, eps=adam_eps, dim=stats.dim)
    raise ValueError(f"unknown preconditioner {kind!r}; expected one of {', '.join(PRECONDITIONERS)}")


def from_config(config: AttributionConfig, stats: IndexStatistics, *, adam_exp_avg_sq: np.ndarray | None = None,
                scored_alone: bool = True) -> Preconditioner:
    """The preconditioner an ``AttributionConfig`` asks for, at a point scored alone or one of several."""
    return fit_preconditioner(config.preconditioner, stats, damping=config.damping,
                              damping_ratio=config.damping_ratio, adam_exp_avg_sq=adam_exp_avg_sq,
                              kronecker_wide=config.wide_side(scored_alone))


def diagonal_preconditioner(second_moment: np.ndarray, *, damping: float | None = None,
                            damping_ratio: float = 0.1) -> Preconditioner:
    """P = diag(1 / (E[g^2] + lambda)), lambda = damping, else damping_ratio x mean(E[g^2])."""
    moment = _checked_vector(second_moment, "per-coordinate second moments")
    mean = float(moment.mean()) if moment.size else 0.0
    lam = float(damping) if damping is not None else damping_ratio * mean
    denominator = moment + lam
    scale = _safe_reciprocal(denominator)
    knobs = {
        "kind": "diagonal",
        "damping": lam,
        "damping_source": "absolute" if damping is not None else "damping_ratio x mean second moment",
        "damping_ratio": None if damping is not None else float(damping_ratio),
        "mean_second_moment": mean,
        "zero_coordinates": int(np.count_nonzero(denominator <= 0)),
    }
    return Preconditioner(kind="diagonal", dim=moment.size, knobs=knobs, scale=scale)


def kronecker_preconditioner(stats: IndexStatistics, *, damping: float | None = None,
                             damping_ratio: float = 0.1, wide: str = "diagonal") -> Preconditioner:
    """Per LoRA matrix P = (L + lambda/2)^-1 (x) (R + lambda/2)^-1: full on both sides from every row of an exact
    index (``wide`` auto or full), else full on the rank side and diagonal on the wide one, from the sampled rows."""
    from gradian.grads.whitening import SCHEMES  # imports torch; this package does not

    if wide != "diagonal" and stats.kronecker_eigen is not None:
        eigen = stats.kronecker_eigen()
        lam = float(damping) if damping is not None else damping_ratio * eigen.mean_second_moment
        knobs = {"kind": "kronecker", **eigen.info(), "damping": lam,
                 "damping_source": "absolute" if damping is not None else "damping_ratio x mean second moment",
                 "damping_ratio": None if damping is not None else float(damping_ratio),
                 "mean_second_moment": eigen.mean_second_moment}
        return Preconditioner(kind="kronecker", dim=stats.dim, knobs=knobs, eigen=eigen)
    if stats.sample_moments is None or not stats.matrices:
        raise GradientIndexError("the kronecker preconditioner needs a sample of exact gradients, and this index "
                                 "stores sketched rows that were not transformed before the sketch",
                                 "build the index with attribution.preconditioner kronecker (gradian index --config), "
                                 "or use attribution.preconditioner diagonal")
    whitening = stats.sample_moments().whitening(damping=damping, damping_ratio=damping_ratio,
                                                 scheme=SCHEMES["kronecker"])
    factors = tuple((offset, shape, left, right) for (offset, shape), (left, right)
                    in zip(stats.matrices, whitening.squared(), strict=True))
    knobs = {"kind": "kronecker", **whitening.info, "damping_ratio": None if damping is not None else float(damping_ratio)}
    return Preconditioner(kind="kronecker", dim=stats.dim, knobs=knobs, matrix_factors=factors)


def _check_kronecker_wide(wide: str, stats: IndexStatistics) -> None:
    """A known ``kronecker_wide``, and full only where the index keeps exact rows to fit it from."""
    if wide not in KRONECKER_WIDE:
        raise ValueError(f"unknown kronecker_wide {wide!r}; expected one of {', '.join(KRONECKER_WIDE)}")
    if wide == "full" and stats.kronecker_eigen is None:
        raise GradientIndexError("attribution.kronecker_wide full needs an exact index, and this one stores "
                                 "sketched rows", "set attribution.kronecker_wide auto (or diagonal), or rebuild "
                                 "the index with grads.projection_dim none")


def _kronecker_apply(q: np.ndarray, factors: Sequence[tuple[int, tuple[int, int], np.ndarray, np.ndarray]]) -> np.ndarray:
    """left Q right for every matrix block Q of every query row (a vector side multiplies elementwise)."""
    out = np.zeros_like(q)
    for offset, (rows, cols), left, right in factors:
        block = q[:, offset:offset + rows * cols].reshape(-1, rows, cols)
        block = np.matmul(left, block) if left.ndim == 2 else left[:, None] * block
        block = np.matmul(block, right) if right.ndim == 2 else block * right[None, :]
        out[:, offset:offset + rows * cols] = block.reshape(q.shape[0], -1)
    return out


def block_preconditioner(blocks: Sequence[BlockMoment], dim: int, *, damping: float | None = None,
                         damping_ratio: float = 0.1) -> Preconditioner:
    """Per block, P_b = (C_b + lambda_b I)^-1 with lambda_b = damping, else damping_ratio x mean eigenvalue of C_b."""
    missing = [block.name for block in blocks if block.matrix is None]
    if not blocks or missing:
        what = "no blocks" if not blocks else f"no second-moment matrix for {len(missing)} of {len(blocks)} blocks " \
                                              f"(first: {missing[0]})"
        raise GradientIndexError(
            f"the block preconditioner needs each block's second-moment matrix, and the index has {what}",
            "set grads.projection_dim so every block is small enough to keep its matrix, "
            "or use attribution.preconditioner diagonal",
        )
    _check_layout(blocks, dim)
    inverses, per_block = [], []
    for block in blocks:
        inverse, info = _damped_inverse(block, damping, damping_ratio)
        inverses.append((block.offset, block.offset + block.size, inverse))
        per_block.append(info)
    knobs = {
        "kind": "block",
        "damping_source": "absolute" if damping is not None else "damping_ratio x mean eigenvalue per block",
        "damping": float(damping) if damping is not None else None,
        "damping_ratio": None if damping is not None else float(damping_ratio),
        "blocks": per_block,
    }
    return Preconditioner(kind="block", dim=dim, knobs=knobs, block_inverses=tuple(inverses))


def adam_preconditioner(exp_avg_sq: np.ndarray, *, eps: float = DEFAULT_ADAM_EPS, dim: int | None = None) -> Preconditioner:
    """P = diag(1 / (sqrt(v) + eps)) from the optimizer's second moment v, mapped to stored space by the caller."""
    v = np.asarray(exp_avg_sq, dtype=np.float64).reshape(-1)
    if dim is not None and v.size != dim:
        raise RunDirError(
            f"the optimizer state has {v.size} second-moment values and the index is {dim} wide",
            "the run dir's optimizer state must belong to the adapter the index was built from",
        )
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise RunDirError("the optimizer state's exp_avg_sq holds negative or non-finite values",
                          "point --run at an intact checkpoint, or use attribution.preconditioner diagonal")
    if eps <= 0:
        raise ValueError("adam eps must be positive")
    scale = 1.0 / (np.sqrt(v) + eps)
    knobs = {"kind": "adam", "eps": float(eps), "mean_sqrt_v": float(np.sqrt(v).mean()) if v.size else 0.0}
    return Preconditioner(kind="adam", dim=v.size, knobs=knobs, scale=scale)


def _applied_at_capture(kind: str, stats: IndexStatistics) -> Preconditioner:
    """The preconditioner of a whitened index: already in every row and query, so P = I here."""
    from gradian.grads.whitening import SCHEMES  # imports torch; this package does not

    built = next((name for name, scheme in SCHEMES.items() if scheme == stats.whitening.get("scheme")), None)
    if kind != built:
        raise GradientIndexError(
            f"this index's rows were transformed by the {built} preconditioner before they were sketched, so the "
            f"{kind} preconditioner cannot be applied to them",
            "build the index with the same attribution.preconditioner you score with (gradian index --config), "
            f"or use attribution.preconditioner {built}",
        )
    knobs = {"kind": kind, "applied": "before the sketch (fitted on exact gradients)", **stats.whitening}
    return Preconditioner(kind=kind, dim=stats.dim, knobs=knobs, scale=np.ones(stats.dim))


def _adam_unavailable(stats: IndexStatistics) -> GradianError:
    if stats.projected:
        return GradientIndexError(
            "the adam preconditioner needs the optimizer's second moments in the stored space, and this index "
            "stores randomly projected gradients, where they cannot be mapped",
            "use attribution.preconditioner diagonal or block, or rebuild the index without grads.projection_dim",
        )
    return RunDirError(
        "the adam preconditioner needs the run's optimizer state (optimizer.pt with exp_avg_sq), and none was found",
        "pass --run with the checkpoint dir that holds optimizer.pt, or use attribution.preconditioner diagonal",
    )



def _checked_vector(values: np.ndarray, what: str) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(vector)):
        raise GradientIndexError(f"the index's {what} contain NaN or inf",
                                 "rebuild the index; non-finite gradients usually mean an fp16 overflow")
    return vector


def _safe_reciprocal(denominator: np.ndarray) -> np.ndarray:
    """1 / d where d > 0, else 0: a coordinate no train gradient ever touched carries no signal."""
    out = np.zeros_like(denominator)
    positive = denominator > 0
    out[positive] = 1.0 / denominator[positive]
    return out


def _check_layout(blocks: Sequence[BlockMoment], dim: int) -> None:
    """Blocks must tile [0, dim) in order; anything else is an index built by other code."""
    cursor = 0
    for block in blocks:
        if block.offset != cursor or block.size <= 0:
            raise GradientIndexError(f"block {block.name} starts at {block.offset}, expected {cursor}",
                                     "the index's block layout is inconsistent; rebuild it")
        cursor += block.size
    if cursor != dim:
        raise GradientIndexError(f"the blocks cover {cursor} coordinates and the index is {dim} wide",
                                 "the index's block layout is inconsistent; rebuild it")


def _damped_inverse(block: BlockMoment, damping: float | None, damping_ratio: float) -> tuple[np.ndarray, dict]:
    """(C + lambda I)^-1 of one block through a float64 eigendecomposition (pseudo-inverse when singular)."""
    assert block.matrix is not None
    matrix = np.asarray(block.matrix, dtype=np.float64)
    if matrix.shape != (block.size, block.size):
        raise GradientIndexError(f"block {block.name}'s second-moment matrix is {matrix.shape}, expected "
                                 f"({block.size}, {block.size})", "rebuild the index")
    if not np.all(np.isfinite(matrix)):
        raise GradientIndexError(f"block {block.name}'s second-moment matrix contains NaN or inf",
                                 "rebuild the index; non-finite gradients usually mean an fp16 overflow")
    symmetric = (matrix + matrix.T) / 2.0  # float sums leave the stored matrix a hair off symmetric
    eigenvalues, eigenvectors = np.linalg.eigh(symmetric)
    eigenvalues = np.clip(eigenvalues, 0.0, None)  # a second-moment matrix is PSD; negatives are rounding
    mean_eig = float(eigenvalues.mean())
    lam = float(damping) if damping is not None else damping_ratio * mean_eig
    shifted = eigenvalues + lam
    # Below this an eigenvalue is rounding noise of a singular matrix, not a direction to amplify.
    tolerance = max(float(shifted.max()), 0.0) * block.size * np.finfo(np.float64).eps
    kept = shifted > tolerance
    inverse_values = np.zeros_like(shifted)
    inverse_values[kept] = 1.0 / shifted[kept]
    inverse = (eigenvectors * inverse_values) @ eigenvectors.T
    info = {"name": block.name, "offset": block.offset, "size": block.size, "damping": lam,
            "mean_eigenvalue": mean_eig, "dropped_directions": int(np.count_nonzero(~kept))}
    return inverse, info
