"""THE loss mask: ``encode()`` turns an Example into input_ids and labels; training and attribution both use it.

Rules (one place, so the mask trained on is the mask attributed over):

- Conversations are rendered with the tokenizer's chat template when it has one, else the plain format of
  ``gradian.data.rendering``; the rendered string is tokenized once with ``add_special_tokens=False`` (templates
  write their own BOS, so there is never a second one), with character offsets.
- Labels are -100 everywhere except the tokens of **every** supervised assistant turn of the conversation (all
  assistant turns of a multi-turn conversation, except those with OpenAI's ``weight: 0``). A turn's supervised
  tokens run from its first content token through the end-of-turn token that closes it (the first special token
  after the content, e.g. ``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama-3, EOS in the plain format), so the
  model learns to stop. Template text around the content (role headers, the newline after ``<|im_end|>``) is -100.
- Plain ``text`` rows: every token of the text plus an EOS is supervised (BOS first when the tokenizer adds one).
- Prompt/completion rows of two plain strings are rendered as a user and an assistant turn, unless ``pairs`` is
  ``raw`` (``grads.string_pairs``, TRL's way): then ``prompt + completion + EOS`` with no template.
- ``loss_mask`` (``gradian.data.loss_mask``) widens the mask to what other trainers train on: ``completion`` is every
  token after the rendered prompt, ``all`` every token; their one segment is attributed to the last assistant turn.
- Position 0 is never supervised: no logit predicts it, so every supervised label is one the loss really uses.
- Longer sequences keep their start (like trl's keep_start); ``truncated`` says something was cut.

Labels are aligned with input_ids (Hugging Face convention: the model shifts them), so the loss of token t is
read from the logits at position t - 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradian.data.examples import Example, Message
from gradian.data.loss_mask import DEFAULT_LOSS_MASK, LOSS_MASKS
from gradian.data.rendering import TurnSpan, bos_prefix, locate_turns, make_renderer
from gradian.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Encoded:
    """One tokenized example with its loss mask.

    ``supervised_segments`` are the token ranges [start, end) of the supervised turns, in order;
    ``segment_messages`` names the message each segment comes from (-1 for a plain text row);
    ``answer_char_offsets`` has one (start, end) per supervised token, in segment order: the token's characters
    inside its message's content (or inside the text), or (-1, -1) for template tokens such as the end-of-turn.
    """

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    supervised_segments: tuple[tuple[int, int], ...]
    truncated: bool
    num_supervised: int
    length_before_truncation: int
    segment_messages: tuple[int, ...] = ()
    answer_char_offsets: tuple[tuple[int, int], ...] = ()

    @property
    def supervised_positions(self) -> tuple[int, ...]:
        """Token positions whose label is supervised, in order (aligned with ``answer_char_offsets``)."""
        return tuple(position for start, end in self.supervised_segments for position in range(start, end))

    def tokens_for_chars(self, char_start: int, char_end: int, segment: int = -1) -> tuple[int, int]:
        """Token range [start, end) of the supervised tokens overlapping characters [char_start, char_end).

        Characters count inside the content of segment ``segment``'s message (default: the last kept segment,
        i.e. the answer); returns (0, 0) when no kept token overlaps (for example after truncation).
        """
        if not self.supervised_segments:
            return (0, 0)
        segment = segment % len(self.supervised_segments)
        offset = sum(end - start for start, end in self.supervised_segments[:segment])
        start, end = self.supervised_segments[segment]
        hits = [start + k for k, (s, e) in enumerate(self.answer_char_offsets[offset:offset + end - start])
                if s >= 0 and s < char_end and e > char_start]
        return (hits[0], hits[-1] + 1) if hits else (0, 0)


def encode(example: Example, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
           loss_mask: str = DEFAULT_LOSS_MASK, pairs: str = "template") -> Encoded:
    """Tokenize an example and mask everything but its supervised assistant turns (end-of-turn included).

    ``loss_mask`` ``completion`` or ``all`` supervises every token after the prompt, or every token, instead;
    ``pairs`` ``raw`` tokenizes a plain-string prompt/completion row without the chat template, as TRL does.
    """
    if example.text is not None:
        return _encode_text(example.text, tokenizer, max_seq_length)
    if example.plain_pair and pairs == "raw":
        prompt, completion = (message.content for message in example.messages)
        return _encode_raw_pair(prompt, completion, loss_mask, tokenizer, max_seq_length)
    if loss_mask != DEFAULT_LOSS_MASK:
        return _encode_wide(example.messages, loss_mask, tokenizer, max_seq_length, example.location)
    supervise = [index for index, message in enumerate(example.messages) if message.supervised]
    return _encode_messages(example.messages, supervise, tokenizer, max_seq_length, example.location)


def encode_answer(prompt_messages: Sequence[Message | Mapping[str, str]], answer_text: str,
                  tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> Encoded:
    """Encode prompt + one assistant answer with only the answer (and its end-of-turn) supervised."""
    messages = (*_as_messages(prompt_messages), Message("assistant", answer_text))
    return _encode_messages(messages, [len(messages) - 1], tokenizer, max_seq_length, "<answer>")


def encode_prompt(messages: Sequence[Message | Mapping[str, str]], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of the prompt followed by the assistant generation prompt, ready for ``generate``."""
    render = make_renderer(tokenizer, "<prompt>")
    text = render(_as_messages(messages), True)
    return list(_tokenize(text, tokenizer, offsets=False)[0])


