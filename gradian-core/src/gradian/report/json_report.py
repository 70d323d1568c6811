"""report.json: the versioned report dict every other rendering (report.md, plots) is made from.

Three kinds share one schema (``gradian.report/1``) and the same top-level keys:
``attributed`` (a significant regression explained), ``not_significant`` / ``improved`` (refused: no regression
to explain, no attribution), and ``no_capability_target`` (no eval set: attributed against the first training
examples, which runs but is not a diagnosis). The only field that differs between two runs on the same inputs
is the top-level ``generated_at``.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.attribution.causes import Cause, CauseSplit
from gradian.attribution.preconditioners import Preconditioner
from gradian.attribution.results import (
    ACCUSE_ALPHA,
    ClusterAssignment,
    ClusterPrior,
    ClusterResult,
    ClusterScore,
    ExampleScores,
    SpanDrill,
)
from gradian.evaluation.capability import CapabilityResult, refusal_message
from gradian.evaluation.query_signal import QuerySignalChoice
from gradian.report.answer_teachers import AnswerTeachers, answer_teachers
from gradian.report.reply_teachers import ROWS_FILE, ReplyTeachers, accused_by_rows, reply_teachers

if TYPE_CHECKING:
    from gradian.query.spans import SpanBlame

SCHEMA = "gradian.report/1"
EXCERPT_CHARS = 240
VERSIONED_DISTRIBUTIONS = ("gradian-core", "torch", "transformers", "peft", "numpy")

NO_CAPABILITY_TARGET_CODE = "attribution.no_capability_target"
NO_CAPABILITY_TARGET_TEXT = (
    "You ran without --eval-dataset, so Gradian fell back to attributing against the first few training "
    "examples. It runs, but it is not a diagnosis. Give it an eval set describing the capability, with the "
    "answers you wanted."
)
NORMALIZE_WARNING = (
    "attribution.normalize is on: train gradients were unit-normalized (cosine scoring). That removes gradient "
    "size, kills self-influence and ranked planted clusters worst in our measurements (METHODS.md); compare "
    "with normalize off before acting."
)
NOT_SIGNIFICANT_WARNING = (
    "The capability delta is not significant (its confidence interval includes zero) and "
    "evaluation.require_significant is off, so this attribution may be explaining noise."
)


@dataclass(frozen=True)
class ReportWarning:
    """Something the reader must know before trusting the report: a stable code and one sentence."""

    code: str
    message: str


@dataclass(frozen=True)
class Provenance:
    """What makes every number reproducible: the exact command, the index manifest, versions and config."""

    command: str
    manifest: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    index_id: str | None = None
    versions: Mapping[str, str] | None = None  # None: read from the installed distributions
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    generated_at: str | None = None  # None: now, in UTC; the one field allowed to differ between runs


def command_line(argv: Sequence[str] | None = None) -> str:
    """The exact command line, shell-quoted, as the Provenance section prints it."""
    args = list(sys.argv if argv is None else argv)
    if args and argv is None:
        args[0] = args[0].rsplit("/", 1)[-1]
    return shlex.join(args)


def library_versions() -> dict[str, str]:
    """Installed versions of the distributions whose behaviour changes the numbers."""
    versions = {}
    for name in VERSIONED_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def attribution_report(*, scores: ExampleScores, capability: CapabilityResult, preconditioner: Preconditioner,
                       texts: Mapping[str, str], provenance: Provenance, clusters: ClusterResult | None = None,
                       spans: Sequence[SpanDrill] = (), warnings: Sequence[ReportWarning] = (),
                       query_signal: QuerySignalChoice | None = None, top_k: int | None = None,
                       causes: CauseSplit | None = None, checkpoints: Sequence[Mapping[str, Any]] = (),
                       accusation_weight: float | None = None) -> dict[str, Any]:
    """The report of an attributed regression: ``capability`` is the evaluation's CapabilityResult.

    ``accusation_weight`` is the paired query's generated weight the clusters and causes were tested at, where that
    was not the ranking's (``evaluation.accusation_weight``).
    """
    signal = _query_signal_dict(query_signal if query_signal is not None else capability.query_signal)
    notes = list(warnings)
    if signal.get("note"):
        notes.insert(0, ReportWarning("evaluation.query_signal_fallback", signal["note"]))
    if not capability.significant:
        notes.insert(0, ReportWarning("evaluation.not_significant", NOT_SIGNIFICANT_WARNING))
    capability_dict = capability_summary(capability)
    top = _top_examples(scores, texts, clusters, top_k)
    accused = _accused(clusters, causes)
    top_ids = [row["id"] for row in top]
    assignment = clusters.assignment if clusters is not None else None
    teachers = reply_teachers(capability, causes, texts, scores.ids, top_ids, clusters)
    teaching: ReplyTeachers | AnswerTeachers | None = \
        teachers if teachers is not None and teachers.stands_out else None
    # A canned reply that stands out is the narrower account; else every regressed item's own divergent words.
    holders = answer_teachers(capability.items, texts, scores.ids, top_ids, assignment) if teaching is None else None
    if holders is not None and holders.stands_out:
        teaching = holders
    tested = {score.name for score in accused}
    by_rows = [name for name in teaching.accuses if name not in tested] if teaching is not None else []
    headline = _headline(accused, teaching, by_rows)
    own = _causes_answer_teachers(capability, causes, texts, scores.ids, len(top_ids), assignment)
    summary = (f"{_attributed_summary(capability_dict, top, clusters, teaching, by_rows)} "
               f"{_causes_sentence(causes, own)}").strip()
    verdict = {"kind": "attributed", "headline": headline, "summary": summary, **_accusation(top, accused),
               "accused_by_rows": by_rows,
               **({"reply_teachers": teachers.to_dict()} if teachers is not None else {}),
               **({"answer_teachers": holders.to_dict()} if holders is not None else {})}
    return _assemble(verdict=verdict, capability=capability_dict, query_signal=signal,
                     method=method_summary(scores, preconditioner, clusters, checkpoints, _tested_on(provenance),
                                          accusation_weight),
                     top_examples=top,
                     clusters=_clusters_dict(clusters), spans=[_span_dict(drill) for drill in spans],
                     warnings=_with_normalize_warning(notes, scores), provenance=provenance,
                     causes=_causes_list(causes, own))


def _causes_answer_teachers(capability: CapabilityResult, causes: CauseSplit | None, texts: Mapping[str, str],
                            ids: Sequence[str], top: int,
                            assignment: ClusterAssignment | None) -> tuple[AnswerTeachers | None, ...]:
    """Each cause's own count where the regression split (its items' divergent words in its own top rows: the
    report's top rows are cause 1's), else None, one per cause; () where causes were not looked for."""
    if causes is None:
        return ()
    if len(causes.causes) < 2:
        return (None,) * len(causes.causes)

    def count(cause: Cause) -> AnswerTeachers | None:
        if cause.canned:  # a canned reply's rows are counted by reply_teachers
            return None
        own = set(cause.item_ids)
        return answer_teachers([item for item in capability.items if item.id in own], texts, ids,
                               cause.scores.top_ids()[:top], assignment)

    return tuple(count(cause) for cause in causes.causes)


def no_capability_target_report(*, scores: ExampleScores, preconditioner: Preconditioner, texts: Mapping[str, str],
                                provenance: Provenance, clusters: ClusterResult | None = None,
                                spans: Sequence[SpanDrill] = (), warnings: Sequence[ReportWarning] = (),
                                top_k: int | None = None,
                                checkpoints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The report of a run without an eval set: attributed against the first training examples, flagged."""
    targets = list(scores.item_ids)
    signal = {"requested": None, "effective": "classic",
              "note": f"no eval set: the query is the loss gradient of the first {len(targets)} training examples"}
    top = _top_examples(scores, texts, clusters, top_k)
    leading = ", ".join(f"`{row['id']}`" for row in top[:3])
    summary = f"{NO_CAPABILITY_TARGET_TEXT} Against that stand-in target the most blamed examples are {leading}."
    verdict = {"kind": "no_capability_target",
               "headline": f"Not a diagnosis: no eval set ({NO_CAPABILITY_TARGET_CODE}).",
               "summary": summary, **_accusation(top, _accused(clusters))}
    notes = [ReportWarning(NO_CAPABILITY_TARGET_CODE, NO_CAPABILITY_TARGET_TEXT), *warnings]
    return _assemble(verdict=verdict, capability=None, query_signal=signal,
                     method=method_summary(scores, preconditioner, clusters, checkpoints, _tested_on(provenance)),
                     top_examples=top,
                     clusters=_clusters_dict(clusters), spans=[_span_dict(drill) for drill in spans],
                     warnings=_with_normalize_warning(notes, scores), provenance=provenance)


