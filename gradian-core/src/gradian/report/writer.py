"""Writing a report directory: report.json, report.md and the PNG plots, each file written atomically."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.attribution.results import ClusterResult, ExampleScores
from gradian.report import plots
from gradian.report.json_report import render_json
from gradian.report.markdown import render_markdown

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"


@dataclass(frozen=True)
class ReportFiles:
    """The files a report directory holds after ``write_report``."""

    json: Path
    markdown: Path
    plots: tuple[Path, ...] = ()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory and a rename: never half-written."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_report(report: Mapping[str, Any], out_dir: Path, *, scores: ExampleScores | None = None,
                 clusters: ClusterResult | None = None, draw_plots: bool = True) -> ReportFiles:
    """Write report.json, report.md and, when matplotlib is installed, the PNG plots into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    report = dict(report)
    if draw_plots and report.get("method") is not None:
        files, note = _write_plots(report, out_dir, scores, clusters)
        written = [out_dir / name for name in files]
        report["plots"] = {"files": files, "note": note}
    else:
        report["plots"] = {"files": [], "note": None if report.get("method") is None else "Plots not requested."}
    json_path, markdown_path = out_dir / JSON_NAME, out_dir / MARKDOWN_NAME
    write_atomic(json_path, render_json(report).encode("utf-8"))
    write_atomic(markdown_path, render_markdown(report).encode("utf-8"))
    return ReportFiles(json=json_path, markdown=markdown_path, plots=tuple(written))


def _write_plots(report: Mapping[str, Any], out_dir: Path, scores: ExampleScores | None,
                 clusters: ClusterResult | None) -> tuple[list[str], str | None]:
    if not plots.matplotlib_available():
        return [], plots.MISSING_NOTE
    files = []
    if scores is not None:
        accused = clusters.accused if clusters is not None else None
        mask = clusters.assignment.labels == clusters.assignment.names.index(accused.name) if accused else None
        png = plots.blame_distribution_png(scores.blame, mask, accused.name if accused else None)
        write_atomic(out_dir / plots.BLAME_PLOT, png)
        files.append(plots.BLAME_PLOT)
    capability = report.get("capability")
    if capability is not None and capability.get("items"):
        write_atomic(out_dir / plots.ITEMS_PLOT, plots.item_scores_png(capability["items"], capability["metric"]))
        files.append(plots.ITEMS_PLOT)
    return files, None
