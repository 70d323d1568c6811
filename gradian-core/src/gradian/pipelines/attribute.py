"""`gradian.attribute(...)`, the attribution pipeline: evaluate, gate on significance, index, query, score,
cluster, drill into spans, report.

Every stage's wall time is recorded in the report's provenance; nothing is written until the report is
complete (the index has its own atomic, resumable writes).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.attribution.adam_state import adam_second_moment
from gradian.attribution.causes import CauseSplit, find_causes
from gradian.attribution.checkpoint_ensemble import (
    EnsembleBlame,
    base_point_record,
    checkpoint_hashes,
    plan_ensemble,
    score_checkpoints,
    with_base_point,
)
from gradian.attribution.cluster_prior import with_cluster_prior
from gradian.attribution.clusters import assign_clusters, cluster_blame, clusters_from_field
from gradian.attribution.index_statistics import index_statistics
from gradian.attribution.preconditioners import Preconditioner
from gradian.attribution.preconditioners import from_config as fit_from_config
from gradian.attribution.results import ClusterResult, ExampleScores, SpanDrill
from gradian.attribution.scoring import (
    ItemBlameCollector,
    leading_rows,
    ranked_with_config,
    rescore_items,
    score_with_config,
)
from gradian.config import GradianConfig
from gradian.data import load_dataset, load_eval_dataset
from gradian.data.examples import Example
from gradian.errors import ConfigError, GradientIndexError
from gradian.evaluation import evaluate_capability, validate_query_signal
from gradian.evaluation.capability import CapabilityResult
from gradian.evaluation.query_signal import QuerySignalChoice
from gradian.index.manifest import MANIFEST_NAME, read_manifest
from gradian.index.store import Index, get_codec
from gradian.memory import release_freed_memory
from gradian.model.adapter_swap import base_point_hash, base_point_weights
from gradian.model.loaded import LoadedModel, check_unsloth_absent, require_adapter
from gradian.model.placement import Placement, resolve_placement
from gradian.model.quantized import training_base_note
from gradian.pipelines.span_drill import PointQueries, ScoredPoint, span_drills
from gradian.query import query_terms
from gradian.query.signals import PAIRED, shared_answers
from gradian.report import (
    ItemColumns,
    Provenance,
    ReportFiles,
    ReportWarning,
    attribution_report,
    command_line,
    no_capability_target_report,
    refusal_report,
    write_report,
)
from gradian.report.reader import REPORT_FILE, Report, Verdict, parse_report
from gradian.runs import read_run
from gradian.runs.training_format import run_dir_of_adapter

if TYPE_CHECKING:
    from gradian.grads.capture import GradientCapture
    from gradian.query.signals import QueryTerms, ScoredItem

# stage name -> a (done, total) progress callback, or None for no progress display
ProgressFactory = Callable[[str], Callable[[int, int], None] | None]


@dataclass(frozen=True)
class AttributionOutcome:
    """What `attribute` wrote and found: the report dict, its files, the index, and stage timings."""

    report: dict[str, Any]
    out_dir: Path
    files: ReportFiles
    index: Index | None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def parsed(self) -> Report:
        """The report as typed records, checked as every reader of report.json checks it."""
        return parse_report(self.report, self.out_dir / REPORT_FILE, directory=self.out_dir)

    @property
    def verdict(self) -> Verdict:
        """The report's verdict (kind, headline, summary, accused clusters)."""
        return self.parsed.verdict


class _Stages:
    """Times each stage and hands it its progress callback."""

    def __init__(self, progress: ProgressFactory | None) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[Callable[[int, int], None] | None]:
        started = time.perf_counter()
        try:
            yield self.progress(name) if self.progress is not None else None
        finally:
            release_freed_memory()  # the next stage starts from what is live, not this one's high-water mark
            self.timings[name] = round(self.timings.get(name, 0.0) + time.perf_counter() - started, 3)


