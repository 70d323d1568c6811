"""encode() for a whole dataset at once: the same Encoded records, computed faster.

``gradian.data.encode`` is THE loss mask; this module does not define another one. It runs the same steps
(render with the chat template, locate the supervised turns, tokenize once with offsets, mask) with two
changes that only affect speed: the prefix renderings of one conversation are memoized (the last prefix
is the full conversation), and all rendered strings go through the fast tokenizer in batches. A test
checks that every record equals ``encode()``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gradian.data.encode import Encoded, encode, mask_tokens, special_ids
from gradian.data.examples import Example, Message
from gradian.data.rendering import Render, TurnSpan, bos_prefix, locate_turns, make_renderer
from gradian.errors import DatasetError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BATCH = 512  # strings per tokenizer call: large enough to amortize the call, small enough to bound memory


def _memoized(render: Render) -> Render:
    """A renderer that remembers the prefixes of one conversation (locate_turns only renders prefixes)."""
    cache: dict[tuple[int, bool], str] = {}

    def render_prefix(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        key = (len(messages), add_generation_prompt)
        if key not in cache:
            cache[key] = render(messages, add_generation_prompt)
        return cache[key]

    return render_prefix


def _render(example: Example, tokenizer: PreTrainedTokenizerBase, bos: str, eos: str) -> tuple[str, list[TurnSpan]]:
    """The rendered string and the supervised turn spans, exactly as encode() finds them."""
    if example.text is not None:
        start = len(bos)
        full = bos + example.text + eos
        return full, [TurnSpan(-1, start, start + len(example.text), len(full), 0)]
    supervise = [index for index, message in enumerate(example.messages) if message.supervised]
    render = _memoized(make_renderer(tokenizer, example.location))
    full = render(example.messages, False)
    spans = locate_turns(full, example.messages, supervise, render, example.location) if supervise else []
    return full, spans


def encode_examples(examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                    max_seq_length: int) -> tuple[list[Encoded | None], list[tuple[Example, str]]]:
    """encode() of every example (None where the chat template rejects it), and the (example, reason) failures."""
    bos = bos_prefix(tokenizer)
    eos = getattr(tokenizer, "eos_token", None) or ""
    special = special_ids(tokenizer)
    rendered: list[tuple[str, list[TurnSpan]] | None] = []
    failures: list[tuple[Example, str]] = []
    for example in examples:
        try:
            rendered.append(_render(example, tokenizer, bos, eos))
        except DatasetError as error:
            rendered.append(None)
            failures.append((example, error.message))
    encoded: list[Encoded | None] = [None] * len(examples)
    todo = [index for index, item in enumerate(rendered) if item is not None]
    for chunk_start in range(0, len(todo), BATCH):
        chunk = todo[chunk_start:chunk_start + BATCH]
        try:
            tokenized = _tokenize_batch([rendered[i][0] for i in chunk], tokenizer)
        except NotImplementedError:  # a slow tokenizer has no offsets: encode() raises the ModelError that says so
            encode(examples[chunk[0]], tokenizer, max_seq_length)
            raise
        for index, (ids, offsets) in zip(chunk, tokenized, strict=True):
            encoded[index] = mask_tokens(ids, offsets, rendered[index][1], special, max_seq_length)
    return encoded, failures


def _tokenize_batch(texts: list[str],
                    tokenizer: PreTrainedTokenizerBase) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """ids and character offsets of each text, as ``tokenizer(text, add_special_tokens=False)`` gives them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        # The Rust tokenizer directly: the same ids and offsets without transformers' per-token conversion.
        return [(encoding.ids, encoding.offsets) for encoding in backend.encode_batch(texts, add_special_tokens=False)]
    batch = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return [(list(ids), [tuple(pair) for pair in offsets]) for ids, offsets in zip(batch["input_ids"], batch["offset_mapping"], strict=True)]
