"""Row formats: detect which of the five formats a row is in and normalize it to messages or text.

Accepted rows (one format per row, detected in this order):

- ``messages``: chat (OpenAI / Hugging Face), a list of ``{"role", "content"}``; an assistant message with
  OpenAI's ``"weight": 0`` stays in the conversation but out of the loss.
- ``conversations``: ShareGPT, a list of ``{"from", "value"}`` with ``from`` in human / gpt / system
  (``{"role", "content"}`` items are accepted too); a top-level ``system`` string is the first message.
- ``prompt`` + ``completion``: two strings, or two message lists (TRL's conversational prompt-completion).
- ``instruction`` + ``output`` (+ optional ``input``): Alpaca; the prompt is instruction + blank line + input. An
  optional ``system`` string comes first and ``history`` (``[[instruction, response], ...]``, LLaMA-Factory's) gives
  the earlier turns, their responses supervised like any assistant turn.
- ``text``: plain text, every token supervised.

Every other top-level field is kept in ``Example.fields``. A row that fits none of them is an error, never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gradian.data.examples import ROLES, Message

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}

# The keys each format consumes; everything else in the row becomes Example.fields.
FORMAT_KEYS: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "sharegpt": ("conversations", "system"),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "input", "output", "system", "history"),
    "text": ("text",),
}

ACCEPTED_FORMATS_HINT = (
    "a row needs one of: 'messages' (list of {role, content}), 'conversations' (ShareGPT {from, value}), "
    "'prompt' + 'completion', 'instruction' + 'output' (Alpaca, optional 'input'), or 'text'"
)
ROLES_HINT = f"roles are {', '.join(ROLES)} (ShareGPT 'from': human, gpt, system)"


class RowFormatError(Exception):
    """A row that is not in any accepted format; the loader adds the file:line."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class ParsedRow:
    """A row normalized to its format, its messages (or text) and its remaining fields."""

    format: str
    messages: tuple[Message, ...]
    text: str | None
    fields: dict[str, Any]
    plain_pair: bool = False  # prompt and completion were two strings, not messages


def json_type(value: Any) -> str:
    """The JSON name of a value's type with its article ("an array", "null"), as a user sees it in their file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _present(row: Mapping[str, Any], key: str) -> bool:
    # Columnar sources (parquet, arrow) fill a missing key with null, so null counts as absent.
    return row.get(key) is not None


def detect_format(row: Mapping[str, Any]) -> str | None:
    """The format a row's keys announce, or None when it has none of the known keys."""
    if _present(row, "messages"):
        return "messages"
    if _present(row, "conversations"):
        return "sharegpt"
    if _present(row, "prompt") or _present(row, "completion"):
        return "prompt_completion"
    if _present(row, "instruction") or _present(row, "output"):
        return "alpaca"
    if _present(row, "text"):
        return "text"
    return None


def parse_row(row: Any) -> ParsedRow:
    """Normalize one decoded row; raise RowFormatError with the reason and a hint when it is not valid."""
    if not isinstance(row, Mapping):
        raise RowFormatError(f"row is {json_type(row)}, not an object", ACCEPTED_FORMATS_HINT)
    fmt = detect_format(row)
    if fmt is None:
        keys = ", ".join(repr(key) for key in row) or "none"
        raise RowFormatError(f"row has no known format (fields: {keys})", ACCEPTED_FORMATS_HINT)
    if fmt == "messages":
        messages = _parse_messages(row["messages"], "messages", sharegpt=False)
        text = None
    elif fmt == "sharegpt":
        messages = _system(row) + _parse_messages(row["conversations"], "conversations", sharegpt=True)
        text = None
    elif fmt == "prompt_completion":
        messages, text = _parse_prompt_completion(row), None
    elif fmt == "alpaca":
        messages, text = _parse_alpaca(row), None
    else:
        messages, text = (), _string(row, "text")
    consumed = set(FORMAT_KEYS[fmt])
    # system / history are ordinary fields of the formats that do not consume them.
    known = {key for keys in FORMAT_KEYS.values() for key in keys} - {"system", "history"}
    fields = {key: value for key, value in row.items()
              if key not in consumed and not (key in known and value is None)}
    plain_pair = fmt == "prompt_completion" and isinstance(row["prompt"], str)
    return ParsedRow(format=fmt, messages=messages, text=text, fields=fields, plain_pair=plain_pair)