def attribute(*, base_model: str, adapter: str | Path | None, dataset: str | Path, out: str | Path,
              eval_dataset: str | Path | None = None, run: str | Path | None = None,
              config: GradianConfig | None = None, index_dir: str | Path | None = None,
              allow_pickle: bool = False, trust_remote_code: bool = False, loaded_model: LoadedModel | None = None,
              progress: ProgressFactory | None = None, command: Sequence[str] | None = None,
              eval_format: str | None = None, refuse_other_index: bool = False,
              say: Callable[[str], None] | None = None, device: str = "auto",
              dtype: str = "auto", tokenizer: str | Path | None = None) -> AttributionOutcome:
    """Explain a regression: which training examples, clusters and sentences pushed the model toward it.

    ``say`` gets one-line notes meant for the terminal (the index's size estimate before it is built).
    ``eval_format`` declares the eval set's row format (messages, sharegpt, prompt_completion, alpaca); a row in
    another format is an error. An ``index_dir`` holding the index of other inputs (another adapter, dataset,
    gradient settings) is rebuilt in place, or, with ``refuse_other_index`` (what `gradian attribute --index`
    does), refused with an error naming what differs. ``device`` and ``dtype`` place the base model (see
    gradian.model.placement.resolve_placement); a ``loaded_model`` stays where it is.
    """
    config = config or GradianConfig()
    placement = None
    if loaded_model is None:
        require_adapter(adapter, "attribute")
        check_unsloth_absent()
        placement = resolve_placement(device, dtype)  # a bad --device fails before any data is read
    signal_choice = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal)
    if eval_format is not None and eval_dataset is None:
        raise ConfigError("an eval set format was declared without an eval set",
                          "pass --eval-dataset with the file, or drop --eval-format")
    stages = _Stages(progress)
    with stages.stage("load data"):
        examples = load_dataset(dataset)
        eval_items = (load_eval_dataset(eval_dataset, expected_format=eval_format)
                      if eval_dataset is not None else None)
        _check_cluster_field(config, examples)
    with stages.stage("load model"):
        loaded = loaded_model if loaded_model is not None else _load_model(
            base_model, adapter, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, placement=placement,
            tokenizer=tokenizer)
        config = _follow_run(config, loaded, examples, run)
    if index_dir is not None and refuse_other_index:
        check_index_dir_matches(index_dir, loaded, examples, config)
    capability = None
    canned: tuple[str, ...] = ()
    weights = (config.evaluation.generated_weight,)  # the queries' generated weights: the ranking's[, the accusation's]
    if eval_items is not None:
        capability = _evaluate(loaded, eval_items, config, stages)
        canned = _canned_reply(signal_choice, capability, config)
        weights = _query_weights(config, signal_choice)
        if config.evaluation.require_significant and not capability.significant_regression:
            return _refuse(capability, config, out, stages, command, warnings=_model_warnings(loaded))
    ensemble_plan = plan_ensemble(config.attribution.checkpoints, _run_dir(run, loaded), loaded.adapter_dir,
                                  loaded.adapter_hash, allow_pickle=allow_pickle)
    scored_alone = len(ensemble_plan.members) <= 1
    with stages.stage("index") as tick:
        from gradian.index.build import build_index  # imports torch; this module does not

        later = checkpoint_hashes(ensemble_plan, allow_pickle=allow_pickle)
        if config.attribution.base_point > 0 and loaded.adapter_hash is not None:
            later.append(base_point_hash(loaded.adapter_hash))  # its index is counted against the disk up front
        index = build_index(loaded, examples, config, index_dir, progress=tick, say=say, checkpoint_hashes=later,
                            scored_alone=scored_alone)
    with stages.stage("query gradients"):
        from gradian.grads.capture import GradientCapture  # imports torch; this module does not

        capture = GradientCapture.for_index(loaded, config.grads, index)  # queries scaled as the rows were
        if capability is not None:
            queries, item_ids = _eval_queries(capture, loaded, capability, eval_items, config, signal_choice,
                                              canned=canned, weights=weights)
        else:
            queries, item_ids = _fallback_queries(index, examples, config)
    with stages.stage("score"):
        statistics = index_statistics(index, config.attribution.preconditioner,
                                      chunk_bytes=config.attribution.chunk_bytes)
        preconditioner = fit_from_config(config.attribution, statistics,
                                         adam_exp_avg_sq=_adam_state(run, config, capture),
                                         scored_alone=scored_alone)
        preconditioned = preconditioner.apply(queries)
        # Scored as already preconditioned: applying P again would hold a second queries x dim float64 copy.
        item_blame = ItemBlameCollector()  # every example's per-item blame, for scores.csv, from the same read
        scores = score_with_config(index, preconditioned, config.attribution, item_ids=item_ids, item_sink=item_blame)
        blame_matrix = item_blame.matrix()
    rescore = bool(canned) or len(weights) > 1  # the scores ranked again, once, from the final columns
    ensemble = None
    if config.attribution.checkpoints > 1:
        with stages.stage("checkpoints") as tick:
            def score_member(view: LoadedModel) -> tuple[np.ndarray, str, _MemberState]:
                return _member_blame(view, examples, config, capability, eval_items, signal_choice, item_ids,
                                     canned=canned, weights=weights, progress=tick, say=say)

            ensemble = score_checkpoints(ensemble_plan, loaded, blame_matrix, index.index_id, score_member,
                                         allow_pickle=allow_pickle)
            if ensemble.item_blame is not None:  # the report ranks by the summed blame from here on
                blame_matrix, rescore = ensemble.item_blame, True
    base_point = None
    if config.attribution.base_point > 0:
        with stages.stage("base point") as tick, base_point_weights(loaded) as view:
            base_blame, base_index_id, _ = _member_blame(view, examples, config, capability, eval_items,
                                                         signal_choice, item_ids, canned=canned, weights=weights,
                                                         progress=tick, say=say)
        blame_matrix = with_base_point(blame_matrix, base_blame, config.attribution.base_point, blocks=len(weights))
        rescore = True
        base_point = base_point_record(config.attribution.base_point, base_index_id)
    ranked = _Columns(np.asarray(blame_matrix), preconditioned, np.asarray(queries), tuple(item_ids))
    tested = ranked  # the columns the clusters and causes are tested on: the ranking's, or the accusation weight's
    if len(weights) > 1:
        ranked, tested = ranked.by_weight()
    reply = tested_reply = None
    if canned:  # the reply's whole-answer columns set apart: only a canned cause of its own is scored on them
        reply, ranked = ranked.set_apart(canned)
        tested_reply, tested = (reply, ranked) if len(weights) == 1 else tested.set_apart(canned)
    if rescore:
        scores = _rescored(ranked.blame, scores, ranked.item_ids, config)
    tested_scores = _rescored(tested.blame, scores, tested.item_ids, config) if len(weights) > 1 else scores
    with stages.stage("clusters"):
        assignment = assign_clusters(config.attribution, examples, index)  # once: every cause is tested on it
        clusters = cluster_blame(np.asarray(tested_scores.blame), assignment,
                                 permutations=config.attribution.permutations, seed=config.attribution.seed)
        causes = None
        if capability is not None:  # regressed items can have several causes; stand-in training targets cannot
            causes = find_causes(tested.blame, tested_scores.ids, tested.item_ids, tested.gram(), assignment,
                                 config.attribution, tested_scores, clusters, canned=canned,
                                 canned_blame=tested_reply.whole_blame() if tested_reply is not None else None)
            if reply is not None and any(cause.canned for cause in causes.causes):
                ranked = ranked.with_whole_reply(reply)
                signal_choice = dataclasses.replace(signal_choice, whole_answer_items=canned)
            causes = causes.ranked(ranked.blame, ranked.item_ids, config.attribution,
                                   other_blame=len(weights) > 1)
            scores, clusters = causes.primary.scores, causes.primary.clusters  # the report leads with cause 1
        else:
            columns = range(len(ranked.item_ids))
            scores = with_cluster_prior(ranked_with_config(ranked.blame, scores, columns, config.attribution),
                                        ranked.blame, columns, assignment,
                                        [score.name for score in clusters.accused_all], config.attribution.cluster_prior)
    with stages.stage("spans"):
        points = _scored_points(index, ranked.preconditioned, ranked.item_ids, ensemble, examples, config, capability,
                                eval_items, signal_choice)
        drills = span_drills(loaded, examples, scores, points, config, allow_pickle=allow_pickle)
    return _write(config, out, stages, command, index=index, scores=scores, capability=capability,
                  preconditioner=preconditioner, clusters=clusters, drills=drills, examples=examples,
                  signal_choice=signal_choice, warnings=_model_warnings(loaded), items=ranked.written(),
                  causes=causes, ensemble=ensemble, base_point=base_point,
                  tested=tested.written() if len(weights) > 1 else None,
                  accusation_weight=weights[1] if len(weights) > 1 else None)


