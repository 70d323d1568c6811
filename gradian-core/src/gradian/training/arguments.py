"""LoRA and transformers.Trainer arguments from the ``train`` config section, shared by every backend."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.errors import ConfigError, DeviceError
from gradian.model.placement import Placement, resolve_placement

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

    from gradian.config import TrainConfig


def planned_steps(n_examples: int, train: TrainConfig) -> int:
    """Optimizer steps the run will take, counted the way transformers.Trainer counts them."""
    if train.max_steps is not None:
        return int(train.max_steps)
    batches = math.ceil(n_examples / train.batch_size)
    per_epoch = max(batches // train.gradient_accumulation_steps + int(batches % train.gradient_accumulation_steps > 0), 1)
    return math.ceil(train.num_epochs * per_epoch)


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """Warmup as a whole number of steps (transformers 5 reads a float >= 1 as steps, so a ratio of 1.0 would be 1 step)."""
    return math.ceil(total_steps * warmup_ratio)


def check_training_placement(placement: Placement) -> None:
    """Refuse a GPU the Trainer cannot be pointed at: it trains on this process's first visible GPU (its rank's)."""
    if placement.device_type != "cuda":
        return
    rank = os.environ.get("LOCAL_RANK", "").strip() or "0"
    wanted = placement.device.split(":", 1)[1]
    if wanted != rank:
        raise DeviceError(f"training runs on cuda:{rank}, the Trainer's device in this process, not on {placement.device}",
                          f"choose the GPU with CUDA_VISIBLE_DEVICES={wanted} and pass --device cuda")


def trainer_arguments(train: TrainConfig, run_dir: Path, n_examples: int,
                      placement: Placement | None = None) -> dict[str, Any]:
    """Keyword arguments of transformers.TrainingArguments (and trl's SFTConfig) for a gradian run on ``placement``."""
    placement = placement or resolve_placement()
    total = planned_steps(n_examples, train)
    on_cpu = placement.device_type == "cpu"
    # Mixed precision only on CUDA, matching the base dtype (fp16 needs its loss scaler there); on the CPU and MPS the
    # base weights already carry the dtype and the float32 LoRA path needs no autocast.
    on_cuda = placement.device_type == "cuda"
    return {
        "output_dir": str(run_dir),
        "per_device_train_batch_size": train.batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "learning_rate": train.learning_rate,
        "weight_decay": train.weight_decay,
        "max_grad_norm": train.max_grad_norm,
        "lr_scheduler_type": train.scheduler,
        "warmup_steps": warmup_steps(total, train.warmup_ratio),
        "num_train_epochs": train.num_epochs,
        "max_steps": train.max_steps if train.max_steps is not None else -1,
        "optim": "adamw_torch",  # plain AdamW: the same update on CPU and GPU (the fused default differs by device)
        "logging_strategy": "steps",
        "logging_steps": train.logging_steps,
        # train.checkpoints evenly spaced checkpoints, the Trainer adding one at the last step: each holds the adapter
        # at that point (for scoring with gradients along the run), optimizer.pt (Adam's second moments, for the
        # adam preconditioner) and trainer_state.json, which is what run-dir readers look for.
        "save_strategy": "steps",
        "save_steps": max(1, math.ceil(total / train.checkpoints)),
        "save_total_limit": train.checkpoints,
        "eval_strategy": "no",
        "seed": train.seed,
        "data_seed": train.seed,
        # Deterministic algorithms on CPU give byte-identical adapters; on CUDA some kernels have no deterministic
        # variant and would raise, so there the seed alone applies.
        "full_determinism": on_cpu,
        "use_cpu": on_cpu,  # also keeps a machine's GPU or MPS out of a --device cpu run
        "bf16": on_cuda and placement.dtype == "bfloat16",
        "fp16": on_cuda and placement.dtype == "float16",
        _checkpointing_key(): False,  # trl's SFTConfig turns it on by default; LoRA on small models needs no recompute
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
        "report_to": "none",
    }


def _checkpointing_key() -> str:
    """transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name warns)."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def lora_config(train: TrainConfig, base_model_name: str | None = None) -> LoraConfig:
    """A peft LoraConfig from train.lora_r / lora_alpha / lora_dropout / target_modules / use_rslora."""
    from peft import LoraConfig

    return LoraConfig(
        r=train.lora_r,
        lora_alpha=train.lora_alpha,
        lora_dropout=train.lora_dropout,
        target_modules=list(train.target_modules),
        use_rslora=train.use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name,
    )


def attach_lora(model: PreTrainedModel, train: TrainConfig, base_model_name: str) -> PeftModel:
    """Wrap a base model in a fresh LoRA adapter, initialised from train.seed."""
    from peft import get_peft_model
    from transformers import set_seed

    set_seed(train.seed)  # LoRA A is drawn from the global torch generator
    if getattr(model, "config", None) is not None:
        model.config.use_cache = False  # no KV cache while training
    try:
        peft_model = get_peft_model(model, lora_config(train, base_model_name))
    except ValueError as error:
        if "target modules" in str(error).lower() or "target_modules" in str(error):
            found = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_linear(module)})
            raise ConfigError(
                f"train.target_modules {list(train.target_modules)} matches no layer of the base model",
                "its linear layers are named " + ", ".join(found[:12]),
            ) from None
        raise
    # Record the base model as the user named it, so the adapter points back at what diagnose will be given.
    peft_model.peft_config["default"].base_model_name_or_path = base_model_name
    return peft_model


def _is_linear(module: torch.nn.Module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear)


def base_model_label(base_model: str) -> str:
    """The base model as adapter_config.json records it: an absolute path for a directory, else the name given."""
    path = Path(base_model).expanduser()
    return str(path.resolve()) if path.exists() else base_model
