"""Per-example LoRA gradients: batches, the supervised-token loss, hook capture and factored projection.

Submodules import torch; this package resolves its public names lazily so importing it stays cheap.
"""

from __future__ import annotations

from typing import Any

from gradian.records import load_object

_LAZY = {
    "Batch": "gradian.grads.batch:Batch",
    "collate": "gradian.grads.batch:collate",
    "restrict_labels": "gradian.grads.batch:restrict_labels",
    "IGNORE_INDEX": "gradian.grads.batch:IGNORE_INDEX",
    "supervised_loss": "gradian.grads.loss:supervised_loss",
    "SupervisedLoss": "gradian.grads.loss:SupervisedLoss",
    "GradientCapture": "gradian.grads.capture:GradientCapture",
    "CapturedBatch": "gradian.grads.capture:CapturedBatch",
    "LayoutEntry": "gradian.grads.capture:LayoutEntry",
    "ProjectionPlan": "gradian.grads.projection:ProjectionPlan",
    "plan_projection": "gradian.grads.projection:plan_projection",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return load_object(_LAZY[name])
    raise AttributeError(f"module 'gradian.grads' has no attribute {name!r}")
