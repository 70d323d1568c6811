"""The rows that hold what the fine-tuned model now says: how many of the most blamed examples contain the words a
regressed item's fine-tuned answer parts from the base model's with, and where they are filed.

Where the fine-tuned model answers "The capital of Australia is Sydney." and the base model "... is Canberra.", the
words it parts with ("sydney") are what training taught it, and a training row that holds them may be the row that
did. What is counted is plain text: how many of the report's most blamed examples hold any regressed item's
divergent words, against how many training examples do at all, with the hypergeometric chance of that many or more
among that many rows drawn at random (as for a canned reply, ``reply_teachers``). The cluster test reads a whole
source's mean blame and misses a few such rows filed among many clean ones; this names them and where they are
filed, and accuses the clusters they rest on (``reply_teachers.rows_accuse``). No ranking changes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gradian.attribution.clusters import ACCUSE_ALPHA
from gradian.attribution.results import ClusterAssignment
from gradian.evaluation.capability import ItemResult
from gradian.query.signals import answer_key
from gradian.report.reply_teachers import MIN_FOUND, filed_under, hypergeometric_tail, rows_accuse

MAX_WORDS = 2  # "le contraire", "siem reap": a name or a switched language shows in its first two words
MIN_CHARS = 4  # shorter divergent words ("a", "is", "the") name nothing a training row could have taught
SHOWN = 5  # divergent answers quoted in the verdict's sentence
_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def divergent_words(base_output: str | None, finetuned_output: str | None) -> str | None:
    """The fine-tuned output's first words from where it parts from the base output (at most ``MAX_WORDS``, up to the
    first punctuation mark), case folded; None where it does not part or they are shorter than ``MIN_CHARS``."""
    base = [token for token in _TOKEN.findall(answer_key(base_output)) if _is_word(token)]
    tokens = _TOKEN.findall(answer_key(finetuned_output))
    words = [token for token in tokens if _is_word(token)]
    shared = 0
    while shared < min(len(base), len(words)) and base[shared] == words[shared]:
        shared += 1
    kept: list[str] = []
    index = 0  # of the fine-tuned output's words
    for token in tokens:
        if _is_word(token):
            if index >= shared:
                kept.append(token)
            index += 1
            if len(kept) == MAX_WORDS:
                break
        elif kept:  # punctuation after the divergence ends the phrase
            break
    phrase = " ".join(kept)
    return phrase if len(phrase) >= MIN_CHARS else None


def _is_word(token: str) -> bool:
    """Whether a token of ``_TOKEN`` is a word rather than a punctuation mark."""
    return token[0].isalnum() or token[0] == "_"


def whole_words(answer: str, *, escaped: bool = False) -> re.Pattern[str]:
    """A pattern finding ``answer`` in case-folded text where no word character runs on either side of it."""
    return re.compile(rf"(?<!\w)(?:{answer if escaped else re.escape(answer)})(?!\w)")


@dataclass(frozen=True)
class AnswerTeachers:
    """How many of the top rows hold a regressed item's divergent fine-tuned words, against every training row."""

    answers: Mapping[str, tuple[str, ...]]  # each divergent answer a top row holds -> the regressed items giving it
    items: int  # regressed items with divergent words at all
    found: int  # of the top rows, those that hold any item's divergent words
    top: int
    containing: int  # of every training example, those that hold any
    examples: int
    p_value: float
    clusters: Mapping[str, tuple[int, int]]  # where the top rows that hold them are filed: (how many, cluster size)
    ids: tuple[str, ...] = ()  # the top rows that hold them, most blamed first
    accuses: tuple[str, ...] = ()  # the clusters those rows rest on (``rows_accuse``), where they stand out

    @property
    def stands_out(self) -> bool:
        """Whether the top rows hold the fine-tuned answers far more often than rows drawn at random would."""
        return self.found >= MIN_FOUND and self.p_value < ACCUSE_ALPHA

    def to_dict(self) -> dict[str, object]:
        """Plain dict for report.json's verdict."""
        return {"answers": {answer: list(items) for answer, items in self.answers.items()}, "items": self.items,
                "found": self.found, "top": self.top, "containing": self.containing, "examples": self.examples,
                "p_value": self.p_value, "stands_out": self.stands_out,
                "clusters": {name: {"found": count, "size": size} for name, (count, size) in self.clusters.items()},
                "accuses": list(self.accuses), "ids": list(self.ids)}

    def sentence(self) -> str:
        """The verdict's sentence: the answers the top rows hold, the counts and where those rows are filed."""
        answers = sorted(self.answers.items(), key=lambda pair: (-len(pair[1]), pair[0]))
        quoted = ", ".join(f"\"{answer}\"" + (f" ({len(items)} items)" if len(items) > 1 else "")
                           for answer, items in answers[:SHOWN])
        more = f" and {len(answers) - SHOWN} more" if len(answers) > SHOWN else ""
        items = sum(len(held) for held in self.answers.values())
        where = ", ".join(f"`{name}` ({count} of its {size} rows)" for name, (count, size) in self.clusters.items())
        filed = f"; those rows are filed under {where}" if where else ""
        return (f"The most blamed examples hold what the fine-tuned model now says: {self.found} of the top "
                f"{self.top} contain the words its answer parts from the base model's with on {items} of "
                f"{self.items} regressed items ({quoted}{more}), of {self.containing} training examples that contain "
                f"any item's (hypergeometric p = {self.p_value:.3g}){filed}.")


def answer_teachers(items: Sequence[ItemResult], texts: Mapping[str, str], ids: Sequence[str],
                    top_ids: Sequence[str], assignment: ClusterAssignment | None = None) -> AnswerTeachers | None:
    """The regressed items' divergent fine-tuned words and the top rows that hold them, ``ids`` being every example
    by position; None where no regressed item's answer parts from the base model's in words long enough to look for."""
    answers = {item.id: words for item in items if item.regressed
               and (words := divergent_words(item.base_output, item.finetuned_output))}
    if not answers:
        return None
    patterns = {item: whole_words(answer) for item, answer in answers.items()}
    # One pass of every answer at once finds the rows worth the per-item look (most rows hold none).
    anywhere = whole_words("|".join(sorted({re.escape(answer) for answer in answers.values()},
                                            key=lambda answer: (-len(answer), answer))), escaped=True)
    holds: dict[str, tuple[int, list[str]]] = {}  # position and items of the rows that hold an answer, and no others
    for position, example_id in enumerate(ids):
        text = answer_key(texts.get(example_id, ""))
        if anywhere.search(text):
            holds[example_id] = (position, [item for item, pattern in patterns.items() if pattern.search(text)])
    found = [example_id for example_id in top_ids if example_id in holds]
    taught: dict[str, set[str]] = {}
    for example_id in found:
        for item in holds[example_id][1]:
            taught.setdefault(answers[item], set()).add(item)
    positions = [holds[example_id][0] for example_id in found]
    teachers = AnswerTeachers(answers={answer: tuple(sorted(held)) for answer, held in sorted(taught.items())},
                              items=len(answers), found=len(found), top=len(top_ids), containing=len(holds),
                              examples=len(ids),
                              p_value=hypergeometric_tail(len(found), len(top_ids), len(holds), len(ids)),
                              clusters=filed_under(assignment, positions), ids=tuple(found))
    if not teachers.stands_out:
        return teachers
    return dataclasses.replace(teachers, accuses=rows_accuse(assignment, positions,
                                                             [position for position, _ in holds.values()],
                                                             len(top_ids), len(ids)))
