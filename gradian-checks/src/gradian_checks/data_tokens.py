"""Data checks on tokens: truncation, masked-out examples, EOS in the loss, pad/EOS, double BOS, lengths.

They all read core's ``encode()`` (the loss mask training and attribution share), computed once per
example without truncation; truncation at any max length is derived from that one encoding.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gradian.records import Evidence
from gradian_checks.registry import CheckFamily, Hit, count, example_evidence

family = CheckFamily("data")

# How each trainer treats a sequence longer than its max length (what a truncated row loses).
TRUNCATION_BY_FRAMEWORK = {
    "trl": "TRL truncates keeping the start, so the end of the answer and its EOS are cut",
    "unsloth": "unsloth (TRL underneath) truncates keeping the start, so the end of the answer and its EOS are cut",
    "transformers": "a Trainer collator that truncates keeps the start, so the end of the answer and its EOS are cut",
    "axolotl": "axolotl drops rows longer than sequence_len (excess_length_strategy: drop), so they are not trained on",
    "llamafactory": "LLaMA-Factory's cutoff_len shortens prompt and answer in proportion, so the answer loses its end",
    "gradian": "gradian train truncates with encode(), keeping the start, so the end of the answer and its EOS are cut",
}
GRADIAN_TRUNCATION = "Gradian's attribution keeps the start (grads.max_seq_length)"


@dataclass(frozen=True)
class TokenStats:
    """What one example's encoding looks like at the effective max length."""

    length: int
    supervised: int
    supervised_kept: int
    prompt_tokens: int  # tokens before the first supervised one


def token_stats(ctx: Any, max_length: int) -> list[TokenStats | None]:
    """Per example (None where encoding failed): length, supervised tokens, and how many survive ``max_length``."""
    def compute() -> list[TokenStats | None]:
        stats: list[TokenStats | None] = []
        for encoded in ctx.encodings():
            if encoded is None:
                stats.append(None)
                continue
            kept = sum(max(0, min(end, max_length) - start) for start, end in encoded.supervised_segments)
            first = encoded.supervised_segments[0][0] if encoded.supervised_segments else encoded.length_before_truncation
            stats.append(TokenStats(encoded.length_before_truncation, encoded.num_supervised, kept, first))
        return stats

    return ctx.memo(f"data.token_stats.{max_length}", compute)


def truncated_examples(ctx: Any, max_length: int) -> list[tuple[Any, TokenStats]]:
    """Examples with supervised tokens past ``max_length``."""
    return [(example, stats) for example, stats in zip(ctx.examples, token_stats(ctx, max_length), strict=True)
            if stats is not None and stats.supervised_kept < stats.supervised]


def truncation_note(ctx: Any) -> str:
    """How the run's trainer (or every trainer, when unknown) truncates."""
    framework = ctx.run.config.framework if ctx.run is not None else None
    if framework in TRUNCATION_BY_FRAMEWORK:
        return TRUNCATION_BY_FRAMEWORK[framework] + "; " + GRADIAN_TRUNCATION
    return "; ".join([TRUNCATION_BY_FRAMEWORK["trl"], TRUNCATION_BY_FRAMEWORK["axolotl"],
                      TRUNCATION_BY_FRAMEWORK["llamafactory"], GRADIAN_TRUNCATION])


@family.check(
    "truncated_answers", "warning",
    "supervised tokens fall past the effective max length (run config, else grads.max_seq_length)",
    "raise the max length (the run's and grads.max_seq_length together), or shorten / split the listed rows",
    needs={"dataset", "tokenizer"},
)
def truncated_answers(ctx: Any) -> Iterator[Hit]:
    """Examples whose answer is cut by truncation at the effective max length."""
    max_length, source = ctx.max_length()
    cut = truncated_examples(ctx, max_length)
    if not cut:
        return
    share = len(cut) / max(len(ctx.examples), 1)
    severity = "error" if share > ctx.config.diagnose.truncated_error_fraction else None
    evidence = tuple(example_evidence(e, f"{s.length} tokens; {s.supervised - s.supervised_kept} of {s.supervised} "
                                         f"supervised tokens past {max_length}",
                                      length=s.length, lost=s.supervised - s.supervised_kept) for e, s in cut)
    yield Hit(f"{count(len(cut), 'row')} ({share:.1%}) with answer tokens cut at max length {max_length} from {source}. "
              f"{truncation_note(ctx)}", evidence, severity)


