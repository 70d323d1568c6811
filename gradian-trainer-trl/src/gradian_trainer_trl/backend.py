"""The trl backend: trl's SFTTrainer on gradian's pre-encoded examples, refusing to start if trl's mask differs.

trl builds the loss mask itself during its dataset preparation (from ``completion_mask`` / ``assistant_masks``
columns, or the whole sequence when it finds neither). This backend skips that preparation and hands trl the
labels of gradian's ``encode()``; before the first step it runs trl's own dataloader and collator over the
training set and compares the labels trl would train on with gradian's mask, token by token.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gradian.errors import TrainingError
from gradian.records import TrainJob, TrainResult

MASK_COLUMNS = ("labels", "completion_mask")


class TRLTrainer:
    """LoRA fine-tuning with trl.SFTTrainer, checked against gradian's mask before it trains.

    ``mask_column`` is how the mask reaches trl: ``"labels"`` (the default) passes gradian's labels and skips
    trl's dataset preparation; ``"completion_mask"`` passes a 0/1 column and lets trl build the labels, which
    matches gradian's mask only when trl is told ``completion_only_loss=True``. ``sft_overrides`` are extra
    SFTConfig arguments; whatever they change, the mask check decides whether training may start.
    """

    name = "trl"

    def __init__(self, sft_overrides: Mapping[str, Any] | None = None, mask_column: str = "labels") -> None:
        if mask_column not in MASK_COLUMNS:
            raise ValueError(f"mask_column must be one of {MASK_COLUMNS}, not {mask_column!r}")
        self.sft_overrides = dict(sft_overrides or {})
        self.mask_column = mask_column

    def train(self, job: TrainJob) -> TrainResult:
        """Train ``job`` and write ``<job.out>/adapter`` and ``<job.out>/run``; TrainingError if the masks differ."""
        from gradian.model.base import load_base_model
        from gradian.training.data import encode_training_set
        from gradian.training.output import finish_run, job_layout

        started = time.monotonic()
        staged = job_layout(job)
        model, tokenizer = load_base_model(job.base_model, dtype=job.dtype, device=job.device,
                                           trust_remote_code=job.trust_remote_code)
        encoded = encode_training_set(job, tokenizer)
        trainer = self.build(job, model, tokenizer, encoded, staged.run_dir)
        check_trl_mask(trainer, encoded)
        trainer.train()
        return finish_run(trainer, staged, backend=self.name, started=started, notes=encoded.notes())

    def build(self, job: TrainJob, model: Any, tokenizer: Any, encoded: Any, run_dir: Any) -> Any:
        """An SFTTrainer over the encoded examples (LoRA attached the same way as the hf backend)."""
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        from gradian.model.placement import resolve_placement
        from gradian.training.arguments import attach_lora, base_model_label, trainer_arguments

        train = job.config.train
        columns: dict[str, list[list[int]]] = {"input_ids": [list(e.input_ids) for e in encoded.examples]}
        if self.mask_column == "labels":
            columns["labels"] = [list(e.labels) for e in encoded.examples]
        else:
            columns["completion_mask"] = [[int(label != -100) for label in e.labels] for e in encoded.examples]
        arguments = {
            **trainer_arguments(train, run_dir, len(encoded), resolve_placement(job.device, job.dtype)),
            "per_device_eval_batch_size": train.batch_size,  # the mask check reads batches of the training size
            "max_length": train.max_seq_length,
            "packing": False,
            "padding_free": False,
            "assistant_only_loss": False,
            # With gradian's labels present trl has nothing to prepare; skipping it also skips its re-truncation
            # and its silent dropping of fully masked rows.
            "dataset_kwargs": {"skip_prepare_dataset": True} if self.mask_column == "labels" else None,
            **self.sft_overrides,
        }
        return SFTTrainer(
            model=attach_lora(model, train, base_model_label(job.base_model)),
            args=SFTConfig(**arguments),
            train_dataset=Dataset.from_dict(columns),
            processing_class=tokenizer,
        )


def check_trl_mask(trainer: Any, encoded: Any) -> None:
    """Refuse (TrainingError) unless trl's collated labels equal gradian's mask for every training example."""
    import torch

    dataset = trainer.train_dataset
    if len(dataset) != len(encoded):
        raise TrainingError(
            f"trl would train on {len(dataset)} examples where gradian encoded {len(encoded)}",
            "trl's dataset preparation dropped or added rows; keep skip_prepare_dataset on (the backend default) or use --backend hf",
        )
    differing: list[str] = []
    first = ""
    position = 0
    # trl's own dataloader (sequential, same collator and column handling as training); the RNG is restored
    # afterwards so the check never shifts the training run's shuffling or LoRA dropout.
    with torch.random.fork_rng(devices=[]):
        for batch in trainer.get_eval_dataloader(dataset):
            input_ids, labels = batch["input_ids"].cpu(), batch["labels"].cpu()
            rows = encoded.examples[position:position + len(labels)]
            if labels.dim() != 2 or len(rows) != labels.shape[0]:
                raise TrainingError(
                    f"trl collates batches of shape {tuple(labels.shape)} where gradian expects {len(rows)} padded rows",
                    "padding-free or packed batches cannot be compared with gradian's mask; turn packing and padding_free off",
                )
            for row, example in enumerate(rows):
                problem = _row_difference(example, input_ids[row].tolist(), labels[row].tolist())
                if problem:
                    differing.append(example.id)
                    first = first or f"{example.id}: {problem}"
            position += len(rows)
    if differing:
        raise TrainingError(
            f"trl would train on a different loss mask than gradian's encode() in {len(differing)} of "
            f"{len(encoded)} examples (first: {first})",
            "attribution would then explain gradients training never produced; let this backend feed gradian's "
            "labels with skip_prepare_dataset (its default), or use --backend hf",
        )


def _row_difference(example: Any, trl_ids: list[int], trl_labels: list[int]) -> str:
    """Why trl's collated row differs from gradian's encoding of the example, or "" when it does not."""
    n = len(example.input_ids)
    if len(trl_ids) < n or trl_ids[:n] != list(example.input_ids):
        return "trl's input ids differ from gradian's (re-tokenized or truncated)"
    if any(label != -100 for label in trl_labels[n:]):
        return "trl supervises padding"
    # Position 0 never enters the loss (nothing predicts it), so only labels 1..n-1 are compared.
    ours = [label != -100 for label in example.labels[1:n]]
    theirs = [label != -100 for label in trl_labels[1:n]]
    if ours == theirs and list(example.labels[1:n]) == trl_labels[1:n]:
        return ""
    extra = sum(t and not o for o, t in zip(ours, theirs, strict=True))
    missing = sum(o and not t for o, t in zip(ours, theirs, strict=True))
    return f"trl supervises {sum(theirs)} tokens, gradian {sum(ours)} ({extra} extra, {missing} missing)"
