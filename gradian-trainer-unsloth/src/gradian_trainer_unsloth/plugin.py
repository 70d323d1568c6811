"""Entry point of gradian-trainer-unsloth: registers the GPU-only `unsloth` backend.

This module never imports unsloth: unsloth patches transformers, peft and torch globally, so the
backend runs in a process of its own that imports unsloth first.
"""

from __future__ import annotations

import gradian
from gradian.records import TrainerSpec


def _has_gpu() -> str | None:
    """The one thing ``requires`` cannot say: unsloth runs on a CUDA GPU only."""
    import torch  # imported on use: listing plugins must stay light

    return None if torch.cuda.is_available() else "unsloth needs a CUDA GPU and none is visible"


@gradian.hookimpl
def gradian_trainers():
    """unsloth's FastLanguageModel, run in its own process; GPU only."""
    yield TrainerSpec(
        name="unsloth",
        summary="unsloth FastLanguageModel in a separate process (GPU only)",
        load="gradian_trainer_unsloth.backend:UnslothTrainer",
        requires=("gradian-trainer-unsloth", "unsloth"),
        available=_has_gpu,
    )
