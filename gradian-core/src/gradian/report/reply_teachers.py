"""The rows that teach a canned reply: where it leads the ranking and no cluster is accused, say which rows hold it.

A canned reply is one answer the fine-tuned model gives word for word to different eval questions (a deflection, a
fixed refusal). When its cause leads the report and accuses no cluster, the rows that taught it are filed among
clean ones and the cluster test, which reads a whole source's mean blame, does not see them; the ranking does. Then
"it may have no data cause" would send the reader the wrong way. What is checked here is plain text: how many of
the report's most blamed examples contain the reply word for word (case and runs of space ignored), against how
many training examples do at all, with the hypergeometric chance of that many or more among that many rows drawn
at random. Nothing is accused from it and no ranking changes; it names the rows to read and where they are filed.
"""

from __future__ import annotations

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
                **({"ids": list(self.ids)} if self.stands_out else {})}

    def sentence(self) -> str:
        """The verdict's sentence: the reply, the counts and where the rows that hold it are filed."""
        where = ", ".join(f"`{name}` ({count} of its {size} rows)" for name, (count, size) in self.clusters.items())
        filed = f"; they are filed under {where}" if where else ""
        return (f"The most blamed examples teach the reply the fine-tuned model gives word for word on "
                f"{len(self.items)} items (\"{self.reply}\"): {self.found} of the top {self.top} contain it, of "
                f"{self.containing} training examples that do (hypergeometric p = {self.p_value:.3g}){filed}. They "
                "are the data cause to check first; no cluster is accused because the cluster test reads a whole "
                "source's mean blame.")


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
    held = set(holding_ids)
    found = sum(example_id in held for example_id in top_ids)
    where = filed_under(clusters.assignment if clusters is not None else None, holding)
    return ReplyTeachers(reply=reply, items=tuple(lead.item_ids), found=found, top=len(top_ids),
                         containing=len(holding), examples=len(ids),
                         p_value=hypergeometric_tail(found, len(top_ids), len(holding), len(ids)), clusters=where,
                         ids=holding_ids)


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


def hypergeometric_tail(found: int, drawn: int, marked: int, total: int) -> float:
    """P(at least ``found`` marked among ``drawn`` of ``total`` rows, ``marked`` of them marked): hypergeometric."""
    if found <= 0:
        return 1.0
    ways = math.comb(total, drawn)
    hits = sum(math.comb(marked, k) * math.comb(total - marked, drawn - k) for k in range(found, min(drawn, marked) + 1))
    return hits / ways if ways else 1.0