def _as_messages(messages: Sequence[Message | Mapping[str, str]]) -> tuple[Message, ...]:
    return tuple(m if isinstance(m, Message) else Message(m["role"], m["content"]) for m in messages)


def _check_length(max_seq_length: int) -> None:
    if not isinstance(max_seq_length, int) or max_seq_length < 1:
        raise ConfigError(f"max_seq_length must be a positive integer, got {max_seq_length!r}",
                          "set grads.max_seq_length (or train.max_seq_length) to 1 or more")


def _tokenize(text: str, tokenizer: PreTrainedTokenizerBase, *, offsets: bool,
              special_tokens: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    try:
        encoding = tokenizer(text, add_special_tokens=special_tokens, return_offsets_mapping=offsets)
    except NotImplementedError:
        raise ModelError("the tokenizer cannot report character offsets, which the loss mask needs",
                         "load a fast (tokenizers-backed) tokenizer: AutoTokenizer.from_pretrained(..., use_fast=True)") from None
    ids = list(encoding["input_ids"])
    return ids, [tuple(pair) for pair in encoding["offset_mapping"]] if offsets else []


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of every special token (EOS, end-of-turn markers registered as added special tokens...)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    return ids


def _encode_messages(messages: Sequence[Message], supervise: list[int], tokenizer: PreTrainedTokenizerBase,
                     max_seq_length: int, location: str) -> Encoded:
    _check_length(max_seq_length)
    render = make_renderer(tokenizer, location)
    full = render(messages, False)
    spans = locate_turns(full, messages, supervise, render, location) if supervise else []
    return _mask(full, spans, tokenizer, max_seq_length)


def _encode_wide(messages: Sequence[Message], loss_mask: str, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                 location: str) -> Encoded:
    """The ``completion`` / ``all`` masks: one segment from the prompt's end (or the start) to the last token."""
    if loss_mask not in LOSS_MASKS:
        raise ConfigError(f"grads.loss_mask {loss_mask!r} is unknown", f"use one of: auto, {', '.join(LOSS_MASKS)}")
    _check_length(max_seq_length)
    render = make_renderer(tokenizer, location)
    full = render(messages, False)
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    # The answer's characters, so span drill-down still maps the last turn's text onto tokens.
    spans = locate_turns(full, messages, [last], render, location) if last is not None else []
    span = spans[0] if spans else TurnSpan(-1, 0, 0, 0, 0)
    ids, offsets = _tokenize(full, tokenizer, offsets=True)
    start = 0
    if loss_mask == "completion":  # no assistant turn: no completion, nothing supervised
        prompt_end = len(render(messages[:last], True)) if last is not None else len(full)
        start = next((k for k, (begin, _) in enumerate(offsets) if begin >= prompt_end), len(ids))
    return mask_tokens(ids, offsets, [span], special_ids(tokenizer), max_seq_length, ranges=[(start, len(ids))])


def _encode_raw_pair(prompt: str, completion: str, loss_mask: str, tokenizer: PreTrainedTokenizerBase,
                     max_seq_length: int) -> Encoded:
    """TRL's SFTTrainer on string prompt/completion: ``tokenizer(prompt + completion + EOS)`` (its special tokens
    included), the completion starting where that and ``tokenizer(prompt)`` diverge; ``all`` supervises every token."""
    _check_length(max_seq_length)
    eos = getattr(tokenizer, "eos_token", None) or ""
    full = prompt + completion + ("" if completion.endswith(eos) else eos)
    # TRL calls the tokenizer with its defaults, so its special tokens (a BOS, where it adds one) are in.
    ids, offsets = _tokenize(full, tokenizer, offsets=True, special_tokens=True)
    prompt_ids, _ = _tokenize(prompt, tokenizer, offsets=False, special_tokens=True)
    start = 0
    if loss_mask != "all":
        while start < min(len(ids), len(prompt_ids)) and ids[start] == prompt_ids[start]:
            start += 1
    span = TurnSpan(1, len(prompt), len(prompt) + len(completion), len(full), 0)
    return mask_tokens(ids, offsets, [span], special_ids(tokenizer), max_seq_length, ranges=[(start, len(ids))])


def _encode_text(text: str, tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> Encoded:
    _check_length(max_seq_length)
    start = len(bos := bos_prefix(tokenizer))
    full = bos + text + (getattr(tokenizer, "eos_token", None) or "")
    return _mask(full, [TurnSpan(-1, start, start + len(text), len(full), 0)], tokenizer, max_seq_length)


def _turn_tokens(span: TurnSpan, ids: list[int], offsets: list[tuple[int, int]], special: set[int]) -> tuple[int, int]:
    """Token range of one turn: first token reaching into the content through the closing special token."""
    n = len(ids)
    start = 0
    if span.content_end > span.content_start:
        while start < n and offsets[start][1] <= span.content_start:
            start += 1
    else:
        while start < n and offsets[start][0] < span.content_start:
            start += 1
    content_end = start
    while content_end < n and offsets[content_end][0] < span.content_end:
        content_end += 1
    end, probe = content_end, content_end
    while probe < n and offsets[probe][0] < span.region_end:
        if ids[probe] in special:  # the end-of-turn marker (and any whitespace before it) is learned
            end = probe + 1
            break
        probe += 1
    return start, end


def _mask(full: str, spans: list[TurnSpan], tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> Encoded:
    ids, offsets = _tokenize(full, tokenizer, offsets=True)
    return mask_tokens(ids, offsets, spans, special_ids(tokenizer), max_seq_length)


def mask_tokens(ids: list[int], offsets: list[tuple[int, int]], spans: Sequence[TurnSpan], special: set[int],
                max_seq_length: int, ranges: Sequence[tuple[int, int]] | None = None) -> Encoded:
    """The masking step on a rendered conversation's token ids and character offsets (shared by batch encoding).

    ``ranges`` gives each span's token range outright (the wide masks); otherwise it is the turn's own tokens.
    """
    kept = min(len(ids), max_seq_length)
    labels = [IGNORE_INDEX] * kept
    segments: list[tuple[int, int]] = []
    segment_messages: list[int] = []
    char_offsets: list[tuple[int, int]] = []
    for number, span in enumerate(spans):
        start, end = ranges[number] if ranges is not None else _turn_tokens(span, ids, offsets, special)
        start, end = max(start, 1), min(end, kept)  # position 0 is never predicted; keep_start truncation
        if start >= end:
            continue
        segments.append((start, end))
        segment_messages.append(span.message_index)
        labels[start:end] = ids[start:end]
        # A token's characters inside its message content, or (-1, -1) when it holds none of the content;
        # inlined because this loop runs once per supervised token of a whole dataset in diagnose.
        low, high, shift = span.content_start, span.content_end, span.content_shift - span.content_start
        for token_start, token_end in offsets[start:end]:
            a, b = max(token_start, low), min(token_end, high)
            char_offsets.append((a + shift, b + shift) if a < b else (-1, -1))
    return Encoded(
        input_ids=tuple(ids[:kept]),
        labels=tuple(labels),
        supervised_segments=tuple(segments),
        truncated=len(ids) > kept,
        num_supervised=sum(end - start for start, end in segments),
        length_before_truncation=len(ids),
        segment_messages=tuple(segment_messages),
        answer_char_offsets=tuple(char_offsets),
    )
