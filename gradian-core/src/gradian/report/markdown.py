"""report.md: the report dict rendered for a person, verdict first, Provenance last.

Everything here reads the dict that report.json holds, so the two files can never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gradian.report.json_report import (
    CAUSES_INTRO,
    answers_held,
    canned_note,
    causes_alpha,
    checkpoints_text,
    cluster_prior_text,
    clusters_aggregation,
    next_step,
    unexplained,
)

SHOWN_CLUSTERS = 15
SHOWN_ITEMS = 10
CELL_CHARS = 80
MANIFEST_FILE = "manifest.json"  # written next to report.md by the writer


def render_markdown(report: Mapping[str, Any]) -> str:
    """The whole report.md text for a report dict (any of the kinds json_report builds)."""
    parts = ["# Gradian attribution report", _verdict(report["verdict"], next_step(report))]
    if report.get("capability") is not None:
        parts.append(_capability(report["capability"], report.get("query_signal") or {}))
    elif report.get("query_signal"):
        parts.append(_target(report["query_signal"]))
    if report.get("method") is not None:
        parts.append(_top_examples(report["top_examples"], report["method"]))
        parts.append(_scores(report.get("scores") or {}))
        if report.get("clusters") is not None:
            parts.append(_clusters(report["clusters"]))
        if len(report.get("causes") or []) > 1:
            parts.append(_causes(report["causes"]))
        parts.append(_spans(report.get("spans") or []))
        parts.append(_plots(report.get("plots") or {}))
    parts.append(_warnings(report.get("warnings") or []))
    if report.get("method") is not None:
        parts.append(_method(report["method"]))
    parts.append(_provenance(report["provenance"], report.get("generated_at")))
    return "\n\n".join(part.rstrip() for part in parts if part) + "\n"


def _verdict(verdict: Mapping[str, Any], step: str) -> str:
    lines = ["## Verdict", ""]
    if verdict.get("headline"):
        lines += [f"**{verdict['headline']}**", ""]
    lines.append(verdict["summary"])
    if step:
        lines += ["", step]
    return "\n".join(lines)


def _capability(cap: Mapping[str, Any], signal: Mapping[str, Any]) -> str:
    level = f"{cap['confidence']:.0%}"
    lines = [
        "## Capability", "",
        "| | base | fine-tuned | delta | " + level + " CI |",
        "|---|---|---|---|---|",
        f"| {cap['metric']} | {_g(cap['base_mean'])} | {_g(cap['finetuned_mean'])} | {_g(cap['delta'], '+')} | "
        f"[{_g(cap['ci_low'], '+')}, {_g(cap['ci_high'], '+')}] |",
        "",
        f"{cap['n_items']} eval items, {cap['n_regressed']} regressed (base scored higher than fine-tuned). "
        f"Paired bootstrap, {cap['bootstrap_samples']} resamples, seed {cap['seed']}; "
        f"{'significant' if cap['significant'] else 'not significant'} (the CI "
        f"{'excludes' if cap['significant'] else 'includes'} zero).",
    ]
    if signal.get("effective"):
        requested = f" (requested {signal['requested']})" if signal.get("requested") not in (None, signal["effective"]) else ""
        lines += ["", f"Query signal: {signal['effective']}{requested}."]
        if signal.get("whole_answer_items"):
            lines[-1] += (f" {len(signal['whole_answer_items'])} regressed items give an answer another gives word for "
                          "word (a canned reply) and were queried with all of it from where it leaves the wanted "
                          "answer.")
        if signal.get("note"):
            lines += ["", f"> {signal['note']}"]
    regressed = [item for item in cap["items"] if item["regressed"]]
    if regressed:
        lines += ["", "| regressed item | wanted | base said | fine-tuned says |", "|---|---|---|---|"]
        for item in regressed[:SHOWN_ITEMS]:
            lines.append(f"| `{item['id']}` | {_cell(item.get('wanted'))} | {_cell(item.get('base_output'))} | "
                         f"{_cell(item.get('finetuned_output'))} |")
        if len(regressed) > SHOWN_ITEMS:
            lines += ["", f"{len(regressed) - SHOWN_ITEMS} more regressed items in report.json."]
    return "\n".join(lines)


def _target(signal: Mapping[str, Any]) -> str:
    return "\n".join(["## Target", "", signal.get("note") or "", "", f"Query signal: {signal.get('effective')}."])


def _top_examples(rows: list[Mapping[str, Any]], method: Mapping[str, Any]) -> str:
    lines = ["## Top blamed examples", "",
             f"Blame = -(P q) . g over {method['n_examples']} training examples, aggregated over "
             f"{len(method['query_items'])} items by {_aggregation(method['aggregation'])}{_weighted(method)}"
             f"{cluster_prior_text(method)}; positive = training on the example pushed the model toward the failure.",
             ""]
    if not rows:
        return "\n".join([*lines, "No examples scored."])
    lines += ["| rank | example | blame | cluster | excerpt |", "|---|---|---|---|---|"]
    for row in rows:
        cluster = f"`{row['cluster']}`" if row.get("cluster") is not None else ""
        lines.append(f"| {row['rank']} | `{row['id']}` | {_g(row['blame'])} | {cluster} | "
                     f"{_cell(row['excerpt'], 200)} |")
    return "\n".join(lines)


def _scores(scores: Mapping[str, Any]) -> str:
    """Where every example's score is: the files, linked, and why one is missing."""
    files = scores.get("files") or []
    lines = []
    if files:
        links = ", ".join(f"[{name}]({name})" for name in files)
        lines.append(f"Every example's score ({scores.get('rows')} rows, most blamed first; position, id, rank, blame, "
                     f"cluster, accused, one `item:<id>` column per query item): {links}.")
        if scores.get("ranking") == "overall":
            lines.append("Its rank and blame rank every accused cause together: each example's highest blame among "
                         "them, each cause's standardized over the examples (its own in `blame:cause-<n>`).")
    if scores.get("note"):
        lines += (["", scores["note"]] if lines else [scores["note"]])
    return "\n".join(lines)


