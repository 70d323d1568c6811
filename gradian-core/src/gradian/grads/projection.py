"""Factored (LoGra-style) random projection of per-example LoRA gradients to a fixed width.

A LoRA matrix gradient is G = sum_t u_t^T v_t (u: output-side grads, v: inputs). Its sketch is P_rows G P_cols^T,
computed as (U P_rows^T)^T (V P_cols^T) from projected activations and projected output grads, so the full
gradient is never formed. P entries are N(0, 1/k), so E[P^T P] = I and inner products are preserved in
expectation.

Two ways to size the sketches:

- ``auto`` (the default, ``plan_auto_projection``): exact gradients when they are at most ``AUTO_EXACT_LIMIT``
  numbers per example (a small model's adapter); otherwise every matrix keeps its LoRA rank side exact and
  sketches the other side to a width that follows the matrix's size, never below ``MIN_SKETCH_SIDE`` (no 1x1
  sketches), so the stored width stays near ``AUTO_BUDGET`` whatever the model's size.
- a fixed ``grads.projection_dim`` (``plan_projection``): that width split across matrices proportionally to
  their size (at least 1 each); the rank side is kept exact when the matrix's share affords it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradian.errors import ConfigError
from gradian.model.lora_blocks import LoraBlock

SCHEME = "factored-gaussian-v1"
AUTO = "auto"
# Exact gradients up to this width (8 MiB per example in float16): projection costs some recall (0.013 recall@k at
# AUTO_BUDGET, bench/projection.py), so it is paid only where exact rows would not fit (SmolLM2-135M r=8 on 7 projections: 2.4M, exact; Llama-3.2-1B
# r=16: 11.3M and Llama-3-8B r=16: 41.9M, projected).
AUTO_EXACT_LIMIT = 4_194_304
# Numbers stored per example by a projected default index (512 KiB in float16), chosen with bench/projection.py.
AUTO_BUDGET = 262_144
# The narrowest sketch of a matrix's non-rank side under ``auto``.
MIN_SKETCH_SIDE = 16


@dataclass(frozen=True)
class MatrixSketch:
    """How one LoRA matrix gradient (rows x cols) is sketched to k_rows x k_cols; a side with k == size is exact."""

    block: str
    matrix: str  # "A" (r x d_in) or "B" (d_out x r)
    rows: int
    cols: int
    k_rows: int
    k_cols: int

    @property
    def width(self) -> int:
        """Stored numbers for this matrix."""
        return self.k_rows * self.k_cols

    @property
    def projects_rows(self) -> bool:
        """Whether the row side goes through a random matrix (else it is kept exact)."""
        return self.k_rows != self.rows

    @property
    def projects_cols(self) -> bool:
        """Whether the column side goes through a random matrix (else it is kept exact)."""
        return self.k_cols != self.cols


@dataclass(frozen=True)
class ProjectionPlan:
    """The seeded, deterministic split of a fixed width across the LoRA matrices of the selected blocks."""

    dim: int
    seed: int
    sketches: tuple[MatrixSketch, ...]
    padding: int  # trailing zero columns when the width cannot be split exactly (fewer than the largest rank)
    budget: int | None = None  # the per-example budget of an ``auto`` plan; None for a fixed projection_dim

    def to_json(self) -> dict[str, Any]:
        """Plain dict for the manifest."""
        sizing = {"sizing": "auto", "budget": self.budget} if self.budget is not None else {}
        return {
            "scheme": SCHEME,
            **sizing,
            "dim": self.dim,
            "seed": self.seed,
            "padding": self.padding,
            "sketches": [
                {"block": s.block, "matrix": s.matrix, "shape": [s.rows, s.cols], "sketch": [s.k_rows, s.k_cols]}
                for s in self.sketches
            ],
        }


def matrix_seed(seed: int, block: str, matrix: str, side: str) -> int:
    """A 63-bit seed from the config seed and the matrix's identity: stable across runs, processes and machines."""
    text = f"gradian/projection/{SCHEME}/{seed}/{block}/{matrix}/{side}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & (2**63 - 1)


def gaussian_sketch(seed: int, block: str, matrix: str, side: str, k: int, n: int) -> torch.Tensor:
    """The k x n projection matrix with N(0, 1/k) entries for one side of one matrix, float32 on CPU."""
    generator = torch.Generator(device="cpu").manual_seed(matrix_seed(seed, block, matrix, side))
    return torch.randn((k, n), generator=generator, dtype=torch.float32) / math.sqrt(k)


