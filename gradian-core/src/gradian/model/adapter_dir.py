"""A PEFT LoRA adapter directory on disk: validated, its tensor shapes read, its files hashed, its fit to a base checked."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.atomic_files import update_with_file
from gradian.errors import ModelError
from gradian.file_names import ADAPTER_CONFIG, ADAPTER_PICKLE, ADAPTER_SAFETENSORS
from gradian.model.lora_blocks import short_module_name
from gradian.user_files import absent, load_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


ADAPTER_HINT = "pass --adapter DIR, the directory your trainer saved the PEFT LoRA adapter to (it holds adapter_config.json)"

# Saved peft keys drop the adapter name: <module>.lora_A.weight, <module>.lora_embedding_A, ...
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B)\.weight$|^(?P<emb_module>.+)\.(?P<emb_kind>lora_embedding_A|lora_embedding_B)$")


@dataclass(frozen=True)
class AdapterFiles:
    """The validated files of an adapter directory."""

    directory: Path
    config: dict[str, Any]
    weights: Path
    pickled: bool

    @property
    def trained_on(self) -> str | None:
        """The base model the adapter says it was trained from (adapter_config.json base_model_name_or_path)."""
        return self.config.get("base_model_name_or_path")


def inspect_adapter_dir(adapter: str | Path, *, allow_pickle: bool = False, warn: bool = True) -> AdapterFiles:
    """Validate a LoRA adapter directory: it exists, has a LORA adapter_config.json and safe (or allowed) weights.

    An allowed pickle is announced by one UserWarning (``warn``), which the CLI prints as one line.
    """
    directory = Path(adapter).expanduser()
    if not directory.exists():
        raise ModelError(f"adapter directory {directory} {absent(directory)}", ADAPTER_HINT)
    if not directory.is_dir():
        raise ModelError(f"--adapter {directory} is a file, not an adapter directory", ADAPTER_HINT)
    config_path = directory / ADAPTER_CONFIG
    if not config_path.exists() and not config_path.is_symlink():
        raise ModelError(f"{directory} is not a PEFT adapter directory: {ADAPTER_CONFIG} is missing", ADAPTER_HINT)
    config = load_json(config_path, ADAPTER_CONFIG, ModelError, hint="re-save the adapter with peft's save_pretrained")
    if not isinstance(config, dict):
        raise ModelError(f"{config_path} is not a JSON object", "re-save the adapter with peft's save_pretrained")
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise ModelError(
            (f"{directory} holds a {config['peft_type']} PEFT adapter, not LoRA" if config.get("peft_type") else
             f"{config_path} names no peft_type, so it is not a LoRA adapter config")
            + ": Gradian attributes over the A and B matrices of LoRA layers",
            "train a LoRA adapter (peft_type LORA) and pass its directory as --adapter",
        )
    safetensors_path = directory / ADAPTER_SAFETENSORS
    pickle_path = directory / ADAPTER_PICKLE
    if safetensors_path.is_file():
        return AdapterFiles(directory, config, safetensors_path, pickled=False)
    if pickle_path.is_file():
        if not allow_pickle:
            raise ModelError(
                f"{directory} holds its weights as a pickle ({ADAPTER_PICKLE}) and no {ADAPTER_SAFETENSORS}; "
                "Gradian does not unpickle files unless asked",
                "re-save the adapter with save_pretrained(..., safe_serialization=True), or pass --allow-pickle if "
                "you trust the file (it is still read with torch.load(weights_only=True))",
            )
        if warn:
            warnings.warn(f"loading pickled adapter weights {pickle_path} (--allow-pickle) with "
                          "torch.load(weights_only=True): tensors only, no code runs; a crafted file can still "
                          "hold wrong or huge tensors", UserWarning, stacklevel=2)
        return AdapterFiles(directory, config, pickle_path, pickled=True)
    raise ModelError(
        f"no LoRA weights in {directory}: neither {ADAPTER_SAFETENSORS} nor {ADAPTER_PICKLE} is there",
        "point --adapter at the directory peft's save_pretrained wrote (a checkpoint-N/ folder also works)",
    )


def adapter_weight_shapes(files: AdapterFiles) -> dict[str, tuple[int, ...]]:
    """Shapes of the LoRA tensors in the weights file; no LoRA tensors at all is a ModelError."""
    shapes: dict[str, tuple[int, ...]] = {}
    if files.pickled:
        for key, tensor in read_adapter_tensors(files).items():
            shapes[key] = tuple(tensor.shape)
    else:
        from safetensors import safe_open

        try:
            with safe_open(str(files.weights), framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise ModelError(
                f"{files.weights} is not a readable safetensors file: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                "the file is truncated or corrupt; re-save the adapter",
            ) from exc
    lora = {key: shape for key, shape in shapes.items() if _LORA_KEY.match(key)}
    if not lora:
        raise ModelError(
            f"no LoRA weights in {files.weights}: it holds no lora_A / lora_B tensors ({len(shapes)} other tensors)",
            "point --adapter at a LoRA adapter saved by peft's save_pretrained",
        )
    return lora


def read_adapter_tensors(files: AdapterFiles) -> dict[str, torch.Tensor]:
    """Every tensor of the weights file, on CPU (pickles through torch.load(weights_only=True))."""
    import torch

    if files.pickled:
        try:
            state = torch.load(str(files.weights), map_location="cpu", weights_only=True)
        except Exception as exc:  # a weights-only unpickler refusal or a corrupt file
            raise ModelError(f"{files.weights} cannot be read as a weights-only pickle: {exc}".splitlines()[0],
                             "re-save the adapter with safe_serialization=True") from exc
        if not isinstance(state, dict):
            raise ModelError(f"{files.weights} does not hold a state dict", "re-save the adapter with save_pretrained")
        return state
    from safetensors.torch import load_file

    return load_file(str(files.weights), device="cpu")


def adapter_files_hash(files: AdapterFiles) -> str:
    """sha256 over the weights file and the adapter config, each labelled, so either changing changes the hash.

    The config is hashed in canonical form: peft keeps target_modules in a set, so the same training writes
    it in a different order from one process to the next, and that must not change the index id.
    """
    digest = hashlib.sha256()
    digest.update(f"weights:{files.weights.name}\n".encode())
    update_with_file(digest, files.weights)
    digest.update(b"config:\n" + canonical_adapter_config(files.config).encode())
    return digest.hexdigest()


def canonical_adapter_config(config: dict[str, Any]) -> str:
    """adapter_config.json as sorted JSON, with its unordered name lists sorted."""
    canonical = dict(config)
    for key in ("target_modules", "modules_to_save", "exclude_modules"):
        if isinstance(canonical.get(key), list):
            canonical[key] = sorted(canonical[key], key=str)
    return json.dumps(canonical, sort_keys=True, default=str)


def check_adapter_fits(base_model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], files: AdapterFiles,
                       base_name: str) -> None:
    """Raise a one-line ModelError naming the first LoRA tensor whose shape the base model's layer cannot take."""
    for key, shape in shapes.items():
        match = _LORA_KEY.match(key)
        if match is None:
            continue
        module_path = short_module_name(match.group("module") or match.group("emb_module"))
        kind = match.group("kind") or match.group("emb_kind")
        try:
            module = base_model.get_submodule(module_path)
        except AttributeError:
            continue  # renamed through a checkpoint key mapping; peft's loader reports what it cannot place
        expected = _expected_dim(module, kind)
        if expected is None:
            continue
        axis, size, what = expected
        if len(shape) != 2 or shape[axis] != size:
            trained_on = f" (adapter_config.json says it was trained on {files.trained_on})" if files.trained_on else ""
            raise ModelError(
                f"the adapter does not fit base model {base_name}: tensor {key} has shape {list(shape)} but "
                f"{module_path} has {what} {size}{trained_on}",
                "this is an adapter for another base model; pass the --base-model it was trained from",
            )


def _expected_dim(module: torch.nn.Module, kind: str) -> tuple[int, int, str] | None:
    """(axis, size, description) that a LoRA tensor of this kind must match on this base module, if known."""
    import torch.nn as nn

    if isinstance(module, nn.Linear):
        d_in, d_out = module.in_features, module.out_features
    elif type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:  # GPT-2 style, weight is in x out
        d_in, d_out = int(module.weight.shape[0]), int(module.weight.shape[1])
    elif isinstance(module, nn.Embedding):
        d_in, d_out = module.num_embeddings, module.embedding_dim
    else:
        return None
    if kind in ("lora_A", "lora_embedding_A"):
        return 1, d_in, "input size" if kind == "lora_A" else "vocabulary size"
    return 0, d_out, "output size" if kind == "lora_B" else "embedding size"
