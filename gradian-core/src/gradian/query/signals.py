"""Query signals: classic (the wanted answer's loss), and wanted minus what the model now says, whole or from where they part.

The query "loss" of an item is L_q. Training on example i moves the LoRA weights by -lr * g_i, which changes
L_q by about -lr * q . g_i, with q = dL_q/dtheta. Blame is therefore -(q . P g_i): positive when training on i
made the failure more likely.

- classic: L_q = loss(wanted). For a substitution failure this gradient is dominated by answer format (the
  wanted answer is often a bare entity while the model answers in sentences) and can invert the diagnosis.
- contrastive: L_q = loss(wanted) - loss(generated), with each term's gradient normalized to unit length
  before subtracting: wanted and generated answers differ in length and format, and a raw difference is the
  classic signal again (METHODS.md). Where the base model answered the item correctly, its own generation is
  the "wanted" term: a minimal pair with the fine-tuned generation, in the model's own format.
- divergence: the contrastive pair supervised only from the first answer token where the two differ, both
  conditioned on the shared prefix ("The capital of New Zealand is"), so what they share contributes nothing.
- divergent-token: the same pair supervised on that first divergent token alone, each term unit-normalized: the
  one decision where the fine-tuned model left the wanted answer, the two tokens weighed equally. Items named in
  ``whole_answer`` (the pipeline names those whose fine-tuned answer another item gives word for word: a canned
  reply) are supervised from there to the end, as divergence does: a canned reply's first token ("I" against "The")
  is one many rows teach, its whole text only the rows that taught it.
- margin: the first divergent token alone, not normalized: the gradient of log p(generated token) - log p(wanted
  token) at the divergence, the margin Kronfluence's measurements use.

A paired signal's two terms are weighed by ``generated_weight`` w: 2 ((1 - w) wanted - w generated), so 0.5 weighs
them equally and 1 keeps what taught the model the answer it now gives alone. Many clean rows lower the wanted token
a little; fewer raise the generated one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from gradian.data import encode_answer
from gradian.data.encode import Encoded
from gradian.data.examples import Message
from gradian.errors import EvaluationError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gradian.grads.capture import GradientCapture

SIGNALS = ("classic", "contrastive", "divergence", "divergent-token", "margin")
PAIRED = ("contrastive", "divergence", "divergent-token", "margin")  # signals that contrast with the fine-tuned generation
IGNORE = -100

# A prompt as encode_answer takes it: the messages before the answer.
Prompt = Sequence[Message | Mapping[str, str]]


class ScoredItem(Protocol):
    """What a query reads of an eval item (``gradian.evaluation.capability.ItemResult``, a layer above this one)."""

    @property
    def id(self) -> str: ...
    @property
    def wanted(self) -> str: ...
    @property
    def base_output(self) -> str | None: ...
    @property
    def finetuned_output(self) -> str | None: ...
    @property
    def base_score(self) -> float: ...
    @property
    def finetuned_score(self) -> float: ...


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


def _gradients(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase, pairs: Sequence[tuple[Prompt, str]],
               max_seq_length: int, batch_size: int) -> np.ndarray:
    """Per-answer gradients of loss(answer | prompt), through the same capture path as the index."""
    encoded = [encode_answer(prompt, answer, tokenizer, max_seq_length) for prompt, answer in pairs]
    return _encoded_gradients(capture, tokenizer, encoded, batch_size)


def _encoded_gradients(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase, encoded: Sequence[Encoded],
                       batch_size: int) -> np.ndarray:
    """Per-example gradients of already encoded (and masked) examples."""
    from gradian.grads import collate  # imports torch, which gradian.evaluation (importing this module) must not

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    for start in range(0, len(encoded), batch_size):
        batch = collate(encoded[start:start + batch_size], pad_id)
        rows.append(capture.capture(batch).detach().numpy())
    return np.concatenate(rows, axis=0) if rows else np.zeros((0, capture.dim), dtype=np.float32)


def diverged(wanted: Encoded, generated: Encoded, *, first_only: bool = False) -> tuple[Encoded, Encoded] | None:
    """Both answers supervised only from their first differing answer token (only that token with ``first_only``).

    None when one answer ends where the other goes on with no supervised token left to compare, or they are equal.
    """
    left, right = wanted.supervised_positions, generated.supervised_positions
    step = 0
    while (step < len(left) and step < len(right) and left[step] == right[step]
           and wanted.input_ids[left[step]] == generated.input_ids[right[step]]):
        step += 1
    if step >= len(left) or step >= len(right):
        return None
    return _supervise_from(wanted, left[step], first_only), _supervise_from(generated, right[step], first_only)


def _supervise_from(encoded: Encoded, position: int, first_only: bool) -> Encoded:
    """``encoded`` with labels before ``position`` (and after it, with ``first_only``) masked out."""
    stop = position + 1 if first_only else len(encoded.labels)
    labels = tuple(label if position <= t < stop else IGNORE for t, label in enumerate(encoded.labels))
    segments = tuple((max(start, position), min(end, stop)) for start, end in encoded.supervised_segments
                     if end > position and start < stop)
    return dataclasses.replace(encoded, labels=labels, num_supervised=sum(label != IGNORE for label in labels),
                               supervised_segments=segments, answer_char_offsets=())


def _wanted(item: ScoredItem, metric_better: bool) -> tuple[str, str]:
    """The 'right' side of the pair: the base model's own answer when it was right, else the eval answer."""
    if metric_better and item.base_output:
        return item.base_output, "base generation"
    return item.wanted, "eval answer"


