"""Entry point of gradian-trainer-hf: registers the default `hf` backend."""

from __future__ import annotations

import importlib.metadata

import gradian
from gradian.records import TrainerSpec


def _available() -> str | None:
    try:
        importlib.metadata.version("transformers")  # metadata only: checking must not import it
    except importlib.metadata.PackageNotFoundError:
        return "transformers is not installed"
    return None


@gradian.hookimpl
def gradian_trainers():
    """The transformers.Trainer backend."""
    yield TrainerSpec(
        name="hf",
        summary="transformers.Trainer on data pre-encoded by gradian's encode() (the default)",
        load="gradian_trainer_hf.backend:HFTrainer",
        requires=("gradian-trainer-hf", "transformers"),
        available=_available,
    )