def _rescored(blame_matrix: np.ndarray, scores: ExampleScores, item_ids: Sequence[str],
              config: GradianConfig) -> ExampleScores:
    """The examples scored again from a new per-item blame [examples, items], as the index scoring did."""
    return rescore_items(blame_matrix, scores.ids, item_ids, range(len(item_ids)),
                         aggregation=config.attribution.aggregation, normalize=config.attribution.normalize,
                         top_k=config.attribution.top_k)


def _run_dir(run: str | Path | None, loaded: LoadedModel) -> Path | None:
    """--run, else the run the adapter sits in (gradian train's out/run beside out/adapter, a checkpoint's parent)."""
    return Path(run) if run is not None else run_dir_of_adapter(loaded.adapter_dir)


def _member_blame(view: LoadedModel, examples: Sequence[Example], config: GradianConfig,
                  capability: CapabilityResult | None, eval_items: Sequence[Example] | None,
                  signal_choice: QuerySignalChoice, item_ids: Sequence[str], *, canned: Sequence[str] = (),
                  weights: Sequence[float] | None = None, progress: Callable[[int, int], None] | None = None,
                  say: Callable[[str], None] | None = None) -> tuple[np.ndarray, str, _MemberState]:
    """Per-item blame [examples, items] under one checkpoint's weights: its own index, queries and preconditioner."""
    from gradian.grads.capture import GradientCapture  # both import torch; this module does not
    from gradian.index.build import build_index

    index = build_index(view, examples, config, None, progress=progress, say=say, scored_alone=False)  # index cache
    capture = GradientCapture.for_index(view, config.grads, index)
    if capability is not None:
        queries, ids = _eval_queries(capture, view, capability, eval_items, config, signal_choice, canned=canned,
                                     weights=weights)
    else:
        queries, ids = _fallback_queries(index, examples, config)
    if tuple(ids) != tuple(item_ids):
        raise GradientIndexError(f"checkpoint {view.adapter_dir} was queried on other items than the adapter",
                                 "report this with the gradian doctor output")
    statistics = index_statistics(index, config.attribution.preconditioner, chunk_bytes=config.attribution.chunk_bytes)
    preconditioner = fit_from_config(config.attribution, statistics,
                                     adam_exp_avg_sq=_adam_state(view.adapter_dir, config, capture), scored_alone=False)
    collector = ItemBlameCollector()
    score_with_config(index, preconditioner.apply(queries), config.attribution, item_ids=item_ids,
                      item_sink=collector)
    return collector.matrix(), index.index_id, _MemberState(index, preconditioner)


