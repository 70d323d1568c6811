"""LoRA blocks: the peft LoRA Linear layers whose A and B matrices Gradian differentiates."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradian.config import compile_module_filter
from gradian.errors import ModelError

if TYPE_CHECKING:
    import torch
    from peft.tuners.lora.layer import LoraLayer

log = logging.getLogger(__name__)

# peft wraps the user's model as PeftModel.base_model (LoraModel) .model (the transformers model).
PEFT_PREFIXES = ("base_model.model.", "base_model.")

NO_BLOCKS_HINT = (
    "the adapter is not attached, or grads.module_filter matched nothing: Gradian attributes over adapter "
    "parameters, so with no LoRA blocks there is nothing to differentiate. Check that --adapter points at a PEFT "
    "adapter directory, and if you set a module filter, that its regex actually matches your module names "
    "(gradian show-index <dir> prints the block list from a built index). LoRA on embeddings or convolutions is "
    "skipped by the hook path, so an adapter that targets only those produces no blocks."
)


@dataclass(frozen=True)
class LoraBlock:
    """One LoRA Linear layer: grad of A is r x d_in, grad of B is d_out x r."""

    name: str  # short module name, e.g. model.layers.12.mlp.down_proj
    module_name: str  # full name inside the peft model, for get_submodule
    d_in: int
    d_out: int
    r: int
    scaling: float

    @property
    def size(self) -> int:
        """Number of LoRA parameters (A and B) in this block."""
        return self.r * (self.d_in + self.d_out)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for manifests."""
        return {"name": self.name, "d_in": self.d_in, "d_out": self.d_out, "r": self.r, "scaling": self.scaling}


def short_module_name(name: str) -> str:
    """The module name without peft's wrapper prefix: base_model.model.model.layers.0.mlp -> model.layers.0.mlp."""
    for prefix in PEFT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def lora_layers(model: torch.nn.Module) -> Iterator[tuple[str, LoraLayer]]:
    """Every peft LoRA layer of the model (any kind), as (full module name, module), in module order."""
    from peft.tuners.lora.layer import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def active_adapter_name(model: torch.nn.Module) -> str:
    """The one adapter active on the model's LoRA layers; several active adapters need an explicit name."""
    names: list[str] = []
    for _, module in lora_layers(model):
        for adapter in module.active_adapters:
            if adapter not in names:
                names.append(adapter)
    if not names:
        raise ModelError("no LoRA blocks found: the model holds no active LoRA adapter", NO_BLOCKS_HINT)
    if len(names) > 1:
        raise ModelError(
            f"several LoRA adapters are active at once ({', '.join(names)})",
            "activate one adapter (peft_model.set_adapter(name)) or pass adapter_name to LoadedModel",
        )
    return names[0]


def _skip_reason(module: LoraLayer, adapter: str) -> str | None:
    """Why a LoRA layer is not a hookable Linear block for this adapter, or None when it is."""
    import torch.nn as nn
    from peft.tuners.lora import layer as lora_layer

    kind = type(module).__name__
    if adapter in getattr(module, "lora_embedding_A", {}) or isinstance(module, getattr(lora_layer, "Embedding", ())):
        return f"LoRA on an embedding ({kind})"
    # getattr: older peft versions in the supported window lack some of these layer types.
    conv = tuple(t for t in (getattr(lora_layer, "_ConvNd", None),) if t is not None)
    merged_types = tuple(t for t in (getattr(lora_layer, n, None) for n in ("MultiheadAttention", "ParamWrapper"))
                         if t is not None)
    if conv and isinstance(module, conv):
        return f"LoRA on a convolution ({kind})"
    if merged_types and isinstance(module, merged_types):
        # These merge the LoRA weights into another computation; lora_A/lora_B are never called on inputs.
        return f"LoRA layer type {kind} does not call lora_A/lora_B on its inputs"
    if adapter not in module.lora_A:
        return "the adapter has no lora_A on this layer"
    lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
    if not (isinstance(lora_a, nn.Linear) and isinstance(lora_b, nn.Linear)):
        return f"lora_A/lora_B of {kind} are {type(lora_a).__name__}/{type(lora_b).__name__}, not Linear"
    return None


def discover_lora_blocks(model: torch.nn.Module, module_filter: str | None = None,
                         adapter_name: str | None = None) -> list[LoraBlock]:
    """The LoRA Linear blocks of the active adapter whose short name matches module_filter (re.search), in module order."""
    pattern = compile_module_filter(module_filter)
    adapter = adapter_name or active_adapter_name(model)
    blocks: list[LoraBlock] = []
    candidates: list[str] = []
    for full_name, module in lora_layers(model):
        if adapter not in module.lora_A and adapter not in getattr(module, "lora_embedding_A", {}):
            continue
        name = short_module_name(full_name)
        reason = _skip_reason(module, adapter)
        if reason is not None:
            log.info("skipping LoRA layer %s: %s", name, reason)
            continue
        candidates.append(name)
        if pattern is not None and not pattern.search(name):
            continue
        _check_hookable(module, name, adapter)
        lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
        blocks.append(LoraBlock(
            name=name,
            module_name=full_name,
            d_in=int(lora_a.in_features),
            d_out=int(lora_b.out_features),
            r=int(lora_a.out_features),
            scaling=float(module.scaling[adapter]),
        ))
    if not blocks:
        if candidates and pattern is not None:
            raise ModelError(
                f"no LoRA blocks found: grads.module_filter {pattern.pattern!r} matched none of the "
                f"{len(candidates)} LoRA blocks (first: {candidates[0]})",
                NO_BLOCKS_HINT,
            )
        raise ModelError(f"no LoRA blocks found for adapter {adapter!r}", NO_BLOCKS_HINT)
    return blocks


def _check_hookable(module: LoraLayer, name: str, adapter: str) -> None:
    """Refuse layer states in which the hooked lora_A/lora_B calls would not be the layer's computation."""
    variant = getattr(module, "lora_variant", {}).get(adapter)
    if variant is not None:
        kind = type(variant).__name__.removesuffix("LinearVariant") or type(variant).__name__
        raise ModelError(
            f"LoRA variant {kind} on block {name} is not supported: the hook path computes plain LoRA gradients",
            "use a plain LoRA adapter (no DoRA or other variants), or leave these blocks out with grads.module_filter",
        )
    if module.merged:
        raise ModelError(
            f"the adapter is merged into the base weights of {name}, so its LoRA matrices are never called",
            "load the adapter unmerged (do not call merge_adapter / merge_and_unload before attributing)",
        )
    if module.disable_adapters:
        raise ModelError(
            f"adapters are disabled on {name}",
            "re-enable them (peft_model.enable_adapter_layers()) before building a LoadedModel",
        )
    if adapter not in module.active_adapters:
        raise ModelError(
            f"adapter {adapter!r} is not active on {name}",
            "activate it with peft_model.set_adapter(name)",
        )


def block_modules(model: torch.nn.Module, block: LoraBlock,
                  adapter_name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The live (lora_A, lora_B) Linear modules of a block."""
    module = model.get_submodule(block.module_name)
    return module.lora_A[adapter_name], module.lora_B[adapter_name]


def hookable_lora_parameters(model: torch.nn.Module, adapter_name: str) -> list[torch.nn.Parameter]:
    """The A and B weights of every hookable LoRA Linear layer of the adapter (the only trainable parameters)."""
    params = []
    for _, module in lora_layers(model):
        if adapter_name not in module.lora_A or _skip_reason(module, adapter_name) is not None:
            continue
        params.append(module.lora_A[adapter_name].weight)
        params.append(module.lora_B[adapter_name].weight)
    return params
