"""Quantized base checkpoints (bitsandbytes, GPTQ, AWQ, ...): recognised from config.json, refused with the way out.

QLoRA and unsloth train LoRA on a 4-bit base. The adapter they save holds plain LoRA A/B weights that apply unchanged
to the unquantized base the 4-bit checkpoint was made from, so Gradian loads that one and takes gradients on it: the
dequantized base. Nothing here imports a quantization library; config.json and names are all it reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.errors import ModelError

# Names that say a checkpoint is quantized: unsloth's -bnb-4bit / -unsloth-bnb-4bit, TheBloke's -GPTQ / -AWQ, ...
_QUANTIZED_NAME = re.compile(r"(?:^|[-_.])(?:bnb-?[48]bit|gptq|awq|[48]-?bit|nf4|int[48])(?:$|[-_.])", re.IGNORECASE)
# unsloth publishes ``<org>/<model>-bnb-4bit`` (and ``-unsloth-bnb-4bit``) next to the unquantized ``<org>/<model>``.
_UNSLOTH_SUFFIX = re.compile(r"-(?:unsloth-)?bnb-[48]bit$", re.IGNORECASE)
_METHOD_NAMES = {"bitsandbytes": "bitsandbytes", "gptq": "GPTQ", "awq": "AWQ", "hqq": "HQQ", "aqlm": "AQLM",
                 "eetq": "EETQ", "fp8": "FP8"}


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint is quantized, as the ``quantization_config`` of its config.json says."""

    method: str  # quant_method: bitsandbytes, gptq, awq, ...
    bits: int | None
    detail: str = ""  # bitsandbytes' 4-bit type (nf4, fp4)

    def describe(self) -> str:
        """``bitsandbytes 4-bit (nf4)``, ``GPTQ 4-bit``, ``torchao``."""
        text = _METHOD_NAMES.get(self.method.lower(), self.method)
        if self.bits:
            text += f" {self.bits}-bit"
        return text + (f" ({self.detail})" if self.detail else "")

    @property
    def bits_text(self) -> str:
        """``4-bit``, or ``quantized`` when the config does not say how many bits."""
        return f"{self.bits}-bit" if self.bits else "quantized"


def quantization_of(config: Mapping[str, Any]) -> Quantization | None:
    """The quantization a model config declares, or None for an unquantized model."""
    spec = config.get("quantization_config")
    if not isinstance(spec, Mapping) or not spec:
        return None
    loads = {bits: bool(spec.get(f"load_in_{bits}bit") or spec.get(f"_load_in_{bits}bit")) for bits in (4, 8)}
    method = str(spec.get("quant_method") or ("bitsandbytes" if any(loads.values()) else "unknown method"))
    if method == "bitsandbytes":
        bits = 4 if loads[4] else 8 if loads[8] else None
        detail = str(spec.get("bnb_4bit_quant_type") or "") if bits == 4 else ""
        return Quantization(method, bits, detail)
    return Quantization(method, _bits(spec, method))


def read_quantization(model_dir: Path) -> Quantization | None:
    """The quantization declared by a model directory's config.json; None when it declares none or is unreadable."""
    config = _read_config(Path(model_dir) / "config.json")
    return quantization_of(config) if config is not None else None


def unsloth_unquantized_name(name: str) -> str | None:
    """``unsloth/llama-3-8b-bnb-4bit`` -> ``unsloth/llama-3-8b``: unsloth's name for the base it quantized; else None."""
    text = name.strip().rstrip("/")
    stripped = _UNSLOTH_SUFFIX.sub("", text)
    return stripped if stripped != text and stripped else None


def names_quantized_model(name: str | None) -> bool:
    """Whether a model name or local model directory is a quantized checkpoint (by its name or its config.json)."""
    if not name or not str(name).strip():
        return False
    text = str(name).strip().rstrip("/")
    if _QUANTIZED_NAME.search(text.rsplit("/", 1)[-1]):
        return True
    directory = _local_model_dir(text)
    return directory is not None and read_quantization(directory) is not None


def quantized_training_base(adapter_base: str | None, base_model: str | None) -> str | None:
    """The adapter's training base when it was a quantized checkpoint other than ``base_model``; else None."""
    if not adapter_base or str(adapter_base).strip() == str(base_model or "").strip():
        return None
    return str(adapter_base) if names_quantized_model(adapter_base) else None


def training_base_note(quantized_base: str, base_model: str) -> str:
    """The report's sentence for an adapter trained on a quantized base and attributed on an unquantized one."""
    bits = _bits_in_name(quantized_base)
    return (f"The adapter was trained on a {bits} base ({quantized_base}); gradients were taken on the unquantized "
            f"base {base_model}. The LoRA weights apply unchanged, but the base weights differ from the ones training "
            "saw by the quantization error, so blame is measured on the dequantized model.")


