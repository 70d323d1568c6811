"""Per-item metrics of an eval answer: SQuAD-style normalized text metrics, and the loglik metric by name."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gradian.errors import EvaluationError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Casefold, drop punctuation (ASCII and Unicode) and the articles a/an/the, collapse whitespace."""
    # NFKC first so full-width and compatibility forms ("Ｐａｒｉｓ", "ﬁ") compare equal to their plain spelling.
    text = unicodedata.normalize("NFKC", text).casefold()
    # Punctuation becomes a space, not nothing, so "Paris,France" still splits into two tokens.
    text = "".join(
        " " if ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P") else ch for ch in text
    )
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(predicted: str, wanted: str) -> float:
    """1.0 when the normalized prediction equals the normalized wanted answer, else 0.0."""
    return float(normalize_answer(predicted) == normalize_answer(wanted))


def contains(predicted: str, wanted: str) -> float:
    """1.0 when the normalized wanted answer occurs in the normalized prediction as whole words, else 0.0."""
    want = normalize_answer(wanted)
    have = normalize_answer(predicted)
    if not want:
        # An answer that normalizes to nothing ("The.") is contained in everything; only an empty output matches it.
        return float(not have)
    # Word boundaries: "Paris" is in "It is Paris" but not in "Parisian".
    return float(f" {want} " in f" {have} ")


def token_f1(predicted: str, wanted: str) -> float:
    """SQuAD token F1 between the normalized prediction and the normalized wanted answer."""
    predicted_tokens = normalize_answer(predicted).split()
    wanted_tokens = normalize_answer(wanted).split()
    if not predicted_tokens or not wanted_tokens:
        return float(predicted_tokens == wanted_tokens)
    same = sum((Counter(predicted_tokens) & Counter(wanted_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted_tokens)
    recall = same / len(wanted_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Metric:
    """A metric by name: text metrics score a generation against the wanted answer; loglik generates nothing."""

    name: str
    summary: str
    generates_text: bool
    score: Callable[[str, str], float] | None = None


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("exact_match", "normalized output equals the wanted answer (SQuAD normalization)", True, exact_match),
        Metric("contains", "normalized wanted answer appears in the normalized output as whole words", True, contains),
        Metric("token_f1", "SQuAD token F1 of the output against the wanted answer", True, token_f1),
        Metric("loglik", "mean log-probability per token of the wanted answer; generates no text", False, None),
    )
}


def get_metric(name: str) -> Metric:
    """The metric called `name`; an unknown name is an EvaluationError listing the choices."""
    try:
        return METRICS[name]
    except KeyError:
        raise EvaluationError(
            f"unknown evaluation metric {name!r}",
            "set evaluation.metric to one of " + ", ".join(METRICS),
        ) from None
