"""Reading report.json back: the fields its readers use, as frozen records, checked once with one-line errors.

Every command and script that reads a report (verify, export, inject, demo, the bench) goes through
``read_report`` (a report directory) or ``parse_report`` (a report dict already in memory), so a missing file,
broken JSON, a newer schema or a missing field is one ``ReportError`` here, not a KeyError somewhere else.
The writer (``json_report``) is the schema's definition; this module only reads what it writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.errors import ReportError
from gradian.report.json_fields import JsonObject
from gradian.report.json_report import SCHEMA
from gradian.user_files import load_json

REPORT_FILE = "report.json"
SCHEMA_PREFIX = "gradian.report/"
READABLE_SCHEMAS = (SCHEMA,)
# Verdict kinds that computed blame (a refusal computes none): the report has top examples and a method.
ATTRIBUTED_KINDS = ("attributed", "no_capability_target")
RUN_ATTRIBUTE = "pass the --out directory of a gradian attribute run"


@dataclass(frozen=True)
class Verdict:
    """What the report concluded: its kind, headline, summary and the clusters it accuses, first one first."""

    kind: str  # attributed | no_capability_target | not_significant | improved
    headline: str
    summary: str = ""
    accused_cluster: str | None = None
    accused_clusters: tuple[str, ...] = ()
    accused_by_rows: tuple[str, ...] = ()  # by the rows that hold what the fine-tuned model says, not the cluster test


@dataclass(frozen=True)
class ScoredItem:
    """One eval item as the capability section records it: both answers and both scores."""

    id: str
    prompt: str | None
    wanted: str | None
    base_output: str | None
    finetuned_output: str | None
    base_score: float | None
    finetuned_score: float | None
    regressed: bool


@dataclass(frozen=True)
class Capability:
    """The measured capability delta with its confidence interval, and every eval item."""

    metric: str
    n_items: int
    n_regressed: int
    base_mean: float | None
    finetuned_mean: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float | None
    significant: bool
    items: tuple[ScoredItem, ...] = ()


@dataclass(frozen=True)
class ExampleRow:
    """One of the report's most blamed training examples."""

    rank: int
    id: str
    blame: float | None = None
    cluster: str | None = None
    excerpt: str = ""


@dataclass(frozen=True)
class ClusterRow:
    """One ranked cluster; the fields and their order are report.json's, so ``dataclasses.asdict`` gives the row."""

    rank: int
    name: str
    size: int
    blame: float | None = None
    z: float | None = None
    effect: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    accused: bool = False


@dataclass(frozen=True)
class ClusterMethod:
    """How cluster membership was decided: ``field`` (a dataset field) or ``auto`` (seeded k-means), with knobs."""

    method: str
    field: str | None = None
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class SpanRow:
    """A drilled span of a blamed example; start and end are character offsets within message ``message_index``."""

    text: str
    message_index: int
    start: int
    end: int
    blame: float | None


@dataclass(frozen=True)
class DrillRow:
    """The spans of one blamed example."""

    example_id: str
    query_item: str  # the regressed item whose query drilled it
    spans: tuple[SpanRow, ...] = ()


@dataclass(frozen=True)
class CauseRow:
    """One group of regressed eval items and the clusters the report accuses of causing it (none: no data cause)."""

    number: int
    items: tuple[str, ...]  # eval item ids
    accused_clusters: tuple[str, ...] = ()


@dataclass(frozen=True)
class IndexedInputs:
    """What the index manifest says was indexed: base model, adapter, dataset and the dataset file's sha256."""

    base_model: str | None = None
    adapter: str | None = None
    dataset: str | None = None
    dataset_sha256: str | None = None


@dataclass(frozen=True)
class ReportProvenance:
    """What the report was made from: the command line, the index id and inputs, and the config."""

    command: str = ""
    index_id: str | None = None
    inputs: IndexedInputs = IndexedInputs()
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """An attribution report as its readers use it."""

    verdict: Verdict
    capability: Capability | None = None  # None: no eval set
    top_examples: tuple[ExampleRow, ...] = ()  # most blamed first
    clusters: tuple[ClusterRow, ...] = ()  # strongest first; empty when the report has no clusters
    cluster_method: ClusterMethod | None = None
    spans: tuple[DrillRow, ...] = ()
    causes: tuple[CauseRow, ...] = ()  # empty when the report did not split the regressed items into causes
    provenance: ReportProvenance = ReportProvenance()
    directory: Path | None = None  # where report.json was read from; None for a report built in memory
    # The document as read, for commands that print report.json whole; readers use the fields above.
    document: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def attributed(self) -> bool:
        """True when blame was computed (a refusal attributes nothing)."""
        return self.verdict.kind in ATTRIBUTED_KINDS

    @property
    def accused_names(self) -> tuple[str, ...]:
        """Every cluster the report accuses: the verdict's (every cause's), then any other ranked one flagged accused."""
        flagged = (row.name for row in self.clusters if row.accused)
        return tuple(dict.fromkeys((*self.verdict.accused_clusters, *flagged)))

    def cluster(self, name: str) -> ClusterRow | None:
        """The ranked cluster called ``name``, or None."""
        return next((row for row in self.clusters if row.name == name), None)


def read_report(directory: Path | str) -> Report:
    """The report in an attribution report directory (its report.json)."""
    directory = Path(directory)
    path = directory / REPORT_FILE
    if not directory.is_dir():
        raise ReportError(f"report directory {directory} does not exist", RUN_ATTRIBUTE)
    if not path.is_file():
        raise ReportError(f"{directory} is not an attribution report (no {REPORT_FILE})", RUN_ATTRIBUTE)
    document = load_json(path, REPORT_FILE, ReportError, hint="rerun gradian attribute to rewrite the report")
    return parse_report(document, path, directory=directory)


