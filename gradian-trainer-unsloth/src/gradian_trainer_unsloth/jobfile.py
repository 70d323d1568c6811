"""The JSON files between the unsloth backend and its worker process: the job going in, the result coming out.

Standard library and gradian only, so the calling process can write a job without importing unsloth.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.pipelines.train import job_from_dict, job_to_dict
from gradian.records import TrainJob
from gradian.training.data import EncodedExample, EncodedSet

JOB_FILE = "unsloth-job.json"
RESULT_FILE = "unsloth-result.json"
ERROR_FILE = "unsloth-error.json"


@dataclass(frozen=True)
class WorkerJob:
    """Everything the worker needs: the job (``out`` = the staging dir), the resolved model and the encoded data."""

    job: TrainJob
    model_dir: Path  # local directory of the base model, resolved by the caller (embedded alias included)
    base_model_label: str  # what adapter_config.json records as the base model
    pad_token_id: int  # of gradian's tokenizer, the one the examples were encoded with
    encoded: EncodedSet


def worker_job_to_dict(work: WorkerJob) -> dict[str, Any]:
    """A WorkerJob as JSON-able data."""
    return {
        "job": job_to_dict(work.job),
        "model_dir": str(work.model_dir),
        "base_model_label": work.base_model_label,
        "pad_token_id": work.pad_token_id,
        "encoded": {
            "examples": [
                {"id": e.id, "input_ids": list(e.input_ids), "labels": list(e.labels)} for e in work.encoded.examples
            ],
            "dropped_ids": list(work.encoded.dropped_ids),
            "unsupervised_ids": list(work.encoded.unsupervised_ids),
        },
    }


def worker_job_from_dict(data: dict[str, Any]) -> WorkerJob:
    """The WorkerJob ``worker_job_to_dict`` wrote."""
    encoded = data["encoded"]
    return WorkerJob(
        job=job_from_dict(data["job"]),
        model_dir=Path(data["model_dir"]),
        base_model_label=data["base_model_label"],
        pad_token_id=int(data["pad_token_id"]),
        encoded=EncodedSet(
            examples=tuple(
                EncodedExample(e["id"], tuple(e["input_ids"]), tuple(e["labels"])) for e in encoded["examples"]
            ),
            dropped_ids=tuple(encoded["dropped_ids"]),
            unsupervised_ids=tuple(encoded["unsupervised_ids"]),
        ),
    )


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write JSON through a temp file and a rename, so a reader never sees half a file."""
    temp = path.with_name(path.name + f".tmp-{os.getpid()}")
    temp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temp, path)
    return path


def write_worker_job(directory: Path, work: WorkerJob) -> Path:
    """Write the job file into ``directory`` and return its path."""
    return write_json(Path(directory) / JOB_FILE, worker_job_to_dict(work))


def read_worker_job(path: Path) -> WorkerJob:
    """Read a job file written by ``write_worker_job``."""
    return worker_job_from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
