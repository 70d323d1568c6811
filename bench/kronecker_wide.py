"""The Kronecker preconditioner with a full wide side: does the d x d factor the shipped fit leaves diagonal matter?

The shipped fit (``attribution.preconditioner: kronecker``, gradian/grads/whitening.py) models each LoRA matrix
gradient's second moment as L (x) R, full on the rank side (r x r) and diagonal on the wide side (the hidden or MLP
width), from 64 sampled rows. A residual stream's features are strongly correlated, so the wide side's off-diagonal
terms may carry what the diagonal throws away. This fits the wide side in full too (R = E[G^T G] / rows, d x d per
matrix, as Shampoo and K-FAC's factors are), from the same 64 rows or from every stored row (64 rows x rank 8 gives
at most 512 directions of a 576- or 1536-wide side; damping fills the rest), with the shipped damping, and scores
the shipped query signal and ranking (kurtosis-weighted smooth_max) at the final adapter alone.

The product's fit (``attribution.kronecker_wide``, gradian/attribution/kronecker_eigen.py) is the ``every row`` variant,
built after this table and kept as float32 eigenbases; tests check it against the dense Kronecker inverse and the goal
table measures it through the product.

Rule, written before any case was scored: a full variant is built into the product only if, at the adapter alone, the
five tuning cases gain 0.03 mean recall@k with none 0.05 lower; the better of the two there (64 rows on a tie) is then
scored on the held-out cases and kept only if they gain 0.03 too, none 0.05 lower.

    OMP_NUM_THREADS=2 .venv/bin/python bench/kronecker_wide.py --cases /work/bench-cases rank-lr5e4-fact-0 ...
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "kronecker_wide"
SHIPPED = "kronecker as shipped (wide side diagonal, 64 rows)"
FULL_SAMPLE = "both sides full, 64 rows"
FULL_EVERY = "both sides full, every row"
# Not a candidate (added after the tuning cases were scored, before any held-out one): which of the two changes the
# gain comes from, the full wide side or fitting on every row.
SHIPPED_EVERY = "wide side diagonal, every row (diagnostic)"


class WideMoments:
    """Per LoRA matrix, over stored exact rows: sum G G^T and sum G^T G (both sides in full) and the sum of squares."""

    def __init__(self, shapes: list[tuple[int, int]]) -> None:
        import torch

        self.shapes = shapes
        self.left = [torch.zeros((r, r), dtype=torch.float64) for r, _ in shapes]
        self.right = [torch.zeros((c, c), dtype=torch.float64) for _, c in shapes]
        self.examples = 0

    def add_rows(self, rows: np.ndarray) -> None:
        """Add flat exact gradient rows [n, width], matrices in layout order."""
        import torch

        offset = 0
        for index, (n_rows, n_cols) in enumerate(self.shapes):
            block = torch.from_numpy(np.ascontiguousarray(rows[:, offset:offset + n_rows * n_cols], dtype=np.float32))
            block = block.reshape(rows.shape[0], n_rows, n_cols)
            by_rows = block.transpose(0, 1).reshape(n_rows, -1)  # [rows, n * cols]: its Gram is sum G G^T
            by_cols = block.reshape(-1, n_cols)  # [n * rows, cols]: its Gram is sum G^T G
            self.left[index] += (by_rows @ by_rows.T).double()
            self.right[index] += (by_cols.T @ by_cols).double()
            offset += n_rows * n_cols
        self.examples += rows.shape[0]

    def factors(self, damping_ratio: float, offsets: list[int], *, wide: str = "full"
                ) -> tuple[tuple[int, tuple[int, int], np.ndarray, np.ndarray], ...]:
        """P = m (L + lambda/2)^-1 (x) (R + lambda/2)^-1 per matrix, lambda as the shipped fit sets it.

        ``wide`` "diagonal" keeps only the diagonal of the wide side (the shipped fit's form).
        """
        totals = [float(left.trace()) for left in self.left]
        width = sum(r * c for r, c in self.shapes)
        lam = damping_ratio * sum(totals) / (self.examples * width)
        out = []
        for index, (n_rows, n_cols) in enumerate(self.shapes):
            mean = totals[index] / (self.examples * n_rows * n_cols)
            left = self.left[index] / (self.examples * n_cols)
            right = self.right[index] / (self.examples * n_rows)
            if wide == "diagonal":
                left, right = _damped_inverse(left, lam / 2, diagonal=n_rows > n_cols), _damped_inverse(
                    right, lam / 2, diagonal=n_rows <= n_cols)
            else:
                left, right = _damped_inverse(left, lam / 2), _damped_inverse(right, lam / 2)
            out.append((offsets[index], (n_rows, n_cols), mean * left, right))
        return tuple(out)


def _damped_inverse(matrix: Any, damping: float, *, diagonal: bool = False) -> np.ndarray:
    """(M + damping I)^-1 of a second-moment matrix, through a float64 eigendecomposition; a vector if diagonal."""
    import torch

    if diagonal:
        return (1.0 / (matrix.diagonal().clamp(min=0.0) + damping)).numpy()
    values, vectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    values = values.clamp(min=0.0) + damping
    return ((vectors / values) @ vectors.T).numpy()


def wide_moments(index: Any, positions: list[int], chunk_bytes: int) -> WideMoments:
    """Both sides' second moments in full over the stored rows at ``positions``."""
    from gradian.index.store import rows_per_chunk

    moments = WideMoments([tuple(block.stored_shape) for block in index.blocks])
    step = rows_per_chunk(chunk_bytes, index.dim)
    for start in range(0, len(positions), step):
        moments.add_rows(index.rows(positions[start:start + step]))
    return moments


def fitted_preconditioner(case: Any, moments: WideMoments, wide: str = "full") -> Any:
    """The kronecker preconditioner (wide side ``wide``) from the moments of some of the case's index rows."""
    from gradian.attribution.preconditioners import Preconditioner

    attribution = case.config.attribution
    offsets = [block.offset for block in case.index.blocks]
    return Preconditioner(kind="kronecker", dim=case.index.dim, knobs={"kind": "kronecker-full"},
                          matrix_factors=moments.factors(attribution.damping_ratio, offsets, wide=wide))


def score_case(directory: Path, base_model: str) -> dict[str, Any]:
    """recall@k / AUPRC of the shipped ranking under each preconditioner on one case, at the adapter alone."""
    from accuracy_methods import load_case, preconditioned_blame, preconditioner, query
    from finished_cases import planted_case, score_rankings
    from weakened_items import shipped_ranking

    from gradian.config import load_config
    from gradian.grads.whitening import sample_positions

    row, report, truth = planted_case(directory)
    if truth is None:
        return row
    case = load_case(directory, base_model, load_config(directory / "config.yaml"), report)
    signal = json.loads((directory / "report" / "report.json").read_text())["query_signal"]["effective"]
    queries = query(case, signal)
    sample = sample_positions(case.index.num_examples, int(case.index.manifest.spec["seed"]))
    chunk = case.config.attribution.chunk_bytes
    every = wide_moments(case.index, list(range(case.index.num_examples)), chunk)
    shipped = dataclasses.replace(case, config=case.config.replace(  # the 64-row fit, whatever the default is now
        attribution=dataclasses.replace(case.config.attribution, kronecker_wide="diagonal")))
    variants = {SHIPPED: preconditioner(shipped, "kronecker"),
                FULL_SAMPLE: fitted_preconditioner(case, wide_moments(case.index, sample, chunk)),
                FULL_EVERY: fitted_preconditioner(case, every),
                SHIPPED_EVERY: fitted_preconditioner(case, every, wide="diagonal")}
    item_ids = [item.id for item in case.items]
    score_rankings(row, truth, {name: shipped_ranking(preconditioned_blame(case, pre.apply(queries), item_ids))
                                for name, pre in variants.items()})
    print(f"  {directory.name}: " + ", ".join(f"{m['recall_at_k']:.2f}" for m in row["methods"].values()), flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per preconditioner, one column per case, then the tuning and held-out means of recall@k."""
    from finished_cases import rankings_table

    return rankings_table("The Kronecker preconditioner with a full wide side (recall@k, the final adapter alone)",
                          "preconditioner", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/kronecker_wide.json and .md."""
    from finished_cases import indexed_case_main

    return indexed_case_main("kronecker_wide", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
