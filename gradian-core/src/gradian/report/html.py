"""report.html: the report dict as one self-contained page, verdict first, Provenance collapsed.

No external assets (plots inline as base64 PNG, styles inline, no script), every piece of user text escaped.
It reads the same dict as report.json and report.md, so the three can never disagree.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
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
CELL_CHARS = 200
NUMERIC = ' class="num"'

STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1f2933}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #d9dee3;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #d9dee3;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f3f5f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{border-left:5px solid #d64545;background:#fdf3f3;padding:.6em 1em}.verdict.neutral{border-color:#2f6fb0;
background:#f2f7fc}.headline{font-weight:600;font-size:1.1em}code{background:#f3f5f7;padding:0 .2em}
pre{background:#f3f5f7;padding:.6em;overflow:auto;font-size:.85em}tr.accused td{background:#fdecec}
img{max-width:100%}details{margin:.6em 0}summary{cursor:pointer;font-weight:600}
""".strip()


def render_html(report: Mapping[str, Any], images: Mapping[str, bytes] | None = None) -> str:
    """The whole report.html text; ``images`` maps each plot file name in the report to its PNG bytes."""
    parts = [_verdict(report["verdict"], next_step(report))]
    if report.get("capability") is not None:
        parts.append(_capability(report["capability"], report.get("query_signal") or {}))
    elif report.get("query_signal"):
        parts.append(_section("Target", _p(report["query_signal"].get("note") or "")))
    if report.get("method") is not None:
        parts.append(_top_examples(report["top_examples"], report.get("scores") or {}))
        if report.get("clusters") is not None:
            parts.append(_clusters(report["clusters"]))
        if len(report.get("causes") or []) > 1:
            parts.append(_causes(report["causes"]))
        parts.append(_spans(report.get("spans") or []))
        parts.append(_plots(report.get("plots") or {}, images or {}))
    parts.append(_warnings(report.get("warnings") or []))
    if report.get("method") is not None:
        parts.append(_method(report["method"]))
    parts.append(_provenance(report["provenance"], report.get("generated_at")))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>Gradian report: {escape(report['verdict'].get('headline') or '')}</title>\n"
            f"<style>\n{STYLE}\n</style>\n</head>\n<body>\n<h1>Gradian attribution report</h1>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def _verdict(verdict: Mapping[str, Any], step: str) -> str:
    kind = "" if verdict.get("accused_cluster") else " neutral"
    body = [f"<p class=\"headline\">{_with_code(verdict.get('headline') or '')}</p>", _p(verdict["summary"])]
    if step:
        body.append(_p(step))
    return f"<section id=\"verdict\" class=\"verdict{kind}\">\n<h2>Verdict</h2>\n" + "\n".join(body) + "\n</section>"


def _capability(cap: Mapping[str, Any], signal: Mapping[str, Any]) -> str:
    level = f"{cap['confidence']:.0%}"
    body = [_table(["", "base", "fine-tuned", "delta", f"{level} CI"],
                   [[cap["metric"], _g(cap["base_mean"]), _g(cap["finetuned_mean"]), _g(cap["delta"], "+"),
                     f"[{_g(cap['ci_low'], '+')}, {_g(cap['ci_high'], '+')}]"]], numeric=(1, 2, 3)),
            _p(f"{cap['n_items']} eval items, {cap['n_regressed']} regressed. Paired bootstrap, "
               f"{cap['bootstrap_samples']} resamples, seed {cap['seed']}; "
               f"{'significant' if cap['significant'] else 'not significant'}.")]
    if signal.get("effective"):
        body.append(_p(f"Query signal: {signal['effective']}." + (f" {signal['note']}" if signal.get("note") else "")))
    regressed = [item for item in cap["items"] if item["regressed"]]
    if regressed:
        body.append(_table(["regressed item", "wanted", "base said", "fine-tuned says"],
                           [[_code(item["id"]), _cut(item.get("wanted")), _cut(item.get("base_output")),
                             _cut(item.get("finetuned_output"))] for item in regressed[:SHOWN_ITEMS]], raw=(0,)))
        if len(regressed) > SHOWN_ITEMS:
            body.append(_p(f"{len(regressed) - SHOWN_ITEMS} more regressed items in report.json."))
    return _section("Capability", *body)


