"""LoadedModel: a base model with a LoRA adapter, in eval mode, everything frozen except LoRA A and B."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.errors import ModelError
from gradian.model import base as model_base  # through the module, so a test can stand in for model loading
from gradian.model.adapter_dir import (
    AdapterFiles,
    adapter_files_hash,
    adapter_weight_shapes,
    check_adapter_fits,
    inspect_adapter_dir,
    read_adapter_tensors,
)
from gradian.model.lora_blocks import (
    LoraBlock,
    active_adapter_name,
    discover_lora_blocks,
    hookable_lora_parameters,
    lora_layers,
    short_module_name,
)
from gradian.model.placement import resolve_placement
from gradian.model.quantized import QuantizedBaseError, quantized_training_base
from gradian.runs.training_format import TokenizerChoice, apply_saved_files, tokenizer_dirs

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

UNSLOTH_ENV = "GRADIAN_ALLOW_UNSLOTH_IN_PROCESS"

UNSLOTH_MESSAGE = (
    "unsloth is imported in this process, so a plain transformers model cannot be built here: import unsloth patches "
    "transformers, peft and torch globally, and a plain model built afterwards fails later, deep in attention"
)
UNSLOTH_HINT = (
    "run attribution in a fresh process that never imports unsloth (your adapter needs nothing special); to attribute "
    "an unsloth model held in memory, pass it through gradian.model.unsloth_compat.prepare_for_gradients, wrap it in "
    f"a LoadedModel and give that to build_index; {UNSLOTH_ENV}=1 bypasses this refusal, for experiments"
)

# Config keys that say where or how a model was loaded, not what it is.
_VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash", "use_cache", "_attn_implementation",
                         "_attn_implementation_autoset", "attn_implementation")
# Name parts peft adds around the base model's own parameters.
_PEFT_NAME_PARTS = re.compile(r"\.base_layer(?=\.)|\.original_module(?=\.)")
_SAMPLES_PER_TENSOR = 1024


def require_adapter(adapter: str | Path | None, command: str = "attribute") -> Path:
    """The adapter path, or the spec's refusal when none is given (attribution differentiates adapter parameters)."""
    if adapter is None or not str(adapter).strip():
        raise ModelError(
            f"no adapter given: Gradian attributes over adapter parameters, so without one there is nothing to "
            f"differentiate, and gradian {command} refuses to run without an adapter",
            "pass --adapter DIR (a PEFT LoRA adapter directory); Gradian does not train your model, so with no "
            "adapter yet start with `gradian diagnose`, which needs only a dataset",
        )
    return Path(adapter)


