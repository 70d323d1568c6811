"""Diagonal preconditioning applied before the sketch, so a projected index keeps exact-space preconditioning.

A projected index cannot take the diagonal preconditioner diag(1 / (E[g^2] + lambda)) afterwards: estimated on
sketched rows it ranks worse than the same preconditioner in exact space (bench/results/projection_preconditioner.md).
So a projected build first measures E[g^2] in exact space on a seeded sample of its rows, and the capture scales
each LoRA matrix gradient by w = 1 / sqrt(E[g^2] + lambda) before sketching: S(w * q) . S(w * g) ~ q . P g.

The capture never forms a matrix gradient G = sum_t u_t^T v_t, so w must act on its factors: per matrix it is
fitted as an outer product a b^T (Adafactor's factoring of a second moment: E[g^2]_ij ~ r_i c_j / m with row means
r, column means c and matrix mean m, lambda split between the sides), and diag(a) G diag(b) = sum_t (a * u_t)^T (b * v_t).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

SCHEME = "factored-diagonal-v1"
# Rows measured before sketching: a 64-row estimate ranks as well as one from every row (bench/projection_preconditioner.py).
SAMPLE_ROWS = 64


class Whitening:
    """Per LoRA matrix (layout order), the row-side and column-side scales applied to a gradient's factors."""

    def __init__(self, scales: Sequence[tuple[torch.Tensor, torch.Tensor]], info: dict[str, Any]) -> None:
        self.scales = tuple(scales)
        self.info = dict(info)
        self._by_device: dict[str, tuple[tuple[torch.Tensor, torch.Tensor], ...]] = {"cpu": self.scales}

    def matrices(self, index: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(row scale, column scale) of the index-th matrix on a device."""
        key = str(device)
        if key not in self._by_device:
            self._by_device[key] = tuple((rows.to(device), cols.to(device)) for rows, cols in self.scales)
        return self._by_device[key][index]

    def save(self, path: Path) -> None:
        """Write the scales as safetensors (never a pickle), with what they were measured from as metadata."""
        from safetensors.torch import save_file

        tensors = {}
        for index, (rows, cols) in enumerate(self.scales):
            tensors[f"{index}.rows"], tensors[f"{index}.cols"] = rows.contiguous(), cols.contiguous()
        save_file(tensors, str(path), metadata={"info": json.dumps(self.info, sort_keys=True)})

    @classmethod
    def load(cls, path: Path, matrices: int) -> Whitening:
        """Read the scales of ``matrices`` LoRA matrices written by ``save``."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            info = json.loads((handle.metadata() or {}).get("info", "{}"))
            names = set(handle.keys())
            wanted = {f"{i}.{side}" for i in range(matrices) for side in ("rows", "cols")}
            if names != wanted or info.get("scheme") != SCHEME:
                raise ValueError(f"{path.name} holds {len(names)} tensors of scheme {info.get('scheme')!r}, "
                                 f"expected {len(wanted)} of {SCHEME!r}")
            scales = tuple((handle.get_tensor(f"{i}.rows").float(), handle.get_tensor(f"{i}.cols").float())
                           for i in range(matrices))
        return cls(scales, info)


class MomentAccumulator:
    """Running per-matrix sums of squared exact gradients: by row, by column, in total, and the example count."""

    def __init__(self, shapes: Sequence[tuple[int, int]]) -> None:
        self.rows = [torch.zeros(r, dtype=torch.float64) for r, _ in shapes]
        self.cols = [torch.zeros(c, dtype=torch.float64) for _, c in shapes]
        self.examples = 0

    def add(self, index: int, gradients: torch.Tensor) -> None:
        """Add a batch of exact gradients [B, rows, cols] of the index-th matrix."""
        squared = gradients.double().square()
        self.rows[index] += squared.sum(dim=(0, 2)).cpu()
        self.cols[index] += squared.sum(dim=(0, 1)).cpu()

    def whitening(self, *, damping: float | None, damping_ratio: float) -> Whitening:
        """The factored 1 / sqrt(E[g^2] + lambda): lambda = damping, else damping_ratio x mean E[g^2] over all matrices."""
        if self.examples <= 0:
            raise ValueError("no examples were measured")
        totals = [float(rows.sum()) for rows in self.rows]
        width = sum(rows.numel() * cols.numel() for rows, cols in zip(self.rows, self.cols, strict=True))
        mean = sum(totals) / (self.examples * width)
        lam = float(damping) if damping is not None else damping_ratio * mean
        scales = []
        for rows, cols, total in zip(self.rows, self.cols, totals, strict=True):
            n_rows, n_cols = rows.numel(), cols.numel()
            matrix_mean = total / (self.examples * n_rows * n_cols)
            side = math.sqrt(math.sqrt(matrix_mean))  # sqrt(m) split between the two sides
            row_scale = side * _inverse_sqrt(rows / (self.examples * n_cols) + lam / 2)
            col_scale = side * _inverse_sqrt(cols / (self.examples * n_rows) + lam / 2)
            scales.append((row_scale.float(), col_scale.float()))
        info = {"scheme": SCHEME, "sample_rows": self.examples, "damping": lam,
                "damping_source": "absolute" if damping is not None else "damping_ratio x mean second moment",
                "mean_second_moment": mean}
        return Whitening(tuple(scales), info)


def _inverse_sqrt(values: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(v) where v > 0, else 0: a coordinate no sampled gradient touched and no damping carries nothing."""
    out = torch.zeros_like(values)
    positive = values > 0
    out[positive] = values[positive].rsqrt()
    return out


def sample_positions(count: int, seed: int, sample_rows: int = SAMPLE_ROWS) -> list[int]:
    """The seeded, sorted dataset positions a build measures E[g^2] on."""
    if count <= sample_rows:
        return list(range(count))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(count, size=sample_rows, replace=False))


def whitening_spec(projected: bool, preconditioner: str, num_examples: int) -> dict[str, Any] | None:
    """What an index build whitens by, for its spec: only a projected index scored with the diagonal preconditioner.

    An exact index takes any preconditioner exactly at query time; a projected one scored otherwise (none, block,
    adam) is sketched unscaled, so that preconditioner sees the gradients it expects.
    """
    if not projected or preconditioner != "diagonal":
        return None
    return {"scheme": SCHEME, "sample_rows": min(num_examples, SAMPLE_ROWS)}
