"""Entry point of gradian-trainer-trl: registers the `trl` backend without importing trl."""

from __future__ import annotations

import gradian
from gradian.records import TrainerSpec


@gradian.hookimpl
def gradian_trainers():
    """trl's SFTTrainer, fed gradian's pre-encoded data, with a mask-equality check at start."""
    yield TrainerSpec(
        name="trl",
        summary="trl SFTTrainer on gradian's pre-encoded data; refuses if trl's mask differs",
        load="gradian_trainer_trl.backend:TRLTrainer",
        requires=("gradian-trainer-trl", "trl"),
    )