@dataclass(frozen=True)
class _MemberState:
    """What the span drill-down needs again of a scored checkpoint: its index and fitted preconditioner."""

    index: Index
    preconditioner: Preconditioner


def _scored_points(index: Index, preconditioned: np.ndarray, item_ids: Sequence[str], ensemble: EnsembleBlame | None,
                   examples: Sequence[Example], config: GradianConfig, capability: CapabilityResult | None,
                   eval_items: Sequence[Example] | None, signal_choice: QuerySignalChoice) -> list[ScoredPoint]:
    """The points the examples were scored at, for the span drill-down: the adapter alone, or every member."""
    positions = {item: row for row, item in enumerate(item_ids)}

    def adapter_queries(capture: GradientCapture, view: LoadedModel, wanted: Sequence[str]) -> np.ndarray:
        return preconditioned[[positions[item] for item in wanted]]  # already taken with the adapter's index

    if ensemble is None or not ensemble.scored:
        return [ScoredPoint(None, 1.0, index, adapter_queries)]

    def member_queries(state: _MemberState) -> PointQueries:
        def queries(capture: GradientCapture, view: LoadedModel, wanted: Sequence[str]) -> np.ndarray:
            if capability is None:
                rows, ids = _fallback_queries(state.index, examples, config)
            else:
                rows, ids = _eval_queries(capture, view, capability, eval_items, config, signal_choice, only=wanted)
            by_id = dict(zip(ids, state.preconditioner.apply(rows), strict=True))
            return np.stack([by_id[item] for item in wanted])
        return queries

    return [ScoredPoint(None, member.weight, index, adapter_queries) if state is None
            else ScoredPoint(member.adapter_dir, member.weight, state.index, member_queries(state))
            for member, state in ensemble.scored]


