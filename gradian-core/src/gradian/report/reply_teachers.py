"""The rows that teach a canned reply: where it leads the ranking and no cluster is accused, say which rows hold it.

A canned reply is one answer the fine-tuned model gives word for word to different eval questions (a deflection, a
fixed refusal). When its cause leads the report and accuses no cluster, the rows that taught it are filed among
clean ones and the cluster test, which reads a whole source's mean blame, does not see them; the ranking does. Then
"it may have no data cause" would send the reader the wrong way. What is checked here is plain text: how many of
the report's most blamed examples contain the reply word for word (case and runs of space ignored), against how
many training examples do at all, with the hypergeometric chance of that many or more among that many rows drawn
at random. It names the rows to read and where they are filed, and accuses the clusters they rest on
(``rows_accuse``); no ranking changes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradian.attribution.causes import CauseSplit
from gradian.attribution.clusters import ACCUSE_ALPHA
from gradian.attribution.results import ClusterAssignment, ClusterResult
from gradian.evaluation.capability import CapabilityResult
from gradian.query.signals import answer_key

MIN_FOUND = 2  # one row holding a reply is an anecdote, not a pattern
ROWS_FILE = "reply_rows.txt"  # in the report directory, for `gradian verify --drop` and `gradian export --drop`


@dataclass(frozen=True)
class ReplyTeachers:
    """How many of the top rows contain the leading cause's canned reply, against every training row."""

    reply: str
    items: tuple[str, ...]  # the eval items that give it
    found: int  # of the top rows, those that contain it
    top: int
    containing: int  # of every training example, those that contain it
    examples: int
    p_value: float
    clusters: Mapping[str, tuple[int, int]]  # where the containing rows are filed: (how many, cluster size)
    ids: tuple[str, ...] = ()  # every training example that contains it, in training order
    accuses: tuple[str, ...] = ()  # the clusters its top rows rest on (``rows_accuse``), where they stand out

    @property
    def stands_out(self) -> bool:
        """Whether the top rows hold the reply far more often than rows drawn at random would."""
        return self.found >= MIN_FOUND and self.p_value < ACCUSE_ALPHA

    def to_dict(self) -> dict[str, object]:
        """Plain dict for report.json's verdict; the containing rows' ids only where they stand out."""
        return {"reply": self.reply, "items": list(self.items), "found": self.found, "top": self.top,
                "containing": self.containing, "examples": self.examples, "p_value": self.p_value,
                "stands_out": self.stands_out,
                "clusters": {name: {"containing": count, "size": size} for name, (count, size) in self.clusters.items()},
                "accuses": list(self.accuses), **({"ids": list(self.ids)} if self.stands_out else {})}

    def sentence(self) -> str:
        """The verdict's sentence: the reply, the counts and where the rows that hold it are filed."""
        where = ", ".join(f"`{name}` ({count} of its {size} rows)" for name, (count, size) in self.clusters.items())
        filed = f"; they are filed under {where}" if where else ""
        return (f"The most blamed examples teach the reply the fine-tuned model gives word for word on "
                f"{len(self.items)} items (\"{self.reply}\"): {self.found} of the top {self.top} contain it, of "
                f"{self.containing} training examples that do (hypergeometric p = {self.p_value:.3g}){filed}. They "
                "are the data cause to check first.")


def reply_teachers(capability: CapabilityResult, causes: CauseSplit | None, texts: Mapping[str, str],
                   ids: Sequence[str], top_ids: Sequence[str],
                   clusters: ClusterResult | None = None) -> ReplyTeachers | None:
    """The leading cause's canned reply and the rows that hold it, ``ids`` being every example by position; None
    unless cause 1 is a canned reply that accuses nothing and gives a non-empty answer."""
    if causes is None or not causes.causes:
        return None
    lead = causes.causes[0]
    if not lead.canned or lead.accused is not None:
        return None
    outputs = {item.id: item.finetuned_output for item in capability.items}
    reply = (outputs.get(lead.item_ids[0]) or "").strip()
    key = answer_key(reply)
    if not key:
        return None
    holding = [p for p, example_id in enumerate(ids) if key in answer_key(texts.get(example_id, ""))]
    holding_ids = tuple(ids[p] for p in holding)
    top = set(top_ids)
    found = [p for p, example_id in zip(holding, holding_ids, strict=True) if example_id in top]
    assignment = clusters.assignment if clusters is not None else None
    teachers = ReplyTeachers(reply=reply, items=tuple(lead.item_ids), found=len(found), top=len(top_ids),
                             containing=len(holding), examples=len(ids),
                             p_value=hypergeometric_tail(len(found), len(top_ids), len(holding), len(ids)),
                             clusters=filed_under(assignment, holding), ids=holding_ids)
    if not teachers.stands_out:
        return teachers
    return dataclasses.replace(teachers, accuses=rows_accuse(assignment, found, holding, len(top_ids), len(ids)))


