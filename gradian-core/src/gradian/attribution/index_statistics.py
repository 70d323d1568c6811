"""An index's statistics in the form the preconditioners are fitted from (moments, block matrices, a row sample)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.attribution.kronecker_eigen import kronecker_eigen
from gradian.attribution.preconditioners import BlockMoment, IndexStatistics
from gradian.index.store import DEFAULT_CHUNK_BYTES, Index, rows_per_chunk

if TYPE_CHECKING:
    from gradian.grads.whitening import MomentAccumulator


def index_statistics(index: Index, preconditioner: str = "diagonal", *,
                     chunk_bytes: int | None = None) -> IndexStatistics:
    """The index's statistics in the form the preconditioners take; block matrices only for ``block``.

    Block matrices are width^2 floats per block and only the block preconditioner reads them, so they are
    computed (one streamed pass of ``chunk_bytes`` chunks, then cached with the index) only when it is asked for;
    the kronecker preconditioner's sample of exact rows is read only when that preconditioner is fitted.
    """
    stats = index.stats()
    if preconditioner == "block" and stats.has_block_matrices():
        stats = index.block_stats(chunk_bytes or DEFAULT_CHUNK_BYTES)
    blocks = tuple(BlockMoment(b.name, b.offset, b.width,
                               stats.block_second_moment(b.name) if b.name in stats.matrices else None)
                   for b in stats.blocks)
    whitening = index.whitening()
    exact = whitening is None and index.manifest.projection is None
    return IndexStatistics(dim=index.dim, second_moment=stats.second_moment(), blocks=blocks,
                           projected=index.manifest.projection is not None,
                           whitening=None if whitening is None else whitening.info,
                           # read only if the kronecker preconditioner is fitted: 64 exact rows are megabytes each
                           sample_moments=(lambda: sample_moments(index, chunk_bytes or DEFAULT_CHUNK_BYTES))
                           if exact else None,
                           matrices=tuple((b.offset, tuple(b.stored_shape)) for b in index.blocks),
                           kronecker_eigen=(lambda: kronecker_eigen(index, chunk_bytes or DEFAULT_CHUNK_BYTES))
                           if exact else None)


def sample_moments(index: Index, chunk_bytes: int) -> MomentAccumulator | None:
    """Second moments of the seeded sample of an exact index's rows that a projected build would measure."""
    from gradian.grads.whitening import moments_of_rows, sample_positions  # imports torch; this package does not

    positions = sample_positions(index.num_examples, int(index.manifest.spec["seed"]))
    shapes = [tuple(block.stored_shape) for block in index.blocks]
    step = rows_per_chunk(chunk_bytes, index.dim)
    moments = None
    for start in range(0, len(positions), step):  # a sampled exact row of a real model is megabytes
        moments = moments_of_rows(index.rows(positions[start:start + step]), shapes, moments)
    return moments
