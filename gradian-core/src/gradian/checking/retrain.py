"""Training the models a check compares, through `gradian train`'s backends, reusing identical earlier runs.

Each model goes to ``<dir>/adapter`` and ``<dir>/run`` (the `gradian train` layout). A finished model's key
(base model, dataset bytes, dropped ids, the ``train`` config section, backend) is written last to
``<dir>/gradian-check.json``; a rerun with the same key reuses it instead of training again, so an interrupted
verify resumes at the first model it had not finished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gradian.model.placement import Placement

MARKER = "gradian-check.json"


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


def train_key(*, base_model: str, dataset_sha256: str, drop_ids: Iterable[str], config: Any, backend: str,
              placement: Placement | None = None) -> str:
    """The hash that says two training runs would produce the same adapter."""
    from gradian import __version__
    from gradian.model.placement import resolve_placement

    placement = placement or resolve_placement()
    payload = {"base_model": base_model, "dataset_sha256": dataset_sha256, "drop_ids": sorted(drop_ids),
               "train": config.to_dict()["train"], "backend": backend, "gradian": __version__,
               "compute": placement.to_dict()}  # a bfloat16 or GPU run trains another adapter
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def train_model(name: str, directory: Path, *, base_model: str, dataset: Path, dataset_sha256: str, config: Any,
                drop_ids: Iterable[str] = (), backend: str = "hf", trust_remote_code: bool = False,
                placement: Placement | None = None) -> TrainedModel:
    """Train ``dataset`` minus ``drop_ids`` into ``directory``, or reuse the model an identical earlier run left there."""
    from gradian.atomic_files import write_atomic
    from gradian.model.placement import resolve_placement
    from gradian.train import make_job, run_training

    placement = placement or resolve_placement()
    drop = tuple(sorted(set(drop_ids)))
    key = train_key(base_model=base_model, dataset_sha256=dataset_sha256, drop_ids=drop, config=config, backend=backend,
                    placement=placement)
    reused = _reusable(directory, key)
    if reused is not None:
        return reused
    job = make_job(base_model, dataset, directory, config, drop_ids=drop, trust_remote_code=trust_remote_code,
                   device=placement.device, dtype=placement.dtype)
    result = run_training(job, backend, overwrite=True)  # anything here without a matching key is stale
    model = TrainedModel(name=name, adapter_dir=result.adapter_dir, run_dir=result.run_dir, dropped=len(drop),
                         steps=int(result.steps), final_loss=result.final_loss, seconds=round(result.seconds, 3),
                         backend=result.backend)
    record = {"key": key, "model": model.to_dict()}
    write_atomic(directory / MARKER, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    return model


def _reusable(directory: Path, key: str) -> TrainedModel | None:
    marker = directory / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        if record.get("key") != key:
            return None
        data = dict(record["model"])
        model = TrainedModel(**{**data, "adapter_dir": Path(data["adapter_dir"]), "run_dir": Path(data["run_dir"]),
                                "reused": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged marker: train again
    if not (model.adapter_dir / "adapter_config.json").is_file():
        return None
    return model