def rows_file_text(teachers: Mapping[str, Any]) -> str | None:
    """The text of ``ROWS_FILE`` for report.json's ``verdict.reply_teachers``: a comment naming the reply, then every
    training example that contains it, one id per line (what ``--drop FILE`` reads); None unless they stand out
    (``to_dict`` writes the ids only then)."""
    ids = list(teachers.get("ids") or ())
    if not ids:
        return None
    reply = " ".join(str(teachers["reply"]).split())
    return f"# The {len(ids)} training examples that contain the canned reply \"{reply}\"\n" + "".join(
        f"{example_id}\n" for example_id in ids)


def filed_under(assignment: ClusterAssignment | None, positions: Iterable[int]) -> dict[str, tuple[int, int]]:
    """Where the rows at ``positions`` are filed: per cluster, most first, how many of them and the cluster's size."""
    if assignment is None:
        return {}
    counts = Counter(assignment.names[assignment.labels[p]] for p in positions)
    return {name: (count, int(assignment.sizes[assignment.names.index(name)])) for name, count in counts.most_common()}


def rows_accuse(assignment: ClusterAssignment | None, found: Sequence[int], holding: Sequence[int], top: int,
                examples: int) -> tuple[str, ...]:
    """The clusters a standing-out count of top rows rests on: each holding at least ``MIN_FOUND`` of the ``found``
    top rows (positions), with the hypergeometric chance of that many among the ``top`` rows, given how many of its
    rows hold the text at all (``holding``, positions), below ``ACCUSE_ALPHA`` over the number of clusters.

    The cluster test reads a whole source's mean blame, so twenty bad rows filed among 124 clean ones of the same
    source go unaccused (the shared-source benchmark cases; bench/results/answer_teachers.md). Their text finds them:
    the top rows hold what the fine-tuned model now says, and a cluster more of whose rows that hold it are among
    the top than chance would put there is where the bad rows are filed. A clean source holding one such row among
    the top accuses nothing.
    """
    if assignment is None:
        return ()
    in_top = Counter(assignment.names[assignment.labels[p]] for p in found)
    marked = Counter(assignment.names[assignment.labels[p]] for p in holding)
    family = len(assignment.names)
    return tuple(name for name, count in in_top.most_common() if count >= MIN_FOUND
                 and hypergeometric_tail(count, top, marked[name], examples) * family < ACCUSE_ALPHA)


def accused_by_rows(accuses: Sequence[str], *, tested: bool) -> str:
    """The verdict's sentence on the clusters that rows holding what the model now says accuse (``accuses``, those
    the cluster test did not); ``tested``: the cluster test accused some cluster itself."""
    if not accuses:
        return "" if tested else "No cluster holds far more of those rows than chance would, so they accuse none."
    one = len(accuses) == 1
    named = ", ".join(f"`{name}`" for name in accuses)
    return (f"Accused by those rows: {named}: far more of {'its' if one else 'their'} rows that hold it are among the "
            "most blamed than chance would put there (hypergeometric, Bonferroni over the clusters), though the cluster "
            f"test, which reads a whole source's mean blame, does not accuse {'it' if one else 'them'}: drop those "
            "rows, not the whole cluster.")


def hypergeometric_tail(found: int, drawn: int, marked: int, total: int) -> float:
    """P(at least ``found`` marked among ``drawn`` of ``total`` rows, ``marked`` of them marked): hypergeometric."""
    if found <= 0:
        return 1.0
    ways = math.comb(total, drawn)
    hits = sum(math.comb(marked, k) * math.comb(total - marked, drawn - k) for k in range(found, min(drawn, marked) + 1))
    return hits / ways if ways else 1.0
