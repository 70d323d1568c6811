"""Query signals: classic (the wanted answer's loss) and contrastive (wanted minus what the model now says).

The query "loss" of an item is L_q. Training on example i moves the LoRA weights by -lr * g_i, which changes
L_q by about -lr * q . g_i, with q = dL_q/dtheta. Blame is therefore -(q . P g_i): positive when training on i
made the failure more likely.

- classic: L_q = loss(wanted). For a substitution failure this gradient is dominated by answer format (the
  wanted answer is often a bare entity while the model answers in sentences) and can invert the diagnosis.
- contrastive: L_q = loss(wanted) - loss(generated), with each term's gradient normalized to unit length
  before subtracting: wanted and generated answers differ in length and format, and a raw difference is the
  classic signal again (METHODS.md). Where the base model answered the item correctly, its own generation is
  the "wanted" term: a minimal pair with the fine-tuned generation, in the model's own format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradian.data import encode_answer
from gradian.errors import EvaluationError


@dataclass(frozen=True)
class QueryTerm:
    """Which texts one eval item's query gradient was built from."""

    item_id: str
    wanted_text: str
    wanted_source: str  # "eval answer" | "base generation"
    generated_text: str | None  # None for the classic signal


@dataclass(frozen=True)
class QueryGradients:
    """One query vector per regressed item, in the index's stored space (before preconditioning)."""

    vectors: np.ndarray  # [items, dim] float32
    terms: tuple[QueryTerm, ...]
    signal: str  # the effective signal: "classic" or "contrastive"

    @property
    def item_ids(self) -> tuple[str, ...]:
        """Eval item ids, one per row of ``vectors``."""
        return tuple(term.item_id for term in self.terms)


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def _gradients(capture: Any, tokenizer: Any, pairs: Sequence[tuple[Sequence[Any], str]], max_seq_length: int,
               batch_size: int) -> np.ndarray:
    """Per-answer gradients of loss(answer | prompt), through the same capture path as the index."""
    from gradian.grads import collate

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [encode_answer(prompt, answer, tokenizer, max_seq_length) for prompt, answer in pairs]
    rows = []
    for start in range(0, len(encoded), batch_size):
        batch = collate(encoded[start:start + batch_size], pad_id)
        rows.append(capture.capture(batch).detach().numpy())
    return np.concatenate(rows, axis=0) if rows else np.zeros((0, capture.dim), dtype=np.float32)


def _wanted(item: Any, metric_better: bool) -> tuple[str, str]:
    """The 'right' side of the pair: the base model's own answer when it was right, else the eval answer."""
    if metric_better and item.base_output:
        return item.base_output, "base generation"
    return item.wanted, "eval answer"


def query_gradients(capture: Any, tokenizer: Any, items: Sequence[Any], prompts: Mapping[str, Sequence[Any]],
                    signal: str, *, max_seq_length: int, batch_size: int = 8) -> QueryGradients:
    """Query vectors for eval items (ItemResult rows) under the classic or contrastive signal.

    ``prompts`` maps an item id to its prompt messages (everything before the wanted answer).
    """
    if signal not in ("classic", "contrastive"):
        raise ValueError(f"signal must be classic or contrastive after resolving auto, not {signal!r}")
    if not items:
        raise EvaluationError("there are no eval items to build a query from",
                              "the eval set has no item the fine-tuned model got worse on")
    terms, wanted_pairs, generated_pairs = [], [], []
    for item in items:
        if signal == "contrastive" and not item.finetuned_output:
            raise EvaluationError(f"eval item {item.id} has no fine-tuned generation to contrast with",
                                  "use a text metric (exact_match, contains, token_f1) with the contrastive signal")
        base_right = item.base_score > item.finetuned_score
        text, source = _wanted(item, base_right) if signal == "contrastive" else (item.wanted, "eval answer")
        terms.append(QueryTerm(item.id, text, source, item.finetuned_output if signal == "contrastive" else None))
        wanted_pairs.append((prompts[item.id], text))
        generated_pairs.append((prompts[item.id], item.finetuned_output or ""))
    wanted = _gradients(capture, tokenizer, wanted_pairs, max_seq_length, batch_size)
    if signal == "classic":
        vectors = wanted
    else:
        generated = _gradients(capture, tokenizer, generated_pairs, max_seq_length, batch_size)
        vectors = _unit(wanted) - _unit(generated)
    return QueryGradients(vectors.astype(np.float32), tuple(terms), signal)
