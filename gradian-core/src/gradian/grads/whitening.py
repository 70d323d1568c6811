"""Preconditioning applied to a gradient's factors: before the sketch, and as the Kronecker preconditioner.

A projected index cannot take the diagonal preconditioner diag(1 / (E[g^2] + lambda)) afterwards: estimated on
sketched rows it ranks worse than the same preconditioner in exact space (bench/results/projection_preconditioner.md).
So a projected build first measures second moments in exact space on a seeded sample of its rows, and the capture
transforms each LoRA matrix gradient G by T_rows G T_cols before sketching: S(T q) . S(T g) ~ q . P g.

The capture never forms G = sum_t u_t^T v_t, so T must act on its factors: T_rows G T_cols = sum_t (u_t T_rows)^T
(v_t T_cols) for symmetric T. Two schemes fit T from the sample (lambda split between the two sides):

  diagonal    T = diag(a), diag(b): E[g^2]_ij ~ r_i c_j / m with row means r, column means c and matrix mean m
              (Adafactor's factoring of a second moment).
  kronecker   the empirical Fisher of G as a Kronecker product L (x) R (L = E[G G^T] / cols, R = E[G^T G] / rows,
              as Shampoo estimates it), full on the matrix's narrow side (the LoRA rank: r x r, cheap at any model
              size) and diagonal on the wide side; T = (L + lambda/2)^-1/2 and (R + lambda/2)^-1/2, scaled by sqrt(m).
              It is never below the diagonal on a tuning case, and above it on most (bench/results/kronecker.md).

An exact index applies the Kronecker fit at query time (P = T^2 on each side, ``Whitening.squared``), from the same
sample of its stored rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

# attribution.preconditioner -> the scheme that fits it from a sample of exact gradients.
SCHEMES = {"diagonal": "factored-diagonal-v1", "kronecker": "kronecker-rank-v1"}
SCHEME = SCHEMES["diagonal"]
# Rows measured before sketching: a 64-row estimate ranks as well as one from every row (bench/projection_preconditioner.py).
SAMPLE_ROWS = 64


class Whitening:
    """Per LoRA matrix (layout order), the row-side and column-side transforms applied to a gradient's factors.

    A transform is a vector (a diagonal, applied elementwise) or a symmetric matrix.
    """

    def __init__(self, scales: Sequence[tuple[torch.Tensor, torch.Tensor]], info: dict[str, Any]) -> None:
        self.scales = tuple(scales)
        self.info = dict(info)
        self._by_device: dict[str, tuple[tuple[torch.Tensor, torch.Tensor], ...]] = {"cpu": self.scales}

    def matrices(self, index: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(row transform, column transform) of the index-th matrix on a device."""
        key = str(device)
        if key not in self._by_device:
            self._by_device[key] = tuple((rows.to(device), cols.to(device)) for rows, cols in self.scales)
        return self._by_device[key][index]

    def squared(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per matrix the two sides of P = T^2 (float64): what a query is multiplied by when rows stay unscaled."""
        return [(_square(rows), _square(cols)) for rows, cols in self.scales]

    def save(self, path: Path) -> None:
        """Write the transforms as safetensors (never a pickle), with what they were measured from as metadata."""
        tensors = {}
        for index, (rows, cols) in enumerate(self.scales):
            tensors[f"{index}.rows"], tensors[f"{index}.cols"] = rows.contiguous(), cols.contiguous()
        save_file(tensors, str(path), metadata={"info": json.dumps(self.info, sort_keys=True)})

    @classmethod
    def load(cls, path: Path, matrices: int) -> Whitening:
        """Read the transforms of ``matrices`` LoRA matrices written by ``save``."""
        with safe_open(str(path), framework="pt") as handle:
            info = json.loads((handle.metadata() or {}).get("info", "{}"))
            names = set(handle.keys())
            wanted = {f"{i}.{side}" for i in range(matrices) for side in ("rows", "cols")}
            if names != wanted or info.get("scheme") not in SCHEMES.values():
                raise ValueError(f"{path.name} holds {len(names)} tensors of scheme {info.get('scheme')!r}, "
                                 f"expected {len(wanted)} of one of {', '.join(SCHEMES.values())}")
            scales = tuple((handle.get_tensor(f"{i}.rows").float(), handle.get_tensor(f"{i}.cols").float())
                           for i in range(matrices))
        return cls(scales, info)


def _square(transform: torch.Tensor) -> np.ndarray:
    values = transform.double().numpy()
    return values @ values if values.ndim == 2 else values * values


class MomentAccumulator:
    """Running per-matrix sums over exact gradients: squares by row and by column, the narrow side's Gram matrix."""

    def __init__(self, shapes: Sequence[tuple[int, int]]) -> None:
        self.rows = [torch.zeros(r, dtype=torch.float64) for r, _ in shapes]
        self.cols = [torch.zeros(c, dtype=torch.float64) for _, c in shapes]
        # The LoRA rank side (A's rows, B's columns): sum_n G G^T or sum_n G^T G there is only r x r.
        self.narrow_rows = [r <= c for r, c in shapes]
        self.grams = [torch.zeros((min(r, c), min(r, c)), dtype=torch.float64) for r, c in shapes]
        self.examples = 0

    def add(self, index: int, gradients: torch.Tensor) -> None:
        """Add a batch of exact gradients [B, rows, cols] of the index-th matrix."""
        narrow_rows = self.narrow_rows[index]
        # The rank side's Gram matrix as one r x (B * wide) product (a batched einsum over megabyte rows is far
        # slower); its diagonal is that side's sums of squares, so only the wide side needs its own pass.
        side = gradients.transpose(0, 1) if narrow_rows else gradients.permute(2, 0, 1)
        flat = side.reshape(side.shape[0], -1).double()
        gram = (flat @ flat.T).cpu()
        wide = torch.sum(gradients.square(), dim=(0, 1) if narrow_rows else (0, 2), dtype=torch.float64).cpu()
        self.grams[index] += gram
        narrow_sums = gram.diagonal()
        if narrow_rows:
            self.rows[index] += narrow_sums
            self.cols[index] += wide
        else:
            self.cols[index] += narrow_sums
            self.rows[index] += wide

    def whitening(self, *, damping: float | None, damping_ratio: float, scheme: str = SCHEME) -> Whitening:
        """The transforms of ``scheme``; lambda = damping, else damping_ratio x mean E[g^2] over all matrices."""
        if self.examples <= 0:
            raise ValueError("no examples were measured")
        if scheme not in SCHEMES.values():
            raise ValueError(f"unknown whitening scheme {scheme!r}")
        totals = [float(rows.sum()) for rows in self.rows]
        width = sum(rows.numel() * cols.numel() for rows, cols in zip(self.rows, self.cols, strict=True))
        mean = sum(totals) / (self.examples * width)
        lam = float(damping) if damping is not None else damping_ratio * mean
        scales = []
        for index, total in enumerate(totals):
            n_rows, n_cols = self.rows[index].numel(), self.cols[index].numel()
            side = math.sqrt(math.sqrt(total / (self.examples * n_rows * n_cols)))  # sqrt(m) split between the sides
            row_scale = side * _inverse_sqrt(self.rows[index] / (self.examples * n_cols) + lam / 2)
            col_scale = side * _inverse_sqrt(self.cols[index] / (self.examples * n_rows) + lam / 2)
            if scheme == SCHEMES["kronecker"]:
                other = n_cols if self.narrow_rows[index] else n_rows
                full = side * _inverse_root(self.grams[index] / (self.examples * other), lam / 2)
                row_scale, col_scale = (full, col_scale) if self.narrow_rows[index] else (row_scale, full)
            scales.append((row_scale.float(), col_scale.float()))
        info = {"scheme": scheme, "sample_rows": self.examples, "damping": lam,
                "damping_source": "absolute" if damping is not None else "damping_ratio x mean second moment",
                "mean_second_moment": mean}
        return Whitening(tuple(scales), info)


def moments_of_rows(rows: np.ndarray, shapes: Sequence[tuple[int, int]], moments: MomentAccumulator | None = None
                    ) -> MomentAccumulator:
    """``moments`` (or new ones) with flat exact gradient rows [n, sum(rows x cols)] added, matrices in order."""
    moments = moments if moments is not None else MomentAccumulator(shapes)
    offset = 0
    for index, (n_rows, n_cols) in enumerate(shapes):
        block = np.ascontiguousarray(rows[:, offset:offset + n_rows * n_cols])
        moments.add(index, torch.from_numpy(block).reshape(rows.shape[0], n_rows, n_cols))
        offset += n_rows * n_cols
    moments.examples += rows.shape[0]
    return moments


def _inverse_sqrt(values: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(v) where v > 0, else 0: a coordinate no sampled gradient touched and no damping carries nothing."""
    out = torch.zeros_like(values)
    positive = values > 0
    out[positive] = values[positive].rsqrt()
    return out


def _inverse_root(matrix: torch.Tensor, damping: float) -> torch.Tensor:
    """(M + damping I)^-1/2 of a second-moment matrix; directions with no signal and no damping get 0, never inf."""
    values, vectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    values = values.clamp(min=0.0) + damping  # a Gram matrix is PSD; negatives are rounding
    tolerance = max(float(values.max()), 0.0) * values.numel() * torch.finfo(torch.float64).eps
    inverse = torch.where(values > tolerance, values.clamp(min=tolerance).rsqrt(), torch.zeros_like(values))
    return (vectors * inverse) @ vectors.T


def sample_positions(count: int, seed: int, sample_rows: int = SAMPLE_ROWS) -> list[int]:
    """The seeded, sorted dataset positions second moments are measured on."""
    if count <= sample_rows:
        return list(range(count))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(count, size=sample_rows, replace=False))


def whitening_spec(projected: bool, preconditioner: str, num_examples: int) -> dict[str, Any] | None:
    """What an index build transforms by, for its spec: a projected index scored with the diagonal or Kronecker fit.

    An exact index takes any preconditioner exactly at query time; a projected one scored otherwise (none, block,
    adam) is sketched unscaled, so that preconditioner sees the gradients it expects.
    """
    if not projected or preconditioner not in SCHEMES:
        return None
    return {"scheme": SCHEMES[preconditioner], "sample_rows": min(num_examples, SAMPLE_ROWS)}
