"""Render a DiagnoseReport: a rich table grouped by severity, JSON (versioned), or markdown."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from gradian.diagnose.runner import DiagnoseReport
from gradian.records import SEVERITIES, AuditCheck, Evidence, Finding

if TYPE_CHECKING:
    from rich.console import Console

JSON_SCHEMA = "gradian.diagnose/1"
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_TITLE = {"error": "Errors", "warning": "Warnings", "info": "Info"}
TABLE_EVIDENCE = 4  # evidence lines shown per finding in the terminal (json/md show all kept)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def evidence_dict(evidence: Evidence) -> dict[str, Any]:
    """One Evidence as plain JSON data."""
    return _json_safe({"text": evidence.text, "location": evidence.location, "example_ids": list(evidence.example_ids),
                       "steps": list(evidence.steps), "values": dict(evidence.values)})


def finding_dict(finding: Finding, check: AuditCheck | None = None) -> dict[str, Any]:
    """One Finding as plain JSON data."""
    return {
        "id": finding.check_id,
        "family": check.family if check else None,
        "severity": finding.severity,
        "message": finding.message,
        "fix": finding.fix,
        "evidence": [evidence_dict(e) for e in finding.evidence],
    }


def to_json(report: DiagnoseReport) -> dict[str, Any]:
    """The whole report as JSON data (schema ``gradian.diagnose/1``)."""
    return {
        "schema": JSON_SCHEMA,
        "inputs": _json_safe(dict(report.inputs)),
        "summary": {**report.counts(), "checks_run": len(report.ran), "checks_skipped": len(report.skipped),
                    "checks_failed": len(report.failed), "seconds": round(report.seconds, 3)},
        "findings": [finding_dict(f, report.checks.get(f.check_id)) for f in report.findings],
        "skipped": [{"id": s.id, "family": s.family, "needs": list(s.missing), "reason": s.reason()} for s in report.skipped],
        "failed": [{"id": f.id, "error": f.error} for f in report.failed],
        "ran": list(report.ran),
        "timings": {check_id: round(seconds, 4) for check_id, seconds in report.timings.items()},
    }


def evidence_line(evidence: Evidence) -> str:
    """One evidence item on one line: location, text, then ids / steps not already in the text."""
    parts = [evidence.location] if evidence.location else []
    parts.append(evidence.text)
    if evidence.example_ids:
        ids = list(evidence.example_ids)
        parts.append("[" + ", ".join(ids[:3]) + (f", +{len(ids) - 3}" if len(ids) > 3 else "") + "]")
    if evidence.steps and "step" not in evidence.text:
        steps = list(evidence.steps)
        parts.append("steps " + ", ".join(map(str, steps[:5])) + (" …" if len(steps) > 5 else ""))
    return " — ".join(parts[:2]) + (" " + " ".join(parts[2:]) if len(parts) > 2 else "")


def skipped_by_reason(report: DiagnoseReport) -> dict[str, list[str]]:
    """Skipped check ids grouped by what they need."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for skipped in report.skipped:
        grouped[skipped.reason()].append(skipped.id)
    return dict(grouped)


def summary_line(report: DiagnoseReport) -> str:
    """One line: counts per severity, checks run / skipped, seconds."""
    counts = report.counts()
    def plural(n: int, word: str) -> str:
        return f"{n} {word}" if n == 1 else f"{n} {word}s"

    text = (f"{plural(counts['error'], 'error')}, {plural(counts['warning'], 'warning')}, {counts['info']} info · "
            f"{plural(len(report.ran), 'check')} ran, {len(report.skipped)} skipped")
    if report.failed:
        text += f", {len(report.failed)} crashed"
    return text + f" · {report.seconds:.1f} s"


