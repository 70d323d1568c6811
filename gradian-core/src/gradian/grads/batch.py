"""Batches for gradient capture: padded input_ids, attention_mask and labels (-100 outside the supervised tokens)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Batch:
    """A padded batch; labels are -100 wherever the loss must not look (prompt, padding, masked spans)."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    labels: torch.Tensor  # [B, T] long

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2 or self.input_ids.shape != self.labels.shape \
                or self.input_ids.shape != self.attention_mask.shape:
            raise ValueError(
                f"input_ids {tuple(self.input_ids.shape)}, attention_mask {tuple(self.attention_mask.shape)} and "
                f"labels {tuple(self.labels.shape)} must be the same [batch, tokens] shape"
            )

    @property
    def size(self) -> int:
        """Number of examples."""
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on another device."""
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))

    def with_labels(self, labels: torch.Tensor) -> Batch:
        """The same tokens with other labels (e.g. restricted to a span)."""
        return Batch(self.input_ids, self.attention_mask, labels.to(self.labels.device))

    def position_ids(self) -> torch.Tensor:
        """Positions counted over real tokens only, so a left-padded example sees the positions it has alone."""
        return (self.attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def supervised_counts(self) -> torch.Tensor:
        """Per example, the number of tokens the loss predicts (labels after the first position that are not -100)."""
        return (self.labels[:, 1:] != IGNORE_INDEX).sum(-1)


def _field(item: Any, name: str) -> Any:
    value = item[name] if isinstance(item, Mapping) else getattr(item, name)
    return value.tolist() if isinstance(value, torch.Tensor) else list(value)


def collate(encoded: Sequence[Any], pad_id: int, padding_side: str = "right") -> Batch:
    """Pad encoded examples (anything with input_ids and labels, as lists or tensors) into one Batch."""
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', not {padding_side!r}")
    if not encoded:
        raise ValueError("cannot collate an empty list of examples")
    rows = []
    for position, item in enumerate(encoded):
        ids, labels = _field(item, "input_ids"), _field(item, "labels")
        if len(ids) != len(labels):
            raise ValueError(f"example {position}: {len(ids)} input_ids but {len(labels)} labels")
        if not ids:
            raise ValueError(f"example {position} has no tokens")
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, labs) in enumerate(rows):
        span = slice(0, len(ids)) if padding_side == "right" else slice(width - len(ids), width)
        input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
        attention[row, span] = 1
        labels[row, span] = torch.tensor(labs, dtype=torch.long)
    return Batch(input_ids, attention, labels)


def as_batch(batch: Batch | Mapping[str, Any]) -> Batch:
    """A Batch from a Batch or a mapping with input_ids, labels and optionally attention_mask (tensors)."""
    if isinstance(batch, Batch):
        return batch
    input_ids = torch.as_tensor(batch["input_ids"], dtype=torch.long)
    labels = torch.as_tensor(batch["labels"], dtype=torch.long)
    mask = batch.get("attention_mask")
    attention = torch.ones_like(input_ids) if mask is None else torch.as_tensor(mask, dtype=torch.long)
    return Batch(input_ids, attention, labels)


def restrict_labels(labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Labels with -100 wherever keep is False: the loss (and its gradient) of a token subset such as a span."""
    if keep.shape != labels.shape:
        raise ValueError(f"keep mask {tuple(keep.shape)} must match labels {tuple(labels.shape)}")
    return labels.masked_fill(~keep.to(torch.bool), IGNORE_INDEX)