def check_unsloth_absent() -> None:
    """Refuse to build a plain model in a process where unsloth has patched transformers, unless the env allows it."""
    if "unsloth" in sys.modules and os.environ.get(UNSLOTH_ENV, "") != "1":
        raise ModelError(UNSLOTH_MESSAGE, UNSLOTH_HINT)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A peft LoRA model ready for gradients: eval mode, only LoRA A/B require grad; never an optimizer step.

    Build one with ``LoadedModel.load(base_model, adapter)`` or wrap a peft model already in memory with
    ``LoadedModel(peft_model, tokenizer)``; hashes not given are computed from the model's contents.
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase | None = None
    base_model_name: str | None = None
    adapter_dir: Path | None = None
    adapter_hash: str | None = None
    base_model_hash: str | None = None
    adapter_name: str | None = None
    # The quantized checkpoint (QLoRA, unsloth -bnb-4bit) adapter_config.json says the adapter was trained on, when
    # the base loaded here is another, unquantized one; the report says so.
    quantized_training_base: str | None = None
    # Where the tokenizer and chat template came from, when loaded.
    tokenizer_choice: TokenizerChoice | None = None

    def __post_init__(self) -> None:
        if next(lora_layers(self.model), None) is None:
            configs = getattr(self.model, "peft_config", None) or {}
            kinds = sorted({str(getattr(c.peft_type, "value", c.peft_type)) for c in configs.values()})
            carried = f" (it carries a {', '.join(kinds)} adapter)" if kinds else ""
            raise ModelError(
                f"the model holds no LoRA layers{carried}, so there is nothing to differentiate",
                "attach a LoRA adapter (PeftModel.from_pretrained(base, adapter_dir)) before wrapping it in LoadedModel",
            )
        adapter = self.adapter_name or active_adapter_name(self.model)
        object.__setattr__(self, "adapter_name", adapter)
        self.model.eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        for param in hookable_lora_parameters(self.model, adapter):
            param.requires_grad_(True)
        if self.adapter_dir is not None:
            object.__setattr__(self, "adapter_dir", Path(self.adapter_dir))
        if self.base_model_name is None:
            name = getattr(getattr(self.causal_lm, "config", None), "_name_or_path", None)
            object.__setattr__(self, "base_model_name", name or None)
        if self.adapter_hash is None:
            object.__setattr__(self, "adapter_hash", lora_state_hash(self.model, adapter))
        if self.base_model_hash is None:
            object.__setattr__(self, "base_model_hash", base_model_fingerprint(self.model))

    @classmethod
    def load(cls, base_model: str | Path, adapter: str | Path | None, *, allow_pickle: bool = False,
             trust_remote_code: bool = False, dtype: str = "auto", device: str = "auto",
             adapter_name: str = "default", tokenizer: str | Path | None = None) -> LoadedModel:
        """Load a base model (on ``device``, in ``dtype``; see resolve_placement) and a LoRA adapter directory.

        The adapter is safetensors (a pickle only with allow_pickle); its LoRA weights are float32 whatever the
        base dtype, so the captured gradients are too. The tokenizer is ``tokenizer`` when given, else the one the
        run saved (adapter dir, then its checkpoints), else the base's (gradian.runs.training_format).
        """
        check_unsloth_absent()
        placement = resolve_placement(device, dtype)  # before any file is read: a bad --device fails fast
        files = inspect_adapter_dir(require_adapter(adapter), allow_pickle=allow_pickle)
        shapes = adapter_weight_shapes(files)
        try:
            base, tokenizer_loaded = model_base.load_base_model(str(base_model), dtype=placement.dtype,
                                                                trust_remote_code=trust_remote_code,
                                                                device=placement.device)
        except QuantizedBaseError as error:  # the adapter's own record of its base sharpens the advice
            raise error.naming_adapter_base(files.trained_on) from None
        check_adapter_fits(base, shapes, files, str(base_model))
        base_hash = base_model_fingerprint(base)
        peft_model = _attach_adapter(base, files, adapter_name)
        tokenizer, choice = training_tokenizer(tokenizer_loaded, str(base_model), files.directory, tokenizer,
                                               trust_remote_code=trust_remote_code)
        return cls(model=peft_model, tokenizer=tokenizer, base_model_name=str(base_model), adapter_dir=files.directory,
                   adapter_hash=adapter_files_hash(files), base_model_hash=base_hash, adapter_name=adapter_name,
                   quantized_training_base=quantized_training_base(files.trained_on, str(base_model)),
                   tokenizer_choice=choice)

    @property
    def causal_lm(self) -> torch.nn.Module:
        """The transformers causal LM inside the peft wrapper (LoRA layers injected in place)."""
        getter = getattr(self.model, "get_base_model", None)
        return getter() if callable(getter) else self.model

    @property
    def device(self) -> torch.device:
        """Device of the model's first parameter."""
        return next(self.model.parameters()).device

    def compute(self) -> dict[str, str]:
        """Where the gradients are computed: device type, the base weights' dtype and the LoRA weights' dtype."""
        lora = {str(p.dtype).removeprefix("torch.") for p in hookable_lora_parameters(self.model, self.adapter_name)}
        return {"device_type": self.device.type, "base_dtype": _base_dtype(self.causal_lm),
                "lora_dtype": "/".join(sorted(lora))}

    def blocks(self, module_filter: str | None = None) -> list[LoraBlock]:
        """The LoRA blocks of this model's adapter matching module_filter (see gradian.model.lora_blocks)."""
        return discover_lora_blocks(self.model, module_filter, self.adapter_name)

    def trainable_parameter_names(self) -> list[str]:
        """Names of the parameters that require grad (only LoRA A and B weights)."""
        return [name for name, param in self.model.named_parameters() if param.requires_grad]


def training_tokenizer(base_tokenizer: PreTrainedTokenizerBase, base_source: str, adapter_dir: Path | None,
                       override: str | Path | None = None, *,
                       trust_remote_code: bool = False) -> tuple[PreTrainedTokenizerBase, TokenizerChoice]:
    """The tokenizer the adapter was trained with (``override``, else saved by the run, else the base's) and its source."""
    def load(path: Path | str) -> PreTrainedTokenizerBase:
        # A checkpoint or adapter dir holds a tokenizer without a model config.json, which load_tokenizer wants.
        if Path(path).is_dir():
            return model_base._load_tokenizer_from(Path(path), trust_remote_code=trust_remote_code)
        return model_base.load_tokenizer(path, trust_remote_code=trust_remote_code)

    if override is not None:
        return load(override), TokenizerChoice(f"the tokenizer given ({override})")
    return apply_saved_files(base_tokenizer, base_source, tokenizer_dirs(adapter_dir), load)