def refusal_report(*, capability: CapabilityResult, provenance: Provenance,
                   warnings: Sequence[ReportWarning] = ()) -> dict[str, Any]:
    """The report that refuses to attribute: no significant regression, the numbers and the spec's advice."""
    improved = bool(capability.significant and capability.delta > 0)
    headline = ("Not attributed: the fine-tuned model is significantly better, not worse." if improved
                else "Not attributed: the capability delta is not significant.")
    verdict = {"kind": "improved" if improved else "not_significant", "headline": headline,
               "summary": refusal_message(capability), "accused_cluster": None, "accused_clusters": [],
               "top_examples": []}
    return _assemble(verdict=verdict, capability=capability_summary(capability),
                     query_signal=_query_signal_dict(capability.query_signal), method=None, top_examples=[],
                     clusters=None, spans=[], warnings=list(warnings), provenance=provenance)


def render_json(report: Mapping[str, Any]) -> str:
    """report.json text: fixed key order, two-space indent, UTF-8, trailing newline; NaN is refused."""
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def capability_summary(capability: CapabilityResult) -> dict[str, Any]:
    """The capability measurement as plain JSON (from a CapabilityResult or an object with its fields)."""
    items = [{
        "id": item.id, "prompt": getattr(item, "prompt", None), "wanted": getattr(item, "wanted", None),
        "base_output": getattr(item, "base_output", None), "finetuned_output": getattr(item, "finetuned_output", None),
        "base_score": _num(item.base_score), "finetuned_score": _num(item.finetuned_score),
        "regressed": bool(item.base_score > item.finetuned_score),
    } for item in capability.items]
    return {
        "metric": capability.metric, "n_items": int(capability.n_items),
        "n_regressed": sum(1 for item in items if item["regressed"]),
        "base_mean": _num(capability.base_mean), "finetuned_mean": _num(capability.finetuned_mean),
        "delta": _num(capability.delta), "ci_low": _num(capability.ci_low), "ci_high": _num(capability.ci_high),
        "confidence": _num(capability.confidence), "bootstrap_samples": int(capability.bootstrap_samples),
        "seed": int(capability.seed), "significant": bool(capability.significant), "items": items,
    }


