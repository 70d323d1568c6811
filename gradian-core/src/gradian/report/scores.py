"""scores.csv (always) and scores.parquet (when pyarrow is installed): every training example's blame.

One row per training example, most blamed first: ``position`` (row in the dataset, 0-based), ``id``, ``rank``
(1 = most blamed), ``blame`` (aggregated; a member of an accused cluster carries that cluster's share of mean
blame, ``attribution.cluster_prior``, whose amounts report.json's method and causes record), ``cluster`` (its
cluster's name, empty without clusters), ``accused`` (whether that cluster is accused); where the regression split
into causes, one ``blame:cause-<n>`` column per cause (its blame), and ``blame`` / ``rank`` are cause 1's, or, where
two or more causes accuse a cluster, each example's highest standardized blame among those causes
(``CauseSplit.overall_blame``), so the top rows hold every accused cause's most blamed examples; then one
``item:<eval item id>`` column per query item holding that item's raw blame -(P q) . g before any per-item
standardization (the same numbers as report.json's ``item_blame``); then, where the clusters and causes were tested
at another generated weight (``evaluation.accusation_weight``), one ``tested:<eval item id>`` column per item they
were tested on, holding that item's raw blame at that weight. Wide, one column per item, because that is what
``pandas.read_csv`` users index by; a report without per-item numbers has no item columns.
"""

from __future__ import annotations

import csv
import importlib.util
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from gradian.attribution.aggregation import ranks_of
from gradian.errors import GradianError

if TYPE_CHECKING:
    from gradian.attribution.results import ExampleScores

SCORES_CSV = "scores.csv"
SCORES_PARQUET = "scores.parquet"
ITEM_PREFIX = "item:"
CAUSE_PREFIX = "blame:cause-"
TESTED_PREFIX = "tested:"
FIXED_COLUMNS = ("position", "id", "rank", "blame", "cluster", "accused")
PARQUET_MISSING_NOTE = "scores.parquet skipped: pyarrow is not installed (pip install 'gradian-core[parquet]')."


@dataclass(frozen=True)
class ItemColumns:
    """Per-item blame ``[examples, items]`` by position, and the eval items its columns are."""

    blame: np.ndarray
    item_ids: tuple[str, ...]


@dataclass(frozen=True)
class ScoreTable:
    """Every example's scores as columns, rows most blamed first; ``items`` are the per-item columns' eval ids."""

    position: np.ndarray
    ids: tuple[str, ...]
    rank: np.ndarray
    blame: np.ndarray
    cluster: tuple[str | None, ...]
    accused: np.ndarray
    items: tuple[str, ...]
    item_blame: np.ndarray | None  # [rows, items] in row order, or None without per-item numbers
    cause_blame: tuple[np.ndarray, ...] = ()  # each cause's blame in row order (none: one cause)
    ranking: str = "blame"  # blame and rank: "blame" (the scores' own) or "overall" (over the accusing causes)
    tested_items: tuple[str, ...] = ()  # the items the clusters and causes were tested on at another weight
    tested_blame: np.ndarray | None = None  # [rows, tested items] in row order, or None: tested on the item columns

    @property
    def cause_columns(self) -> tuple[str, ...]:
        """The per-cause blame columns' names (none: one cause)."""
        return tuple(f"{CAUSE_PREFIX}{number}" for number in range(1, len(self.cause_blame) + 1))

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column name, in file order."""
        return (FIXED_COLUMNS + self.cause_columns + tuple(ITEM_PREFIX + item for item in self.items)
                + tuple(TESTED_PREFIX + item for item in self.tested_items))


def parquet_available() -> bool:
    """Whether pyarrow can be imported, without importing it."""
    return importlib.util.find_spec("pyarrow") is not None


def score_table(scores: ExampleScores, *, cluster_names: Sequence[str | None] | None = None,
                accused: Sequence[str] = (), items: ItemColumns | None = None, cause_blame: Sequence[np.ndarray] = (),
                overall: np.ndarray | None = None, tested: ItemColumns | None = None) -> ScoreTable:
    """The table of an ExampleScores, ``cluster_names`` per position and ``items``, the per-item blame columns.

    ``cause_blame`` is each cause's blame by position, when there are several; ``overall`` (by position) replaces
    the scores' blame and rank: the causes' overall ranking; ``tested`` is the per-item blame the clusters and
    causes were tested on, where that differs from ``items``.
    """
    blame = np.asarray(scores.blame if overall is None else overall, dtype=np.float64)
    if blame.shape != (len(scores),):
        raise ValueError("overall needs one value per example")
    ranks = np.asarray(scores.ranks if overall is None else ranks_of(blame), dtype=np.int64)
    order = np.argsort(ranks, kind="stable")
    names = tuple(cluster_names) if cluster_names is not None else (None,) * len(scores)
    blocked = set(accused)
    per_item = _in_row_order(items, order, "items")
    tested_blame = _in_row_order(tested, order, "tested")
    return ScoreTable(
        position=order, ids=tuple(scores.ids[p] for p in order),
        rank=ranks[order], blame=blame[order],
        cluster=tuple(names[p] for p in order), accused=np.array([names[p] in blocked for p in order], dtype=bool),
        items=tuple(items.item_ids) if items is not None else (), item_blame=per_item,
        cause_blame=tuple(np.asarray(cause, dtype=np.float64)[order] for cause in cause_blame),
        ranking="blame" if overall is None else "overall",
        tested_items=tuple(tested.item_ids) if tested is not None else (), tested_blame=tested_blame)


def _in_row_order(columns: ItemColumns | None, order: np.ndarray, name: str) -> np.ndarray | None:
    """Per-item columns' blame as float64 in the table's row order (None stays None)."""
    if columns is None:
        return None
    values = np.asarray(columns.blame, dtype=np.float64)
    if values.shape != (len(order), len(columns.item_ids)):
        raise ValueError(f"{name} needs one row per example and one column per item")
    return values[order]


def csv_rows(table: ScoreTable) -> Iterator[list[str]]:
    """The header, then one row of text cells per example; floats in their shortest round-trip form."""
    yield list(table.columns)
    for row in range(len(table.ids)):
        cells = [str(int(table.position[row])), table.ids[row], str(int(table.rank[row])), _float(table.blame[row]),
                 table.cluster[row] or "", "true" if table.accused[row] else "false"]
        cells += [_float(blame[row]) for blame in table.cause_blame]
        if table.item_blame is not None:
            cells += [_float(value) for value in table.item_blame[row]]
        if table.tested_blame is not None:
            cells += [_float(value) for value in table.tested_blame[row]]
        yield cells


def write_csv(table: ScoreTable, handle: BinaryIO) -> None:
    """Write scores.csv to a binary file handle (UTF-8, LF line ends, RFC 4180 quoting)."""
    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows(csv_rows(table))
    text.flush()
    text.detach()  # the caller owns (and closes) the binary handle


def write_parquet(table: ScoreTable, path: Path) -> None:
    """Write scores.parquet (typed columns, the same rows and names as scores.csv) with pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {
        "position": pa.array(table.position, type=pa.int64()), "id": pa.array(table.ids, type=pa.string()),
        "rank": pa.array(table.rank, type=pa.int64()), "blame": pa.array(table.blame, type=pa.float64()),
        "cluster": pa.array(table.cluster, type=pa.string()), "accused": pa.array(table.accused, type=pa.bool_()),
    }
    for name, blame in zip(table.cause_columns, table.cause_blame, strict=True):
        columns[name] = pa.array(blame, type=pa.float64())
    for column, item in enumerate(table.items):
        columns[ITEM_PREFIX + item] = pa.array(table.item_blame[:, column], type=pa.float64())
    for column, item in enumerate(table.tested_items):
        columns[TESTED_PREFIX + item] = pa.array(table.tested_blame[:, column], type=pa.float64())
    pq.write_table(pa.table(columns), str(path), compression="zstd")