@family.check(
    "all_labels_masked", "error",
    "an example has zero supervised tokens after encode() (prompt fills the context)",
    "shorten the prompts of the listed rows or raise the max length; TRL drops such rows silently and they "
    "contribute nothing",
    needs={"dataset", "tokenizer"},
)
def all_labels_masked(ctx: Any) -> Iterator[Hit]:
    """Examples with an assistant turn but no supervised token left at the effective max length."""
    max_length, source = ctx.max_length()
    evidence = []
    for example, stats in zip(ctx.examples, token_stats(ctx, max_length), strict=True):
        if stats is None or stats.supervised_kept > 0:
            continue
        if example.text is None and not any(m.role == "assistant" for m in example.messages):
            continue  # no_assistant_turn reports these
        if stats.supervised == 0:
            why = "no supervised token at all (every assistant turn has weight 0 or renders empty)"
        else:
            why = f"the prompt takes {stats.prompt_tokens} tokens, past max length {max_length}"
        evidence.append(example_evidence(example, why, prompt_tokens=stats.prompt_tokens))
    if evidence:
        yield Hit(f"{count(len(evidence), 'example')} with no supervised token at max length {max_length} ({source})",
                  tuple(evidence))


def _token(tokenizer: Any, token_id: int | None) -> str:
    return repr(tokenizer.convert_ids_to_tokens(token_id)) if token_id is not None else "None"


@family.check(
    "eos_missing_from_loss", "error",
    "the end-of-turn / EOS token is not inside the supervised span, so the model never learns to stop",
    "use a chat template whose assistant turns end with the tokenizer's EOS (or set eos_token to the "
    "template's end-of-turn token) so that the stop token is trained on",
    needs={"dataset", "tokenizer"},
)
def eos_missing_from_loss(ctx: Any) -> Iterator[Hit]:
    """Examples whose supervised labels never contain the tokenizer's EOS."""
    tokenizer = ctx.tokenizer
    eos = tokenizer.eos_token_id
    if eos is None:
        yield Hit("the tokenizer has no EOS token, so no example can learn to stop", ())
        return
    missing = []
    for example, encoded in zip(ctx.examples, ctx.encodings(), strict=True):
        if encoded is None or not encoded.num_supervised:
            continue
        supervised = [encoded.labels[p] for start, end in encoded.supervised_segments for p in range(start, end)]
        if eos not in supervised:
            missing.append(example_evidence(example, f"supervised span ends with {_token(tokenizer, supervised[-1])}, "
                                                     f"not EOS {_token(tokenizer, eos)}", last_token=supervised[-1]))
    if missing:
        yield Hit(f"{count(len(missing), 'example')} without EOS {_token(tokenizer, eos)} in the loss: the fine-tuned model "
                  "will not learn to stop", tuple(missing))


