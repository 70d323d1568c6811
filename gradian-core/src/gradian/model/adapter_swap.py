"""Another checkpoint of the same adapter, swapped into an already loaded model: no second copy of the base."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.errors import ModelError
from gradian.model.adapter_dir import adapter_files_hash, inspect_adapter_dir, read_adapter_tensors
from gradian.model.loaded import LoadedModel

if TYPE_CHECKING:
    import torch


def checkpoint_hash(directory: Path, *, allow_pickle: bool = False) -> str:
    """The adapter hash a checkpoint directory would load with (weights and config), without loading it."""
    return adapter_files_hash(inspect_adapter_dir(directory, allow_pickle=allow_pickle))


@contextmanager
def checkpoint_weights(loaded: LoadedModel, directory: Path, *, allow_pickle: bool = False) -> Iterator[LoadedModel]:
    """``loaded`` with the LoRA weights of the checkpoint in ``directory``; the adapter's own weights come back after.

    The checkpoint must hold the same adapter (the same LoRA tensors, the same shapes), as every checkpoint of one
    run does; its tensors are copied into the live ones, so no second base model is loaded.
    """
    import torch  # here, not at the top: checkpoint_hash is used while choosing checkpoints, before torch is needed
    from peft import get_peft_model_state_dict

    files = inspect_adapter_dir(directory, allow_pickle=allow_pickle)
    saved = {key: tensor for key, tensor in read_adapter_tensors(files).items() if ".lora_" in key}
    # state_dict tensors share storage with the parameters, so copying into them sets the weights
    live = {key: tensor for key, tensor in get_peft_model_state_dict(
        loaded.model, adapter_name=loaded.adapter_name, save_embedding_layers=False).items() if ".lora_" in key}
    _check_same_adapter(saved, live, directory, loaded.adapter_dir)
    original = {key: tensor.detach().clone() for key, tensor in live.items()}
    try:
        with torch.no_grad():
            for key, tensor in live.items():
                tensor.copy_(saved[key].to(device=tensor.device, dtype=tensor.dtype))
        yield LoadedModel(model=loaded.model, tokenizer=loaded.tokenizer, base_model_name=loaded.base_model_name,
                          adapter_dir=files.directory, adapter_hash=adapter_files_hash(files),
                          base_model_hash=loaded.base_model_hash, adapter_name=loaded.adapter_name,
                          quantized_training_base=loaded.quantized_training_base,
                          tokenizer_choice=loaded.tokenizer_choice)
    finally:
        with torch.no_grad():
            for key, tensor in live.items():
                tensor.copy_(original[key])


def _check_same_adapter(saved: dict[str, torch.Tensor], live: dict[str, torch.Tensor], directory: Path,
                        adapter: Path | None) -> None:
    """Refuse a checkpoint whose LoRA tensors are not the loaded adapter's (another rank, other target modules)."""
    missing = sorted(set(live) - set(saved))
    extra = sorted(set(saved) - set(live))
    shaped = sorted(key for key in set(live) & set(saved) if tuple(live[key].shape) != tuple(saved[key].shape))
    problem = (f"lacks {missing[0]}" if missing else f"has {extra[0]}, which the adapter lacks" if extra
               else f"holds {shaped[0]} in shape {tuple(saved[shaped[0]].shape)}, not {tuple(live[shaped[0]].shape)}"
               if shaped else None)
    if problem is not None:
        raise ModelError(f"checkpoint {directory} is not a checkpoint of the adapter {adapter or 'loaded'}: it {problem}",
                         "pass the --run the adapter was trained in, or set attribution.checkpoints: 1 to score "
                         "the adapter alone")
