"""Writing a report directory: report.json, report.md, report.html, the scores files, the manifest and the plots.

Each file is written atomically (a temp file in the same directory, then a rename), so a reader never sees a
half-written one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.atomic_files import atomic_file, atomic_path, write_atomic
from gradian.attribution.results import ClusterResult, ExampleScores
from gradian.report import plots
from gradian.report import scores as score_files
from gradian.report.html import render_html
from gradian.report.json_report import render_json
from gradian.report.markdown import MANIFEST_FILE, render_markdown
from gradian.report.reply_teachers import ROWS_FILE, rows_file_text

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"
HTML_NAME = "report.html"
MANIFEST_NAME = MANIFEST_FILE


@dataclass(frozen=True)
class ReportFiles:
    """The files a report directory holds after ``write_report``."""

    json: Path
    markdown: Path
    plots: tuple[Path, ...] = ()
    html: Path | None = None
    scores: tuple[Path, ...] = ()
    manifest: Path | None = None
    reply_rows: Path | None = None  # the training rows that hold a leading canned reply, where they stand out


def write_report(report: Mapping[str, Any], out_dir: Path, *, scores: ExampleScores | None = None,
                 clusters: ClusterResult | None = None, draw_plots: bool = True,
                 items: score_files.ItemColumns | None = None, cause_blame: Sequence[np.ndarray] = (),
                 overall_blame: np.ndarray | None = None, tested: score_files.ItemColumns | None = None) -> ReportFiles:
    """Write the report directory; ``items`` adds per-item columns to the scores files, ``cause_blame`` one column
    per cause, ``overall_blame`` ranks them instead of the scores' blame, and ``tested`` adds the per-item blame the
    clusters and causes were tested on at another generated weight."""
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
    score_paths = _write_scores(report, out_dir, scores, clusters, items, cause_blame, overall_blame, tested)
    manifest = _write_manifest(report, out_dir)
    reply_rows = _write_reply_rows(report, out_dir)
    json_path, markdown_path, html_path = out_dir / JSON_NAME, out_dir / MARKDOWN_NAME, out_dir / HTML_NAME
    write_atomic(json_path, render_json(report).encode("utf-8"))
    write_atomic(markdown_path, render_markdown(report).encode("utf-8"))
    images = {path.name: path.read_bytes() for path in written}
    write_atomic(html_path, render_html(report, images).encode("utf-8"))
    return ReportFiles(json=json_path, markdown=markdown_path, plots=tuple(written), html=html_path,
                       scores=score_paths, manifest=manifest, reply_rows=reply_rows)


def _write_scores(report: dict[str, Any], out_dir: Path, scores: ExampleScores | None,
                  clusters: ClusterResult | None, items: score_files.ItemColumns | None = None,
                  cause_blame: Sequence[np.ndarray] = (), overall_blame: np.ndarray | None = None,
                  tested: score_files.ItemColumns | None = None) -> tuple[Path, ...]:
    """Write scores.csv (and scores.parquet with pyarrow); record them in ``report["scores"]``."""
    stale = out_dir / score_files.SCORES_PARQUET
    if report.get("method") is None:  # a refusal scores nothing
        report["scores"] = score_files.scores_section(None, [], None)
        return ()
    if scores is None:
        report["scores"] = score_files.scores_section(None, [], "Scores not written (no scores were passed).")
        return ()
    names = None
    if clusters is not None:
        names = [clusters.assignment.names[label] for label in clusters.assignment.labels]
    table = score_files.score_table(scores, cluster_names=names, accused=score_files.accused_names(report),
                                    items=items, cause_blame=cause_blame, overall=overall_blame,
                                    tested=tested)
    paths = [out_dir / score_files.SCORES_CSV]
    with atomic_file(paths[0]) as handle:
        score_files.write_csv(table, handle)
    note = None
    if score_files.parquet_available():
        paths.append(stale)
        with atomic_path(stale) as temp:
            score_files.write_parquet(table, temp)
    else:
        stale.unlink(missing_ok=True)  # a parquet file from an earlier run would disagree with this scores.csv
        note = score_files.PARQUET_MISSING_NOTE
    report["scores"] = score_files.scores_section(table, [path.name for path in paths], note)
    return tuple(paths)


def _write_manifest(report: dict[str, Any], out_dir: Path) -> Path | None:
    """The index manifest as its own file, so report.md links it instead of inlining hundreds of KB."""
    manifest = (report.get("provenance") or {}).get("manifest")
    path = out_dir / MANIFEST_NAME
    if not manifest:
        path.unlink(missing_ok=True)
        return None
    write_atomic(path, (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
    return path


def _write_reply_rows(report: Mapping[str, Any], out_dir: Path) -> Path | None:
    """The ids of the rows that teach the leading canned reply, for ``--drop FILE``; removed where none stand out, so
    a report written again over an older one leaves no stale list."""
    path = out_dir / ROWS_FILE
    text = rows_file_text((report.get("verdict") or {}).get("reply_teachers") or {})
    if text is None:
        path.unlink(missing_ok=True)
        return None
    write_atomic(path, text.encode("utf-8"))
    return path


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