def _tested_on(provenance: Provenance) -> str | None:
    """The aggregation the clusters were tested on, from the config the report was made with."""
    attribution = provenance.config.get("attribution") or {}
    return attribution.get("aggregation")


def clusters_aggregation(method: Mapping[str, Any]) -> str:
    """What a report's clusters were tested on (reports before attribution.ranking: what ranked the examples)."""
    return (method.get("clusters") or {}).get("aggregation", method["aggregation"])


def method_summary(scores: ExampleScores, preconditioner: Preconditioner, clusters: ClusterResult | None = None,
                   checkpoints: Sequence[Mapping[str, Any]] = (), tested_on: str | None = None,
                   accusation_weight: float | None = None) -> dict[str, Any]:
    """How blame was computed: preconditioner and its knobs, normalization, aggregation, the query items.

    ``aggregation`` is what ranked the examples; ``clusters.aggregation`` (``tested_on``) what the clusters were
    tested on, when that was another one (``attribution.ranking`` against ``attribution.aggregation``);
    ``clusters.generated_weight`` the paired query's generated weight they were tested at, where that was not the
    ranking's (``evaluation.accusation_weight``).
    """
    method: dict[str, Any] = {
        "blame": "-(P q) . g_i; positive = training on the example pushed the model toward the failure",
        "preconditioner": preconditioner.kind,
        "preconditioner_knobs": _jsonable(dict(preconditioner.knobs)),
        "normalize": bool(scores.normalize),
        "aggregation": scores.aggregation,
        "item_weights": scores.item_weights,
        "n_examples": len(scores),
        "query_items": list(scores.item_ids),
        "index_passes": int(scores.passes),
    }
    if scores.cluster_prior is not None:  # the ranking's blame less these amounts is each member's own
        method["cluster_prior"] = _prior(scores.cluster_prior)
    if checkpoints:  # TracIn-CP: the blame is the learning-rate weighted sum over these points of the run
        method["checkpoints"] = [dict(member) for member in checkpoints]
    if clusters is not None:
        method["clusters"] = {"method": clusters.assignment.method, "field": clusters.assignment.field,
                              "aggregation": tested_on or scores.aggregation,
                              "knobs": _jsonable(dict(clusters.assignment.knobs)),
                              "permutations": clusters.permutations, "seed": clusters.seed, "alpha": clusters.alpha}
        if accusation_weight is not None:
            method["clusters"]["generated_weight"] = accusation_weight
    return method


