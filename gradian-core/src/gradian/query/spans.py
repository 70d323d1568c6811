"""Span drill-down: which sentence of a training example carries its blame.

Whole-example influence dilutes one wrong sentence inside a long entry (the spec's ~760x); a sentence's own
gradient does not. Three measures (``SPAN_BLAMES``, ``attribution.span_blame``), each -(query . g) of a gradient:

- ``alone`` (``attribution.span_blame``'s default): the example with the sentence as its whole answer, so nothing
  else in it can take the sentence's blame. A true sentence that names the planted city ("Its largest city is
  Karachi.") before the wrong capital sentence lets the later one copy the city at low loss, and the restricted
  measure then blames the true one.
- ``restricted``: the loss of the sentence's own tokens in the whole example. With ``sum`` reduction these add up to
  the answer's gradient (template tokens such as the end-of-turn belong to no sentence).
- ``removed``: the example's blame minus its blame with the sentence deleted, what dropping it would change.

On SmolLM2-135M span cases, summed over the checkpoint points, alone puts the planted sentence first on 54 of 58
planted rows of five unseen seeds against restricted's 45 (the reports' own drill: 25/25 against 20/25), by a rule
written before they were scored; on the two tuning seeds restricted led 27/28 to 26/28. On the tests' tiny random
span fixture restricted does better (14 of 14 items against alone's 8) (bench/results/spans_checkpoints.md).

Build the query from the one failing item the example is blamed for, not an average of items: that is the
difference between 92% and 33% localization in the spec.

Example::

    from gradian.query import span_blames
    spans = span_blames(capture, tokenizer, example, preconditioned_query, max_seq_length=1024, measure="alone")
    worst = max(spans, key=lambda s: s.blame)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gradian.data import encode
from gradian.data.loss_mask import DEFAULT_LOSS_MASK
from gradian.query.sentences import sentence_spans

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase

    from gradian.data.encode import Encoded
    from gradian.data.examples import Example
    from gradian.grads.batch import Batch
    from gradian.grads.capture import GradientCapture

SPAN_BLAMES = ("restricted", "alone", "removed")


@dataclass(frozen=True)
class SpanBlame:
    """One sentence of a supervised turn and its blame against one query."""

    text: str
    char_start: int
    char_end: int
    message_index: int  # which message of the example (-1 for a plain text row)
    token_start: int
    token_end: int
    blame: float


def span_blames(capture: GradientCapture, tokenizer: PreTrainedTokenizerBase, example: Example, query: np.ndarray, *,
                max_seq_length: int, batch_size: int = 8, loss_mask: str = DEFAULT_LOSS_MASK,
                pairs: str = "template", measure: str) -> list[SpanBlame]:
    """Blame of every sentence of every supervised turn of an example under ``measure`` (``SPAN_BLAMES``).

    ``query`` is one preconditioned query vector in the capture's stored space; blame is -(query . g).
    ``loss_mask`` and ``pairs`` encode the example as the index did (``gradian.data.encode.encode``).
    """
    if measure not in SPAN_BLAMES:
        raise ValueError(f"unknown span blame {measure!r}; expected one of {', '.join(SPAN_BLAMES)}")
    from gradian.grads import collate

    def encoded_as_indexed(row: Example) -> Encoded:
        return encode(row, tokenizer, max_seq_length, loss_mask=loss_mask, pairs=pairs)

    encoded = encoded_as_indexed(example)
    spans = _token_spans(example, encoded)
    if not spans:
        return []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    query = np.asarray(query, dtype=np.float64)

    def blames_of(batch: Batch) -> list[float]:
        return (-(capture.capture(batch).detach().numpy().astype(np.float64) @ query)).tolist()

    def edited_blames(edit: Callable[[Example, int, int, int], Example]) -> list[float]:
        blames: list[float] = []
        for start in range(0, len(spans), batch_size):
            rows = [encoded_as_indexed(edit(example, span[5], span[1], span[2])) for span in spans[start:start + batch_size]]
            blames.extend(blames_of(collate(rows, pad_id)))
        return blames

    if measure == "alone":
        blames = edited_blames(_alone)
    elif measure == "removed":
        whole = blames_of(collate([encoded], pad_id))[0]
        blames = [whole - blame for blame in edited_blames(_without)]
    else:
        blames = _restricted(blames_of, collate([encoded], pad_id), spans, batch_size)
    return [SpanBlame(text, cs, ce, message, ts, te, float(blame))
            for (text, cs, ce, ts, te, message), blame in zip(spans, blames, strict=True)]


def _restricted(blames_of: Callable[[Batch], list[float]], base: Batch,
                spans: list[tuple[str, int, int, int, int, int]], batch_size: int) -> list[float]:
    """Each sentence's blame from the loss of its own tokens in the whole example."""
    # torch here, not at the top: gradian.evaluation imports this package and stays torch-free
    import torch

    from gradian.grads import restrict_labels

    blames: list[float] = []
    for start in range(0, len(spans), batch_size):
        chunk = spans[start:start + batch_size]
        keep = torch.zeros((len(chunk), base.labels.shape[1]), dtype=torch.bool)
        for row, span in enumerate(chunk):
            keep[row, span[3]:span[4]] = True
        repeated = base.labels.expand(len(chunk), -1)
        blames.extend(blames_of(type(base)(base.input_ids.expand(len(chunk), -1),
                                           base.attention_mask.expand(len(chunk), -1),
                                           restrict_labels(repeated, keep))))
    return blames


def _without(example: Example, message_index: int, char_start: int, char_end: int) -> Example:
    """The example with one sentence (and the whitespace after it) deleted from its message or text."""
    content = (example.text or "") if message_index == -1 else example.messages[message_index].content
    kept = (content[:char_start] + content[char_end:].lstrip()).rstrip()
    if message_index == -1:
        return dataclasses.replace(example, text=kept)
    messages = list(example.messages)
    messages[message_index] = dataclasses.replace(messages[message_index], content=kept)
    return dataclasses.replace(example, messages=tuple(messages))


def _alone(example: Example, message_index: int, char_start: int, char_end: int) -> Example:
    """The example with one sentence as its whole message (or text), later turns dropped, earlier answers not trained."""
    if message_index == -1:
        return dataclasses.replace(example, text=(example.text or "")[char_start:char_end])
    earlier = [dataclasses.replace(m, weight=0) if m.role == "assistant" else m for m in example.messages[:message_index]]
    message = example.messages[message_index]
    only = dataclasses.replace(message, content=message.content[char_start:char_end])
    return dataclasses.replace(example, messages=(*earlier, only))


def _token_spans(example: Example, encoded: Encoded) -> list[tuple[str, int, int, int, int, int]]:
    """(text, char_start, char_end, token_start, token_end, message) of each sentence of each supervised turn.

    Sentences cut off by truncation have no tokens and are skipped.
    """
    spans = []
    for segment, message_index in enumerate(encoded.segment_messages or (-1,) * len(encoded.supervised_segments)):
        content = example.text if message_index == -1 else example.messages[message_index].content
        for char_start, char_end in sentence_spans(content):
            token_start, token_end = encoded.tokens_for_chars(char_start, char_end, segment)
            if token_end > token_start:
                spans.append((content[char_start:char_end], char_start, char_end, token_start, token_end, message_index))
    return spans
