"""Training that reuses the adapter an identical earlier run left in the same output directory.

A finished run's key (everything that changes the adapter) and its headline numbers are written last, atomically,
to ``<out>/gradian-train-key.json``. The key file is deleted before a run starts, so a run interrupted anywhere,
even between publishing ``run/`` and ``adapter/``, leaves no key and trains again; a rerun with the same key reuses
the adapter, so an interrupted verify or demo resumes at the first model it had not finished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian import __version__
from gradian.atomic_files import sha256_file, write_atomic
from gradian.data.loss_mask import concrete_encoding
from gradian.data.readers import directory_sha256
from gradian.model.base import resolve_base_model
from gradian.model.placement import Placement
from gradian.records import TrainJob, TrainResult
from gradian.training.output import ADAPTER_DIR, ADAPTER_FILES, RUN_DIR

KEY_FILE = "gradian-train-key.json"
# Base-model files above this size (the weights) are known by name and size: hashing gigabytes on every check
# would cost more than many trainings it saves. Config, tokenizer and chat template are hashed whole.
HASHED_FILE_LIMIT = 16 * 1024 * 1024

# Runs the job with the named backend, replacing whatever is in job.out (nothing there matches a key any more).
Train = Callable[[TrainJob, str], TrainResult]


@dataclass(frozen=True)
class Training:
    """A job's result in its output dir, and whether an identical earlier run left it there."""

    result: TrainResult
    reused: bool


def adapter_key(job: TrainJob, backend: str) -> dict[str, Any]:
    """Everything that changes the adapter ``job`` trains with ``backend``, as JSON-ready data."""
    return {
        "gradian": __version__,
        "backend": backend,
        "base_model": base_model_identity(job.base_model),
        "datasets": [_data_sha256(Path(path)) for path in (job.dataset, *job.extra_datasets)],
        "drop_ids": sorted(job.drop_ids),
        "train": job.config.to_dict()["train"],  # the seed, learning rate, LoRA shape and schedule
        "encoding": concrete_encoding(job.config.grads),  # the loss mask and pair rendering training encodes with
        "compute": Placement(job.device, job.dtype).to_dict(),  # a bfloat16 or GPU run trains another adapter
    }


def train_or_reuse(job: TrainJob, backend: str, train: Train) -> Training:
    """The adapter an identical earlier run left in ``job.out``, else ``train(job, backend)``'s, recorded for reuse."""
    key = adapter_key(job, backend)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()
    key_path = Path(job.out) / KEY_FILE
    finished = _finished(key_path, digest)
    if finished is not None:
        return Training(finished, reused=True)
    key_path.unlink(missing_ok=True)  # from here on nothing in job.out matches a key
    result = train(job, backend)
    record = {"key": digest, "inputs": key, "result": {"final_loss": result.final_loss, "steps": int(result.steps),
                                                        "seconds": result.seconds, "backend": result.backend,
                                                        "notes": list(result.notes)}}
    write_atomic(key_path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return Training(result, reused=False)


def base_model_identity(name: str) -> dict[str, Any]:
    """The base model as its name and its directory's files: hashed whole up to HASHED_FILE_LIMIT, else sized."""
    files = {}
    for path in sorted(p for p in resolve_base_model(name).iterdir() if p.is_file()):
        size = path.stat().st_size
        files[path.name] = sha256_file(path) if size <= HASHED_FILE_LIMIT else f"{size} bytes"
    return {"name": name, "files": files}


def _data_sha256(path: Path) -> str:
    """sha256 of a dataset's bytes (every file of a save_to_disk directory), as loading records it."""
    return directory_sha256(path) if path.is_dir() else sha256_file(path)


def _finished(key_path: Path, digest: str) -> TrainResult | None:
    """The result recorded with ``digest``, when its adapter and run dir are all there; else None."""
    out = key_path.parent
    try:
        record = json.loads(key_path.read_text(encoding="utf-8"))
        if record.get("key") != digest:
            return None
        data = record["result"]
        # The dirs come from where the key file is, not from the record, so a moved work dir is still reused.
        result = TrainResult(adapter_dir=out / ADAPTER_DIR, run_dir=out / RUN_DIR, final_loss=data["final_loss"],
                             steps=int(data["steps"]), seconds=float(data["seconds"]), backend=str(data["backend"]),
                             notes=tuple(data.get("notes") or ()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no key file, or a damaged one: train again
    if not all((result.adapter_dir / name).is_file() for name in ADAPTER_FILES) or not result.run_dir.is_dir():
        return None
    return result
