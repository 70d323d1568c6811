"""Render a conversation to the string the model sees, and find each assistant turn's characters in it.

With a chat template (``tokenizer.chat_template``) the conversation is rendered by the tokenizer itself. The
character span of assistant turn k is found by rendering prefixes: ``messages[:k]`` with the generation prompt
ends where the turn's content begins, and ``messages[:k+1]`` ends after the turn's end-of-turn marker. This
works for any template whose renderings of prefixes are prefixes of the full rendering (ChatML, Llama-3,
Mistral, Gemma, Phi, Zephyr...); for other templates each message's content is searched in order instead.

Without a chat template a plain format is used (``PLAIN_ROLE_NAMES``), each header on its own line so that
no token straddles a header and the content::

    <bos>System:
    ...
    User:
    ...
    Assistant:
    ...<eos>

where ``<bos>`` appears only when the tokenizer itself adds one and ``<eos>`` is ``tokenizer.eos_token``; the
generation prompt is ``Assistant:`` and a newline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradian.data.examples import Message
from gradian.errors import DatasetError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PLAIN_ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}

Render = Callable[[Sequence[Message], bool], str]


@dataclass(frozen=True)
class TurnSpan:
    """Where a supervised turn sits in the rendered string.

    ``content_start:content_end`` is the turn's content as rendered; ``region_end`` is where the turn (with its
    end-of-turn marker) ends; ``content_shift`` is the offset of the rendered content inside the message's own
    content (non-zero when the template trims leading whitespace, as Llama-3's does).
    """

    message_index: int
    content_start: int
    content_end: int
    region_end: int
    content_shift: int


def bos_prefix(tokenizer: PreTrainedTokenizerBase) -> str:
    """The BOS string the tokenizer adds on its own (``add_special_tokens=True``), or "" when it adds none."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos:
        return ""
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    adds_bos = len(with_special) > len(without) and with_special[0] == tokenizer.bos_token_id
    return bos if adds_bos else ""


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer carries a chat template (otherwise the plain format is used)."""
    return bool(getattr(tokenizer, "chat_template", None))


def make_renderer(tokenizer: PreTrainedTokenizerBase, location: str) -> Render:
    """A function rendering messages (with or without the generation prompt) the way this tokenizer does."""
    if has_chat_template(tokenizer):
        def render_template(messages: Sequence[Message], add_generation_prompt: bool) -> str:
            conversation = [{"role": m.role, "content": m.content} for m in messages]
            try:
                return tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
            except Exception as exc:  # jinja2 TemplateError, or a template's raise_exception(...)
                raise DatasetError(f"{location}: the tokenizer's chat template rejected this conversation ({exc})",
                                   "check the roles and turn order against the model's chat template") from None
        return render_template

    bos, eos = bos_prefix(tokenizer), getattr(tokenizer, "eos_token", None) or ""

    def render_plain(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        parts = [f"{PLAIN_ROLE_NAMES[m.role]}:\n{m.content}" + (eos if m.role == "assistant" else "")
                 for m in messages]
        if add_generation_prompt:
            parts.append(f"{PLAIN_ROLE_NAMES['assistant']}:\n")
        return bos + "\n".join(parts)

    return render_plain


def locate_turns(full: str, messages: Sequence[Message], supervise: Sequence[int], render: Render,
                 location: str) -> list[TurnSpan]:
    """Character spans of the supervised turns (``supervise``: message indices) inside the full rendering."""
    spans = []
    for index in supervise:
        span = _span_by_prefixes(full, messages, index, render)
        if span is None:
            break
        spans.append(span)
    else:
        return spans
    return _spans_by_search(full, messages, supervise, location)


def _find_content(region: str, content: str) -> tuple[int, int, int] | None:
    """(start, end, shift) of a message's content inside ``region``: verbatim, else trimmed; None if absent."""
    position = region.find(content)
    if position >= 0:
        return position, position + len(content), 0
    stripped = content.strip()
    position = region.find(stripped)
    if position >= 0:
        return position, position + len(stripped), len(content) - len(content.lstrip())
    return None


def _span_by_prefixes(full: str, messages: Sequence[Message], index: int, render: Render) -> TurnSpan | None:
    try:
        before = render(messages[:index], True)
    except DatasetError:  # some templates refuse an empty or assistant-first prefix
        return None
    after = render(messages[: index + 1], False)
    if not (full.startswith(before) and full.startswith(after) and len(after) >= len(before)):
        return None
    found = _find_content(full[len(before):len(after)], messages[index].content)
    if found is None:
        return None
    start, end, shift = found
    return TurnSpan(index, len(before) + start, len(before) + end, len(after), shift)


def _spans_by_search(full: str, messages: Sequence[Message], supervise: Sequence[int],
                     location: str) -> list[TurnSpan]:
    """Fallback: find every message's content in order; a turn's region ends where the next content starts."""
    found: list[tuple[int, int, int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        hit = _find_content(full[cursor:], message.content)
        if hit is None:
            raise DatasetError(
                f"{location}: the chat template changes the text of message {index} ({message.role}), "
                "so its tokens cannot be located for the loss mask",
                "use a chat template that renders message content verbatim (or trimmed)")
        start, end, shift = hit
        found.append((cursor + start, cursor + end, shift))
        cursor += end
    spans = []
    for index in supervise:
        start, end, shift = found[index]
        region_end = found[index + 1][0] if index + 1 < len(found) else len(full)
        spans.append(TurnSpan(index, start, end, region_end, shift))
    return spans