def _top_examples(rows: Sequence[Mapping[str, Any]], scores: Mapping[str, Any]) -> str:
    body = [_p("Blame = -(P q) . g; positive = training on the example pushed the model toward the failure.")]
    if rows:
        body.append(_table(["rank", "example", "blame", "cluster", "excerpt"],
                           [[str(row["rank"]), _code(row["id"]), _g(row["blame"]),
                             _code(row["cluster"]) if row.get("cluster") is not None else "", _cut(row["excerpt"])]
                            for row in rows], numeric=(0, 2), raw=(1, 3)))
    else:
        body.append(_p("No examples scored."))
    files = scores.get("files") or []
    if files:
        links = ", ".join(f"<a href=\"{escape(name)}\">{escape(name)}</a>" for name in files)
        body.append(f"<p>Every example's score ({escape(str(scores.get('rows')))} rows): {links}.</p>")
    if scores.get("note"):
        body.append(_p(scores["note"]))
    return _section("Top blamed examples", *body)


def _clusters(clusters: Mapping[str, Any]) -> str:
    accused = clusters.get("accused_all") or ([clusters["accused"]] if clusters.get("accused") else [])
    summary = (f"Accused: {', '.join(accused)}." if accused else
               f"No cluster stands out (the strongest has family-wise p >= {clusters['alpha']:g}).")
    rows, classes = [], []
    for row in clusters["ranked"][:SHOWN_CLUSTERS]:
        rows.append([str(row["rank"]), _code(row["name"]), str(row["size"]), _g(row["blame"]),
                     _g(row.get("effect"), digits=3), _g(row["z"], digits=3), _g(row["p_value"], digits=3),
                     _g(row["p_adjusted"], digits=3)])
        classes.append("accused" if row["accused"] else "")
    body = [_p(f"Membership: {clusters['membership']}. Permutation test against {clusters['permutations']} random "
               f"clusters of the same size (seed {clusters['seed']}). {summary}"),
            _table(["rank", "cluster", "size", "mean blame", "effect", "z", "p-value", "family-wise p"], rows,
                   numeric=(0, 2, 3, 4, 5, 6, 7), raw=(1,), row_classes=classes)]
    if clusters["count"] > SHOWN_CLUSTERS:
        body.append(_p(f"{clusters['count'] - SHOWN_CLUSTERS} more clusters in report.json."))
    return _section("Clusters", *body)


def _causes(causes: Sequence[Mapping[str, Any]]) -> str:
    rows = [[str(cause["cause"]), ", ".join(cause["items"]),
             cause["accused_cluster"] or f"nothing: {unexplained(cause)}", _g(cause["z"], digits=3),
             _g(cause["p_adjusted"], digits=3), ", ".join(cause["top_examples"][:3]),
             answers_held(cause.get("answer_teachers"), quote="")] for cause in causes]
    return _section("Causes", _p(f"{CAUSES_INTRO}{canned_note(causes)}{causes_alpha(causes)} The sections above "
                                 "attribute cause 1."),
                    _table(["cause", "items", "accuses", "z", "family-wise p", "most blamed examples",
                            "top rows holding its answers"], rows,
                           numeric=(0, 3, 4)))


def _spans(drills: Sequence[Mapping[str, Any]]) -> str:
    if not drills:
        return _section("Span drill-down", _p("No span drill-down in this run."))
    body = []
    for drill in drills:
        rows = []
        for index, span in enumerate(drill["spans"]):
            where = f"{span['start']}-{span['end']}"
            if span.get("message_index", -1) >= 0:
                where = f"message {span['message_index']}, {where}"
            rows.append([">" if index == drill.get("top_span") else "", where, _g(span["blame"]), _cut(span["text"])])
        body += [f"<h3>{_code(drill['example_id'])} against item {_code(drill['query_item'])}</h3>",
                 _table(["", "chars", "blame", "sentence"], rows, numeric=(2,))]
    return _section("Span drill-down", *body)


