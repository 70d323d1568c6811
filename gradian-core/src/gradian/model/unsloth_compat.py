"""Make a model that unsloth loaded or patched usable for Gradian's gradients, and report its state.

For users holding an unsloth model in memory who want to attribute on that object instead of loading a
plain one in a fresh process (the supported path). ``prepare_for_gradients`` undoes what unsloth leaves
behind that breaks per-example LoRA gradients:

- fused cross-entropy: unsloth's causal-LM forward returns empty logits and a fused loss when labels are
  passed, unless ``UNSLOTH_RETURN_LOGITS=1``; with ``UNSLOTH_RETURN_HIDDEN_STATES=1`` it returns hidden
  states in place of logits. Both are read on every forward, so setting the variables suffices (process-wide).
- gradient checkpointing (unsloth enables its own by default): turned off on every module.
- ``use_cache``: turned off in every config the model holds.
- inference mode: ``for_inference`` leaves ``_flag_for_generation`` on modules (the fast generation path) and
  ``_fast_lora`` caches on parameters; tensors created under ``torch.inference_mode`` (weights loaded or rotary
  caches built during generation) cannot be saved for backward. Flags and caches are removed and every
  inference tensor among parameters, buffers and tensor attributes is replaced by a normal copy (ties kept).
- train/eval state: eval mode (no dropout), LoRA A and B trainable and everything else frozen, which is the
  state ``LoadedModel`` and ``build_index`` expect.

Status: verified at contract level on CPU (``pytest tests/integration/test_unsloth_contract.py -q``) with a
tiny model patched the way unsloth patches one. It has NOT been run end to end on a GPU with unsloth installed.
This module never imports unsloth.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch  # every function here takes a model already in memory, so torch is loaded anyway

from gradian.errors import ModelError

RETURN_LOGITS_ENV = "UNSLOTH_RETURN_LOGITS"
RETURN_HIDDEN_STATES_ENV = "UNSLOTH_RETURN_HIDDEN_STATES"
GENERATION_FLAG = "_flag_for_generation"
FAST_LORA_CACHE = "_fast_lora"
LORA_PARAMETER_MARKERS = ("lora_A", "lora_B")


@dataclass(frozen=True)
class CompatState:
    """What about a model (and this process) matters for taking LoRA gradients through it."""

    unsloth_imported: bool
    unsloth_version: str | None
    return_logits: str | None  # the value of UNSLOTH_RETURN_LOGITS
    return_hidden_states: str | None  # the value of UNSLOTH_RETURN_HIDDEN_STATES
    checkpointing_modules: tuple[str, ...]
    use_cache_configs: int
    generation_flags: int
    fast_lora_caches: int
    inference_tensors: tuple[str, ...]
    inference_mode_enabled: bool
    training_modules: int
    lora_tensors: int
    lora_trainable: int
    other_trainable: tuple[str, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        """Each thing that stops correct LoRA gradients, as one line; empty when the model is ready."""
        found = []
        if self.return_logits != "1":
            found.append(f"fused cross-entropy may be on ({RETURN_LOGITS_ENV} is not 1): the forward can return empty logits")
        if self.return_hidden_states == "1":
            found.append(f"{RETURN_HIDDEN_STATES_ENV}=1: the forward returns hidden states in place of logits")
        if self.checkpointing_modules:
            found.append(f"gradient checkpointing is on in {len(self.checkpointing_modules)} modules")
        if self.use_cache_configs:
            found.append(f"use_cache is on in {self.use_cache_configs} configs")
        if self.generation_flags or self.fast_lora_caches:
            found.append(f"inference flags left by for_inference: {self.generation_flags} {GENERATION_FLAG}, "
                         f"{self.fast_lora_caches} {FAST_LORA_CACHE} caches")
        if self.inference_tensors:
            found.append(f"{len(self.inference_tensors)} tensors were created under torch.inference_mode "
                         f"(first: {self.inference_tensors[0]}); backward through them fails")
        if self.inference_mode_enabled:
            found.append("torch.inference_mode is enabled where this runs: no gradient can be taken here")
        if self.training_modules:
            found.append(f"{self.training_modules} modules are in train mode (dropout would make gradients random)")
        if self.lora_tensors == 0:
            found.append("no LoRA A/B parameters: the adapter is not attached")
        elif self.lora_trainable < self.lora_tensors:
            found.append(f"{self.lora_tensors - self.lora_trainable} of {self.lora_tensors} LoRA A/B tensors do not require grad")
        if self.other_trainable:
            found.append(f"{len(self.other_trainable)} non-LoRA tensors require grad (first: {self.other_trainable[0]})")
        return tuple(found)


def _is_lora(name: str) -> bool:
    return any(marker in name for marker in LORA_PARAMETER_MARKERS)


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every distinct config object held by the model's modules (a PEFT wrapper and the base share one)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "use_cache"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def _inference_tensors(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """(module, kind, attribute, tensor) for every inference tensor among parameters, buffers and tensor attributes."""
    found = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and param.is_inference():
                found.append((module, "parameter", name, param))
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_inference():
                found.append((module, "buffer", name, buffer))
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.is_inference():
                found.append((module, "attribute", name, value))
    return found


def compat_state(model: torch.nn.Module) -> CompatState:
    """The model's state as far as gradients are concerned (reads, never changes anything)."""
    names = {id(module): name or "<root>" for name, module in model.named_modules()}
    unsloth = sys.modules.get("unsloth")
    lora = [(name, p) for name, p in model.named_parameters() if _is_lora(name)]
    return CompatState(
        unsloth_imported=unsloth is not None,
        unsloth_version=getattr(unsloth, "__version__", None) if unsloth is not None else None,
        return_logits=os.environ.get(RETURN_LOGITS_ENV),
        return_hidden_states=os.environ.get(RETURN_HIDDEN_STATES_ENV),
        checkpointing_modules=tuple(
            names[id(m)] for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True
        ),
        use_cache_configs=sum(1 for config in _configs(model) if config.use_cache),
        generation_flags=sum(1 for m in model.modules() if hasattr(m, GENERATION_FLAG)),
        fast_lora_caches=sum(1 for p in model.parameters() if hasattr(p, FAST_LORA_CACHE)),
        inference_tensors=tuple(f"{names[id(m)]}.{attr} ({kind})" for m, kind, attr, _ in _inference_tensors(model)),
        inference_mode_enabled=torch.is_inference_mode_enabled(),
        training_modules=sum(1 for m in model.modules() if m.training),
        lora_tensors=len(lora),
        lora_trainable=sum(1 for _, p in lora if p.requires_grad),
        other_trainable=tuple(name for name, p in model.named_parameters() if p.requires_grad and not _is_lora(name)),
    )