class QuantizedBaseError(ModelError):
    """A quantized base checkpoint, refused before loading, with the unquantized base to pass instead."""

    def __init__(self, model_dir: Path, name: str, quantization: Quantization, adapter_base: str | None = None):
        self.model_dir, self.name, self.quantization, self.adapter_base = Path(model_dir), name, quantization, adapter_base
        super().__init__(
            f"base model {name} is a {quantization.describe()} checkpoint (quantization_config in its config.json), "
            "which Gradian does not load: it takes gradients through unquantized weights",
            _hint(self.model_dir, name, quantization, adapter_base),
        )

    def naming_adapter_base(self, adapter_base: str | None) -> QuantizedBaseError:
        """The same refusal, also using the adapter's adapter_config.json base_model_name_or_path for the advice."""
        return QuantizedBaseError(self.model_dir, self.name, self.quantization, adapter_base)


def refuse_quantized_base(model_dir: Path, name: str, adapter_base: str | None = None) -> None:
    """Raise QuantizedBaseError when ``model_dir``'s config.json declares a quantization; do nothing otherwise."""
    quantization = read_quantization(model_dir)
    if quantization is not None:
        raise QuantizedBaseError(model_dir, str(name), quantization, adapter_base)


def unquantized_base(model_dir: Path, name: str, adapter_base: str | None = None) -> tuple[str, str] | None:
    """The unquantized base a quantized checkpoint was made from, and what says so; None when nothing does."""
    config = _read_config(Path(model_dir) / "config.json") or {}
    recorded = config.get("_name_or_path")
    recorded = str(recorded).strip() if isinstance(recorded, str) and recorded.strip() else None
    named = [(adapter_base, "adapter_config.json base_model_name_or_path"), (recorded, "config.json _name_or_path")]
    # A name that is itself unquantized says so directly; a local path to the checkpoint itself says nothing.
    for candidate, source in named:
        if candidate and not names_quantized_model(candidate) and not _same_dir(candidate, model_dir):
            return candidate, source
    for candidate in (adapter_base, recorded, name):
        mapped = unsloth_unquantized_name(candidate) if candidate else None
        if mapped:
            suffix = candidate[len(mapped):]
            return mapped, f"the unsloth name without {suffix}"
    return None


def _hint(model_dir: Path, name: str, quantization: Quantization, adapter_base: str | None) -> str:
    who = " (QLoRA, unsloth)" if quantization.method == "bitsandbytes" else ""
    why = (f"a LoRA adapter trained on the {quantization.bits_text} base{who} applies to the unquantized base "
           "unchanged, and gradients are then taken on the dequantized base")
    found = unquantized_base(model_dir, name, adapter_base)
    if found is None:
        return (f"pass the unquantized base it was made from (for unsloth/<model>-bnb-4bit that is unsloth/<model>); "
                f"{why}")
    base, source = found
    where = "" if _local_model_dir(base) is not None else (
        "; it is not in the local Hugging Face cache, so download it first: Gradian never downloads")
    return f"pass the unquantized base it was made from: --base-model {base} ({source}{where}); {why}"


def _bits(spec: Mapping[str, Any], method: str) -> int | None:
    """Bits per weight from the keys the quantizers use (bits, w_bit, nbits, weights='int4'); FP8 methods are 8."""
    for key in ("bits", "w_bit", "nbits", "weight_bits", "weights"):
        value = spec.get(key)
        match = re.search(r"\d+", str(value)) if value is not None else None
        if match:
            return int(match.group())
    return 8 if "fp8" in method.lower() else None


def _bits_in_name(name: str) -> str:
    match = re.search(r"([48])-?bit", name, re.IGNORECASE)
    return f"{match.group(1)}-bit" if match else "quantized"


def _read_config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the loader that follows explains a missing or broken config.json
    return data if isinstance(data, dict) else None


def _local_model_dir(name: str) -> Path | None:
    """The local directory a model name refers to (a path, or an id in the local HF cache), without any network."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    from gradian.model.base import hub_cache_snapshot  # cycle: gradian.model.base imports this module

    try:
        return hub_cache_snapshot(name)
    except ValueError:  # not a valid repo id (huggingface_hub's HFValidationError is a ValueError)
        return None


def _same_dir(name: str, model_dir: Path) -> bool:
    try:
        return Path(name).expanduser().resolve() == Path(model_dir).resolve()
    except OSError:
        return False
