"""Mean log-probability per token of a wanted answer, batched, without generating anything."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gradian.evaluation.generation import Progress, eval_mode, left_pad, model_device

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100


def answer_logliks(model: torch.nn.Module, encoded: Sequence[tuple[Sequence[int], Sequence[int]]], *, pad_id: int,
                   batch_size: int = 8, progress: Progress | None = None, stage: str = "loglik") -> list[float]:
    """For each (input_ids, labels) pair, the mean log-probability of the tokens whose label is not -100."""
    import torch

    for input_ids, labels in encoded:
        if len(input_ids) != len(labels):
            raise ValueError("answer_logliks needs labels aligned with input_ids")
        # Position 0 has no preceding context, so a label there cannot be scored.
        if not any(label != IGNORE_INDEX for label in list(labels)[1:]):
            raise ValueError("answer_logliks got an item with no answer tokens to score")
    device = model_device(model)
    scores: list[float] = []
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            batch = encoded[start:start + batch_size]
            input_ids, attention_mask = left_pad([ids for ids, _ in batch], pad_id)
            labels, _ = left_pad([lab for _, lab in batch], IGNORE_INDEX)
            # Left padding puts every answer at the end of its row: only the last `keep` positions are
            # needed, so the vocab-sized logits are never built for prompt tokens.
            supervised = labels != IGNORE_INDEX
            first = max(1, int(supervised.float().argmax(dim=1).min()))
            keep = input_ids.shape[1] - first + 1
            # Explicit positions so a row's padding does not shift its rotary positions.
            position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device), logits_to_keep=keep, use_cache=False,
            ).logits
            # logits[:, j] is the distribution at position (width - keep + j), predicting the next token.
            predict = logits[:, :-1].float().log_softmax(dim=-1)
            targets = labels[:, input_ids.shape[1] - keep + 1:].to(device)
            mask = targets != IGNORE_INDEX
            token_logprobs = predict.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            means = (token_logprobs * mask).sum(dim=1) / mask.sum(dim=1)
            scores.extend(float(value) for value in means.tolist())
            if progress is not None:
                progress(stage, len(scores), len(encoded))
    return scores
