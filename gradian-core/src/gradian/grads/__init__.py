"""Per-example LoRA gradients: batches, the supervised-token loss, hook capture and factored projection.

Submodules import torch; this package resolves its public names lazily so importing it stays cheap.
"""

from __future__ import annotations

from gradian.records import lazy_exports

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


__getattr__ = lazy_exports("gradian.grads", _LAZY)
