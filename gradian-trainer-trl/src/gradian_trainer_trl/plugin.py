"""Entry point of gradian-trainer-trl: registers the `trl` backend without importing trl."""

from __future__ import annotations

import importlib.metadata

import gradian
from gradian.records import TrainerSpec


def _available() -> str | None:
    try:
        importlib.metadata.version("trl")  # metadata only: checking must not import it
    except importlib.metadata.PackageNotFoundError:
        return "trl is not installed (pip install gradian-trainer-trl)"
    return None


@gradian.hookimpl
def gradian_trainers():
    """trl's SFTTrainer, fed gradian's pre-encoded data, with a mask-equality check at start."""
    yield TrainerSpec(
        name="trl",
        summary="trl SFTTrainer on gradian's pre-encoded data; refuses if trl's mask differs",
        load="gradian_trainer_trl.backend:TRLTrainer",
        requires=("gradian-trainer-trl", "trl"),
        available=_available,
    )
