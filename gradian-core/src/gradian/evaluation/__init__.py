"""Evaluation: score an eval set with the adapter off and on, and the capability delta with its bootstrap CI.

Importing this package does not import torch; generation and loglik scoring import it when they run.
"""

from __future__ import annotations

from gradian.evaluation.bootstrap import DeltaInterval, paired_bootstrap
from gradian.evaluation.capability import (
    CapabilityResult,
    ItemResult,
    capability_from_scores,
    checked_eval_items,
    evaluate_capability,
    refusal_message,
)
from gradian.evaluation.generation import greedy_generate, stop_token_ids
from gradian.evaluation.loglik import answer_logliks
from gradian.evaluation.metrics import METRICS, Metric, contains, exact_match, get_metric, normalize_answer, token_f1
from gradian.evaluation.query_signal import QuerySignalChoice, validate_query_signal

__all__ = [
    "METRICS",
    "CapabilityResult",
    "DeltaInterval",
    "ItemResult",
    "Metric",
    "QuerySignalChoice",
    "answer_logliks",
    "capability_from_scores",
    "checked_eval_items",
    "contains",
    "evaluate_capability",
    "exact_match",
    "get_metric",
    "greedy_generate",
    "normalize_answer",
    "paired_bootstrap",
    "refusal_message",
    "stop_token_ids",
    "token_f1",
    "validate_query_signal",
]