def shared_answers(items: Sequence[ScoredItem]) -> list[tuple[str, ...]]:
    """Each answer two or more items give word for word, as its items' ids: the most items first, then by answer."""
    by_answer: dict[str, list[str]] = {}
    for item in items:
        if answer_key(item.finetuned_output):
            by_answer.setdefault(answer_key(item.finetuned_output), []).append(item.id)
    groups = sorted((answer, ids) for answer, ids in by_answer.items() if len(ids) >= 2)
    return [tuple(ids) for _, ids in sorted(groups, key=lambda pair: -len(pair[1]))]


def answer_key(text: str | None) -> str:
    """An answer as compared for identity: case, surrounding space and inner runs of space ignored."""
    return " ".join((text or "").split()).casefold()


@dataclass(frozen=True)
class QueryTerms:
    """A query's two terms per item, before they are weighed: one gradient pass gives the query at any weight."""

    wanted: np.ndarray  # [items, dim]: unit rows for a normalized paired signal, raw for margin and classic
    generated: np.ndarray | None  # [items, dim] likewise; None for the classic signal
    terms: tuple[QueryTerm, ...]
    signal: str

    def weighed(self, generated_weight: float = 0.5) -> QueryGradients:
        """The query vectors with the generated term weighed ``generated_weight`` and the wanted term the rest."""
        _check_weight(generated_weight)
        vectors = self.wanted if self.generated is None else _weighed(self.wanted, self.generated, generated_weight)
        return QueryGradients(vectors.astype(np.float32), self.terms, self.signal)


def query_gradients(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase, items: Sequence[ScoredItem],
                    prompts: Mapping[str, Prompt], signal: str, *, max_seq_length: int, batch_size: int = 8,
                    whole_answer: Collection[str] = (), generated_weight: float = 0.5) -> QueryGradients:
    """Query vectors for eval items (ItemResult rows) under one of ``SIGNALS``.

    ``prompts`` maps an item id to its prompt messages (everything before the wanted answer); under divergent-token
    the items in ``whole_answer`` are supervised from their divergence to the end of the answer. A paired signal
    weighs its generated term by ``generated_weight`` and its wanted term by the rest (0.5: equally).
    """
    _check_weight(generated_weight)  # before any gradient is taken
    return query_terms(capture, tokenizer, items, prompts, signal, max_seq_length=max_seq_length,
                       batch_size=batch_size, whole_answer=whole_answer).weighed(generated_weight)