def inputs_line(report: DiagnoseReport) -> str:
    """Which inputs were read."""
    inputs = report.inputs
    parts = []
    if "dataset" in inputs:
        d = inputs["dataset"]
        parts.append(f"dataset {d['path']} ({d['rows']} rows{', ' + str(d['bad_rows']) + ' bad' if d['bad_rows'] else ''})")
    if "run" in inputs:
        parts.append(f"run {inputs['run']['path']} ({inputs['run']['reader']}, {inputs['run']['logged_points']} logged points)")
    if "adapter" in inputs:
        a = inputs["adapter"]
        parts.append(f"adapter {a['path']}" + (" (found with the run)" if a.get("found_in_run_dir") else ""))
    if "base_model" in inputs:
        parts.append(f"base model {inputs['base_model']}")
    if "eval_dataset" in inputs:
        parts.append(f"eval set {inputs['eval_dataset']['path']}")
    return " · ".join(parts)


def render_table(report: DiagnoseReport, console: Console) -> None:
    """Print the report as rich tables, one per severity, then the skipped checks and a summary."""
    console.print(Text("gradian diagnose · ", style="bold") + Text(inputs_line(report)))
    for severity in SEVERITIES:
        findings = [f for f in report.findings if f.severity == severity]
        if not findings:
            continue
        table = Table(title=f"{SEVERITY_TITLE[severity]} ({len(findings)})", title_style=SEVERITY_STYLE[severity],
                      title_justify="left", show_lines=True, expand=True)
        table.add_column("check", style=SEVERITY_STYLE[severity], no_wrap=True)
        table.add_column("finding and evidence", ratio=3)
        table.add_column("fix", ratio=2)
        for finding in findings:
            body = Text(finding.message)
            for evidence in finding.evidence[:TABLE_EVIDENCE]:
                body.append("\n  • " + evidence_line(evidence), style="dim")
            if len(finding.evidence) > TABLE_EVIDENCE:
                body.append(f"\n  • … {len(finding.evidence) - TABLE_EVIDENCE} more in --format json", style="dim")
            table.add_row(finding.check_id, body, finding.fix)
        console.print(table)
    if not report.findings:
        console.print(Text("No findings: every check that ran is quiet.", style="green"))
    for failed in report.failed:
        console.print(Text(f"check {failed.id} crashed: {failed.error}", style="red"))
    for reason, ids in skipped_by_reason(report).items():
        console.print(Text(f"Skipped {len(ids)} ({reason}): ", style="dim") + Text(", ".join(ids), style="dim"))
    console.print(Text(summary_line(report), style="bold"))


def to_markdown(report: DiagnoseReport) -> str:
    """The report as markdown: findings by severity with evidence and fix, then the skipped checks."""
    lines = ["# gradian diagnose", "", inputs_line(report), "", f"**{summary_line(report)}**", ""]
    for severity in SEVERITIES:
        findings = [f for f in report.findings if f.severity == severity]
        if not findings:
            continue
        lines += [f"## {SEVERITY_TITLE[severity]} ({len(findings)})", ""]
        for finding in findings:
            lines += [f"### `{finding.check_id}`: {finding.message}", ""]
            lines += [f"- {evidence_line(e)}" for e in finding.evidence]
            lines += ["", f"**Fix:** {finding.fix}", ""]
    if not report.findings:
        lines += ["No findings: every check that ran is quiet.", ""]
    if report.failed:
        lines += ["## Crashed checks", ""] + [f"- `{f.id}`: {f.error}" for f in report.failed] + [""]
    if report.skipped:
        lines += ["## Skipped", ""]
        lines += [f"- {reason}: " + ", ".join(f"`{i}`" for i in ids) for reason, ids in skipped_by_reason(report).items()]
        lines.append("")
    return "\n".join(lines)


def render_check_list(checks: Mapping[str, AuditCheck], distributions: Mapping[str, str], console: Console) -> None:
    """`--list`: every registered check with family, severity, needs and the distribution it comes from."""
    table = Table(title=f"{len(checks)} audit checks", title_justify="left", expand=True)
    for column in ("id", "family", "sev", "needs", "summary", "from"):
        table.add_column(column, no_wrap=column in ("id", "family", "sev"))
    order = {family: rank for rank, family in enumerate(("data", "config", "dynamics"))}
    for check in sorted(checks.values(), key=lambda c: (order.get(c.family, 9), c.id)):
        table.add_row(check.id, check.family, check.severity[0].upper(), ", ".join(sorted(check.needs)), check.summary,
                      distributions.get(check.id, "unknown"))
    console.print(table)
