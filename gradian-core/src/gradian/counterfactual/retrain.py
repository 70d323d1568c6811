"""Training the models a check compares, through `gradian train`'s backends, reusing identical earlier runs.

Each model goes to ``<dir>/adapter`` and ``<dir>/run`` (the `gradian train` layout); ``gradian.training.reuse``
keeps the key of a finished one, so an interrupted verify resumes at the first model it had not finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gradian.config import GradianConfig
from gradian.model.placement import Placement, resolve_placement
from gradian.pipelines.train import make_job, run_training
from gradian.training.reuse import train_or_reuse


@dataclass(frozen=True)
class TrainedModel:
    """One trained (or reused) adapter of a check and how it was made."""

    name: str
    adapter_dir: Path
    run_dir: Path
    dropped: int
    steps: int
    final_loss: float | None
    seconds: float
    backend: str
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for verify.json / inject.json."""
        data = asdict(self)
        data["adapter_dir"], data["run_dir"] = str(self.adapter_dir), str(self.run_dir)
        return data


def train_model(name: str, directory: Path, *, base_model: str, dataset: Path, config: GradianConfig,
                drop_ids: Iterable[str] = (), backend: str = "hf", trust_remote_code: bool = False,
                placement: Placement | None = None) -> TrainedModel:
    """Train ``dataset`` minus ``drop_ids`` into ``directory``, or reuse the model an identical earlier run left there."""
    placement = placement or resolve_placement()
    drop = tuple(sorted(set(drop_ids)))
    job = make_job(base_model, dataset, directory, config, drop_ids=drop, trust_remote_code=trust_remote_code,
                   device=placement.device, dtype=placement.dtype)
    trained = train_or_reuse(job, backend, lambda job, backend: run_training(job, backend, overwrite=True))
    result = trained.result
    return TrainedModel(name=name, adapter_dir=result.adapter_dir, run_dir=result.run_dir, dropped=len(drop),
                        steps=int(result.steps), final_loss=result.final_loss, seconds=round(result.seconds, 3),
                        backend=result.backend, reused=trained.reused)