def scores_section(table: ScoreTable | None, files: Sequence[str], note: str | None) -> dict[str, Any]:
    """What report.json says about the scores files: names, rows, columns, and why one is missing."""
    if table is None:
        return {"files": [], "rows": 0, "columns": [], "order": None, "ranking": None, "note": note}
    return {"files": list(files), "rows": len(table.ids), "columns": list(table.columns),
            "order": "rank (most blamed first)", "ranking": table.ranking, "note": note}


@dataclass(frozen=True)
class RecordedScores:
    """scores.csv read back: ids, ranks, clusters and accused flags, most blamed first."""

    path: Path
    ids: tuple[str, ...]
    positions: tuple[int, ...]
    ranks: tuple[int, ...]
    clusters: tuple[str, ...]
    accused: tuple[bool, ...]


class ScoresFileError(GradianError):
    """A scores.csv that is missing or not the one a gradian report writes."""


def read_scores(report_dir: Path | str) -> RecordedScores:
    """Read a report directory's scores.csv with the csv module (pandas not needed)."""
    path = Path(report_dir) / SCORES_CSV
    if not path.is_file():
        raise ScoresFileError(f"{report_dir} has no {SCORES_CSV} (reports from before it existed lack it)",
                              "rerun gradian attribute to write it, or pass --drop ids.txt")
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        if tuple(header[: len(FIXED_COLUMNS)]) != FIXED_COLUMNS:
            raise ScoresFileError(f"{path} does not start with the columns {', '.join(FIXED_COLUMNS)}",
                                  "rerun gradian attribute to rewrite the report")
        rows = [row for row in reader if row]
    try:
        return RecordedScores(path=path, ids=tuple(row[1] for row in rows),
                              positions=tuple(int(row[0]) for row in rows), ranks=tuple(int(row[2]) for row in rows),
                              clusters=tuple(row[4] for row in rows), accused=tuple(row[5] == "true" for row in rows))
    except (IndexError, ValueError):
        raise ScoresFileError(f"{path} has a malformed row", "rerun gradian attribute to rewrite the report") from None


def accused_names(report: Mapping[str, Any]) -> tuple[str, ...]:
    """The clusters the report accuses: the verdict's (every cause's), then any other ranked one flagged accused."""
    verdict = report.get("verdict") or {}
    listed = verdict.get("accused_clusters") or ([verdict["accused_cluster"]] if verdict.get("accused_cluster") else [])
    ranked = (report.get("clusters") or {}).get("ranked") or []
    return tuple(dict.fromkeys([*listed, *(row["name"] for row in ranked if row.get("accused"))]))


def _float(value: float) -> str:
    """A float's shortest round-trip text; NaN / inf (never expected) as an empty cell, as pandas reads NaN."""
    number = float(value)
    return repr(number) if np.isfinite(number) else ""
