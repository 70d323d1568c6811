"""What an index build will take before it starts: bytes per example, size on disk, peak memory, free disk.

The peak-memory figure is an estimate ("about"): the model's weights, the fp32 logits of the largest batch's
supervised tokens (the allocation the troubleshooting guide names), the activations kept for the backward pass,
and the shard buffer. The disk check is exact arithmetic against ``shutil.disk_usage``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.cache import CACHE_DIR_ENV, index_cache_dir
from gradian.errors import GradientIndexError
from gradian.index.dtypes import storage_numpy_dtype

if TYPE_CHECKING:
    import torch

# Room kept beyond the shards and statistics: manifest, examples.jsonl and the filesystem's own rounding.
DISK_MARGIN = 1.05
NPY_HEADER_BYTES = 128  # what numpy's .npy format puts before a 1-D array
# Tensors a Llama-style block keeps for backward, per token, in hidden- and intermediate-sized units: the
# residual stream, norms, q/k/v, attention output and the MLP's gate, up, activation and product, plus what the
# capture hooks hold. Calibrated on SmolLM2-135M (batch 8 x 128 tokens, 30 layers): a capture's working memory
# measured 1.5 GB, and the index stage of `gradian attribute` peaked at 2.6 to 2.75 GB against 2.4 estimated.
HIDDEN_TENSORS, INTERMEDIATE_TENSORS = 12, 6
# Python, torch and the tokenizer before any model (0.2 to 0.4 GB measured).
RUNTIME_BYTES = 400 * 1000**2
# The kronecker fit with a full wide side (attribution.kronecker_wide) keeps, beside an exact index, both sides'
# eigendecompositions of every LoRA matrix in float32: width eigenvalues per side, and width^2 eigenvector entries
# for a side up to this width (wider ones stay diagonal). 1.2 GB beside a 2.0 GB SmolLM2-135M index.
KRONECKER_WIDE_MAX = 2048
# A shard bigger than this is assembled in a scratch memory map, whose written pages go back to the page cache,
# instead of in RAM (exact gradients of a real model are ~5-10 MB per example).
IN_MEMORY_SHARD_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class IndexEstimate:
    """The size of an index build, known before its first gradient."""

    num_examples: int
    dim: int
    storage_dtype: str
    projected: bool
    peak_memory_bytes: int
    num_shards: int = 1

    @property
    def bytes_per_example(self) -> int:
        """Bytes one example's stored row takes."""
        return self.dim * storage_numpy_dtype(self.storage_dtype).itemsize

    @property
    def total_bytes(self) -> int:
        """Bytes of every shard together."""
        return self.bytes_per_example * self.num_examples

    @property
    def disk_bytes(self) -> int:
        """Bytes of the finished index on disk: its shards and its statistics files."""
        # A float64 count, sum and sum of squares per coordinate, per shard and for the whole: a third of a 30-row
        # test index, about 3% of an exact SmolLM2-135M index in shards of 256 examples.
        return self.total_bytes + (self.num_shards + 1) * (NPY_HEADER_BYTES + 8 * (1 + 2 * self.dim))

    def line(self) -> str:
        """One line for the terminal: per example, in all, peak memory."""
        kind = "projected" if self.projected else "exact"
        return (f"index estimate: {self.num_examples:,} examples x {self.dim:,} ({kind}, {self.storage_dtype}) = "
                f"{human_bytes(self.bytes_per_example)} per example, {human_bytes(self.total_bytes)} in all; "
                f"peak memory about {human_bytes(self.peak_memory_bytes)}")


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KB' (powers of 1000, as disk tools print)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def estimate_index(model: torch.nn.Module, dim: int, storage_dtype: str, projected: bool, token_counts: Sequence[int],
                   supervised_counts: Sequence[int], batch_size: int, shard_size: int) -> IndexEstimate:
    """The size and peak memory of indexing examples with these token and supervised-token counts."""
    config = getattr(getattr(model, "get_base_model", lambda: model)(), "config", None)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    dtype_bytes = next(iter(model.parameters())).element_size()
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    batch = min(batch_size, len(token_counts))
    longest = sorted(token_counts, reverse=True)[:batch]
    most_supervised = sorted(supervised_counts, reverse=True)[:batch]
    # The vocab-sized tensor exists in the model's dtype and again upcast to fp32.
    logits = sum(most_supervised) * vocab * (4 + dtype_bytes)
    per_token = HIDDEN_TENSORS * hidden + INTERMEDIATE_TENSORS * intermediate
    activations = batch * max(longest, default=0) * layers * per_token * dtype_bytes
    shard = min(shard_size, len(token_counts)) * dim * storage_numpy_dtype(storage_dtype).itemsize
    in_memory_shard = shard if shard <= IN_MEMORY_SHARD_BYTES else 0
    buffers = in_memory_shard + 3 * batch * dim * 4  # the shard when in RAM, and the batch's fp32 rows
    return IndexEstimate(num_examples=len(token_counts), dim=dim, storage_dtype=storage_dtype, projected=projected,
                         peak_memory_bytes=int(RUNTIME_BYTES + weights + logits + activations + buffers),
                         num_shards=-(-len(token_counts) // shard_size))


def kronecker_side_floats(width: int, full: bool) -> int:
    """Floats one side of a matrix takes in the kronecker fit's cache: its eigenvalues, then its eigenvectors if full."""
    return width * (width + 1) if full else width


def kronecker_fit_bytes(shapes: Sequence[tuple[int, int]]) -> int:
    """Bytes of the full kronecker fit's cache beside an exact index whose LoRA matrices have these shapes."""
    floats = sum(kronecker_side_floats(width, width <= KRONECKER_WIDE_MAX) for shape in shapes for width in shape)
    return NPY_HEADER_BYTES + 4 * floats


def free_bytes(directory: Path) -> int:
    """Free bytes on the filesystem that holds ``directory`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing(directory)).free


def _existing(directory: Path) -> Path:
    """``directory`` or its nearest existing parent."""
    probe = Path(directory).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_free_disk(estimate: IndexEstimate, builds: Sequence[tuple[Path, int, int]]) -> None:
    """Refuse to start when the indexes still to build will not fit, summed per filesystem.

    ``builds`` holds (directory, bytes an interrupted build there already wrote, bytes written beside it after the
    build: the kronecker fit's cache) for each index of ``estimate``'s size this command builds: the adapter's, and
    the checkpoints' that attribution.checkpoints scores next.
    """
    by_disk: dict[int, list[tuple[Path, int, int]]] = {}
    for directory, written, beside in builds:
        by_disk.setdefault(os.stat(_existing(directory)).st_dev, []).append((directory, written, beside))
    for entries in by_disk.values():
        need = sum(int(estimate.disk_bytes * DISK_MARGIN) - written + beside for _, written, beside in entries)
        where = entries[0][0]
        free = free_bytes(where)
        if need <= free:
            continue
        fit = sum(beside for _, _, beside in entries)
        size = f"{estimate.num_examples:,} examples x {human_bytes(estimate.bytes_per_example)}" + (
            f", with the kronecker fit's {human_bytes(fit)} beside" if fit else "")
        fit_hint = "set attribution.kronecker_wide=diagonal (no fit kept beside the index), " if fit else ""
        hint = _cache_hint(where) + fit_hint + shrink_hint(estimate.storage_dtype)
        if len(entries) == 1:
            raise GradientIndexError(
                f"not enough free disk for the gradient index: it needs about {human_bytes(need)} at {where} "
                f"({size}) and {human_bytes(free)} is free", hint)
        raise GradientIndexError(
            f"not enough free disk for the {len(entries)} gradient indexes still to build (attribution.checkpoints "
            f"indexes each checkpoint scored): they need about {human_bytes(need)} on the disk of {where} "
            f"({len(entries)} x {size}) and {human_bytes(free)} is free",
            f"lower attribution.checkpoints (one index per checkpoint; the checkpoints' go to the index cache, "
            f"${CACHE_DIR_ENV}), or {hint}")


def shrink_hint(storage_dtype: str) -> str:
    """The ways to make an index smaller, leaving out a storage dtype it already has."""
    # Suggesting float16 to an index already stored in 16 bits sends the user to a setting that changes nothing.
    dtype = " or grads.storage_dtype=float16 (half of float32)" if storage_dtype == "float32" else ""
    return ("shrink the index with grads.projection_dim (a fixed width such as 65536, whatever the model's size), "
            f"grads.module_filter (e.g. down_proj, about 4.3x smaller){dtype}, "
            "or put it on a disk with room (--out for gradian index, --index for gradian attribute)")


def _cache_hint(where: Path) -> str:
    """What the index cache on the same disk as ``where`` holds, which pruning frees; '' when nothing."""
    # Checkpoint indexes of earlier runs pile up there unseen (a 2,000-row SmolLM2 run leaves 3 x 9.8 GB).
    root = index_cache_dir()
    if not root.is_dir() or root.stat().st_dev != os.stat(_existing(where)).st_dev:
        return ""
    held = sum(path.stat().st_size for path in root.rglob("*") if path.is_file() and not path.is_symlink())
    if held == 0:
        return ""
    return (f"free {human_bytes(held)} held by the index cache on that disk ({root}; `gradian cache list` shows "
            "what built each, `gradian cache prune --older-than 7d` or `--id` removes them), or ")


def written_bytes(directory: Path) -> int:
    """Bytes of the files already in a (partial) build directory, which a resumed build does not write again."""
    if not directory.is_dir():
        return 0
    return sum(path.stat().st_size for path in directory.iterdir() if path.is_file())
