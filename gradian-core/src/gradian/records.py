"""Frozen records passed through Gradian's hooks; plugins yield these, never live heavy objects."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
Family = Literal["data", "config", "dynamics"]
Need = Literal["dataset", "tokenizer", "eval_dataset", "run_config", "run_logs", "adapter"]

SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
FAMILIES: tuple[Family, ...] = ("data", "config", "dynamics")
NEEDS: tuple[Need, ...] = ("dataset", "tokenizer", "eval_dataset", "run_config", "run_logs", "adapter")


def load_object(target: str) -> Any:
    """Import and return the object named by a ``"package.module:attr"`` string."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` that imports each public name of ``table`` on first use (PEP 562)."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return load_object(table[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


# --- trainers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainJob:
    """One LoRA fine-tune that Gradian runs to check itself (counterfactuals, injection)."""

    base_model: str
    dataset: Path
    out: Path
    config: Any  # gradian.config.GradianConfig; typed loosely so records stay import-light
    drop_ids: frozenset[str] = frozenset()
    extra_datasets: tuple[Path, ...] = ()
    trust_remote_code: bool = False
    device: str = "cpu"  # a checked placement (gradian.model.placement): cpu, cuda:N or mps
    dtype: str = "float32"  # the base model's dtype; LoRA weights stay float32


@dataclass(frozen=True)
class TrainResult:
    """What a finished training job wrote: the adapter dir, the run dir and a few headline numbers."""

    adapter_dir: Path
    run_dir: Path
    final_loss: float | None
    steps: int
    seconds: float
    backend: str
    notes: tuple[str, ...] = ()  # what a user should know about what was trained on (skipped examples, ...)


@dataclass(frozen=True)
class TrainerSpec:
    """A training backend; ``load`` names a class whose instances have ``train(job) -> TrainResult``."""

    name: str
    summary: str
    load: str
    requires: tuple[str, ...] = ()  # distributions that must be installed (checked from metadata, never imported)
    available: Callable[[], str | None] | None = None  # anything else it needs (a GPU): None when it can run

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None when it can (computed once per process)."""
        return _unavailable_reason(self.requires, self.available)


@functools.cache
def _unavailable_reason(requires: tuple[str, ...], available: Callable[[], str | None] | None) -> str | None:
    """The plugin's own reason first (it knows the best hint), then the first required distribution missing."""
    reason = available() if available is not None else None
    if reason:
        return reason
    missing = [name for name in requires if not _installed(name)]
    return f"{missing[0]} is not installed (pip install {missing[0]})" if missing else None


def _installed(distribution: str) -> bool:
    """Whether a distribution is installed, from its metadata alone: checking must not import it."""
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# --- run logs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricPoint:
    """One logged training or evaluation entry, with the field names normalized."""

    step: int
    epoch: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    eval_loss: float | None = None
    mean_token_accuracy: float | None = None
    num_tokens: float | None = None
    line: int | None = None  # where it was read from, for evidence


@dataclass(frozen=True)
class RunConfig:
    """A run's training configuration, normalized across trainers; None means not found."""

    learning_rate: float | None = None
    lr_scheduler: str | None = None
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    num_epochs: float | None = None
    max_steps: int | None = None
    per_device_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    world_size: int | None = None
    max_grad_norm: float | None = None
    max_length: int | None = None
    packing: bool | None = None
    packing_strategy: str | None = None
    padding_free: bool | None = None
    loss_mask: str | None = None  # "completion_only" | "assistant_only" | "all" | "unknown"
    precision: str | None = None
    eval_strategy: str | None = None
    val_set_size: float | None = None
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_target_modules: tuple[str, ...] | None = None
    use_rslora: bool | None = None
    modules_to_save: tuple[str, ...] | None = None
    seed: int | None = None
    finetuning_type: str | None = None  # "lora" | "qlora" | "full"
    framework: str | None = None  # "transformers" | "trl" | "axolotl" | "llamafactory" | "custom"
    group_by_length: bool | None = None
    chat_template: str | None = None  # the template the trainer names: axolotl chat_template, LLaMA-Factory template
    dataset_type: str | None = None  # axolotl's datasets[].type (alpaca, chat_template...), the first one given


@dataclass(frozen=True)
class RunArtifact:
    """One normalized record of a training run, whatever trainer wrote it."""

    path: Path
    reader: str
    config: RunConfig = field(default_factory=RunConfig)
    metrics: tuple[MetricPoint, ...] = ()
    global_step: int | None = None
    finished: bool | None = None
    adapter_config: Mapping[str, Any] = field(default_factory=dict)
    adapter_dir: Path | None = None  # a PEFT adapter found inside the run dir (top level or latest checkpoint)
    framework_versions: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # field name -> "file[:line]" it came from


@dataclass(frozen=True)
class RunLogReaderSpec:
    """A run-directory reader: ``sniff(path)`` is a confidence in [0, 1], ``read(path)`` the artifact."""

    name: str
    summary: str
    sniff: Callable[[Path], float]
    read: Callable[[Path], RunArtifact]
    looks_for: tuple[str, ...] = ()  # file names, listed when no reader matches


# --- audit checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Where a finding comes from: a file:line, example ids, steps or values."""

    text: str
    location: str | None = None
    example_ids: tuple[str, ...] = ()
    steps: tuple[int, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """One problem an audit check found, with its evidence and its fix."""

    check_id: str
    severity: Severity
    message: str
    fix: str
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class AuditCheck:
    """An audit check of ``gradian diagnose``; ``run(ctx)`` yields Findings."""

    id: str
    family: Family
    severity: Severity
    summary: str
    fix: str
    needs: frozenset[Need]
    run: Callable[[Any], Iterable[Finding]]


# --- storage codecs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CodecSpec:
    """A storage codec for index shards: ``write(path, array)`` and a memory-mapped ``read(path)``."""

    name: str
    summary: str
    suffix: str
    write: Callable[[Path, Any], None]
    read: Callable[[Path], Any]


# --- config sections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSection:
    """A config section a plugin owns, read as ``config.<name>``: ``settings`` is its frozen dataclass of fields."""

    name: str
    summary: str
    settings: type  # every field made with gradian.config.option: a default, help text and the values it allows
    aliases: tuple[str, ...] = ()  # names people write for it from other tools; an error points them at ``name``

    def __post_init__(self) -> None:
        # Checked here, where the plugin builds the record, so a malformed section fails that plugin alone.
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"config section name {self.name!r} is not a lower-case identifier")
        if not (isinstance(self.settings, type) and is_dataclass(self.settings)
                and self.settings.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            raise TypeError(f"config section {self.name}: settings {self.settings!r} is not a frozen dataclass")
        for f in fields(self.settings):
            if "help" not in f.metadata or (f.default is MISSING and f.default_factory is MISSING):
                raise TypeError(f"config section {self.name}: field {f.name} is not made with gradian.config.option")


# --- plugin listing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginInfo:
    """One loaded (or failed) plugin, as `gradian plugins` and `gradian doctor` show it."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: tuple[str, ...]
    status: str  # "loaded" | "failed"
    error: str | None = None