def _prior(prior: ClusterPrior) -> dict[str, Any]:
    return {"share": prior.share, "added": {name: _num(amount) for name, amount in prior.added.items()}}


def cluster_prior_text(method: Mapping[str, Any]) -> str:
    """How the ranking lifted the accused clusters' members, as a clause ('' where it did not)."""
    prior = method.get("cluster_prior")
    if not prior:
        return ""
    added = ", ".join(f"`{name}` {amount:+.3g}" for name, amount in prior["added"].items())
    return (f", each member of an accused cluster ranked with {prior['share']:g} x its cluster's mean blame added "
            f"({added}; attribution.cluster_prior)")


def checkpoints_text(members: Sequence[Mapping[str, Any]]) -> str:
    """The scored points of the run in one line: step and weight of each, the adapter and the base point marked."""
    def point(member: Mapping[str, Any]) -> str:
        step = "" if member.get("step") is None else f"step {member['step']}"
        name = f"the adapter ({step})" if member.get("is_adapter") and step else "the adapter" if member.get(
            "is_adapter") else step
        return f"{name} x {member['weight']:.3g}"

    run = [member for member in members if not member.get("base_point")]
    parts = [f"blame summed over {len(run)} points of the run, weighted by learning rate (TracIn-CP): "
             + ", ".join(point(member) for member in run)] if len(run) > 1 else []
    parts += [f"the base model's blame (the adapter's B matrices zeroed) given {member['weight']:.3g} of the "
              "unit-scaled total (attribution.base_point)" for member in members if member.get("base_point")]
    return "; ".join(parts)


CAUSES_INTRO = ("The regressed items were grouped by their query gradients and each group attributed on its own; "
                "groups that accuse the same cluster are one cause.")


def canned_note(causes: Sequence[Mapping[str, Any]]) -> str:
    """The sentence naming a cause that is a canned reply ('' where none is)."""
    canned = [str(cause["cause"]) for cause in causes if cause.get("canned_reply")]
    return (f" Cause {canned[0]}'s items give one reply word for word (a canned reply), so they are a cause of their "
            "own, queried with all of that reply." if canned else "")


def causes_alpha(causes: Sequence[Mapping[str, Any]]) -> str:
    """The threshold a cause accuses below, as a sentence ('' for a report written before causes recorded it)."""
    alpha = causes[0].get("alpha") if causes else None
    if alpha is None:
        return ""
    return (f" Each group tests every cluster again, so a cause accuses a cluster only below family-wise p = {alpha:.3g}"
            f" ({ACCUSE_ALPHA:g} over the number of groups).")


def answers_held(teachers: Mapping[str, Any] | None, quote: str = "`") -> str:
    """A cause's top rows that hold its items' fine-tuned answers, as a table cell: "9 of 20 (p = 3.2e-08;
    `geography_qa` 9 of its 134 rows)"; "-" where none of its items' answers was looked for."""
    if not teachers:
        return "-"
    where = ", ".join(f"{quote}{name}{quote} {filed['found']} of its {filed['size']} rows"
                      for name, filed in teachers["clusters"].items())
    return f"{teachers['found']} of {teachers['top']} (p = {teachers['p_value']:.2g}{'; ' + where if where else ''})"


