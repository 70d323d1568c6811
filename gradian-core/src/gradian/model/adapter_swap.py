"""Another checkpoint of the same adapter, or the base point, swapped into an already loaded model: no second base."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.errors import ModelError
from gradian.model.adapter_dir import adapter_files_hash, inspect_adapter_dir, read_adapter_tensors
from gradian.model.loaded import LoadedModel

if TYPE_CHECKING:
    import torch

_DORA_MAGNITUDE = ".lora_magnitude_vector"  # a DoRA adapter's per-output scale, in its state dict keys


def checkpoint_hash(directory: Path, *, allow_pickle: bool = False) -> str:
    """The adapter hash a checkpoint directory would load with (weights and config), without loading it."""
    return adapter_files_hash(inspect_adapter_dir(directory, allow_pickle=allow_pickle))


@contextmanager
def checkpoint_weights(loaded: LoadedModel, directory: Path, *, allow_pickle: bool = False) -> Iterator[LoadedModel]:
    """``loaded`` with the LoRA weights of the checkpoint in ``directory``; the adapter's own weights come back after.

    The checkpoint must hold the same adapter (the same LoRA tensors, the same shapes), as every checkpoint of one
    run does; its tensors are copied into the live ones, so no second base model is loaded.
    """
    files = inspect_adapter_dir(directory, allow_pickle=allow_pickle)
    saved = {key: tensor for key, tensor in read_adapter_tensors(files).items() if ".lora_" in key}
    live = _live_lora_tensors(loaded)
    _check_same_adapter(saved, live, directory, loaded.adapter_dir)
    with _swapped(loaded, live, saved, files.directory, adapter_files_hash(files)) as view:
        yield view


@contextmanager
def base_point_weights(loaded: LoadedModel) -> Iterator[LoadedModel]:
    """``loaded`` with every LoRA B matrix zeroed: the base model's outputs, before any training step.

    B A x = 0, so the model computes the base model; a block's gradient there is dL/dB = dL/dW A^T (and
    dL/dA = B^T dL/dW = 0), the base model's weight gradient seen through the subspace the adapter's A picked.
    """
    if loaded.adapter_hash is None:
        raise ModelError("the base point needs an adapter: it zeroes the adapter's B matrices",
                         "pass --adapter, or set attribution.base_point: 0")
    live = _live_lora_tensors(loaded)
    if any(_DORA_MAGNITUDE in key for key in live):  # DoRA rescales the base weight: zero B is not the base model
        raise ModelError("the base point is not defined for a DoRA adapter (its magnitude vector rescales the base "
                         "weights even with B at zero)", "set attribution.base_point: 0")
    zeroed = {key: tensor.new_zeros(tensor.shape) if _is_b_matrix(key) else tensor for key, tensor in live.items()}
    with _swapped(loaded, live, zeroed, loaded.adapter_dir, base_point_hash(loaded.adapter_hash)) as view:
        yield view


def base_point_hash(adapter_hash: str) -> str:
    """The hash the base point's index is kept under: the adapter's, marked (only A enters its gradients)."""
    return hashlib.sha256(f"base-point:{adapter_hash}".encode()).hexdigest()


def _is_b_matrix(key: str) -> bool:
    """A LoRA B (up-projection) tensor, of a linear or an embedding layer."""
    return ".lora_B." in key or ".lora_embedding_B" in key


def _live_lora_tensors(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """The model's LoRA tensors; state_dict tensors share storage with the parameters, so copying sets weights."""
    from peft import get_peft_model_state_dict

    return {key: tensor for key, tensor in get_peft_model_state_dict(
        loaded.model, adapter_name=loaded.adapter_name, save_embedding_layers=False).items() if ".lora_" in key}


@contextmanager
def _swapped(loaded: LoadedModel, live: dict[str, torch.Tensor], values: dict[str, torch.Tensor],
             adapter_dir: Path | None, adapter_hash: str) -> Iterator[LoadedModel]:
    """``loaded`` with ``values`` copied into its live LoRA tensors, seen as ``adapter_hash``; the originals after."""
    import torch  # here, not at the top: checkpoint_hash is used while choosing checkpoints, before torch is needed

    original = {key: tensor.detach().clone() for key, tensor in live.items()}
    try:
        with torch.no_grad():
            for key, tensor in live.items():
                tensor.copy_(values[key].to(device=tensor.device, dtype=tensor.dtype))
        yield LoadedModel(model=loaded.model, tokenizer=loaded.tokenizer, base_model_name=loaded.base_model_name,
                          adapter_dir=adapter_dir, adapter_hash=adapter_hash,
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