def _clusters(clusters: Mapping[str, Any]) -> str:
    accused = clusters.get("accused_all") or ([clusters["accused"]] if clusters.get("accused") else [])
    verdict = ("Accused: " + ", ".join(f"`{name}`" for name in accused) + "." if accused else
               f"No cluster stands out (the strongest has family-wise p >= {clusters['alpha']:g}).")
    if len(accused) > 1:
        verdict += (" Every cluster below the family-wise threshold is accused, the one whose members are the most "
                    "blamed (effect: mean blame above the overall mean, in blame standard deviations) first.")
    lines = ["## Clusters", "",
             f"Membership: {clusters['membership']}. Cluster blame is the mean blame of its members; z is how far "
             "that mean sits above a random cluster's of the same size, in standard deviations; clusters are "
             f"ranked by z. p-value: permutation test against {clusters['permutations']} random clusters of the "
             f"same size (seed {clusters['seed']}); family-wise p: the same test against the strongest of all "
             f"{clusters['count']} clusters in each permutation, which is what an accusation is judged on. " + verdict,
             "",
             "| rank | cluster | size | mean blame | effect | z | p-value | family-wise p |",
             "|---|---|---|---|---|---|---|---|"]
    for row in clusters["ranked"][:SHOWN_CLUSTERS]:
        name = f"**`{row['name']}`**" if row["accused"] else f"`{row['name']}`"
        lines.append(f"| {row['rank']} | {name} | {row['size']} | {_g(row['blame'])} | "
                     f"{_g(row.get('effect'), digits=3)} | {_g(row['z'], digits=3)} | "
                     f"{_g(row['p_value'], digits=3)} | {_g(row['p_adjusted'], digits=3)} |")
    if clusters["count"] > SHOWN_CLUSTERS:
        lines += ["", f"{clusters['count'] - SHOWN_CLUSTERS} more clusters in report.json."]
    return "\n".join(lines)


