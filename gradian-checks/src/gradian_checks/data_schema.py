"""Data checks on the rows themselves: schema, assistant turns, markup of other chat formats."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gradian.records import Evidence
from gradian_checks.registry import CheckFamily, Hit, count, example_evidence, excerpt

family = CheckFamily("data")

# Markup of chat formats (and literal special tokens) that should never appear inside message text.
FOREIGN_MARKUP: dict[str, str] = {
    "### Instruction:": "Alpaca", "### Response:": "Alpaca", "### Input:": "Alpaca",
    "<|im_start|>": "ChatML", "<|im_end|>": "ChatML",
    "[INST]": "Llama-2", "[/INST]": "Llama-2", "<<SYS>>": "Llama-2",
    "<|start_header_id|>": "Llama-3", "<|end_header_id|>": "Llama-3", "<|eot_id|>": "Llama-3",
    "<|begin_of_text|>": "Llama-3",
    "<start_of_turn>": "Gemma", "<end_of_turn>": "Gemma",
    "<|user|>": "Zephyr/Phi", "<|assistant|>": "Zephyr/Phi", "<|system|>": "Zephyr/Phi", "<|end|>": "Phi",
    "<|endoftext|>": "special token",
}
_RESERVED = r"<\|reserved_special_token_\d+\|>"


@family.check(
    "schema_invalid", "error",
    "a row is not valid JSON, has no known format, a message lacks role/content, or a role is unknown",
    "fix or remove the listed rows; every row needs messages, conversations, prompt/completion, instruction/output or text",
    needs={"dataset"},
)
def schema_invalid(ctx: Any) -> Iterator[Hit]:
    """Every row the dataset layer could not parse (and, with a tokenizer, every row its template rejects)."""
    problems = list(ctx.dataset.problems)
    evidence = [Evidence(text=problem.reason, location=problem.location) for problem in problems]
    if "tokenizer" in ctx.available():
        for failure in ctx.encode_failures():
            evidence.append(Evidence(text=failure.reason, location=failure.location, example_ids=(failure.example_id,)))
    if evidence:
        yield Hit(f"{len(evidence)} of {count(ctx.dataset.rows, 'row')} cannot be read or rendered", tuple(evidence))


@family.check(
    "no_assistant_turn", "error",
    "a conversation has no assistant message",
    "add the assistant answer to each listed conversation, or drop it: there is nothing to learn from it",
    needs={"dataset"},
)
def no_assistant_turn(ctx: Any) -> Iterator[Hit]:
    """Conversations without any assistant turn."""
    bad = [e for e in ctx.examples if e.text is None and not any(m.role == "assistant" for m in e.messages)]
    if bad:
        evidence = tuple(example_evidence(e, f"roles: {', '.join(m.role for m in e.messages)}") for e in bad)
        yield Hit(f"{count(len(bad), 'conversation')} without an assistant turn", evidence)


@family.check(
    "empty_assistant_turn", "error",
    "assistant content is empty or whitespace",
    "write the missing answers or drop the rows; empty turns teach the model to answer with nothing",
    needs={"dataset"},
)
def empty_assistant_turn(ctx: Any) -> Iterator[Hit]:
    """Assistant turns whose content is empty or only whitespace."""
    evidence = []
    for example in ctx.examples:
        for position, message in enumerate(example.messages):
            if message.role == "assistant" and not message.content.strip():
                evidence.append(example_evidence(example, f"message {position} (assistant) is {message.content!r}"))
    if evidence:
        yield Hit(f"{count(len(evidence), 'empty assistant turn')}", tuple(evidence))


def _markup_pattern(ctx: Any) -> re.Pattern[str]:
    markers = set(FOREIGN_MARKUP)
    if "tokenizer" in ctx.available():
        tokenizer = ctx.tokenizer
        specials = set(getattr(tokenizer, "all_special_tokens", ()) or ())
        specials.update(str(t) for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values())
        # Only markup-looking special tokens: plain words that happen to be tokens are fine in text.
        markers.update(t for t in specials if len(t) >= 3 and t[0] in "<[" and t[-1] in ">]")
    alternatives = sorted((re.escape(m) for m in markers), key=len, reverse=True)
    return re.compile("|".join(alternatives + [_RESERVED]))


@family.check(
    "foreign_template_markup", "warning",
    "content holds another chat format's markup or literal special / reserved token strings",
    "strip chat markup from the text: the chat template adds the real control tokens, and literal ones in "
    "content teach the model to emit them",
    needs={"dataset"},
)
def foreign_template_markup(ctx: Any) -> Iterator[Hit]:
    """Messages whose text contains chat-format markup or special token strings."""
    pattern = _markup_pattern(ctx)
    evidence = []
    for example in ctx.examples:
        texts = [("text", example.text)] if example.text is not None else [
            (f"message {i} ({m.role})", m.content) for i, m in enumerate(example.messages)]
        for where, text in texts:
            match = pattern.search(text)
            if match:
                kind = FOREIGN_MARKUP.get(match.group(0), "special token")
                snippet = excerpt(text[max(0, match.start() - 20): match.end() + 20])
                evidence.append(example_evidence(example, f"{where} contains {match.group(0)!r} ({kind}): …{snippet}…",
                                                 marker=match.group(0)))
                break
    if evidence:
        yield Hit(f"{count(len(evidence), 'example')} with chat markup or special token strings in the text", tuple(evidence))


CHECKS = tuple(family.checks)
