"""The supervised-token loss: gather supervised positions of the final hidden states, then lm_head, then fp32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gradian.grads.batch import IGNORE_INDEX, Batch

REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class SupervisedLoss:
    """The batch loss (sum of the examples' own losses, so per-example gradients stay exact) and its parts."""

    total: torch.Tensor  # scalar with the autograd graph
    per_example: torch.Tensor  # [B] float32, detached
    token_counts: torch.Tensor  # [B] supervised tokens per example
    row_owner: torch.Tensor  # [N] example of each gathered row; rows of one example are contiguous
    logit_rows: int  # rows of the vocab-sized tensor: exactly the number of supervised tokens


@dataclass(frozen=True)
class SupervisedPositions:
    """Where the loss looks: hidden position (example, t) predicts target labels[example, t + 1]."""

    example: torch.Tensor  # [N]
    position: torch.Tensor  # [N]
    target: torch.Tensor  # [N]

    @property
    def count(self) -> int:
        """Number of supervised tokens in the batch."""
        return int(self.example.numel())

    @property
    def width(self) -> int:
        """Tokens of input the loss depends on (a causal model never looks past the last predicting position)."""
        return int(self.position.max()) + 1 if self.count else 0


def supervised_positions(labels: torch.Tensor) -> SupervisedPositions:
    """The supervised (example, position, target) triples of a label tensor, example-major."""
    shifted = labels[:, 1:]
    example, position = (shifted != IGNORE_INDEX).nonzero(as_tuple=True)
    return SupervisedPositions(example, position, shifted[example, position])


def causal_lm_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers causal LM inside a peft wrapper (or the model itself)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def supervised_loss(model: torch.nn.Module, batch: Batch, reduction: str = "sum",
                    positions: SupervisedPositions | None = None) -> SupervisedLoss:
    """Per-example cross-entropy over supervised tokens; the vocab-sized fp32 tensor has one row per supervised token.

    The model runs with explicit position_ids from the attention mask and only up to the last predicting position;
    the lm_head sees the gathered supervised rows only (a pre-hook swaps its input), so whatever the model applies to
    logits after the lm_head (soft-capping, scaling) still applies. ``reduction`` "sum" or "mean" is per example.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"loss_reduction must be one of {REDUCTIONS}, not {reduction!r}")
    causal_lm = causal_lm_of(model)
    positions = positions if positions is not None else supervised_positions(batch.labels)
    size = batch.size
    device = batch.input_ids.device
    if positions.count == 0:
        zero = torch.zeros((), device=device)
        return SupervisedLoss(zero, torch.zeros(size, device=device), torch.zeros(size, dtype=torch.long, device=device),
                              positions.example, 0)
    width = positions.width
    lm_head = causal_lm.get_output_embeddings()
    calls: list[tuple[int, ...]] = []

    def gather_supervised_rows(module: torch.nn.Module, args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        hidden = args[0] if args else kwargs.pop("input")
        calls.append(tuple(hidden.shape))
        if hidden.dim() != 3 or tuple(hidden.shape[:2]) != (size, width):
            raise RuntimeError(f"lm_head got hidden states of shape {tuple(hidden.shape)}, expected [{size}, {width}, d]")
        return (hidden[positions.example, positions.position], *args[1:]), kwargs

    handle = lm_head.register_forward_pre_hook(gather_supervised_rows, with_kwargs=True)
    try:
        output = causal_lm(
            input_ids=batch.input_ids[:, :width],
            attention_mask=batch.attention_mask[:, :width],
            position_ids=batch.position_ids()[:, :width],
            use_cache=False,
        )
    finally:
        handle.remove()
    if len(calls) != 1:
        raise RuntimeError(f"expected the lm_head to run once per forward, it ran {len(calls)} times")
    logits = output.logits if hasattr(output, "logits") else output[0]
    if logits.dim() != 2 or logits.shape[0] != positions.count:
        raise RuntimeError(f"logits of shape {tuple(logits.shape)}; expected [{positions.count}, vocab]")
    token_loss = F.cross_entropy(logits.float(), positions.target, reduction="none")
    per_example = torch.zeros(size, dtype=torch.float32, device=device).index_add(0, positions.example, token_loss)
    counts = torch.bincount(positions.example, minlength=size)
    if reduction == "mean":
        per_example = per_example / counts.clamp(min=1).to(per_example.dtype)
    return SupervisedLoss(per_example.sum(), per_example.detach(), counts, positions.example, int(logits.shape[0]))