def prepare_for_gradients(model: torch.nn.Module) -> torch.nn.Module:
    """Undo unsloth's fused-CE, checkpointing, cache and inference-mode state in place; returns the model."""
    if torch.is_inference_mode_enabled():
        raise ModelError("prepare_for_gradients was called inside torch.inference_mode()",
                         "call it, and compute gradients, outside the inference_mode context")
    # Read on every unsloth forward, so this takes effect for models already built.
    os.environ[RETURN_LOGITS_ENV] = "1"
    os.environ[RETURN_HIDDEN_STATES_ENV] = "0"
    if hasattr(model, "gradient_checkpointing_disable"):
        try:
            model.gradient_checkpointing_disable()
        except (ValueError, AttributeError):  # models without checkpointing support raise; the loop below covers them
            pass
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            module.gradient_checkpointing = False
        if GENERATION_FLAG in vars(module):
            delattr(module, GENERATION_FLAG)
    if hasattr(model, "_unsloth_gradient_checkpointing"):
        model._unsloth_gradient_checkpointing = False
    for config in _configs(model):
        config.use_cache = False
    for param in model.parameters():
        if hasattr(param, FAST_LORA_CACHE):
            delattr(param, FAST_LORA_CACHE)
    _replace_inference_tensors(model)
    model.eval()
    for name, param in model.named_parameters():
        param.requires_grad_(_is_lora(name))
    return model


def _replace_inference_tensors(model: torch.nn.Module) -> None:
    """Swap every inference tensor for a normal copy; a tensor shared by two modules (tied weights) stays shared."""
    copies: dict[int, torch.Tensor] = {}
    with torch.inference_mode(False):
        for module, kind, attr, tensor in _inference_tensors(model):
            if id(tensor) not in copies:
                data = tensor.detach().clone()
                copies[id(tensor)] = torch.nn.Parameter(data, requires_grad=False) if kind == "parameter" else data
            if kind == "parameter":
                module._parameters[attr] = copies[id(tensor)]
            elif kind == "buffer":
                module._buffers[attr] = copies[id(tensor)]
            else:
                setattr(module, attr, copies[id(tensor)])


def unsloth_compat_report(model: torch.nn.Module) -> str:
    """A plain-text report of the state a reviewer needs before trusting gradients through this model."""
    state = compat_state(model)
    on_off = {True: "on", False: "off"}
    lines = [
        "unsloth compatibility (contract-tested on CPU; not yet run end to end on a GPU)",
        f"  unsloth imported in this process: {'yes' if state.unsloth_imported else 'no'}"
        + (f" (version {state.unsloth_version})" if state.unsloth_version else ""),
        f"  fused cross-entropy: {'off' if state.return_logits == '1' else 'may be on'} "
        f"({RETURN_LOGITS_ENV}={state.return_logits!r}, {RETURN_HIDDEN_STATES_ENV}={state.return_hidden_states!r})",
        f"  gradient checkpointing: {on_off[bool(state.checkpointing_modules)]}"
        + (f" in {', '.join(state.checkpointing_modules[:4])}{', ...' if len(state.checkpointing_modules) > 4 else ''}"
           if state.checkpointing_modules else ""),
        f"  use_cache: {'on in ' + str(state.use_cache_configs) + ' configs' if state.use_cache_configs else 'off'}",
        f"  inference flags: {state.generation_flags} {GENERATION_FLAG}, {state.fast_lora_caches} {FAST_LORA_CACHE} caches",
        f"  inference-mode tensors: {len(state.inference_tensors)}"
        + (f" (first: {state.inference_tensors[0]})" if state.inference_tensors else ""),
        f"  torch.inference_mode enabled here: {'yes' if state.inference_mode_enabled else 'no'}",
        f"  mode: {'train' if state.training_modules else 'eval'} ({state.training_modules} modules in train mode)",
        f"  LoRA A/B tensors: {state.lora_tensors} ({state.lora_trainable} require grad); "
        f"other tensors requiring grad: {len(state.other_trainable)}",
    ]
    problems = state.problems
    lines.append("  ready for gradients: " + ("yes" if not problems else "no"))
    lines.extend(f"    - {problem}" for problem in problems)
    return "\n".join(lines)