def split_width(total: int, sizes: Sequence[int], units: Sequence[int]) -> tuple[list[int], int]:
    """Split total across items proportionally to sizes, at least 1 each, in multiples of units where the share is large.

    Returns the allocation and the remainder that no item could take in whole units (zero padding).
    """
    count = len(sizes)
    if total < count:
        raise ValueError("total must be at least one per item")
    whole = float(sum(sizes))
    ideal = [total * size / whole for size in sizes]
    unit = [u if keeps_rank_exact(ideal[i], u) else 1 for i, u in enumerate(units)]
    alloc = [max(1, unit[i] * int(ideal[i] // unit[i])) for i in range(count)]
    left = total - sum(alloc)
    while left < 0:  # the at-least-one floor over-spent: take back from the most over-allocated item
        i = max((j for j in range(count) if alloc[j] > 1), key=lambda j: (alloc[j] - ideal[j], -j))
        if alloc[i] - unit[i] < 1:
            unit[i] = 1
        alloc[i] -= unit[i]
        left += unit[i]
    while left > 0:
        candidates = [j for j in range(count) if unit[j] <= left]
        if not candidates:
            break
        i = max(candidates, key=lambda j: (ideal[j] - alloc[j], -j))
        alloc[i] += unit[i]
        left -= unit[i]
    return alloc, left


def keeps_rank_exact(width: float, rank_side: int) -> bool:
    """Whether a matrix's share is large enough to keep its rank side exact.

    With the rank side exact, a low-rank gradient is sketched about as well as by a k/r-dimensional JL projection;
    below r^2/4 numbers a balanced Kronecker split (sqrt(k) per side) does better.
    """
    return width >= max(rank_side, rank_side * rank_side / 4)


def factor_width(width: int, rank_side: int) -> tuple[int, int]:
    """(k_rank, k_other) with k_rank * k_other == width: the rank side exact when the share affords it, else balanced."""
    if keeps_rank_exact(width, rank_side) and width % rank_side == 0:
        return rank_side, width // rank_side
    root = math.sqrt(width)
    divisors = [d for d in range(1, min(width, rank_side) + 1) if width % d == 0]
    # Closest to sqrt(width) in log scale; ties go to the smaller rank-side factor (the other side is the larger one).
    k_rank = min(divisors, key=lambda d: (round(abs(math.log(d / root)), 9), d))
    return k_rank, width // k_rank


def plan_projection(blocks: Sequence[LoraBlock], dim: int, seed: int = 0) -> ProjectionPlan:
    """Split ``dim`` across the A and B matrices of the blocks (module order, A then B per block)."""
    matrices = lora_matrices(blocks)
    if dim < len(matrices):
        raise ConfigError(
            f"grads.projection_dim {dim} is smaller than the {len(matrices)} LoRA matrices it must cover "
            f"({len(blocks)} blocks x A and B)",
            f"set grads.projection_dim to at least {len(matrices)}, select fewer blocks with grads.module_filter, "
            "or use null for exact gradients",
        )
    sizes = [rows * cols for _, _, rows, cols in matrices]
    ranks = [rows if kind == "A" else cols for _, kind, rows, cols in matrices]
    widths, padding = split_width(dim, sizes, ranks)
    sketches = []
    for (block, kind, rows, cols), width, rank in zip(matrices, widths, ranks, strict=True):
        k_rank, k_other = factor_width(width, rank)
        k_rows, k_cols = (k_rank, k_other) if kind == "A" else (k_other, k_rank)
        sketches.append(MatrixSketch(block, kind, rows, cols, k_rows, k_cols))
    return ProjectionPlan(dim=dim, seed=seed, sketches=tuple(sketches), padding=padding)


def lora_matrices(blocks: Sequence[LoraBlock]) -> list[tuple[str, str, int, int]]:
    """(block, "A"|"B", rows, cols) of every LoRA matrix, in module order, A then B per block."""
    return [m for b in blocks for m in ((b.name, "A", b.r, b.d_in), (b.name, "B", b.d_out, b.r))]


def exact_width(blocks: Sequence[LoraBlock]) -> int:
    """Numbers in one example's exact LoRA gradient over these blocks."""
    return sum(block.size for block in blocks)


def plan_auto_projection(blocks: Sequence[LoraBlock], seed: int = 0, budget: int = AUTO_BUDGET,
                         exact_limit: int | None = None) -> ProjectionPlan | None:
    """None (exact) up to ``exact_limit`` (default ``budget``); else rank-exact sketches whose widths follow size.

    Each matrix gets a share of the budget proportional to its size; the rank side stays exact and the other side
    is sketched to share / rank, clamped to [MIN_SKETCH_SIDE, its size], the budget a clamped matrix frees or takes
    going to the others. When even the narrowest sketches exceed the budget (thousands of LoRA matrices), they are
    used anyway: a 1x1 sketch keeps nothing worth ranking by.
    """
    if exact_width(blocks) <= (budget if exact_limit is None else exact_limit):
        return None
    matrices = lora_matrices(blocks)
    ranks = [rows if kind == "A" else cols for _, kind, rows, cols in matrices]
    others = [cols if kind == "A" else rows for _, kind, rows, cols in matrices]
    sides = _water_fill(budget, [rows * cols for _, _, rows, cols in matrices], ranks,
                        [min(MIN_SKETCH_SIDE, other) for other in others], others)
    sketches = []
    for (block, kind, rows, cols), rank, k in zip(matrices, ranks, sides, strict=True):
        k_rows, k_cols = (rank, k) if kind == "A" else (k, rank)
        sketches.append(MatrixSketch(block, kind, rows, cols, k_rows, k_cols))
    dim = sum(s.width for s in sketches)
    return ProjectionPlan(dim=dim, seed=seed, sketches=tuple(sketches), padding=0, budget=budget)


def _water_fill(budget: int, sizes: Sequence[int], units: Sequence[int], lows: Sequence[int],
                highs: Sequence[int]) -> list[int]:
    """Sides k_i in [lows_i, highs_i] with sum k_i * units_i near budget and k_i * units_i proportional to sizes_i."""
    sides: list[int | None] = [None] * len(sizes)
    free, remaining = set(range(len(sizes))), float(budget)
    while free:
        total = float(sum(sizes[i] for i in free))
        clamped = []
        for i in sorted(free):
            ideal = remaining * sizes[i] / total / units[i]
            if ideal < lows[i] or ideal > highs[i]:
                clamped.append((i, lows[i] if ideal < lows[i] else highs[i]))
        if not clamped:
            for i in free:
                sides[i] = int(remaining * sizes[i] / total // units[i])
            break
        for i, side in clamped:
            sides[i] = side
            free.discard(i)
            remaining -= side * units[i]
    return [int(side) for side in sides]  # type: ignore[arg-type]


def resolve_projection(blocks: Sequence[LoraBlock], projection_dim: int | str | None, seed: int = 0) -> ProjectionPlan | None:
    """The projection plan of a ``grads.projection_dim`` setting: auto, null (exact) or a fixed width."""
    if projection_dim is None:
        return None
    if projection_dim == AUTO:
        return plan_auto_projection(blocks, seed, AUTO_BUDGET, AUTO_EXACT_LIMIT)
    return plan_projection(blocks, int(projection_dim), seed)


class FactoredProjection:
    """The projection matrices of a plan, built once (seeded) and kept per device."""

    def __init__(self, plan: ProjectionPlan) -> None:
        self.plan = plan
        self._cpu: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
        for s in plan.sketches:
            rows = gaussian_sketch(plan.seed, s.block, s.matrix, "rows", s.k_rows, s.rows) if s.projects_rows else None
            cols = gaussian_sketch(plan.seed, s.block, s.matrix, "cols", s.k_cols, s.cols) if s.projects_cols else None
            self._cpu.append((rows, cols))
        self._by_device: dict[str, list[tuple[torch.Tensor | None, torch.Tensor | None]]] = {"cpu": self._cpu}

    def matrices(self, index: int, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(P_rows, P_cols) of the index-th sketch on a device; None means that side is kept exact."""
        key = str(device)
        if key not in self._by_device:
            self._by_device[key] = [tuple(p.to(device) if p is not None else None for p in pair) for pair in self._cpu]
        return self._by_device[key][index]

    def sketch_gradient(self, index: int, gradient: torch.Tensor) -> torch.Tensor:
        """P_rows G P_cols^T of full matrix gradients [B, rows, cols] (for checks; capture never forms G)."""
        rows, cols = self.matrices(index, gradient.device)
        out = gradient if rows is None else torch.matmul(rows, gradient)
        return out if cols is None else torch.matmul(out, cols.T)