def unexplained(cause: Mapping[str, Any], quote: str = "") -> str:
    """What a cause that accuses nothing says: no data cause found, and its strongest cluster where recorded."""
    if cause.get("strongest_cluster") is None or cause.get("strongest_p_adjusted") is None:
        return "no data cause found"
    return (f"no data cause found (the strongest, {quote}{cause['strongest_cluster']}{quote}, has family-wise "
            f"p = {cause['strongest_p_adjusted']:.3g}, not below {cause['alpha']:.3g})")


# An accused cluster more than this many times the report's top K is mostly rows with little blame of their own: on
# planted rows filed among clean ones, dropping a whole 134-row host gave back 20% of the lost capability where its
# 20 most blamed rows gave 40%, and on a 64-row host 42% against 67% (docs/accuracy.md, verify on held-out cases).
WIDE_ACCUSATION = 2


def next_step(report: Mapping[str, Any], directory: Path | None = None) -> str:
    """What to run to check an attributed report's answer, as one paragraph ('' where there is no blame to act on);
    the commands name ``directory`` where the report's directory is known."""
    verdict = report["verdict"]
    top = len(report.get("top_examples") or ())
    if verdict.get("kind") != "attributed" or not top:
        return ""
    where = (shlex.quote(str(directory)), shlex.quote(str(directory.parent / "verify"))) if directory is not None \
        else ("REPORT_DIR", "VERIFY_DIR")
    verify = f"gradian verify --report {where[0]} --out {where[1]}"
    export = f"gradian export --report {where[0]} --out CLEANED_DATASET"
    accused = [name for name in verdict.get("accused_clusters") or () if name]
    teaching = (verdict.get("reply_teachers") or {}).get("ids")  # written only where they stand out
    if not accused and teaching:
        rows = shlex.quote(str(directory / ROWS_FILE)) if directory is not None else f"REPORT_DIR/{ROWS_FILE}"
        held = len(teaching)
        return (f"Next: `{verify} --drop {rows}` retrains without the {held} training examples that contain the canned "
                f"reply, against a random drop of {held}, and `{export} --drop {rows}` writes the dataset without "
                "them.")
    if not accused:
        return (f"Next: read the top examples; `{verify} --drop top:{top}` retrains without the {top} most blamed "
                f"against a random drop of {top}, and `{export} --drop top:{top}` writes the dataset without them.")
    one = len(accused) == 1
    it, its = ("it", "its") if one else ("them", "their")
    text = (f"Next: check the blamed {'cluster' if one else 'clusters'} by retraining without {it} against a random "
            f"drop of the same size (`{verify}`), or read {its} examples; `{export} --drop accused` writes the "
            f"dataset without {it}.")
    sizes = {row["name"]: int(row["size"]) for row in (report.get("clusters") or {}).get("ranked") or ()}
    held = sum(sizes.get(name, 0) for name in accused)
    # scores.csv ranks a split report's examples by their highest blame among the causes that accuse a cluster, so
    # its top K per such cause covers each one's most blamed rows, where the top K alone is mostly cause 1's.
    causes = report.get("causes") or ()
    accusing = sum(1 for cause in causes if cause.get("accused_cluster")) if len(causes) > 1 else 1
    narrow = top * max(accusing, 1)
    if held > WIDE_ACCUSATION * narrow:
        each = (f" ({top} for each of the {accusing} causes that accuse a cluster; scores.csv ranks every example by "
                "its highest blame among them)" if accusing > 1 else "")
        text += (f" {'It holds' if one else 'They hold'} {held} examples: where the blame sits in a few of them, "
                 f"`--drop top:{narrow}` checks the {narrow} most blamed instead{each}.")
    return text


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The text with whitespace collapsed, cut at ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _assemble(*, verdict: dict, capability: dict | None, query_signal: dict, method: dict | None,
              top_examples: list, clusters: dict | None, spans: list, warnings: Sequence[ReportWarning],
              provenance: Provenance, causes: list | None = None) -> dict[str, Any]:
    versions = provenance.versions if provenance.versions is not None else library_versions()
    return {
        "schema": SCHEMA,
        "verdict": verdict,
        "capability": capability,
        "query_signal": query_signal,
        "method": method,
        "top_examples": top_examples,
        "clusters": clusters,
        "causes": causes,
        "spans": spans,
        "warnings": [{"code": w.code, "message": w.message} for w in warnings],
        "plots": {"files": [], "note": "plots not written (write_report writes them)"},
        "scores": {"files": [], "rows": 0, "columns": [], "order": None, "ranking": None,
                   "note": "scores not written (write_report writes them)"},
        "provenance": {
            "command": provenance.command,
            "index_id": provenance.index_id,
            "versions": dict(sorted(versions.items())),
            "config": _jsonable(provenance.config),
            "manifest": _jsonable(provenance.manifest),
        },
        # The one field that differs between two runs on the same inputs.
        "generated_at": provenance.generated_at or datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _top_examples(scores: ExampleScores, texts: Mapping[str, str], clusters: ClusterResult | None,
                  top_k: int | None) -> list[dict[str, Any]]:
    count = scores.top_k if top_k is None else min(top_k, scores.top_k)
    rows = []
    for j in range(count):
        position = int(scores.top_positions[j])
        example_id = scores.ids[position]
        rows.append({
            "rank": int(scores.ranks[position]),
            "id": example_id,
            "position": position,
            "blame": _num(scores.blame[position]),
            "cluster": clusters.assignment.name_of(position) if clusters is not None else None,
            "excerpt": excerpt(texts.get(example_id, "")),
            "item_blame": [_num(v) for v in scores.top_item_blame[j]],
        })
    return rows


def _accused(clusters: ClusterResult | None, causes: CauseSplit | None = None) -> tuple[ClusterScore, ...]:
    """Every cluster the report accuses: each cause's, in cause order, when the regression split into causes."""
    if causes is not None and len(causes.causes) > 1:
        named: dict[str, ClusterScore] = {}
        for cause in causes.causes:
            for score in cause.clusters.accused_all:
                named.setdefault(score.name, score)
        return tuple(named.values())
    return clusters.accused_all if clusters is not None else ()


def _accusation(top: list[dict], accused: Sequence[ClusterScore]) -> dict[str, Any]:
    return {"accused_cluster": accused[0].name if accused else None,
            "accused_clusters": [score.name for score in accused], "top_examples": [row["id"] for row in top[:3]]}


def _headline(accused: Sequence[ClusterScore], teaching: ReplyTeachers | AnswerTeachers | None,
              by_rows: Sequence[str] = ()) -> str:
    """The verdict's first line: the accused clusters (by the cluster test, then by the rows that hold what the
    fine-tuned model says), else what the top rows teach where that stands out."""
    rows = ("the rows that teach the canned reply" if isinstance(teaching, ReplyTeachers)
            else "the rows that hold the fine-tuned answers")
    named = ", ".join(f"`{name}`" for name in by_rows)
    if accused:
        also = f"; {named}, by {rows}" if by_rows else ""
        return f"Attributed: cluster {_named(accused)} {'is' if len(accused) == 1 else 'are'} blamed{also}."
    if by_rows:
        one = len(by_rows) == 1
        return f"Attributed: {'cluster' if one else 'clusters'} {named} {'is' if one else 'are'} blamed by {rows}."
    if isinstance(teaching, ReplyTeachers):
        return "Attributed: no cluster stands out; the most blamed examples teach the canned reply."
    if teaching is not None:
        return "Attributed: no cluster stands out; the most blamed examples hold the fine-tuned answers."
    return "Attributed: no cluster stands out; read the top examples."


def _named(accused: Sequence[ClusterScore]) -> str:
    """`a`, or `a` (and `b`, `c`) when several clusters are accused, the first one first."""
    first = f"`{accused[0].name}`"
    return first if len(accused) == 1 else f"{first} (and {', '.join(f'`{s.name}`' for s in accused[1:])})"


def _attributed_summary(capability: dict, top: list[dict], clusters: ClusterResult | None,
                        teaching: ReplyTeachers | AnswerTeachers | None = None, by_rows: Sequence[str] = ()) -> str:
    level = f"{capability['confidence']:.0%}"
    what = (f"{capability['metric']} fell from {capability['base_mean']:.4g} (base) to "
            f"{capability['finetuned_mean']:.4g} (fine-tuned): delta {capability['delta']:+.4g}, {level} CI "
            f"[{capability['ci_low']:+.4g}, {capability['ci_high']:+.4g}], over {capability['n_items']} eval items "
            f"({capability['n_regressed']} regressed).")
    if capability["delta"] >= 0:
        what = (f"{capability['metric']} went from {capability['base_mean']:.4g} (base) to "
                f"{capability['finetuned_mean']:.4g} (fine-tuned): delta {capability['delta']:+.4g}, {level} CI "
                f"[{capability['ci_low']:+.4g}, {capability['ci_high']:+.4g}]; {capability['n_regressed']} of "
                f"{capability['n_items']} items regressed.")
    return f"{what} {_cluster_sentence(clusters, teaching, by_rows)} {_examples_sentence(top)}".strip()


def _cluster_sentence(clusters: ClusterResult | None, teaching: ReplyTeachers | AnswerTeachers | None = None,
                      by_rows: Sequence[str] = ()) -> str:
    """What the cluster test found, then the rows that teach what the fine-tuned model says where they stand out and
    the clusters those rows accuse; where nothing is accused and no such rows stand out, perhaps no data cause."""
    if clusters is None or not clusters.scores:
        return ""
    accused = clusters.accused
    if accused is not None:
        sentence = (f"Blamed cluster: `{accused.name}` ({accused.size} examples, mean blame {accused.blame:.4g}, "
                    f"effect {accused.effect:.3g} blame standard deviations, z {accused.z:.3g}, permutation "
                    f"p = {accused.p_value:.3g}, family-wise p = {accused.p_adjusted:.3g} over "
                    f"{len(clusters.scores)} clusters).")
        others = clusters.accused_all[1:]
        if others:
            sentence += " Also significant, with less blame per member: " + ", ".join(
                f"`{s.name}` ({s.size} examples, effect {s.effect:.3g}, z {s.z:.3g}, family-wise p = "
                f"{s.p_adjusted:.3g})" for s in others) + "."
        if teaching is None:
            return sentence
        return f"{sentence} {teaching.sentence()} {accused_by_rows(by_rows, tested=True)}".strip()
    top = clusters.scores[0]
    none = (f"No cluster stands out: the strongest, `{top.name}` ({top.size} examples, z {top.z:.3g}), has "
            f"family-wise p = {top.p_adjusted:.3g} over {len(clusters.scores)} clusters, not below {clusters.alpha:g}.")
    if teaching is not None:
        return f"{none} {teaching.sentence()} {accused_by_rows(by_rows, tested=False)}"
    return (f"{none} No group of training data explains the regression: it may have no data cause (an aggressive "
            "learning rate or too many steps regress a model on clean data; `gradian diagnose` checks the run's "
            "settings).")


def _examples_sentence(top: list[dict]) -> str:
    if not top:
        return ""
    listed = ", ".join(f"`{row['id']}` ({row['blame']:.3g})" for row in top[:3])
    return f"Most blamed examples: {listed}."


def _causes_list(causes: CauseSplit | None,
                 teachers: Sequence[AnswerTeachers | None]) -> list[dict[str, Any]] | None:
    """Each cause's items, what it accuses, its most blamed examples and the answers they hold (``teachers``, one
    per cause); None when causes were not looked for."""
    if causes is None:
        return None
    out = []
    for number, (cause, holders) in enumerate(zip(causes.causes, teachers, strict=True), start=1):
        accused = cause.accused
        strongest = cause.clusters.scores[0] if cause.clusters.scores else None
        out.append({"cause": number, "items": list(cause.item_ids), "accused_cluster": accused.name if accused else None,
                    "accused_clusters": [s.name for s in cause.clusters.accused_all],
                    "z": _num(accused.z) if accused else None, "effect": _num(accused.effect) if accused else None,
                    "p_adjusted": _num(accused.p_adjusted) if accused else None,
                    "alpha": cause.clusters.alpha,  # alpha / the split's groups: what a cause accuses below
                    "strongest_cluster": strongest.name if strongest else None,
                    "strongest_p_adjusted": _num(strongest.p_adjusted) if strongest else None,
                    "top_examples": list(cause.scores.top_ids()[:5]), **({"canned_reply": True} if cause.canned else {}),
                    **({"cluster_prior": _prior(cause.scores.cluster_prior)} if cause.scores.cluster_prior else {}),
                    **({"answer_teachers": holders.to_dict()} if holders is not None else {})})
    return out


def _causes_sentence(causes: CauseSplit | None, teachers: Sequence[AnswerTeachers | None]) -> str:
    if causes is None or len(causes.causes) < 2:
        return ""
    parts = []
    for number, (cause, holders) in enumerate(zip(causes.causes, teachers, strict=True), start=1):
        accused = cause.accused
        what = (f"`{accused.name}` (z {accused.z:.3g}, family-wise p = {accused.p_adjusted:.3g})" if accused
                else "no cluster stands out: no data cause found")
        reply = ", one reply word for word" if cause.canned else ""
        # Cause 1's top rows are the report's, counted in the verdict's own sentence.
        if number > 1 and holders is not None and holders.stands_out:
            what += f", its top rows holding its items' fine-tuned answers: {answers_held(holders.to_dict())}"
        parts.append(f"cause {number} ({len(cause.item_ids)} items{reply}): {what}")
    how = ("one reply given word for word" if any(cause.canned for cause in causes.causes)
           else "their query gradients")
    return (f"The regressed items split into {len(causes.causes)} causes by {how}; "
            + "; ".join(parts) + ". The sections below attribute cause 1.")


def _clusters_dict(clusters: ClusterResult | None) -> dict[str, Any] | None:
    if clusters is None:
        return None
    accused = clusters.accused
    accused_names = {score.name for score in clusters.accused_all}
    return {
        "membership": clusters.assignment.describe(),
        "permutations": clusters.permutations,
        "seed": clusters.seed,
        "alpha": clusters.alpha,
        "accused": accused.name if accused is not None else None,
        "accused_all": [score.name for score in clusters.accused_all],
        "count": len(clusters.scores),
        "ranked": [{"rank": s.rank, "name": s.name, "size": s.size, "blame": _num(s.blame), "z": _num(s.z),
                    "effect": _num(s.effect), "p_value": _num(s.p_value), "p_adjusted": _num(s.p_adjusted),
                    "accused": s.name in accused_names}
                   for s in clusters.scores],
    }


def _span_dict(drill: SpanDrill) -> dict[str, Any]:
    spans = list(drill.spans)
    best = max(range(len(spans)), key=lambda i: spans[i].blame) if spans else None
    return {
        "example_id": drill.example_id, "position": int(drill.position), "query_item": drill.query_item,
        "top_span": best,
        "spans": [_one_span(span) for span in spans],
    }


def _one_span(span: SpanBlame) -> dict[str, Any]:
    """A span as JSON; char ranges are within its message (``message_index``; -1 for a plain text row)."""
    start = getattr(span, "char_start", None)
    end = getattr(span, "char_end", None)
    return {"text": span.text, "message_index": int(getattr(span, "message_index", -1)),
            "start": int(span.start if start is None else start), "end": int(span.end if end is None else end),
            "blame": _num(span.blame)}


def _query_signal_dict(choice: QuerySignalChoice | Mapping[str, Any] | None) -> dict[str, Any]:
    if choice is None:
        return {"requested": None, "effective": None, "note": None}
    if isinstance(choice, Mapping):
        choice = QuerySignalChoice(requested=choice.get("requested"), effective=choice.get("effective"),
                                   note=choice.get("note"), whole_answer_items=tuple(choice.get("whole_answer_items") or ()))
    if isinstance(choice, QuerySignalChoice):
        return choice.to_dict()
    return {"requested": choice.requested, "effective": choice.effective, "note": getattr(choice, "note", None)}


def _with_normalize_warning(notes: list[ReportWarning], scores: ExampleScores) -> list[ReportWarning]:
    if scores.normalize:
        notes = [*notes, ReportWarning("attribution.normalize", NORMALIZE_WARNING)]
    return notes


def _num(value: Any) -> float | None:
    """A JSON number: NaN and inf become null (they must never reach a report, but never crash it either)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _jsonable(value: Any) -> Any:
    """Plain JSON types from mappings, sequences, numpy scalars and arrays, paths."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _num(value)
    if value is None or isinstance(value, str):
        return value
    return str(value)
