"""`gradian export`: the training dataset minus the rows a report blames, in the dataset's own format.

What to drop: ``accused`` (every member of the clusters the report accuses, as scores.csv records membership),
``top:K`` (the K most blamed examples) or a file of example ids, one per line. The dataset is the one the report's
provenance names (or ``--dataset``); it must be the bytes the report was made from, since ids embed position and
content. Nothing is written until every check has passed, and the original dataset is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.data import Dataset, load_dataset
from gradian.data.subset import write_subset
from gradian.errors import GradianError
from gradian.report.drop_set import (
    DropChoice,
    ReportInputs,
    check_same_dataset,
    cluster_drop_set,
    file_drop_set,
    parse_drop,
    recorded_scores,
    report_inputs,
    require_blame,
    top_drop_set,
)
from gradian.report.scores import RecordedScores


class ExportError(GradianError):
    """A report, drop choice or output that `gradian export` cannot use."""


@dataclass(frozen=True)
class ExportResult:
    """What export dropped and wrote."""

    dataset: Path
    out: Path
    kind: str  # the container written (the input's own): jsonl | json | parquet | arrow
    how: str  # how rows were copied
    dropped: tuple[str, ...]  # ids, in dataset order
    kept: int
    total: int
    origin: str  # one phrase: where the drop set came from

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON."""
        return {"dataset": str(self.dataset), "out": str(self.out), "format": self.kind, "how": self.how,
                "total": self.total, "kept": self.kept, "dropped": list(self.dropped), "origin": self.origin}


def export_without(report_dir: Path | str, drop: str, out: Path | str, *, dataset: Path | str | None = None,
                   overwrite: bool = False) -> ExportResult:
    """Write the report's dataset minus the ``drop`` rows to ``out``; every check runs before anything is written."""
    report = report_inputs(report_dir)  # a missing report, another schema or a missing field stops here
    choice = parse_drop(drop)
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"--out {out} already exists", "pass --overwrite to replace it, or another --out")
    path = _dataset_path(report, dataset)
    examples = load_dataset(path)
    check_same_dataset(report, examples)
    ids, origin = _drop_ids(report, choice, examples)
    dropped = set(ids)
    keep = [example.index for example in examples if example.id not in dropped]
    if not keep:
        raise ExportError(f"dropping {len(dropped)} of {len(examples)} rows leaves no training data",
                          "drop fewer rows, e.g. --drop top:K with a smaller K")
    written = write_subset(examples.path, keep, out, sha256=examples.sha256)
    ordered = tuple(example.id for example in examples if example.id in dropped)
    return ExportResult(examples.path, out, written.kind, written.how, ordered, len(keep), len(examples), origin)


def _dataset_path(report: ReportInputs, dataset: Path | str | None) -> Path:
    named = dataset if dataset is not None else report.named("dataset")
    if not named:
        raise ExportError(f"the report in {report.directory} names no training dataset",
                          "pass --dataset with the exact training data the report attributed")
    return Path(named)


def _drop_ids(report: ReportInputs, choice: DropChoice, examples: Dataset) -> tuple[tuple[str, ...], str]:
    """The ids to drop and where they came from."""
    if choice.kind == "file":
        drop = file_drop_set(choice.path, examples, dataset_label=str(examples.path))
        return drop.ids, drop.origin
    if choice.kind == "top":
        drop = top_drop_set(report, examples, choice.top, dataset_label=str(examples.path))
        return drop.ids, drop.origin
    require_blame(report)
    return _accused_ids(report, recorded_scores(report, examples, str(examples.path)), examples)


def _accused_ids(report: ReportInputs, recorded: RecordedScores | None, examples: Dataset) -> tuple[tuple[str, ...], str]:
    names = report.report.accused_names
    if not names:
        raise ExportError(f"the report in {report.directory} accuses no cluster ({report.report.verdict.headline})",
                          "pass --drop top:K for the K most blamed examples, or --drop ids.txt")
    listed = ", ".join(f"`{name}`" for name in names)
    if recorded is None:  # an older report: recompute membership the way verify does
        drop = cluster_drop_set(report, examples)
        return drop.ids, drop.origin
    ids = _members(recorded, set(names))
    return ids, f"accused cluster{'s' if len(names) > 1 else ''} {listed} of {recorded.path}"


def _members(recorded: RecordedScores, names: set[str]) -> tuple[str, ...]:
    return tuple(i for i, cluster in zip(recorded.ids, recorded.clusters, strict=True) if cluster in names)


def summary_lines(result: ExportResult, shown: int = 5) -> Sequence[str]:
    """What was dropped and written, as terminal lines."""
    listed = ", ".join(result.dropped[:shown]) + (f" and {len(result.dropped) - shown} more"
                                                  if len(result.dropped) > shown else "")
    return [f"dropped {len(result.dropped)} of {result.total} rows ({result.origin}): {listed}",
            f"wrote {result.kept} rows to {result.out} ({result.kind}, {result.how} from {result.dataset})"]