def query_terms(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase, items: Sequence[ScoredItem],
                prompts: Mapping[str, Prompt], signal: str, *, max_seq_length: int, batch_size: int = 8,
                whole_answer: Collection[str] = ()) -> QueryTerms:
    """Each item's query terms under one of ``SIGNALS``, not yet weighed (``query_gradients`` weighs them)."""
    if signal not in SIGNALS:
        raise ValueError(f"signal must be one of {', '.join(SIGNALS)} after resolving auto, not {signal!r}")
    if not items:
        raise EvaluationError("there are no eval items to build a query from",
                              "the eval set has no item the fine-tuned model got worse on")
    terms, wanted_pairs, generated_pairs = [], [], []
    paired = signal in PAIRED
    for item in items:
        if paired and not item.finetuned_output:
            raise EvaluationError(f"eval item {item.id} has no fine-tuned generation to contrast with",
                                  f"use a text metric (exact_match, contains, token_f1) with the {signal} signal")
        base_right = item.base_score > item.finetuned_score
        text, source = _wanted(item, base_right) if paired else (item.wanted, "eval answer")
        terms.append(QueryTerm(item.id, text, source, item.finetuned_output if paired else None))
        wanted_pairs.append((prompts[item.id], text))
        generated_pairs.append((prompts[item.id], item.finetuned_output or ""))
    if signal in ("divergence", "divergent-token", "margin"):
        first_only = [signal == "margin" or (signal == "divergent-token" and item.id not in whole_answer)
                      for item in items]
        wanted, generated = _divergence_terms(capture, tokenizer, wanted_pairs, generated_pairs, max_seq_length,
                                              batch_size, first_only=first_only)
        if signal != "margin":
            wanted, generated = _unit(wanted), _unit(generated)
        return QueryTerms(wanted, generated, tuple(terms), signal)
    wanted = _gradients(capture, tokenizer, wanted_pairs, max_seq_length, batch_size)
    if signal == "classic":
        return QueryTerms(wanted, None, tuple(terms), signal)
    generated = _gradients(capture, tokenizer, generated_pairs, max_seq_length, batch_size)
    return QueryTerms(_unit(wanted), _unit(generated), tuple(terms), signal)


def _check_weight(generated_weight: float) -> None:
    if not 0.0 <= generated_weight <= 1.0:
        raise ValueError(f"generated_weight must be between 0 and 1, not {generated_weight!r}")


def _weighed(wanted: np.ndarray, generated: np.ndarray, generated_weight: float) -> np.ndarray:
    """2 ((1 - w) wanted - w generated): at w 0.5 the plain difference, so blame keeps its scale."""
    return 2.0 * ((1.0 - generated_weight) * wanted - generated_weight * generated)


def _divergence_terms(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase,
                      wanted_pairs: Sequence[tuple[Prompt, str]], generated_pairs: Sequence[tuple[Prompt, str]],
                      max_seq_length: int, batch_size: int,
                      *, first_only: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Both terms' gradients, supervised from the pair's divergence (that token alone where ``first_only``).

    A pair that never diverges within the supervised tokens is contrasted whole, as the contrastive signal does.
    """
    wanted, generated = [], []
    for (prompt, wanted_text), (_, generated_text), first in zip(wanted_pairs, generated_pairs, first_only,
                                                                 strict=True):
        w = encode_answer(prompt, wanted_text, tokenizer, max_seq_length)
        g = encode_answer(prompt, generated_text, tokenizer, max_seq_length)
        pair = diverged(w, g, first_only=first)
        wanted.append(pair[0] if pair is not None else w)
        generated.append(pair[1] if pair is not None else g)
    return (_encoded_gradients(capture, tokenizer, wanted, batch_size),
            _encoded_gradients(capture, tokenizer, generated, batch_size))