def _causes(causes: list[Mapping[str, Any]]) -> str:
    lines = ["## Causes", "", f"{CAUSES_INTRO}{canned_note(causes)}{causes_alpha(causes)} The sections above and "
             "below attribute cause 1.",
             "", "| cause | items | accuses | z | family-wise p | most blamed examples | top rows holding its answers |",
             "|---|---|---|---|---|---|---|"]
    for cause in causes:
        accused = f"`{cause['accused_cluster']}`" if cause["accused_cluster"] else f"nothing: {unexplained(cause, '`')}"
        lines.append(f"| {cause['cause']} | {_listing(cause['items'], 4)} | {accused} | {_g(cause['z'], digits=3)} | "
                     f"{_g(cause['p_adjusted'], digits=3)} | {_listing(cause['top_examples'], 3)} | "
                     f"{answers_held(cause.get('answer_teachers'))} |")
    return "\n".join(lines)


def _spans(drills: list[Mapping[str, Any]]) -> str:
    lines = ["## Span drill-down", ""]
    if not drills:
        return "\n".join([*lines, "No span drill-down in this run."])
    lines.append("Each sentence's blame against the query built from one regressed item (not an average), "
                 "so a single wrong sentence in a long example can stand out.")
    for drill in drills:
        lines += ["", f"### `{drill['example_id']}` against item `{drill['query_item']}`", "",
                  "| | chars | blame | sentence |", "|---|---|---|---|"]
        for index, span in enumerate(drill["spans"]):
            mark = "**>**" if index == drill.get("top_span") else ""
            where = f"{span['start']}-{span['end']}"
            if span.get("message_index", -1) >= 0:
                where = f"message {span['message_index']}, {where}"
            lines.append(f"| {mark} | {where} | {_g(span['blame'])} | {_cell(span['text'], 160)} |")
    return "\n".join(lines)


def _plots(plots: Mapping[str, Any]) -> str:
    lines = ["## Plots", ""]
    for name in plots.get("files") or []:
        lines.append(f"![{name.rsplit('.', 1)[0].replace('_', ' ')}]({name})")
    if plots.get("note"):
        lines.append(plots["note"])
    return "\n".join(lines)


def _warnings(warnings: list[Mapping[str, Any]]) -> str:
    if not warnings:
        return "## Warnings\n\nNone."
    return "\n".join(["## Warnings", ""] + [f"- **{w['code']}**: {w['message']}" for w in warnings])


def _method(method: Mapping[str, Any]) -> str:
    knobs = method.get("preconditioner_knobs") or {}
    lines = ["## Method", "",
             f"- preconditioner: {method['preconditioner']}{_damping(knobs)}",
             f"- train gradients unit-normalized (cosine): {'yes' if method['normalize'] else 'no'}",
             f"- aggregation over items: {_aggregation(method['aggregation'])}{_weighted(method)}{_tested_on(method)}"
             f"{cluster_prior_text(method)}",
             f"- query items ({len(method['query_items'])}): {_listing(method['query_items'])}",
             f"- index read {method['index_passes']} time(s), in chunks"]
    if method.get("checkpoints"):
        lines.append(f"- {checkpoints_text(method['checkpoints'])}")
    return "\n".join(lines)


def _provenance(provenance: Mapping[str, Any], generated_at: str | None) -> str:
    versions = provenance.get("versions") or {}
    lines = ["## Provenance", "",
             "Every number above is reproducible from the command, manifest and config below; if two runs disagree, "
             "diff their manifests first.", "",
             "Command:", "", "```", provenance.get("command") or "", "```", "",
             f"Index id: `{provenance.get('index_id')}`" if provenance.get("index_id") else "Index id: none", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), "",
             *_manifest_link(provenance.get("manifest") or {}),
             "Config:", "", "```json", _pretty(provenance.get("config")), "```", "",
             f"Generated at {generated_at} (the only line that differs between two runs on the same inputs)."]
    return "\n".join(lines)