def _string(row: Mapping[str, Any], key: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise RowFormatError(f"'{key}' is {json_type(value)}, not a string", f"'{key}' must be a JSON string")
    return value


def _parse_messages(value: Any, key: str, *, sharegpt: bool) -> tuple[Message, ...]:
    """Validate and normalize a list of chat turns found under ``key``."""
    what = "{from, value}" if sharegpt else "{role, content}"
    if not isinstance(value, (list, tuple)):
        raise RowFormatError(f"'{key}' is {json_type(value)}, not a list of {what} objects",
                             f"write '{key}' as a JSON array of {what} objects")
    if not value:
        raise RowFormatError(f"'{key}' is empty", f"a conversation needs at least one {what} message")
    return tuple(_parse_message(item, f"{key}[{position}]", sharegpt=sharegpt) for position, item in enumerate(value))


def _parse_message(item: Any, where: str, *, sharegpt: bool) -> Message:
    if not isinstance(item, Mapping):
        raise RowFormatError(f"{where} is {json_type(item)}, not an object",
                             "each message is an object with 'role' and 'content'")
    if sharegpt and ("from" in item or "value" in item or "role" not in item):
        role_key, content_key, role_map = "from", "value", SHAREGPT_ROLES
    else:
        role_key, content_key, role_map = "role", "content", {role: role for role in ROLES}
    for required in (role_key, content_key):
        if required not in item:
            raise RowFormatError(f"{where} has no '{required}'",
                                 f"each message needs '{role_key}' and '{content_key}'")
    role = item[role_key]
    if not isinstance(role, str) or role not in role_map:
        raise RowFormatError(f"{where} has unknown role {role!r}", ROLES_HINT)
    content = _content(item[content_key], f"{where}.{content_key}")
    weight = item.get("weight", 1)
    if weight not in (0, 1):
        raise RowFormatError(f"{where}.weight is {weight!r}", "'weight' is 0 (not trained on) or 1")
    return Message(role=role_map[role], content=content, weight=int(weight))


def _content(value: Any, where: str) -> str:
    """Message content: a string, or a list of text parts ({"type": "text", "text": ...}) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in value
    ):
        return "".join(part["text"] for part in value)
    raise RowFormatError(f"{where} is {json_type(value)}, not a string",
                         "content must be a string (or a list of {type: text, text} parts); Gradian trains on text only")


def _parse_prompt_completion(row: Mapping[str, Any]) -> tuple[Message, ...]:
    if not _present(row, "completion"):
        raise RowFormatError("row has 'prompt' but no 'completion'",
                             "add the answer as 'completion', or use 'text' for plain text")
    if not _present(row, "prompt"):
        raise RowFormatError("row has 'completion' but no 'prompt'", "add the question as 'prompt'")
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return (Message("user", prompt), Message("assistant", completion))
    if isinstance(prompt, (list, tuple)) and isinstance(completion, (list, tuple)):
        return _parse_messages(prompt, "prompt", sharegpt=False) + _parse_messages(completion, "completion", sharegpt=False)
    raise RowFormatError(
        f"'prompt' is {json_type(prompt)} and 'completion' {json_type(completion)}",
        "give both as strings, or both as lists of {role, content} messages",
    )


def _parse_alpaca(row: Mapping[str, Any]) -> tuple[Message, ...]:
    for required in ("instruction", "output"):
        if not _present(row, required):
            raise RowFormatError(f"Alpaca row has no '{required}'",
                                 "an Alpaca row needs 'instruction' and 'output' (and optionally 'input')")
    instruction, output = _string(row, "instruction"), _string(row, "output")
    extra = _string(row, "input") if _present(row, "input") else ""
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return (*_system(row), *_history(row), Message("user", prompt), Message("assistant", output))


def _system(row: Mapping[str, Any]) -> tuple[Message, ...]:
    """The row's top-level ``system`` string as a leading system message (none when absent or empty)."""
    if not _present(row, "system"):
        return ()
    system = _string(row, "system")
    return (Message("system", system),) if system else ()


def _history(row: Mapping[str, Any]) -> tuple[Message, ...]:
    """LLaMA-Factory's Alpaca ``history``: earlier [instruction, response] pairs, in order."""
    if not _present(row, "history"):
        return ()
    history = row["history"]
    shape_hint = "write 'history' as a list of [instruction, response] string pairs"
    if not isinstance(history, (list, tuple)):
        raise RowFormatError(f"'history' is {json_type(history)}, not a list", shape_hint)
    turns: list[Message] = []
    for position, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise RowFormatError(f"history[{position}] is {json_type(pair)}, not an [instruction, response] pair", shape_hint)
        turns += [Message("user", pair[0]), Message("assistant", pair[1])]
    return tuple(turns)
