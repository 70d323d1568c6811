"""The unsloth worker: ``python -m gradian_trainer_unsloth.worker JOB.json``, a process of its own.

It imports unsloth before anything else (unsloth must patch transformers, peft and torch before they load),
trains with FastLanguageModel on gradian's pre-encoded examples, and writes the adapter and run dir into the
staging dir named by the job, then ``unsloth-result.json`` (or ``unsloth-error.json`` with a one-line reason).
"""

from __future__ import annotations

import unsloth  # noqa: F401  -- first, before transformers / peft / torch are imported

# isort: split

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gradian_trainer_unsloth.jobfile import ERROR_FILE, RESULT_FILE, WorkerJob, read_worker_job, write_json


def train(work: WorkerJob) -> dict[str, Any]:
    """Run the LoRA fine-tune of ``work`` with unsloth and return the result record."""
    import torch
    from transformers import Trainer, TrainingArguments
    from unsloth import FastLanguageModel, is_bfloat16_supported

    from gradian.training.arguments import trainer_arguments
    from gradian.training.data import EncodedDataset, PaddingCollator
    from gradian.training.output import finish_run, job_layout

    started = time.monotonic()
    staged = job_layout(work.job)
    train_cfg = work.job.config.train
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(work.model_dir),
        max_seq_length=train_cfg.max_seq_length,
        dtype=None,  # unsloth picks bfloat16 where the GPU has it, else float16
        load_in_4bit=False,  # a LoRA over the full-precision base, like the other backends
        trust_remote_code=work.job.trust_remote_code,
        fix_tokenizer=False,  # the examples were encoded with gradian's tokenizer; keep ids and pad as they are
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=train_cfg.lora_r,
        target_modules=list(train_cfg.target_modules),
        lora_alpha=train_cfg.lora_alpha,
        lora_dropout=train_cfg.lora_dropout,
        bias="none",
        use_gradient_checkpointing="unsloth",
        random_state=train_cfg.seed,
        use_rslora=train_cfg.use_rslora,
    )
    model.peft_config["default"].base_model_name_or_path = work.base_model_label
    on_gpu = torch.cuda.is_available()
    bf16 = on_gpu and bool(is_bfloat16_supported())
    arguments = {**trainer_arguments(train_cfg, staged.run_dir, len(work.encoded)), "bf16": bf16, "fp16": on_gpu and not bf16}
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**arguments),
        train_dataset=EncodedDataset(work.encoded),
        data_collator=PaddingCollator(work.pad_token_id),
        processing_class=tokenizer,
    )
    trainer.train()
    result = finish_run(trainer, staged, backend="unsloth", started=started, notes=work.encoded.notes())
    return {"final_loss": result.final_loss, "steps": result.steps, "seconds": result.seconds}


def main(argv: list[str] | None = None) -> int:
    """Train the job file named on the command line; exit 0 with a result file, or 1 with an error file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gradian_trainer_unsloth.worker JOB.json", file=sys.stderr)
        return 2
    job_path = Path(args[0])
    try:
        work = read_worker_job(job_path)
        write_json(job_path.parent / RESULT_FILE, train(work))
    except Exception as error:  # the calling process reports it in one line; the traceback stays on stderr
        traceback.print_exc()
        message = (f"{type(error).__name__}: {error}".splitlines() or [type(error).__name__])[0]
        write_json(job_path.parent / ERROR_FILE, {"error": message})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
