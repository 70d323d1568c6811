"""Span drill-down: the sentences of the top examples that carry their blame, summed over the run's scored points.

Each top example is drilled against the one regressed item that blames it most. With a checkpoint ensemble
(``attribution.checkpoints``) a sentence's blame is summed over the same points and weights as the examples'
blame: at the final adapter alone the planted sentence is fitted and its gradient small, so it ranked first on
5 of 10 rows of a span tuning case, against 10 of 10 summed (bench/results/spans_checkpoints.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gradian.attribution.results import ExampleScores, SpanDrill
from gradian.data.loss_mask import concrete_encoding
from gradian.errors import GradianError
from gradian.model.adapter_swap import checkpoint_weights
from gradian.query import span_blames

if TYPE_CHECKING:
    from gradian.config import GradianConfig
    from gradian.data.examples import Example
    from gradian.grads.capture import GradientCapture
    from gradian.index.store import Index
    from gradian.model.loaded import LoadedModel
    from gradian.query.spans import SpanBlame

# (capture, model at the point, item ids) -> those items' preconditioned queries [items, dim], in that order
PointQueries = Callable[["GradientCapture", "LoadedModel", Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class ScoredPoint:
    """One point of the run the examples were scored at: its weights (None: the adapter), weight, index, queries."""

    adapter_dir: Path | None
    weight: float
    index: Index
    queries: PointQueries


def span_drills(loaded: LoadedModel, examples: Sequence[Example], scores: ExampleScores,
                points: Sequence[ScoredPoint], config: GradianConfig, *,
                allow_pickle: bool = False) -> list[SpanDrill]:
    """Sentence blame of the top ``attribution.span_examples`` examples, summed over ``points`` by weight."""
    from gradian.grads.capture import GradientCapture  # imports torch; this module does not

    top = list(scores.top_positions)[: config.attribution.span_examples]
    blames = np.asarray(scores.top_item_blame)
    wanted = [(int(position), scores.item_ids[int(np.argmax(blames[rank]))]) for rank, position in enumerate(top)]
    if not wanted:
        return []
    items = list(dict.fromkeys(item for _, item in wanted))  # each item's query once per point, in a fixed order
    summed: list[list[SpanBlame] | None] = [None] * len(wanted)
    for point in points:
        with _model_at(loaded, point, allow_pickle) as view:
            capture = GradientCapture.for_index(view, config.grads, point.index)
            queries = dict(zip(items, point.queries(capture, view, items), strict=True))
            for slot, (position, item) in enumerate(wanted):
                spans = span_blames(capture, view.tokenizer, examples[position], queries[item],
                                    max_seq_length=config.grads.max_seq_length, batch_size=config.grads.batch_size,
                                    measure=config.attribution.span_blame, **concrete_encoding(config.grads))
                summed[slot] = _add_weighted(summed[slot], spans, point.weight)
    return [SpanDrill(examples[position].id, position, item, tuple(spans or ()))
            for (position, item), spans in zip(wanted, summed, strict=True)]


def _model_at(loaded: LoadedModel, point: ScoredPoint, allow_pickle: bool) -> AbstractContextManager[LoadedModel]:
    """The model with the point's LoRA weights (the adapter's own come back after)."""
    if point.adapter_dir is None:
        return nullcontext(loaded)
    return checkpoint_weights(loaded, point.adapter_dir, allow_pickle=allow_pickle)


def _add_weighted(total: list[SpanBlame] | None, spans: Sequence[SpanBlame], weight: float) -> list[SpanBlame]:
    """``total`` plus ``weight`` x ``spans``; the sentences are the same at every point (cut from the text alone)."""
    if total is None:
        return [dataclasses.replace(span, blame=weight * span.blame) for span in spans]
    if [(s.message_index, s.char_start) for s in total] != [(s.message_index, s.char_start) for s in spans]:
        raise GradianError("an example's sentences differ between two points of the run",
                           "report this with the gradian doctor output")
    return [dataclasses.replace(old, blame=old.blame + weight * new.blame) for old, new in zip(total, spans, strict=True)]
