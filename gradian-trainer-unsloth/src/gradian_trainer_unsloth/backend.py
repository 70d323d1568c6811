"""The unsloth backend: encodes in the calling process, trains in a worker process that imports unsloth first.

unsloth patches transformers, peft and torch globally when it is imported, and a plain model built in a
patched process fails later in attention. So this module never imports unsloth: it writes the job and
gradian's encoded examples to a JSON file and runs ``python -m gradian_trainer_unsloth.worker JOB``, which
writes the same ``adapter/`` + ``run/`` layout as the other backends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gradian.errors import TrainingError
from gradian.records import TrainJob, TrainResult

WORKER_MODULE = "gradian_trainer_unsloth.worker"


class UnslothTrainer:
    """LoRA fine-tuning with unsloth's FastLanguageModel in a separate process (GPU only)."""

    name = "unsloth"

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable

    def train(self, job: TrainJob) -> TrainResult:
        """Encode the job here, train it in the worker process, and return what the worker wrote."""
        from gradian.model.base import load_tokenizer, resolve_base_model
        from gradian.training.arguments import base_model_label
        from gradian.training.data import encode_training_set
        from gradian.training.output import job_layout
        from gradian_trainer_unsloth.jobfile import ERROR_FILE, RESULT_FILE, WorkerJob, write_worker_job

        started = time.monotonic()
        staged = job_layout(job)
        tokenizer = load_tokenizer(job.base_model, trust_remote_code=job.trust_remote_code)
        encoded = encode_training_set(job, tokenizer)
        work = WorkerJob(
            job=job,
            model_dir=resolve_base_model(job.base_model),
            base_model_label=base_model_label(job.base_model),
            pad_token_id=int(tokenizer.pad_token_id),
            encoded=encoded,
        )
        job_path = write_worker_job(staged.staging, work)
        # The worker's progress and logs go straight to this process's stdout/stderr.
        completed = subprocess.run([self.python, "-m", WORKER_MODULE, str(job_path)], check=False)
        result_path, error_path = staged.staging / RESULT_FILE, staged.staging / ERROR_FILE
        if completed.returncode != 0 or not result_path.is_file():
            detail = "see its output above"
            if error_path.is_file():
                detail = json.loads(error_path.read_text(encoding="utf-8")).get("error", detail)
            raise TrainingError(
                f"the unsloth worker failed (exit code {completed.returncode}): {detail}",
                "gradian doctor shows whether unsloth can run here; --backend hf trains without it",
            )
        result = json.loads(result_path.read_text(encoding="utf-8"))
        return TrainResult(
            adapter_dir=staged.adapter_dir,
            run_dir=staged.run_dir,
            final_loss=result["final_loss"],
            steps=int(result["steps"]),
            seconds=time.monotonic() - started,
            backend=self.name,
            notes=encoded.notes(),
        )
