"""Entry point of gradian-trainer-hf: registers the default `hf` backend."""

from __future__ import annotations

import gradian
from gradian.records import TrainerSpec


@gradian.hookimpl
def gradian_trainers():
    """The transformers.Trainer backend."""
    yield TrainerSpec(
        name="hf",
        summary="transformers.Trainer on data pre-encoded by gradian's encode() (the default)",
        load="gradian_trainer_hf.backend:HFTrainer",
        requires=("gradian-trainer-hf", "transformers"),
    )