# What each section of the index id covers, for the error that names why an index does not fit.
_SPEC_PARTS = (
    ("checkpoint", "another adapter"),
    ("base_model", "another base model"),
    ("compute", "another device or base dtype"),
    ("dataset", "another training set (or the same rows in another order)"),
    ("grads", "other gradient settings (grads.*, or attribution.preconditioner for a projected index)"),
    ("seed", "another grads.seed"),
    ("damping", "other attribution.damping settings"),
    ("libraries", "other library versions"),
)


def check_index_dir_matches(index_dir: str | Path, loaded: LoadedModel, examples: Sequence[Example],
                            config: GradianConfig) -> None:
    """Refuse an index directory that holds an index of other inputs (another adapter, dataset, settings...).

    The build would replace it: an index the user pointed at on purpose, possibly for another adapter and expensive
    to rebuild, is refused instead of overwritten.
    """
    from gradian.grads.capture import GradientCapture  # both import torch; this module does not
    from gradian.index.build import encode_pass, make_plan

    directory = Path(index_dir).expanduser()
    if not (directory / MANIFEST_NAME).is_file():
        return  # empty or new: built there; anything else there is refused by the build itself
    try:
        manifest = read_manifest(directory)
    except GradientIndexError:  # damaged or another format version: build_index replaces or refuses it
        return
    capture = GradientCapture.from_config(loaded, config.grads)
    _, ids_sha, encoded_sha = encode_pass(examples, loaded.tokenizer, config.grads)
    plan = make_plan(loaded, capture, config, examples, ids_sha, encoded_sha, directory,
                     get_codec(config.grads.codec), examples)
    if plan.index_id == manifest.index_id:
        return
    differs = [what for key, what in _SPEC_PARTS if manifest.spec.get(key) != plan.spec.get(key)]
    reason = "; ".join(differs) if differs else "other inputs"
    raise GradientIndexError(
        f"--index {directory} holds gradient index {manifest.index_id}, built from {reason}, not from the inputs "
        f"of this run (index id {plan.index_id})",
        "pass the index built for this adapter and dataset, a new or empty --index directory, or leave --index out "
        "to use the cache; gradian attribute never overwrites an index it is pointed at",
    )


def _follow_run(config: GradianConfig, loaded: LoadedModel, examples: Sequence[Example],
                run: str | Path | None) -> GradianConfig:
    """grads.loss_mask and string_pairs ``auto`` made concrete from --run, else from the run the adapter sits in."""
    from gradian.index.build import follow_training_run  # imports torch; this module does not

    artifact = None
    if run is not None and "auto" in (config.grads.loss_mask, config.grads.string_pairs):
        artifact = read_run(Path(run))
    return follow_training_run(config, loaded, examples, artifact)


def _load_model(base_model: str, adapter: str | Path | None, *, allow_pickle: bool, trust_remote_code: bool,
                placement: Placement, tokenizer: str | Path | None = None) -> LoadedModel:
    if not base_model:
        raise ConfigError("gradian attribute needs --base-model", "pass the base model the adapter was trained from")
    return LoadedModel.load(base_model, adapter, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                            device=placement.device, dtype=placement.dtype, tokenizer=tokenizer)


