"""Reports: report.json (versioned schema), report.md and report.html rendered from it, every score, plots.

Build a report dict with ``attribution_report`` / ``no_capability_target_report`` / ``refusal_report``, then
``write_report(report, out_dir, scores=..., clusters=..., items=ItemColumns(blame, item_ids))``; read one back as
typed records with ``read_report(out_dir)``. matplotlib is imported only when plots are drawn, pyarrow only when
scores.parquet is written.
"""

from __future__ import annotations

from gradian.report.html import render_html
from gradian.report.json_report import (
    NO_CAPABILITY_TARGET_CODE,
    NO_CAPABILITY_TARGET_TEXT,
    SCHEMA,
    Provenance,
    ReportWarning,
    attribution_report,
    capability_summary,
    command_line,
    excerpt,
    library_versions,
    method_summary,
    no_capability_target_report,
    refusal_report,
    render_json,
)
from gradian.report.markdown import render_markdown
from gradian.report.reader import Report, parse_report, read_report
from gradian.report.scores import ItemColumns
from gradian.report.writer import ReportFiles, write_report

__all__ = [
    "NO_CAPABILITY_TARGET_CODE",
    "NO_CAPABILITY_TARGET_TEXT",
    "SCHEMA",
    "ItemColumns",
    "Provenance",
    "Report",
    "ReportFiles",
    "ReportWarning",
    "attribution_report",
    "capability_summary",
    "command_line",
    "excerpt",
    "library_versions",
    "method_summary",
    "no_capability_target_report",
    "parse_report",
    "read_report",
    "refusal_report",
    "render_html",
    "render_json",
    "render_markdown",
    "write_report",
]