def parse_report(document: Any, source: Path | str, *, directory: Path | None = None) -> Report:
    """A report.json document as a Report; ``source`` names it in errors."""
    if not isinstance(document, Mapping):
        raise ReportError(f"{source} is not a JSON object", RUN_ATTRIBUTE)
    schema = document.get("schema")
    if not str(schema).startswith(SCHEMA_PREFIX):
        raise ReportError(f"{source} is not a gradian attribution report (schema {schema!r})", RUN_ATTRIBUTE)
    if schema not in READABLE_SCHEMAS:  # a newer gradian's report: its fields may mean other things
        raise ReportError(f"{source} has schema {schema!r}; this gradian reads {', '.join(READABLE_SCHEMAS)}",
                          "read it with the gradian version that wrote it, or rerun gradian attribute")
    root = JsonObject(document, "", str(source))
    clusters = root.optional_object("clusters")
    method = root.optional_object("method")
    capability = root.optional_object("capability")
    return Report(
        verdict=_verdict(root.object("verdict")),
        capability=_capability(capability) if capability is not None else None,
        top_examples=tuple(_example(row) for row in root.objects("top_examples")),
        clusters=tuple(_cluster(row) for row in clusters.objects("ranked")) if clusters is not None else (),
        cluster_method=_cluster_method(method),
        spans=tuple(_drill(drill) for drill in root.objects("spans")),
        causes=_causes(root),
        provenance=_provenance(root.object("provenance")),
        directory=directory,
        document=document,
    )


def _verdict(verdict: JsonObject) -> Verdict:
    accused = verdict.optional_text("accused_cluster")
    # accused_clusters came within schema 1 (a report before it names one cluster at most), so it may be absent.
    listed = verdict.texts("accused_clusters") if verdict.has("accused_clusters") else ((accused,) if accused else ())
    by_rows = verdict.texts("accused_by_rows") if verdict.has("accused_by_rows") else ()  # since stop 70
    return Verdict(kind=verdict.text("kind"), headline=verdict.text("headline"), summary=verdict.text("summary"),
                   accused_cluster=accused, accused_clusters=listed, accused_by_rows=by_rows)


def _capability(capability: JsonObject) -> Capability:
    items = tuple(ScoredItem(id=item.text("id"), prompt=item.optional_text("prompt"),
                             wanted=item.optional_text("wanted"), base_output=item.optional_text("base_output"),
                             finetuned_output=item.optional_text("finetuned_output"),
                             base_score=item.number("base_score"), finetuned_score=item.number("finetuned_score"),
                             regressed=item.flag("regressed"))
                  for item in capability.objects("items"))
    return Capability(metric=capability.text("metric"), n_items=capability.integer("n_items"),
                      n_regressed=capability.integer("n_regressed"), base_mean=capability.number("base_mean"),
                      finetuned_mean=capability.number("finetuned_mean"), delta=capability.number("delta"),
                      ci_low=capability.number("ci_low"), ci_high=capability.number("ci_high"),
                      confidence=capability.number("confidence"), significant=capability.flag("significant"),
                      items=items)


def _example(row: JsonObject) -> ExampleRow:
    return ExampleRow(rank=row.integer("rank"), id=row.text("id"), blame=row.number("blame"),
                      cluster=row.optional_text("cluster"), excerpt=row.text("excerpt"))


def _cluster(row: JsonObject) -> ClusterRow:
    # effect and accused came within schema 1 (every significant cluster accused); a report before them has
    # neither, and its one accused cluster is the verdict's.
    return ClusterRow(rank=row.integer("rank"), name=row.text("name"), size=row.integer("size"),
                      blame=row.number("blame"), z=row.number("z"),
                      effect=row.number("effect") if row.has("effect") else None, p_value=row.number("p_value"),
                      p_adjusted=row.number("p_adjusted"), accused=row.flag("accused") if row.has("accused") else False)


def _cluster_method(method: JsonObject | None) -> ClusterMethod | None:
    clusters = method.optional_object("clusters") if method is not None and method.has("clusters") else None
    if clusters is None:
        return None
    return ClusterMethod(method=clusters.text("method"), field=clusters.optional_text("field"),
                         knobs=clusters.mapping("knobs"))


def _drill(drill: JsonObject) -> DrillRow:
    return DrillRow(example_id=drill.text("example_id"), query_item=drill.text("query_item"), spans=tuple(
        SpanRow(text=span.text("text"), message_index=span.integer("message_index"), start=span.integer("start"),
                end=span.integer("end"), blame=span.number("blame")) for span in drill.objects("spans")))


def _causes(root: JsonObject) -> tuple[CauseRow, ...]:
    # causes came within schema 1 and is null when attribute did not look for them.
    if not root.has("causes") or root.value["causes"] is None:
        return ()
    return tuple(CauseRow(number=cause.integer("cause"), items=cause.texts("items"),
                          accused_clusters=cause.texts("accused_clusters")) for cause in root.objects("causes"))


def _provenance(provenance: JsonObject) -> ReportProvenance:
    manifest = provenance.object("manifest")
    # An empty manifest (a report made without an index, as tests write) records no inputs.
    sources = manifest.optional_object("sources") if manifest.has("sources") else None
    inputs = IndexedInputs() if sources is None else IndexedInputs(
        base_model=sources.optional_text("base_model", absent_ok=True),
        adapter=sources.optional_text("adapter", absent_ok=True),
        dataset=sources.optional_text("dataset", absent_ok=True),
        dataset_sha256=sources.optional_text("dataset_file_sha256", absent_ok=True))
    return ReportProvenance(command=provenance.text("command"), index_id=provenance.optional_text("index_id"),
                            inputs=inputs, config=provenance.mapping("config"))
