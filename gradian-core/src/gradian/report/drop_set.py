"""What `gradian verify` and `gradian export` drop: the accused (or a named) clusters of an attribution report, its K most
blamed examples, or ids from a file.

The report's provenance also names the inputs it was made from (base model, adapter, dataset, eval set, run
dir, index), which become verify's defaults. Cluster membership is recomputed the way the report decided it:
from the dataset field it names, or, for automatic clusters, by re-running the same seeded k-means on the
report's gradient index (cluster names are only meaningful for that index).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.attribution.clusters import DEFAULT_SKETCH_DIM, auto_clusters, clusters_from_field
from gradian.attribution.results import ClusterAssignment
from gradian.data import Dataset
from gradian.data.examples import Example
from gradian.errors import DatasetError, GradianError
from gradian.index.store import DEFAULT_CHUNK_BYTES, open_index
from gradian.report.reader import REPORT_FILE, ClusterMethod, IndexedInputs, Report, read_report
from gradian.report.scores import SCORES_CSV, RecordedScores, read_scores
from gradian.user_files import read_text

# Flags of `gradian attribute` whose values verify can take as defaults.
COMMAND_FLAGS = ("--base-model", "--adapter", "--dataset", "--eval-dataset", "--run", "--index")
DROP_HELP = "accused, top:K or a file of example ids (one per line)"


class VerifyInputError(GradianError):
    """A report, drop choice, drop file or drop set that `gradian verify` or `gradian export` cannot use."""


@dataclass(frozen=True)
class DropChoice:
    """What to drop, parsed from ``--drop``: kind accused | top | file, with K or the ids file."""

    kind: str
    top: int = 0
    path: Path | None = None


@dataclass(frozen=True)
class ReportInputs:
    """An attribution report and what its provenance says about the inputs it was made from."""

    directory: Path
    report: Report
    flags: Mapping[str, str]  # attribute's command-line flags (--dataset ...) as the report recorded them

    @property
    def accused(self) -> str | None:
        """The accused cluster's name, or None when the report accuses none."""
        return self.report.verdict.accused_cluster

    @property
    def sources(self) -> IndexedInputs:
        """What the index manifest says was indexed (base model, adapter, dataset and its sha256)."""
        return self.report.provenance.inputs

    @property
    def config(self) -> Mapping[str, Any]:
        """The config the report was made with."""
        return self.report.provenance.config

    def named(self, key: str) -> str | None:
        """An input the report names: the index manifest's record first (what was really indexed), else the command."""
        indexed = {"base_model": self.sources.base_model, "adapter": self.sources.adapter,
                   "dataset": self.sources.dataset}
        value = indexed.get(key) or self.flags.get(f"--{key.replace('_', '-')}")
        return str(value) if value else None


