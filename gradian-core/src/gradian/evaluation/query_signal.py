"""Which query signal a metric allows: `auto` resolved, a signal that contrasts with generated text refused with `loglik`."""

from __future__ import annotations

from dataclasses import dataclass

from gradian.errors import EvaluationError
from gradian.evaluation.metrics import get_metric
from gradian.query.signals import PAIRED as PAIRED_SIGNALS
from gradian.query.signals import SIGNALS

QUERY_SIGNALS = (*SIGNALS, "auto")

LOGLIK_AUTO_NOTE = (
    "evaluation.query_signal is auto and evaluation.metric is loglik, which generates no text to contrast with, "
    "so the classic query signal (gradient of the wanted answer's loss) was used. For a substitution failure the "
    "classic signal is dominated by answer format and can invert the diagnosis; use a text metric "
    "(exact_match, contains or token_f1) with query_signal auto or contrastive."
)


@dataclass(frozen=True)
class QuerySignalChoice:
    """The query signal asked for, the one that will be used, and a note for the report when they differ."""

    requested: str
    effective: str
    note: str | None = None
    whole_answer_items: tuple[str, ...] = ()  # under divergent-token: queried with their whole shared answer

    def to_dict(self) -> dict[str, object]:
        """As reports write it: the items queried whole only where there are some."""
        out: dict[str, object] = {"requested": self.requested, "effective": self.effective, "note": self.note}
        return out | ({"whole_answer_items": list(self.whole_answer_items)} if self.whole_answer_items else {})


def validate_query_signal(metric: str, query_signal: str) -> QuerySignalChoice:
    """Resolve `auto` for this metric and refuse `contrastive` with a metric that generates no text."""
    text_metric = get_metric(metric).generates_text
    if query_signal not in QUERY_SIGNALS:
        raise EvaluationError(
            f"unknown query signal {query_signal!r}",
            "set evaluation.query_signal to one of " + ", ".join(QUERY_SIGNALS),
        )
    if query_signal in PAIRED_SIGNALS and not text_metric:
        raise EvaluationError(
            f"evaluation.query_signal {query_signal} needs generated text, and evaluation.metric {metric} generates none",
            f"use a text metric (exact_match, contains, token_f1) with {query_signal}, or query_signal auto or classic",
        )
    if query_signal == "auto":
        if text_metric:
            # ranked the planted rows best with margin on SmolLM2, and unlike margin also on tiny models
            # (bench/results/query_signals.md)
            return QuerySignalChoice(requested="auto", effective="divergent-token")
        return QuerySignalChoice(requested="auto", effective="classic", note=LOGLIK_AUTO_NOTE)
    return QuerySignalChoice(requested=query_signal, effective=query_signal)