def _attach_adapter(base: PreTrainedModel, files: AdapterFiles, adapter_name: str) -> PeftModel:
    """Wrap the base in a PeftModel with the adapter's weights, turning peft's failures into one-line ModelErrors."""
    from peft import PeftModel, get_peft_model_state_dict

    try:
        model = PeftModel.from_pretrained(base, str(files.directory), adapter_name=adapter_name, is_trainable=True)
    except (ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise _adapter_load_error(exc, files) from exc
    lora_to_float32(model, adapter_name)
    # Prove the file's LoRA tensors landed in the model, rather than trusting peft's missing-key warning.
    loaded = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    for key, tensor in read_adapter_tensors(files).items():
        if ".lora_" not in key:
            continue
        if key not in loaded:
            raise ModelError(
                f"adapter tensor {key} matches no LoRA layer of the base model",
                "this is an adapter for another base model; pass the --base-model it was trained from",
            )
        if not _same_values(tensor, loaded[key]):
            raise ModelError(f"adapter tensor {key} did not load into the model unchanged",
                             "re-save the adapter with peft's save_pretrained and report this with gradian doctor output")
    return model


def lora_to_float32(model: torch.nn.Module, adapter_name: str) -> None:
    """Make the adapter's LoRA A/B weights float32 in place (peft's autocast_adapter_dtype does this by default).

    peft casts a LoRA layer's input to lora_A's dtype, so float32 weights mean the gradient hooks see float32
    activations and per-example gradients keep float32 precision under a bfloat16 or float16 base.
    """
    import torch

    for _, layer in lora_layers(model):
        for holder in (layer.lora_A, layer.lora_B):
            module = holder[adapter_name] if adapter_name in holder else None
            if module is not None and module.weight.dtype != torch.float32:
                module.to(torch.float32)


def _base_dtype(causal_lm: torch.nn.Module) -> str:
    """The dtype of the base model's weights (its input embedding's, which LoRA never wraps)."""
    embeddings = causal_lm.get_input_embeddings() if callable(getattr(causal_lm, "get_input_embeddings", None)) else None
    weight = getattr(embeddings, "weight", None)
    if weight is None:
        weight = next(p for n, p in causal_lm.named_parameters() if ".lora_" not in n)
    return str(weight.dtype).removeprefix("torch.")


def _same_values(saved: torch.Tensor, live: torch.Tensor) -> bool:
    """Whether a saved tensor equals the live one after the dtype cast loading applies."""
    import torch

    return tuple(saved.shape) == tuple(live.shape) and torch.equal(saved.to(live.dtype), live.detach().cpu())


def _adapter_load_error(exc: Exception, files: AdapterFiles) -> ModelError:
    """A one-line ModelError for an exception raised while peft attached the adapter."""
    text = str(exc)
    size = re.search(r"size mismatch for (\S+): copying a param with shape (.+?) from checkpoint, "
                     r"the shape in current model is (.+?)\.(?:\s|$)", text)
    trained_on = f" (adapter_config.json says it was trained on {files.trained_on})" if files.trained_on else ""
    if size:
        saved, live = (_shape_text(size.group(i)) for i in (2, 3))
        return ModelError(
            f"the adapter does not fit the model: tensor {size.group(1)} has shape {saved} in the adapter file but "
            f"{live} in the model built from the base model and adapter_config.json{trained_on}",
            "this is an adapter for another base model, or its adapter_config.json (r, target_modules) does not "
            "match its weights; pass the --base-model it was trained from",
        )
    if "not found in the base model" in text or "Target module" in text:
        return ModelError(
            f"the adapter's target modules are not in the base model{trained_on}: {text.splitlines()[0][:300]}",
            "this is an adapter for another base model; pass the --base-model it was trained from",
        )
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    return ModelError(f"peft could not attach the adapter in {files.directory}: {first}",
                      "check that the adapter directory was written by peft's save_pretrained for this base model")


def _shape_text(text: str) -> str:
    """'torch.Size([4, 32])' -> '[4, 32]'."""
    return text.removeprefix("torch.Size(").removesuffix(")")


def lora_state_hash(model: torch.nn.Module, adapter_name: str) -> str:
    """sha256 of the adapter's LoRA tensors (names, shapes, dtypes, bytes) and its peft config."""
    digest = hashlib.sha256()
    config = getattr(model, "peft_config", {}).get(adapter_name)
    if config is not None:
        config_dict = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
        digest.update(json.dumps(config_dict, sort_keys=True, default=str).encode())
    for name, param in model.named_parameters():
        if ".lora_" in name and f".{adapter_name}" in name:
            _update_with_tensor(digest, name, param, sample=False)
    return digest.hexdigest()


def base_model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of the base model's config and, per weight, its name, shape, dtype and a strided sample of its bytes.

    Names are normalized so that the same base model gives the same fingerprint before and after peft wraps it;
    LoRA tensors and modules_to_save copies are left out.
    """
    digest = hashlib.sha256()
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    config = getattr(inner, "config", None)
    if config is not None:
        config_dict = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
        digest.update(json.dumps(config_dict, sort_keys=True, default=str).encode())
    for name, param in inner.named_parameters():
        if ".lora_" in name or ".modules_to_save." in name:
            continue
        _update_with_tensor(digest, _PEFT_NAME_PARTS.sub("", short_module_name(name)), param, sample=True)
    return digest.hexdigest()


def _update_with_tensor(digest: Any, name: str, tensor: torch.Tensor, *, sample: bool) -> None:
    """Feed a tensor's identity (and all or a strided sample of its bytes) into a hash."""
    import torch

    digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return
    flat = tensor.detach().reshape(-1)
    if sample:
        step = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
        flat = flat[::step][:_SAMPLES_PER_TENSOR]
    data = flat.contiguous().cpu()
    digest.update(data.view(torch.uint8).numpy().tobytes())