@family.check(
    "pad_equals_eos", "warning",
    "pad_token_id == eos_token_id, so collators that mask pad also mask EOS",
    "give the tokenizer a dedicated pad token (or mask padding by attention_mask, not by token id) so EOS "
    "stays in the loss",
    needs={"tokenizer"},
)
def pad_equals_eos(ctx: Any) -> Iterator[Hit]:
    """The tokenizer pads with its EOS token."""
    tokenizer = ctx.tokenizer
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id:
        location = None
        if ctx.base_model is not None:
            from gradian.model.base import resolve_base_model

            location = str(resolve_base_model(ctx.base_model, progress=False) / "tokenizer_config.json")
        yield Hit(f"pad token {tokenizer.pad_token!r} is the EOS token (id {tokenizer.eos_token_id}): a collator "
                  "that sets labels to -100 where input_ids == pad_token_id also removes every EOS from the loss",
                  (Evidence(f"pad_token = eos_token = {tokenizer.eos_token!r}", location=location,
                            values={"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}),))


@family.check(
    "duplicate_bos", "error",
    "a rendered sequence starts with two BOS tokens",
    "remove the BOS string from the text (the tokenizer or template already adds it); with a pre-rendered "
    "text column, tokenize with add_special_tokens=False",
    needs={"dataset", "tokenizer"},
)
def duplicate_bos(ctx: Any) -> Iterator[Hit]:
    """Encoded examples whose first two tokens are both BOS."""
    bos = ctx.tokenizer.bos_token_id
    if bos is None:
        return
    evidence = [example_evidence(example, f"starts with {ctx.tokenizer.bos_token!r} twice")
                for example, encoded in zip(ctx.examples, ctx.encodings(), strict=True)
                if encoded is not None and len(encoded.input_ids) >= 2 and encoded.input_ids[0] == bos == encoded.input_ids[1]]
    if evidence:
        yield Hit(f"{count(len(evidence), 'sequence')} starting with two BOS tokens", tuple(evidence))


def _answer_tokens(example: Any, encoded: Any) -> int | None:
    """Content tokens of the supervised answer (last assistant turn, or the text) as encode() placed them."""
    target = -1 if example.text is not None else example.last_assistant_index
    offset = 0
    for (start, end), message in zip(encoded.supervised_segments, encoded.segment_messages, strict=True):
        if message == target:
            return sum(1 for s, _ in encoded.answer_char_offsets[offset:offset + end - start] if s >= 0)
        offset += end - start
    return None  # no supervised answer (no assistant turn, or weight 0)


def answer_lengths(ctx: Any) -> list[int | None]:
    """Token count of each example's answer, from the shared encodings (no second tokenization)."""
    def compute() -> list[int | None]:
        return [None if encoded is None else _answer_tokens(example, encoded)
                for example, encoded in zip(ctx.examples, ctx.encodings(), strict=True)]

    return ctx.memo("data.answer_lengths", compute)


@family.check(
    "length_outliers", "info",
    "answers under 3 tokens or over 20x the median; or prompt tokens dominate the supervised budget",
    "check the listed rows: one-word answers and essays among short answers skew what the model learns; "
    "prompts that fill the context leave little room for the answer",
    needs={"dataset", "tokenizer"},
)
def length_outliers(ctx: Any) -> Iterator[Hit]:
    """Very short answers, very long answers, and prompts that take most of the max length."""
    t = ctx.config.diagnose
    lengths = answer_lengths(ctx)
    known = [n for n in lengths if n is not None]
    if not known:
        return
    median = statistics.median(known)
    short = [(e, n) for e, n in zip(ctx.examples, lengths, strict=True) if n is not None and n < t.short_answer_tokens]
    long = [(e, n) for e, n in zip(ctx.examples, lengths, strict=True) if n is not None and median and n > t.long_answer_factor * median]
    if short:
        yield Hit(f"{count(len(short), 'answer')} under {t.short_answer_tokens} tokens",
                  tuple(example_evidence(e, f"answer is {n} tokens", tokens=n) for e, n in short))
    if long:
        yield Hit(f"{count(len(long), 'answer')} over {t.long_answer_factor:g}x the median answer ({median:g} tokens)",
                  tuple(example_evidence(e, f"answer is {n} tokens", tokens=n) for e, n in long))
    max_length, source = ctx.max_length()
    heavy = [(e, s) for e, s in zip(ctx.examples, token_stats(ctx, max_length), strict=True)
             if s is not None and s.supervised_kept > 0 and s.prompt_tokens >= t.prompt_share * max_length]
    if heavy:
        yield Hit(f"{count(len(heavy), 'prompt')} taking over {t.prompt_share:.0%} of max length {max_length} ({source})",
                  tuple(example_evidence(e, f"prompt is {s.prompt_tokens} of {max_length} tokens", tokens=s.prompt_tokens)
                        for e, s in heavy))


CHECKS = tuple(family.checks)