def _check_cluster_field(config: GradianConfig, examples: Sequence[Example]) -> None:
    """Fail before any model work when the cluster field is missing on some rows."""
    if config.attribution.cluster_field:
        clusters_from_field(examples, config.attribution.cluster_field)


def _evaluate(loaded: LoadedModel, eval_items: Sequence[Example], config: GradianConfig,
              stages: _Stages) -> CapabilityResult:
    ticks: dict[str, Callable[[int, int], None] | None] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in ticks:
            ticks[stage] = stages.progress(f"evaluate {stage}") if stages.progress is not None else None
        if ticks[stage] is not None:
            ticks[stage](done, total)

    with stages.stage("evaluate"):
        return evaluate_capability(loaded, eval_items, config.evaluation, progress=progress,
                                   max_seq_length=config.grads.max_seq_length)


def _eval_queries(capture: GradientCapture, loaded: LoadedModel, capability: CapabilityResult,
                  eval_items: Sequence[Example], config: GradianConfig,
                  signal_choice: QuerySignalChoice, only: Sequence[str] | None = None,
                  canned: Sequence[str] = (), weights: Sequence[float] | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """One query vector per regressed item (all items when nothing regressed and the gate is off), or ``only`` these.

    The ``canned`` reply's items get a second vector each, queried with the whole reply, after the others (ids
    ``_WholeReply.column_id``): whether those are used is known only once the causes are found. All of them are
    taken at each generated weight in ``weights`` (the ranking's, then the accusation's if given; default:
    evaluation.generated_weight), one block of columns per weight, the second block's ids ``_Columns.accusation_id``;
    the gradients are taken once.
    """
    items = capability.regressed_items or capability.items
    if only is not None:
        chosen = set(only)
        items = [item for item in items if item.id in chosen]
    prompts = {example.id: example.prompt_messages for example in eval_items}

    def queried(chosen: Sequence[ScoredItem], whole_answer: Collection[str]) -> QueryTerms:
        return query_terms(capture, loaded.tokenizer, chosen, prompts, signal_choice.effective,
                           max_seq_length=config.grads.max_seq_length, batch_size=config.grads.batch_size,
                           whole_answer=whole_answer)

    parts = [queried(items, signal_choice.whole_answer_items)]
    if canned:
        reply = set(canned)
        parts.append(queried([item for item in items if item.id in reply], canned))
    ids = [term.item_id for term in parts[0].terms]
    ids += [_WholeReply.column_id(term.item_id) for part in parts[1:] for term in part.terms]
    weights = tuple(weights or (config.evaluation.generated_weight,))
    if len(weights) > 2:
        raise ValueError(f"queries are taken at the ranking's weight and the accusation's at most, not {weights}")
    vectors = np.concatenate([part.weighed(weight).vectors for weight in weights for part in parts])
    accusation = [_Columns.accusation_id(column) for column in ids] if len(weights) == 2 else []
    return vectors, (*ids, *accusation)


def _query_weights(config: GradianConfig, signal_choice: QuerySignalChoice) -> tuple[float, ...]:
    """The generated weights queries are taken at: the ranking's, then the accusation's where that differs."""
    rank, accuse = config.evaluation.generated_weight, config.evaluation.accusation_weight
    if accuse is None or accuse == rank or signal_choice.effective not in PAIRED:
        return (rank,)
    return (rank, accuse)


def _canned_reply(signal_choice: QuerySignalChoice, capability: CapabilityResult,
                  config: GradianConfig) -> tuple[str, ...]:
    """The regressed items giving the answer most of them give word for word (none unless asked, or under two)."""
    if not config.attribution.canned_replies or signal_choice.effective != "divergent-token":
        return ()
    groups = shared_answers(capability.regressed_items or capability.items)
    return groups[0] if groups else ()


@dataclass(frozen=True)
class _WholeReply:
    """A canned reply's items scored twice: by their divergent token (columns < n) and by the whole reply (after)."""

    blame: np.ndarray  # [examples, n + len(items)]
    queries: np.ndarray  # preconditioned, [n + len(items), dim]
    n: int
    columns: tuple[int, ...]  # each reply item's column among the first n

    @staticmethod
    def column_id(item: str) -> str:
        """The id of an item's whole-reply column (no eval item id holds a NUL)."""
        return f"{item}\0whole-reply"

    @classmethod
    def set_apart(cls, blame: np.ndarray, queries: np.ndarray, item_ids: Sequence[str],
                  canned: Sequence[str]) -> _WholeReply:
        """The scored columns and query rows, checked to end with the reply items' whole-reply ones in item order."""
        n, reply = len(item_ids) - len(canned), set(canned)
        columns = tuple(column for column, item in enumerate(item_ids[:n]) if item in reply)
        if tuple(item_ids[n:]) != tuple(cls.column_id(item_ids[column]) for column in columns):
            raise GradientIndexError("the canned reply's whole-reply queries are out of order",
                                     "report this with the gradian doctor output")
        return cls(np.asarray(blame), np.asarray(queries), n, columns)

    def whole_blame(self) -> np.ndarray:
        """The per-item blame with each reply item's column the one its whole reply gives."""
        out = self.blame[:, :self.n].copy()
        out[:, list(self.columns)] = self.blame[:, self.n:]
        return out

    def whole_queries(self, preconditioned: np.ndarray) -> np.ndarray:
        """``preconditioned`` (the first n rows) with each reply item's row its whole-reply query."""
        out = np.array(preconditioned, copy=True)
        out[list(self.columns)] = self.queries[self.n:]
        return out


@dataclass(frozen=True)
class _Columns:
    """Per-item blame [examples, columns] with the preconditioned and raw queries [columns, dim] that scored it."""

    blame: np.ndarray
    preconditioned: np.ndarray
    queries: np.ndarray
    item_ids: tuple[str, ...]

    @staticmethod
    def accusation_id(column: str) -> str:
        """The id of a column's query at the accusation's generated weight (no eval item id holds a NUL)."""
        return f"{column}\0accusation"

    def by_weight(self) -> tuple[_Columns, _Columns]:
        """The ranking weight's columns and the accusation weight's (the second half, under the same ids)."""
        n = len(self.item_ids) // 2
        first = self.item_ids[:n]
        if self.item_ids[n:] != tuple(self.accusation_id(column) for column in first):
            raise GradientIndexError("the accusation weight's queries are out of order",
                                     "report this with the gradian doctor output")
        return (_Columns(self.blame[:, :n], self.preconditioned[:n], self.queries[:n], first),
                _Columns(self.blame[:, n:], self.preconditioned[n:], self.queries[n:], first))

    def set_apart(self, canned: Sequence[str]) -> tuple[_WholeReply, _Columns]:
        """The canned reply's whole-reply columns, and these columns without them."""
        reply = _WholeReply.set_apart(self.blame, self.preconditioned, self.item_ids, canned)
        return reply, _Columns(reply.blame[:, :reply.n], self.preconditioned[:reply.n], self.queries[:reply.n],
                               self.item_ids[:reply.n])

    def with_whole_reply(self, reply: _WholeReply) -> _Columns:
        """Each reply item's column and query its whole reply's."""
        return dataclasses.replace(self, blame=reply.whole_blame(), preconditioned=reply.whole_queries(self.preconditioned))

    def gram(self) -> np.ndarray:
        """The items' preconditioned query inner products [columns, columns], what causes are grouped by."""
        return self.preconditioned @ self.queries.T

    def written(self) -> ItemColumns:
        """The blame as the scores files' per-item columns."""
        return ItemColumns(self.blame, self.item_ids)


def _fallback_queries(index: Index, examples: Sequence[Example],
                      config: GradianConfig) -> tuple[np.ndarray, tuple[str, ...]]:
    """Without an eval set: the loss gradients of the first few training examples (not a diagnosis)."""
    count = min(config.attribution.fallback_examples, len(examples))
    rows = leading_rows(index, count, config.attribution.chunk_bytes)
    return rows, tuple(example.id for example in examples[:count])


def _adam_state(run: str | Path | None, config: GradianConfig, capture: GradientCapture) -> np.ndarray | None:
    """Adam's exp_avg_sq in stored space, when asked for and the run dir holds it (exact indexes only)."""
    if config.attribution.preconditioner != "adam":
        return None
    return adam_second_moment(run, capture)


# Build-record fields that differ between two builds of the same index (gradian show-index prints them).
_VOLATILE_BUILD_KEYS = ("created_at", "seconds", "computed_examples")


def _provenance(config: GradianConfig, command: Sequence[str] | None, index: Index | None = None) -> Provenance:
    # Stage timings stay out of the report: two runs on the same inputs must write the same report.
    manifest = index.manifest.to_dict() if index is not None else {}
    if "build" in manifest:  # when and how fast the index was built differs between identical builds
        manifest["build"] = {k: v for k, v in manifest["build"].items() if k not in _VOLATILE_BUILD_KEYS}
    return Provenance(command=command_line(command), manifest=manifest,
                      index_id=index.index_id if index is not None else None, config=config.to_dict())


def _model_warnings(loaded: LoadedModel) -> list[ReportWarning]:
    """What the report must say about the model itself: an adapter trained on a quantized base, attributed unquantized."""
    quantized = getattr(loaded, "quantized_training_base", None)
    if not quantized:
        return []
    return [ReportWarning("model.quantized_training_base", training_base_note(quantized, loaded.base_model_name))]


def _refuse(capability: CapabilityResult, config: GradianConfig, out: str | Path, stages: _Stages,
            command: Sequence[str] | None, *, warnings: Sequence[ReportWarning] = ()) -> AttributionOutcome:
    report = refusal_report(capability=capability, provenance=_provenance(config, command), warnings=warnings)
    files = write_report(report, Path(out))
    return AttributionOutcome(_as_written(files), Path(out), files, None, dict(stages.timings))


def _write(config: GradianConfig, out: str | Path, stages: _Stages, command: Sequence[str] | None, *,
           index: Index, scores: ExampleScores, capability: CapabilityResult | None,
           preconditioner: Preconditioner, clusters: ClusterResult, drills: list[SpanDrill],
           examples: Sequence[Example], signal_choice: QuerySignalChoice, warnings: Sequence[ReportWarning] = (),
           items: ItemColumns | None = None, causes: CauseSplit | None = None,
           ensemble: EnsembleBlame | None = None, base_point: dict[str, Any] | None = None,
           tested: ItemColumns | None = None, accusation_weight: float | None = None) -> AttributionOutcome:
    """Write the report; ``tested`` is the per-item blame the clusters and causes were tested on and
    ``accusation_weight`` its generated weight, where that was not the ranking's."""
    texts = {example.id: example.supervised_text or example.text or "" for example in examples}
    provenance = _provenance(config, command, index)
    members = (*(ensemble.members if ensemble is not None else ()), *((base_point,) if base_point else ()))
    if ensemble is not None and ensemble.note:
        warnings = [*warnings, ReportWarning("attribution.checkpoints", ensemble.note)]
    if capability is None:
        report = no_capability_target_report(scores=scores, preconditioner=preconditioner, texts=texts,
                                             provenance=provenance, clusters=clusters, spans=drills,
                                             warnings=warnings, checkpoints=members)
    else:
        report = attribution_report(scores=scores, capability=capability, preconditioner=preconditioner,
                                    texts=texts, provenance=provenance, clusters=clusters, spans=drills,
                                    query_signal=signal_choice, warnings=warnings, causes=causes,
                                    checkpoints=members, accusation_weight=accusation_weight)
    split = causes is not None and len(causes.causes) > 1
    cause_blame = [cause.scores.blame for cause in causes.causes] if split else []
    files = write_report(report, Path(out), scores=scores, clusters=clusters, items=items, cause_blame=cause_blame,
                         overall_blame=causes.overall_blame() if split else None, tested=tested)
    return AttributionOutcome(_as_written(files), Path(out), files, index, dict(stages.timings))


def _as_written(files: ReportFiles) -> dict[str, Any]:
    """The report exactly as report.json holds it (writing adds the plot files it drew)."""
    return json.loads(Path(files.json).read_text(encoding="utf-8"))
