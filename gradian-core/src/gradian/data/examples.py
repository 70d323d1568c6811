"""The normalized records every dataset row becomes: Message and Example, and the position-bearing example id."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]
Format = Literal["messages", "sharegpt", "prompt_completion", "alpaca", "text"]

ROLES: tuple[str, ...] = ("system", "user", "assistant")
FORMATS: tuple[str, ...] = ("messages", "sharegpt", "prompt_completion", "alpaca", "text")


class Fields(Mapping[str, Any]):
    """A read-only mapping of a row's extra fields that, unlike MappingProxyType, pickles (for worker processes)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Example fields are read-only")

    def __getstate__(self) -> dict[str, Any]:
        return self._data

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "_data", state)

    def __repr__(self) -> str:
        return f"Fields({self._data!r})"


@dataclass(frozen=True)
class Message:
    """One chat turn. ``weight`` 0 (OpenAI's per-message weight) keeps an assistant turn out of the loss."""

    role: str
    content: str
    weight: int = 1

    @property
    def supervised(self) -> bool:
        """Whether this turn's tokens are trained on: assistant turns with weight 1."""
        return self.role == "assistant" and self.weight == 1


@dataclass(frozen=True)
class Example:
    """One training or eval row, normalized; ``id`` embeds the position so a reordered file is a new dataset."""

    id: str
    index: int
    messages: tuple[Message, ...]
    format: str
    text: str | None = None
    # Every other top-level field of the row (``source``, ``category``, ...), read-only; not part of the hash.
    fields: Mapping[str, Any] = field(default_factory=Fields, hash=False)
    location: str = "<memory>"
    # A prompt/completion row of two plain strings (TRL's standard format): TRL trains on them raw, not templated.
    plain_pair: bool = False

    @property
    def content_sha256(self) -> str:
        """Hex sha256 of the normalized content (messages or text); the id carries its first 8 digits."""
        return content_sha256(self.messages, self.text)

    @property
    def last_assistant_index(self) -> int | None:
        """Position in ``messages`` of the last assistant turn, or None when there is none."""
        for position in range(len(self.messages) - 1, -1, -1):
            if self.messages[position].role == "assistant":
                return position
        return None

    @property
    def prompt_messages(self) -> tuple[Message, ...]:
        """Every message before the last assistant turn (all of them when there is no assistant turn)."""
        last = self.last_assistant_index
        return self.messages if last is None else self.messages[:last]

    @property
    def answer(self) -> str | None:
        """Content of the last assistant turn, or None (plain text rows and conversations without one)."""
        last = self.last_assistant_index
        return None if last is None else self.messages[last].content

    @property
    def prompt_text(self) -> str:
        """The prompt messages' contents joined by blank lines (for lexical checks, not for the model)."""
        return "\n\n".join(message.content for message in self.prompt_messages)

    @property
    def supervised_text(self) -> str:
        """What the loss trains on: the whole text, or every supervised assistant turn joined by blank lines."""
        if self.text is not None:
            return self.text
        return "\n\n".join(message.content for message in self.messages if message.supervised)


def content_sha256(messages: Iterable[Message], text: str | None) -> str:
    """Hex sha256 of canonical JSON of the roles and contents (format-independent: ShareGPT == messages)."""
    turns = []
    for message in messages:
        turn: list[Any] = [message.role, message.content]
        if message.weight != 1:  # only non-default weights change what is trained, so only they enter the hash
            turn.append(message.weight)
        turns.append(turn)
    payload = {"text": text} if text is not None else {"messages": turns}
    canonical = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def example_id(index: int, digest: str) -> str:
    """The id of the example at 0-based ``index`` with content digest ``digest``: ``ex-000123-1a2b3c4d``."""
    return f"ex-{index:06d}-{digest[:8]}"


def make_example(
    index: int,
    *,
    messages: Iterable[Message] = (),
    text: str | None = None,
    format: str = "messages",
    fields: Mapping[str, Any] | None = None,
    location: str = "<memory>",
    plain_pair: bool = False,
) -> Example:
    """Build an Example with its id computed from its position and content (for generators and tests)."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    turns = tuple(messages)
    for message in turns:
        if message.role not in ROLES:
            raise ValueError(f"unknown role {message.role!r}; expected one of {', '.join(ROLES)}")
    if format == "text" and (text is None or turns):
        raise ValueError("format 'text' needs text and no messages")
    if format != "text" and text is not None:
        raise ValueError(f"format {format!r} holds messages, not text")
    if plain_pair and (format != "prompt_completion" or [m.role for m in turns] != ["user", "assistant"]):
        raise ValueError("plain_pair needs format 'prompt_completion' with one user and one assistant message")
    return Example(
        id=example_id(index, content_sha256(turns, text)),
        index=index,
        messages=turns,
        format=format,
        text=text,
        fields=Fields(fields),
        location=location,
        plain_pair=plain_pair,
    )
