"""Entry point of gradian-trainer-unsloth: registers the GPU-only `unsloth` backend.

This module never imports unsloth: unsloth patches transformers, peft and torch globally, so the
backend runs in a process of its own that imports unsloth first.
"""

from __future__ import annotations

import importlib.metadata

import gradian
from gradian.records import TrainerSpec


def _available() -> str | None:
    import torch  # imported on use: listing plugins must stay light

    if not torch.cuda.is_available():
        return "unsloth needs a CUDA GPU and none is visible"
    try:
        importlib.metadata.version("unsloth")  # metadata only: never import unsloth here
    except importlib.metadata.PackageNotFoundError:
        return "unsloth is not installed (pip install 'gradian-trainer-unsloth[unsloth]')"
    return None


@gradian.hookimpl
def gradian_trainers():
    """unsloth's FastLanguageModel, run in its own process; GPU only."""
    yield TrainerSpec(
        name="unsloth",
        summary="unsloth FastLanguageModel in a separate process (GPU only)",
        load="gradian_trainer_unsloth.backend:UnslothTrainer",
        requires=("gradian-trainer-unsloth", "unsloth"),
        available=_available,
    )
