"""The output layout of `gradian train`: ``<out>/adapter`` (PEFT) and ``<out>/run`` (HF run dir), published whole.

A backend writes into a staging directory inside ``<out>``; only a finished run is renamed into place, run
dir first and adapter last, so an adapter dir that exists is always complete and never half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gradian import __version__
from gradian.errors import TrainingError
from gradian.file_names import ADAPTER_CONFIG, ADAPTER_SAFETENSORS, TRAINER_STATE, TRAINING_ARGS
from gradian.records import TrainJob, TrainResult

if TYPE_CHECKING:
    from transformers import Trainer

ADAPTER_DIR = "adapter"
RUN_DIR = "run"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_SAFETENSORS)
RUN_FILES = (TRAINER_STATE, TRAINING_ARGS)
CONFIG_FILE = "gradian-train.yaml"
JOB_FILE = "gradian-job.json"


@dataclass(frozen=True)
class StagedOutput:
    """Where a backend writes while it trains, and where the result will be published."""

    out: Path
    staging: Path

    @property
    def adapter_dir(self) -> Path:
        """Staging adapter dir (standard PEFT files)."""
        return self.staging / ADAPTER_DIR

    @property
    def run_dir(self) -> Path:
        """Staging run dir (trainer_state.json, training_args.bin, checkpoint-N/, gradian-train.yaml)."""
        return self.staging / RUN_DIR


def job_layout(job: TrainJob) -> StagedOutput:
    """The adapter and run dirs a backend writes for a job (run_training points ``job.out`` at its staging dir)."""
    out = Path(job.out)
    staged = StagedOutput(out, out)
    staged.adapter_dir.mkdir(parents=True, exist_ok=True)
    staged.run_dir.mkdir(parents=True, exist_ok=True)
    return staged


def check_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse an --out that is a file, or that already holds a result unless overwriting."""
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} is a file", "pass a directory; gradian train writes adapter/ and run/ into it")
    existing = [name for name in (ADAPTER_DIR, RUN_DIR) if (out / name).exists()]
    if existing and not overwrite:
        raise TrainingError(
            f"{out} already holds {' and '.join(n + '/' for n in existing)} from an earlier run",
            "pass another --out, or --overwrite to replace it",
        )


@contextmanager
def staged_output(out: Path, overwrite: bool = False) -> Iterator[StagedOutput]:
    """A staging dir inside ``out``; on a clean exit its adapter/ and run/ replace ``out``'s, else it is deleted."""
    out = Path(out)
    check_output_dir(out, overwrite)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staged = StagedOutput(out, Path(tempfile.mkdtemp(prefix=".partial-", dir=out)))
    published = False
    try:
        staged.adapter_dir.mkdir()
        staged.run_dir.mkdir()
        yield staged
        _publish(staged)
        published = True
    finally:
        shutil.rmtree(staged.staging, ignore_errors=True)
        if created and not published and not any(out.iterdir()):
            out.rmdir()  # a failed run leaves no trace where there was none


def missing_files(staged: StagedOutput) -> list[str]:
    """The layout files a backend should have written and did not."""
    missing = [f"{ADAPTER_DIR}/{name}" for name in ADAPTER_FILES if not (staged.adapter_dir / name).is_file()]
    missing += [f"{RUN_DIR}/{name}" for name in RUN_FILES if not (staged.run_dir / name).is_file()]
    return missing


def _publish(staged: StagedOutput) -> None:
    missing = missing_files(staged)
    if missing:
        raise TrainingError(f"the training backend did not write {', '.join(missing)}", "this is a bug in the backend plugin")
    # The old adapter goes first so that a crash part-way never pairs an old adapter with a new run.
    for name in (ADAPTER_DIR, RUN_DIR):
        if (staged.out / name).exists():
            os.replace(staged.out / name, staged.staging / f"replaced-{name}")
    os.replace(staged.run_dir, staged.out / RUN_DIR)
    os.replace(staged.adapter_dir, staged.out / ADAPTER_DIR)


def final_loss(log_history: Sequence[dict[str, Any]]) -> float | None:
    """The last logged training loss (the per-step one, not the run average)."""
    for entry in reversed(list(log_history)):
        if "loss" in entry:
            return float(entry["loss"])
    return None


def finish_run(trainer: Trainer, staged: StagedOutput, *, backend: str, started: float,
               notes: Sequence[str] = ()) -> TrainResult:
    """Save a trained transformers.Trainer's adapter, state and arguments into the staging layout."""
    import torch
    from transformers.trainer import TRAINING_ARGS_NAME

    # save_embedding_layers=False: the base vocabulary is never resized, and "auto" asks the hub to make sure.
    trainer.model.save_pretrained(str(staged.adapter_dir), safe_serialization=True, save_embedding_layers=False)
    trainer.save_state()  # trainer_state.json with log_history, in args.output_dir == the run dir
    torch.save(trainer.args, staged.run_dir / TRAINING_ARGS_NAME)  # what Trainer.save_model writes
    state = trainer.state
    return TrainResult(
        adapter_dir=staged.adapter_dir,
        run_dir=staged.run_dir,
        final_loss=final_loss(state.log_history),
        steps=int(state.global_step),
        seconds=time.monotonic() - started,
        backend=backend,
        notes=tuple(notes),
    )


def write_job_files(run_dir: Path, job: TrainJob, backend: str, notes: Sequence[str]) -> None:
    """gradian-train.yaml (the config, reusable with --config) and gradian-job.json (what was trained on)."""
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(job.config.to_dict(), sort_keys=False), encoding="utf-8")
    record = {
        "gradian_version": __version__,
        "backend": backend,
        "base_model": job.base_model,
        "dataset": str(Path(job.dataset).resolve()),
        "extra_datasets": [str(Path(p).resolve()) for p in job.extra_datasets],
        "drop_ids": sorted(job.drop_ids),
        "trust_remote_code": job.trust_remote_code,
        "device": job.device,
        "dtype": job.dtype,
        "notes": list(notes),
    }
    (run_dir / JOB_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