def _plots(plots: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    body = []
    for name in plots.get("files") or []:
        if name in images:
            data = base64.b64encode(images[name]).decode("ascii")
            alt = escape(name.rsplit(".", 1)[0].replace("_", " "))
            body.append(f"<figure><img alt=\"{alt}\" src=\"data:image/png;base64,{data}\"></figure>")
    if plots.get("note"):
        body.append(_p(plots["note"]))
    return _section("Plots", *body)


def _warnings(warnings: Sequence[Mapping[str, Any]]) -> str:
    if not warnings:
        return _section("Warnings", _p("None."))
    items = "".join(f"<li><strong>{escape(w['code'])}</strong>: {escape(w['message'])}</li>" for w in warnings)
    return _section("Warnings", f"<ul>{items}</ul>")


def _method(method: Mapping[str, Any]) -> str:
    items = [f"preconditioner: {method['preconditioner']}",
             f"train gradients unit-normalized (cosine): {'yes' if method['normalize'] else 'no'}",
             f"aggregation over items: {method['aggregation']}, items weighed {method.get('item_weights', 'uniform')}"
             f" (clusters and causes: {clusters_aggregation(method)}, items weighed uniform)"
             f"{cluster_prior_text(method).replace('`', '')}",
             f"query items ({len(method['query_items'])}): {', '.join(method['query_items'][:SHOWN_ITEMS])}"
             + (f" and {len(method['query_items']) - SHOWN_ITEMS} more" if len(method['query_items']) > SHOWN_ITEMS
                else ""),
             f"index read {method['index_passes']} time(s), in chunks"]
    if method.get("checkpoints"):
        items.append(checkpoints_text(method["checkpoints"]))
    return _section("Method", "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in items) + "</ul>")


def _provenance(provenance: Mapping[str, Any], generated_at: str | None) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in (provenance.get("versions") or {}).items())
    body = ["<details>", "<summary>Command, versions, config and manifest</summary>",
            _p("Every number above is reproducible from the command, manifest and config below; if two runs "
               "disagree, diff their manifests first."),
            f"<pre>{escape(provenance.get('command') or '')}</pre>",
            _p(f"Index id: {provenance.get('index_id') or 'none'}"), _p(f"Versions: {versions}"),
            "<details><summary>Config</summary>", _pre_json(provenance.get("config")), "</details>",
            "<details><summary>Manifest</summary>", _pre_json(provenance.get("manifest")), "</details>",
            "</details>",
            _p(f"Generated at {generated_at} (the only line that differs between two runs on the same inputs).")]
    return _section("Provenance", *body)


def _section(title: str, *body: str) -> str:
    slug = title.lower().replace(" ", "-")
    return f"<section id=\"{slug}\">\n<h2>{escape(title)}</h2>\n" + "\n".join(body) + "\n</section>"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = (),
           raw: Sequence[int] = (), row_classes: Sequence[str] = ()) -> str:
    """An HTML table; cells are escaped unless their column is in ``raw`` (already built from escaped parts)."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    lines = [f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>"]
    for number, row in enumerate(rows):
        css = row_classes[number] if number < len(row_classes) and row_classes[number] else ""
        cells = "".join(f"<td{NUMERIC if column in numeric else ''}>{cell if column in raw else escape(cell)}</td>"
                        for column, cell in enumerate(row))
        lines.append(f"<tr class=\"{css}\">{cells}</tr>" if css else f"<tr>{cells}</tr>")
    return "\n".join([*lines, "</tbody>\n</table>"])


def _p(text: str) -> str:
    """A paragraph; `names` in backticks (the report's Markdown-style quoting) become <code>, the rest is escaped."""
    return f"<p>{_with_code(str(text))}</p>"


def _with_code(text: str) -> str:
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: keep every character as written
        return escape(text)
    return "".join(escape(part) if i % 2 == 0 else f"<code>{escape(part)}</code>" for i, part in enumerate(parts))


def _code(text: Any) -> str:
    return f"<code>{escape(str(text))}</code>"


def _pre_json(value: Any) -> str:
    text = json.dumps(value if value is not None else {}, indent=2, sort_keys=True, ensure_ascii=False)
    return f"<pre>{escape(text)}</pre>"


def _cut(text: Any, limit: int = CELL_CHARS) -> str:
    """Text for a table cell: one line, cut at ``limit`` characters (escaped by the table)."""
    if text is None:
        return ""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _g(value: Any, sign: str = "", digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:{sign}.{digits}g}"
