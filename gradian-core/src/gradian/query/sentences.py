"""Sentence boundaries for span drill-down, as exact character offsets into the text.

Rule-based on purpose: gradian-core's dependencies are fixed, the maintained segmenters either are not pure
Python or lose offsets, and span blame needs offsets that map back to tokens exactly. The rules cover what
training answers hold: abbreviations and titles (``Dr. Smith``, ``e.g. Paris``), initials and dotted acronyms
(``J. R. R. Tolkien``, ``The U.S. capital``), decimals and numbered lists (``3.14``, ``1. Preheat``),
ellipses, quotes closing after the terminator, and CJK sentence punctuation (``。！？``) with no space after it.
"""

from __future__ import annotations

import re

# A Western terminator run (with closing quotes/brackets) ends a sentence only before whitespace: "3.14",
# "example.com" and "U.S" inside a word never split. CJK terminators need no space; a line break always ends one.
_BOUNDARY = re.compile(
    r"(?P<cjk>[。！？｡]+[」』）〕】〉》”’\"')\]]*)"
    r"|(?P<west>[.!?…؟।]+[\"'”’)\]}»]*)(?=\s)"
    r"|(?P<line>\n+)"
)
_WORD_BEFORE = re.compile(r"(\S+)$")
_OPENERS = "\"'“‘([{«「『（"
_DOTTED_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")  # U.S, e.g, i.e, a.m, Ph.D (the last dot is cut)

# Titles stand before a name, so the period after one never ends a sentence.
TITLES = frozenset({
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "rev", "hon", "gen", "col", "lt", "sgt", "capt",
    "cmdr", "adm", "gov", "sen", "rep", "pres", "messrs", "mme", "mlle", "fr", "sra", "srta",
})
# These end a sentence only when the next word is one that starts sentences ("... etc. We went").
ABBREVIATIONS = frozenset({
    "etc", "vs", "approx", "cf", "al", "ca", "est", "dept", "inc", "ltd", "co", "corp", "univ", "assn", "misc",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "min", "max", "avg",
})
# These abbreviate only before a number ("No. 5", "Fig. 3"); before anything else "no." is the word.
BEFORE_NUMBERS = frozenset({"no", "nos", "fig", "figs", "vol", "p", "pp", "ch", "sec", "art", "eq", "op", "tab"})
SENTENCE_STARTERS = frozenset({
    "a", "an", "the", "this", "that", "these", "those", "it", "its", "he", "she", "they", "we", "i", "you", "there",
    "here", "his", "her", "their", "our", "my", "your", "in", "on", "at", "for", "but", "and", "so", "then", "however",
    "also", "if", "when", "while", "after", "before", "as", "since", "because", "what", "which", "who", "how", "why",
    "where", "yes", "no", "not", "all", "some", "many", "most", "one", "each", "both", "today", "now", "finally",
})
# Japanese quotes a sentence and goes on: 「はい。」と言った is one sentence.
_QUOTATIVE = ("と", "って")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges [start, end) of the sentences of a text, whitespace trimmed, empty ones dropped."""
    spans, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.lastgroup == "line" or _ends_sentence(text, match):
            spans.append((start, match.end()))
            start = match.end()
    spans.append((start, len(text)))
    return [trimmed for begin, end in spans if (trimmed := _trim(text, begin, end)) is not None]


def _trim(text: str, begin: int, end: int) -> tuple[int, int] | None:
    """The range without its surrounding whitespace; None when nothing is left."""
    piece = text[begin:end]
    left, right = len(piece) - len(piece.lstrip()), len(piece.rstrip())
    return (begin + left, begin + right) if right > left else None


def _ends_sentence(text: str, match: re.Match[str]) -> bool:
    """Whether a terminator match is a sentence boundary."""
    following = _next_word(text, match.end())
    if match.lastgroup == "cjk":
        return not following.startswith(_QUOTATIVE)
    if following[:1].islower():
        return False  # "e.g. apples", '"Why?" she asked', "wait... what"
    terminator = match.group("west").rstrip("\"'”’)]}»")
    if terminator != ".":
        return True  # ! ? … and runs such as "?!" or "..."
    return _period_ends_sentence(_word_before(text, match.start()), following, text, match.start())


def _period_ends_sentence(word: str, following: str, text: str, position: int) -> bool:
    """Whether a single period after ``word`` ends a sentence, given the text that follows it."""
    lowered = word.lower()
    if lowered in TITLES:
        return False
    if len(word) == 1 and word.isupper():
        return False  # an initial: "J. Smith", "George W. Bush"
    if lowered in BEFORE_NUMBERS and following[:1].isdigit():
        return False
    if word.isdigit() and _first_on_line(text, position - len(word)):
        return False  # a numbered list item: "1. Preheat the oven."
    if lowered in ABBREVIATIONS or _DOTTED_ACRONYM.match(word):
        return _starts_sentence(following)
    return True


def _word_before(text: str, position: int) -> str:
    """The word that a terminator at ``position`` closes, without opening quotes or brackets."""
    found = _WORD_BEFORE.search(text, 0, position)
    return found.group(1).lstrip(_OPENERS) if found else ""


def _next_word(text: str, position: int) -> str:
    """The text after a boundary, from its first character that is neither whitespace nor an opening quote."""
    rest = text[position:position + 64].lstrip()  # a bounded look-ahead: long answers stay linear
    return rest.lstrip(_OPENERS)


def _starts_sentence(following: str) -> bool:
    """Whether the next word is one that typically starts a sentence."""
    word = re.match(r"[A-Za-z]+", following)
    return bool(word) and word.group(0)[0].isupper() and word.group(0).lower() in SENTENCE_STARTERS


def _first_on_line(text: str, position: int) -> bool:
    """Whether only whitespace stands between the start of the line and ``position``."""
    line_start = text.rfind("\n", 0, position) + 1
    return not text[line_start:position].strip()