@dataclass(frozen=True)
class DropSet:
    """The examples to drop, in dataset order, and where the choice came from."""

    ids: tuple[str, ...]
    origin: str  # one phrase for verify.md: "accused cluster `x` of report DIR (dataset field `source`)"
    clusters: tuple[str, ...] = ()  # the clusters dropped whole (none for top:K or a file of ids)
    label: str = ""  # what was dropped, for a headline, where no cluster names it: "the 20 most blamed examples"
    membership: str | None = None  # how cluster membership was decided
    positions: tuple[int, ...] = field(default=(), compare=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def cluster(self) -> str | None:
        """The dropped clusters' names as one label ("a, b"), or None for a file of ids."""
        return ", ".join(self.clusters) or None


def report_inputs(directory: Path | str) -> ReportInputs:
    """The report in an attribution report directory, with the inputs its command line names."""
    report = read_report(directory)
    return ReportInputs(directory=Path(directory), report=report, flags=command_flags(report.provenance.command))


def command_flags(command: str) -> dict[str, str]:
    """The values of attribute's input flags in a recorded command line (``--flag value`` or ``--flag=value``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return {}
    flags: dict[str, str] = {}
    for position, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name not in COMMAND_FLAGS:
            continue
        if equals:
            flags[name] = value
        elif position + 1 < len(words):
            flags[name] = words[position + 1]
    return flags


def parse_drop(spec: str) -> DropChoice:
    """``accused``, ``top:K`` (K >= 1) or the path of an ids file."""
    if spec == "accused":
        return DropChoice("accused")
    if spec.startswith("top:"):
        count = spec[4:]
        if not count.isdigit() or int(count) < 1:
            raise VerifyInputError(f"--drop {spec!r}: K must be a whole number of examples, at least 1",
                                   "e.g. --drop top:20")
        return DropChoice("top", top=int(count))
    path = Path(spec)
    if not path.is_file():
        raise VerifyInputError(f"--drop {spec!r} is neither accused, top:K nor an existing ids file",
                               f"pass {DROP_HELP}")
    return DropChoice("file", path=path)


def check_same_dataset(report: ReportInputs | None, examples: Dataset) -> None:
    """Refuse a dataset that is not the bytes the report was made from: ids and cluster membership depend on them."""
    recorded = report.sources.dataset_sha256 if report is not None else None
    if recorded and recorded != examples.sha256:
        raise DatasetError(f"{examples.path} is not the file the report was made from: it changed since the report "
                           f"was made (sha256 {examples.sha256[:12]} here, {str(recorded)[:12]} in the report)",
                           "pass --dataset with the exact training data the report attributed, in the same order, "
                           "restore it, or rerun gradian attribute")


def recorded_scores(report: ReportInputs, examples: Sequence[Example],
                    dataset_label: str = "the dataset") -> RecordedScores | None:
    """The report's scores.csv, checked against the dataset; None for a report written before scores.csv existed."""
    if not (report.directory / SCORES_CSV).is_file():
        return None
    recorded = read_scores(report.directory)
    known = {example.id for example in examples}
    if set(recorded.ids) != known:
        unknown = next((i for i in recorded.ids if i not in known), None)
        raise VerifyInputError(f"{recorded.path} scores ids that {dataset_label} does not hold"
                               + (f" (first: {unknown})" if unknown else ""),
                               "the dataset changed since the report; pass --dataset with the exact training data "
                               "the report attributed, or rerun gradian attribute")
    return recorded


def require_blame(report: ReportInputs) -> None:
    """Refuse a report that attributed nothing (a refusal, or a delta that was not significant): no blame to drop by."""
    if not report.report.attributed:
        raise VerifyInputError(f"the report in {report.directory} attributed nothing "
                               f"({report.report.verdict.headline or report.report.verdict.kind})",
                               "there is no blame to drop by; pass --drop ids.txt to drop rows you chose")


def top_drop_set(report: ReportInputs, examples: Sequence[Example], k: int,
                 dataset_label: str = "the dataset") -> DropSet:
    """The report's ``k`` most blamed examples (scores.csv's ranking; an older report's listed top), in dataset order."""
    require_blame(report)
    if k > len(examples):
        raise VerifyInputError(f"--drop top:{k} asks for more examples than the dataset's {len(examples)}",
                               f"pass K of at most {len(examples) - 1}")
    recorded = recorded_scores(report, examples, dataset_label)
    if recorded is not None:
        chosen = {i for i, rank in zip(recorded.ids, recorded.ranks, strict=True) if rank <= k}
        source = str(recorded.path)
    else:
        top = report.report.top_examples
        if k > len(top):
            raise VerifyInputError(f"the report in {report.directory} has no {SCORES_CSV} and lists only its top "
                                   f"{len(top)}", f"pass K of at most {len(top)}, or rerun gradian attribute to write "
                                   f"{SCORES_CSV}")
        chosen, source = {row.id for row in top[:k]}, f"{report.directory}/{REPORT_FILE}"
    positions = tuple(p for p, example in enumerate(examples) if example.id in chosen)
    return DropSet(ids=tuple(examples[p].id for p in positions), origin=f"the {k} most blamed examples in {source}",
                   label=f"the {k} most blamed examples", positions=positions)


def cluster_drop_set(report: ReportInputs, examples: Sequence[Example], *, cluster: str | None = None,
                     chunk_bytes: int | None = None) -> DropSet:
    """The members of every cluster the report accuses (or of ``cluster``), recomputed on ``examples``."""
    ranked = report.report.clusters
    names = (cluster,) if cluster is not None else report.report.accused_names
    if not names:
        verdict = report.report.verdict
        strongest = ", ".join(f"{row.name} ({row.size})" for row in ranked[:3])
        top = len(report.report.top_examples) if report.report.attributed else 0
        raise VerifyInputError(
            f"the report in {report.directory} accuses no cluster ({verdict.headline or verdict.kind})",
            "pass " + (f"--drop top:{top} for its most blamed examples, " if top else "")
            + "--cluster NAME to drop one of its clusters" + (f" (strongest: {strongest})" if strongest else "")
            + ", or --drop ids.txt with the example ids to drop")
    sizes = {row.name: row.size for row in ranked}
    unknown = [name for name in names if name not in sizes]
    if unknown:
        known = ", ".join(list(sizes)[:8]) or "none"
        raise VerifyInputError(f"the report in {report.directory} has no cluster named {unknown[0]!r}",
                               f"its clusters are: {known}")
    method = report.report.cluster_method or ClusterMethod("auto")
    if method.method == "field":
        assignment = _field_assignment(examples, str(method.field))
        membership = f"dataset field `{method.field}`"
    else:
        assignment = _auto_assignment(report, examples, method, chunk_bytes)
        membership = "automatic clusters recomputed on the report's gradient index"
    for name in names:
        found = int(assignment.sizes[assignment.names.index(name)]) if name in assignment.names else 0
        if found != sizes[name]:
            raise VerifyInputError(
                f"cluster {name!r} has {found} members in this dataset but {sizes[name]} in the report",
                "pass the --dataset the report was made from, or --drop ids.txt with the ids to drop")
    positions = tuple(sorted(int(p) for name in names for p in assignment.members(name)))
    role = "cluster" if cluster is not None and cluster not in report.report.accused_names else "accused cluster"
    listed = ", ".join(f"`{name}`" for name in names)
    return DropSet(ids=tuple(examples[p].id for p in positions),
                   origin=f"{role}{'s' if len(names) > 1 else ''} {listed} of the report in {report.directory} "
                          f"({membership})",
                   clusters=tuple(names), membership=membership, positions=positions)


def file_drop_set(path: Path | str, examples: Sequence[Example], dataset_label: str = "the dataset") -> DropSet:
    """The ids listed in a file (one per line; blank lines and # comments skipped), checked against ``examples``."""
    path = Path(path)
    lines = read_text(path, "--drop file", VerifyInputError,
                      hint="pass a UTF-8 text file with one example id per line").splitlines()
    positions = {example.id: position for position, example in enumerate(examples)}
    wanted: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if text not in positions:
            raise DatasetError(
                f"{path}:{line_number}: id {text!r} is not in {dataset_label} ({len(examples)} examples)",
                "ids embed the position and content hash (ex-000123-1a2b3c4d); take them from a report made on "
                "this exact dataset, in the same order")
        wanted[text] = positions[text]
    if not wanted:
        raise VerifyInputError(f"--drop file {path} lists no example ids", "write one example id per line")
    ordered = sorted(wanted.values())
    return DropSet(ids=tuple(examples[p].id for p in ordered), origin=f"{len(ordered)} ids listed in {path}",
                   label=f"the {len(ordered)} examples listed in {path.name}", positions=tuple(ordered))


def _field_assignment(examples: Sequence[Example], field_name: str) -> ClusterAssignment:
    return clusters_from_field(examples, field_name)


def _auto_assignment(report: ReportInputs, examples: Sequence[Example], method: ClusterMethod,
                     chunk_bytes: int | None) -> ClusterAssignment:
    """The report's automatic clusters, recomputed with its knobs on the index it scored."""
    from gradian.index.build import default_index_dir  # imports torch; reading a report does not

    named, index_id = report.named("index"), report.report.provenance.index_id
    index_dir = Path(named) if named else (default_index_dir(index_id) if index_id else None)
    if index_dir is None or not (index_dir / "manifest.json").is_file():
        raise VerifyInputError(
            f"the report's clusters are automatic and its gradient index ({index_id or 'unknown id'}) is not "
            f"at {index_dir}" if index_dir is not None else "the report names no gradient index",
            "rerun gradian attribute to rebuild it, or pass --drop ids.txt with the example ids to drop")
    index = open_index(index_dir)
    if tuple(index.ids) != tuple(example.id for example in examples):
        raise VerifyInputError(f"the gradient index at {index_dir} was built from another dataset than --dataset",
                               "pass the --dataset the report was made from")
    knobs = method.knobs
    # The sketch is the same bits under any budget, so the report's clusters come back whatever chunk_mb is now.
    return auto_clusters(index, num_clusters=knobs.get("k_requested"), seed=int(knobs.get("seed", 0)),
                         chunk_bytes=chunk_bytes or DEFAULT_CHUNK_BYTES,
                         sketch_dim=int(knobs.get("sketch_dim") or DEFAULT_SKETCH_DIM))
