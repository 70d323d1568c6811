"""Blame vectors for the accuracy benchmark: Gradian's configurations and the field's baselines, on one trained case.

Every method returns one score per training example, higher = more blamed for the regression, computed on the
same data, adapter, gradient index and regressed eval items:

- Gradian configurations: the index scored with a query signal (divergent-token / margin / divergence / contrastive / classic), a preconditioner
  (diagonal / none / block / adam), optional unit normalization and an aggregation (mean z-score / rank vote);
- grad dot: TracIn at the final adapter (classic query, no preconditioner, raw dot product);
- LESS: cosine of Adam-preconditioned train gradients with the classic query gradient;
- DataInf (Kwon et al.): the closed-form per-layer inverse for LoRA, with the averaged classic query;
- BM25 (bm25s): lexical retrieval with the eval items (prompt + wanted answer) as queries;
- hidden-state cosine: mean-pooled last hidden states of train rows vs the regressed items' prompt + what the
  fine-tuned model now says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gradian.report.reader import Report

CHUNK = 64  # index rows per read in the baselines' own passes: exact gradients of SmolLM2 are ~10 MB a row
_TRAIN_STATES: dict[Path, np.ndarray] = {}  # pooled hidden states of a case's training rows, by run dir


@dataclass(frozen=True)
class Case:
    """One trained scenario, loaded for scoring."""

    loaded: Any
    capture: Any
    index: Any
    examples: Sequence[Any]
    eval_items: Sequence[Any]
    items: tuple[Any, ...]  # the regressed ItemResults (all of them when none regressed)
    config: Any
    run_dir: Path
    scored_alone: bool = True  # False at a point of a checkpoint ensemble: attribute fits auto's wide side diagonal

    @property
    def prompts(self) -> dict[str, Any]:
        """Eval item id -> prompt messages."""
        return {example.id: example.prompt_messages for example in self.eval_items}


def report_items(report: Report) -> list[Any]:
    """The report's eval items (gradian.report.reader.ScoredItem) as the evaluation's own records."""
    from gradian.evaluation.capability import ItemResult

    return [ItemResult(id=item.id, prompt=item.prompt, wanted=item.wanted, base_output=item.base_output,
                       finetuned_output=item.finetuned_output, base_score=item.base_score,
                       finetuned_score=item.finetuned_score) for item in report.capability.items]


def load_case(workdir: Path, base_model: str, config: Any, report: Report) -> Case:
    """The model with its adapter, the index, the data and the regressed items of a finished demo run."""
    from gradian.data import load_dataset, load_eval_dataset
    from gradian.grads.capture import GradientCapture
    from gradian.index.store import Index
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(base_model, workdir / "train" / "adapter")
    all_items = report_items(report)
    # as `gradian attribute` does: the regressed items, or every item when none regressed and the gate is off
    items = tuple(item for item in all_items if item.regressed) or tuple(all_items)
    index = Index.open(workdir / "index")
    # for_index: a projected index's rows are scaled before the sketch, and the queries must be too
    return Case(loaded=loaded, capture=GradientCapture.for_index(loaded, config.grads, index),
                index=index, examples=load_dataset(workdir / "scenario" / "train.jsonl"),
                eval_items=load_eval_dataset(workdir / "scenario" / "eval.jsonl"), items=items, config=config,
                run_dir=workdir / "train" / "run")


def ensemble_points(final: Case, workdir: Path) -> Iterator[tuple[Any, Case]]:
    """(member, the case at its weights) for each point of the case's checkpoint ensemble, the adapter last.

    A checkpoint's index comes from the user cache where `gradian attribute` left it (built there otherwise); with
    ``attribution.checkpoints`` 1 the one member is the adapter, weight 1.
    """
    from gradian.attribution.checkpoint_ensemble import EnsembleMember, plan_ensemble
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index
    from gradian.model.adapter_swap import checkpoint_weights

    adapter = workdir / "train" / "adapter"
    plan = plan_ensemble(final.config.attribution.checkpoints, workdir / "train" / "run", adapter,
                         final.loaded.adapter_hash)
    alone = len(plan.members) <= 1
    for member in plan.members or (EnsembleMember(None, adapter, None, 1.0, is_adapter=True),):
        if member.is_adapter:
            yield member, dataclasses.replace(final, scored_alone=alone)
            continue
        with checkpoint_weights(final.loaded, member.adapter_dir) as view:
            index = build_index(view, final.examples, final.config, None, scored_alone=alone)
            yield member, dataclasses.replace(final, loaded=view, index=index, scored_alone=alone,
                                              capture=GradientCapture.for_index(view, final.config.grads, index))


def with_reduction(case: Case, reduction: str, directory: Path) -> Case:
    """The same case under another per-example loss reduction: its own index and query capture."""
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index

    config = case.config.replace(grads=dataclasses.replace(case.config.grads, loss_reduction=reduction))
    index = build_index(case.loaded, case.examples, config, directory)
    return dataclasses.replace(case, config=config, index=index,
                               capture=GradientCapture.from_config(case.loaded, config.grads))


def query(case: Case, signal: str, items: Sequence[Any] | None = None) -> np.ndarray:
    """Query gradients [items, dim] under the classic, contrastive or generated-only signal.

    generated-only (METHODS.md's "what taught the model to say what it now says") is L_q = -loss(generated),
    each item's gradient unit-normalized as in the contrastive signal; it is a benchmark variant, not a product
    signal.
    """
    from gradian.query import query_gradients
    from gradian.query.signals import _gradients, _unit

    if signal == "generated":
        prompts = case.prompts
        pairs = [(prompts[item.id], item.finetuned_output or "") for item in (items or case.items)]
        return -_unit(_gradients(case.capture, case.loaded.tokenizer, pairs, case.config.grads.max_seq_length,
                                 case.config.grads.batch_size))
    result = query_gradients(case.capture, case.loaded.tokenizer, list(items or case.items), case.prompts, signal,
                             max_seq_length=case.config.grads.max_seq_length, batch_size=case.config.grads.batch_size)
    return result.vectors


def preconditioner(case: Case, kind: str) -> Any:
    """A fitted preconditioner of ``kind`` from the index statistics (adam from the run's optimizer state)."""
    [fitted] = damped_preconditioners(case, kind, (None,))
    return fitted


def damped_preconditioners(case: Case, kind: str, damping_ratios: Sequence[float | None]) -> list[Any]:
    """One preconditioner of ``kind`` per damping ratio (None: the case's), the index statistics read once."""
    from gradian.attribution.adam_state import adam_second_moment
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import from_config

    attribution = dataclasses.replace(case.config.attribution, preconditioner=kind)
    adam = adam_second_moment(case.run_dir, case.capture) if kind == "adam" else None
    stats = index_statistics(case.index, kind, chunk_bytes=attribution.chunk_bytes)
    if len(damping_ratios) > 1 and stats.sample_moments is not None:  # the kronecker sample's moments: one pass
        moments = stats.sample_moments()
        stats = dataclasses.replace(stats, sample_moments=lambda: moments)
    return [from_config(attribution if ratio is None else dataclasses.replace(attribution, damping_ratio=ratio), stats,
                        adam_exp_avg_sq=adam, scored_alone=case.scored_alone) for ratio in damping_ratios]


def item_blame(case: Case, signal: str) -> np.ndarray:
    """Per-item blame [examples, items] of one point, scored as `gradian attribute` scores a checkpoint."""
    queries = preconditioner(case, case.config.attribution.preconditioner).apply(query(case, signal))
    return preconditioned_blame(case, queries, [item.id for item in case.items])


def preconditioned_blame(case: Case, queries: np.ndarray, item_ids: Sequence[str]) -> np.ndarray:
    """Per-item blame [examples, items] of already preconditioned queries, one per item id, read from the index."""
    from gradian.attribution.scoring import ItemBlameCollector, score_with_config

    collector = ItemBlameCollector()
    score_with_config(case.index, queries, case.config.attribution, item_ids=list(item_ids), item_sink=collector)
    return collector.matrix()


def index_blame(case: Case, queries: np.ndarray, pre: Any, *, normalize: bool = False,
                aggregation: str = "mean") -> np.ndarray:
    """Gradian's scoring of every indexed example (aggregated over the query rows)."""
    from gradian.attribution.scoring import score_examples

    scores = score_examples(case.index, queries, preconditioner=pre, normalize=normalize, aggregation=aggregation,
                            top_k=20, chunk_bytes=case.config.attribution.chunk_bytes)
    return np.asarray(scores.blame, dtype=np.float64)


def gradian_methods() -> dict[str, Callable[[Case, dict[str, np.ndarray]], np.ndarray]]:
    """Gradian's configurations, by name; the first is the shipped default."""

    def method(signal: str, kind: str, normalize: bool = False, aggregation: str = "mean"):
        def run(case: Case, queries: dict[str, np.ndarray]) -> np.ndarray:
            return index_blame(case, queries[signal], preconditioner(case, kind), normalize=normalize,
                               aggregation=aggregation)
        return run

    return {
        "gradian: divergent-token, diagonal (default)": method("divergent-token", "diagonal"),
        "gradian: contrastive, diagonal": method("contrastive", "diagonal"),
        "gradian: divergence, diagonal": method("divergence", "diagonal"),
        "gradian: margin, diagonal": method("margin", "diagonal"),
        "gradian: classic, diagonal": method("classic", "diagonal"),
        "gradian: contrastive, none": method("contrastive", "none"),
        "gradian: contrastive, block": method("contrastive", "block"),
        "gradian: contrastive, adam": method("contrastive", "adam"),
        "gradian: contrastive, diagonal, unit-norm": method("contrastive", "diagonal", normalize=True),
        "gradian: contrastive, diagonal, rank vote": method("contrastive", "diagonal", aggregation="rank_vote"),
        "gradian: generated-only, diagonal": method("generated", "diagonal"),
    }


def baseline_methods() -> dict[str, Callable[[Case, dict[str, np.ndarray]], np.ndarray]]:
    """The field's baselines, by name."""
    return {
        "grad dot (TracIn, final adapter)": lambda case, q: index_blame(case, q["classic"], preconditioner(case, "none")),
        "LESS (adam, cosine)": lambda case, q: index_blame(case, q["classic"], preconditioner(case, "adam"), normalize=True),
        "DataInf": lambda case, q: datainf_blame(case, q["classic"]),
        "BM25": lambda case, q: bm25_blame(case),
        "hidden-state cosine": lambda case, q: hidden_cosine_blame(case),
    }


def _modules(index: Any) -> list[tuple[str, list[tuple[int, int]]]]:
    """Index column ranges grouped by LoRA module (its A and B matrices): DataInf's layers."""
    grouped: dict[str, list[tuple[int, int]]] = {}
    for block in index.blocks:
        grouped.setdefault(block.module, []).append((block.offset, block.offset + block.width))
    return list(grouped.items())


def datainf_blame(case: Case, queries: np.ndarray, lambda_scale: float = 10.0) -> np.ndarray:
    """DataInf: blame_j = -sum_l g_jl . H_l^-1 v_l with the closed-form LoRA inverse and v = the mean query.

    H_l^-1 v ~ (1 / (n lambda_l)) sum_i (v - (v . g_il) / (lambda_l + |g_il|^2) g_il), lambda_l = 10 x the mean
    over examples of mean(g_il^2) (the constants of the DataInf code). Two streamed passes over the index.
    """
    v = np.asarray(queries, dtype=np.float64).mean(axis=0)
    modules = _modules(case.index)
    n = len(case.index)
    dots = np.zeros((n, len(modules)))
    norms = np.zeros((n, len(modules)))
    for offset, chunk in case.index.iter_chunks(CHUNK):
        rows = np.asarray(chunk, dtype=np.float64)
        for m, (_, ranges) in enumerate(modules):
            for start, end in ranges:
                part = rows[:, start:end]
                dots[offset:offset + len(rows), m] += part @ v[start:end]
                norms[offset:offset + len(rows), m] += np.einsum("ij,ij->i", part, part)
    widths = np.array([sum(end - start for start, end in ranges) for _, ranges in modules], dtype=np.float64)
    lambdas = lambda_scale * (norms / widths).mean(axis=0)
    coefficients = dots / (lambdas + norms)  # [n, modules]
    # hvp_l = (v_l - mean_i c_il g_il) / lambda_l, accumulated in a second pass
    correction = np.zeros_like(v)
    for offset, chunk in case.index.iter_chunks(CHUNK):
        rows = np.asarray(chunk, dtype=np.float64)
        for m, (_, ranges) in enumerate(modules):
            c = coefficients[offset:offset + len(rows), m]
            for start, end in ranges:
                correction[start:end] += c @ rows[:, start:end]
    hvp = v - correction / n
    for m, (_, ranges) in enumerate(modules):
        for start, end in ranges:
            hvp[start:end] /= lambdas[m]
    blame = np.zeros(n)
    for offset, chunk in case.index.iter_chunks(CHUNK):
        blame[offset:offset + len(chunk)] = -(np.asarray(chunk, dtype=np.float64) @ hvp)
    return blame


def _zmean(scores: np.ndarray) -> np.ndarray:
    """Per-query z-scores [queries, n] averaged over queries (Gradian's mean aggregation)."""
    std = scores.std(axis=1, keepdims=True)
    z = (scores - scores.mean(axis=1, keepdims=True)) / np.where(std > 0, std, 1.0)
    return z.mean(axis=0)


def bm25_blame(case: Case) -> np.ndarray:
    """BM25 of each training row (prompt + answer) against each regressed eval item (prompt + wanted answer)."""
    import bm25s

    corpus = [f"{example.prompt_text} {example.answer or example.text or ''}" for example in case.examples]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    by_id = {example.id: example for example in case.eval_items}
    texts = [f"{by_id[item.id].prompt_text} {item.wanted}" for item in case.items]
    tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False)
    return _zmean(np.stack([np.asarray(retriever.get_scores(t), dtype=np.float64) for t in tokens]))


def _pooled_states(case: Case, encoded: Sequence[Any]) -> np.ndarray:
    import torch

    model = case.loaded.model
    rows = []
    with torch.no_grad():
        for enc in encoded:
            ids = torch.tensor([list(enc.input_ids)], dtype=torch.long)
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
            rows.append(hidden.mean(dim=0).double().numpy())
    states = np.stack(rows)
    return states / np.maximum(np.linalg.norm(states, axis=1, keepdims=True), 1e-12)


def hidden_cosine_blame(case: Case) -> np.ndarray:
    """Cosine of mean-pooled last hidden states: train rows vs the regressed items' prompt + fine-tuned output."""
    from gradian.data import encode, encode_answer

    length = case.config.grads.max_seq_length
    tokenizer = case.loaded.tokenizer
    case.loaded.model.eval()
    train = _TRAIN_STATES.get(case.run_dir)
    if train is None:  # the same for every query set of a case: computed once
        train = _TRAIN_STATES[case.run_dir] = _pooled_states(case, [encode(example, tokenizer, length)
                                                                    for example in case.examples])
    prompts = case.prompts
    queries = _pooled_states(case, [encode_answer(prompts[item.id], item.finetuned_output or item.wanted, tokenizer,
                                                  length) for item in case.items])
    return _zmean(queries @ train.T)


def span_localization(case: Case, scenario: Any, signal: str | None = None,
                      preconditioner_kind: str | None = None) -> dict[str, Any]:
    """Span kind: for each planted row whose attacked item regressed, is its top sentence the planted one?

    The query is the one item the row attacks, as the span drill-down prescribes, with the case config's query
    signal and preconditioner unless others are named.
    """
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.query import span_blames

    evaluation = case.config.evaluation
    signal = signal or validate_query_signal(evaluation.metric, evaluation.query_signal).effective
    regressed = {item.id: item for item in case.items}
    pre = preconditioner(case, preconditioner_kind or case.config.attribution.preconditioner)
    hits = checked = 0
    for span, target in zip(scenario.planted_spans, scenario.planted_targets, strict=True):
        if target not in regressed:
            continue
        q = pre.apply(query(case, signal, [regressed[target]]))[0]
        spans = span_blames(case.capture, case.loaded.tokenizer, case.examples[span.row], q,
                            max_seq_length=case.config.grads.max_seq_length, batch_size=case.config.grads.batch_size,
                            measure=case.config.attribution.span_blame)
        best = max(spans, key=lambda s: s.blame)
        checked += 1
        hits += int(span.found_at(best.message_index, best.char_start, best.char_end))
    return {"checked": checked, "top1_hits": hits, "top1": hits / checked if checked else None}


def cluster_methods(case: Case, blame: np.ndarray, planted_rows: Sequence[int], field: str | None) -> dict[str, Any]:
    """The two cluster methods on one blame vector: how well the top cluster captures the planted rows.

    For each method: the rank of the cluster holding most planted rows, and the top cluster's precision (planted
    share of its members) and recall (share of the planted rows inside it).
    """
    from gradian.attribution.clusters import auto_clusters, cluster_blame, clusters_from_field

    assignments = {"auto (k-means on gradients)": auto_clusters(case.index, seed=case.config.attribution.seed,
                                                               chunk_bytes=case.config.attribution.chunk_bytes)}
    if field:
        assignments[f"field `{field}`"] = clusters_from_field(case.examples, field, ids=case.index.ids)
    planted = np.zeros(len(blame), dtype=bool)
    planted[list(planted_rows)] = True
    results = {}
    for name, assignment in assignments.items():
        scored = cluster_blame(blame, assignment, permutations=200, seed=case.config.attribution.seed)
        held = np.bincount(assignment.labels[planted], minlength=len(assignment.names))
        richest = assignment.names[int(held.argmax())]
        top = scored.scores[0]
        members = assignment.labels == assignment.names.index(top.name)
        results[name] = {"clusters": len(scored.scores),
                         "richest_cluster_rank": next(s.rank for s in scored.scores if s.name == richest),
                         "top_precision": float(planted[members].mean()),
                         "top_recall": float(planted[members].sum() / planted.sum()),
                         "top_p_adjusted": top.p_adjusted}
    return results
