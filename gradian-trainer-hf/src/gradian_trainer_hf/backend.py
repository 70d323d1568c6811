"""The hf backend: transformers.Trainer on examples pre-encoded by gradian's encode(), the mask attribution uses."""

from __future__ import annotations

import time

from gradian.records import TrainJob, TrainResult


class HFTrainer:
    """LoRA fine-tuning with transformers.Trainer; deterministic on CPU for a given train.seed."""

    name = "hf"

    def train(self, job: TrainJob) -> TrainResult:
        """Train ``job`` and write ``<job.out>/adapter`` and ``<job.out>/run``."""
        from transformers import Trainer, TrainingArguments

        from gradian.model.base import load_base_model
        from gradian.model.placement import resolve_placement
        from gradian.training.arguments import attach_lora, base_model_label, trainer_arguments
        from gradian.training.data import EncodedDataset, PaddingCollator, encode_training_set
        from gradian.training.output import finish_run, job_layout

        started = time.monotonic()
        staged = job_layout(job)
        train = job.config.train
        placement = resolve_placement(job.device, job.dtype)
        model, tokenizer = load_base_model(job.base_model, dtype=placement.dtype, device=placement.device,
                                           trust_remote_code=job.trust_remote_code)
        encoded = encode_training_set(job, tokenizer)
        args = TrainingArguments(**trainer_arguments(train, staged.run_dir, len(encoded), placement))
        trainer = Trainer(
            model=attach_lora(model, train, base_model_label(job.base_model)),
            args=args,
            train_dataset=EncodedDataset(encoded),
            data_collator=PaddingCollator(tokenizer.pad_token_id),
            processing_class=tokenizer,
        )
        trainer.train()
        return finish_run(trainer, staged, backend=self.name, started=started, notes=encoded.notes())