def _manifest_link(manifest: Mapping[str, Any]) -> list[str]:
    """The manifest linked (it is mostly the block list, hundreds of KB on a real model), with its sources inline."""
    if not manifest:
        return ["Manifest: none (no gradient index was read).", ""]
    lines = [f"Manifest: [{MANIFEST_FILE}]({MANIFEST_FILE}) (the gradient index's manifest; also in report.json)."]
    sources = manifest.get("sources") or {}
    shown = [(key, sources.get(key)) for key in ("dataset", "dataset_file_sha256", "base_model", "adapter")]
    if any(value for _, value in shown):
        lines += [""] + [f"- {key}: `{value}`" for key, value in shown if value]
    return [*lines, ""]


def _damping(knobs: Mapping[str, Any]) -> str:
    kind = knobs.get("kind")
    if kind == "diagonal":
        source = knobs.get("damping_source")
        return f" (1 / (E[g^2] + lambda), lambda = {_g(knobs.get('damping'))}, {source})"
    if kind == "kronecker" and knobs.get("fit_rows") is not None:
        return (f" (per LoRA matrix (L + lambda/2)^-1 (x) (R + lambda/2)^-1, full on both sides (wide sides up to "
                f"{knobs.get('wide_max')}), from every row ({knobs.get('fit_rows')}), lambda = "
                f"{_g(knobs.get('damping'))})")
    if kind == "kronecker":
        return (f" (per LoRA matrix (L + lambda/2)^-1 (x) (R + lambda/2)^-1, full on the rank side, from "
                f"{knobs.get('sample_rows')} sampled rows, lambda = {_g(knobs.get('damping'))})")
    if kind == "block":
        blocks = knobs.get("blocks") or []
        how = (f"damping {knobs['damping_ratio']:g} x mean eigenvalue per block" if knobs.get("damping") is None
               else f"damping {_g(knobs['damping'])}")
        return f" ((C_b + lambda_b I)^-1 over {len(blocks)} blocks, {how})"
    if kind == "adam":
        return f" (1 / (sqrt(v) + {knobs.get('eps')}) from the run's optimizer state)"
    return " (raw dot product)"


def _listing(ids: list[str], shown: int = SHOWN_ITEMS) -> str:
    listed = ", ".join(f"`{i}`" for i in ids[:shown])
    return listed + (f" and {len(ids) - shown} more (report.json)" if len(ids) > shown else "")


def _tested_on(method: Mapping[str, Any]) -> str:
    """The clusters' aggregation where it is not the ranking's (``attribution.ranking``), else nothing."""
    tested_on = clusters_aggregation(method)
    text = "" if tested_on == method["aggregation"] else f"; clusters and causes tested on {_aggregation(tested_on)}"
    weight = (method.get("clusters") or {}).get("generated_weight")
    if weight is not None:  # evaluation.accusation_weight
        text += f"; clusters and causes tested on queries weighing the generated answer {weight:g}"
    return text


def _weighted(method: Mapping[str, Any]) -> str:
    """How the ranking weighed the items, where not equally (reports before attribution.item_weights: equally)."""
    if method.get("item_weights", "uniform") == "uniform":
        return ""
    return (", each item weighted by the kurtosis of its blame over the examples (an item whose blame few examples "
            "carry counts most)")


def _aggregation(name: str) -> str:
    return {"mean": "the mean of per-item z-scored blame",
            "harm": "the mean of the positive part of per-item z-scored blame (help to one item does not offset "
                    "harm to another)",
            "smooth_max": "a soft maximum over items of per-item z-scored blame (a row that broke one item alone "
                          "is not averaged away)",
            "rank_vote": "rank vote (mean per-item rank, as a 0-1 Borda score)"}.get(name, name)


def _pretty(value: Any) -> str:
    return json.dumps(value if value is not None else {}, indent=2, sort_keys=True, ensure_ascii=False)


def _g(value: Any, sign: str = "", digits: int = 4) -> str:
    if value is None:
        return "n/a"
    return f"{value:{sign}.{digits}g}"


def _cell(text: Any, limit: int = CELL_CHARS) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, cut at ``limit``."""
    if text is None:
        return ""
    flat = " ".join(str(text).split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
