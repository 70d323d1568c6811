"""GradianConfig: the sections grads / evaluation / attribution / train / diagnose, from YAML and --set."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.errors import ConfigError
from gradian.user_files import load_yaml

ALL_LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _opt(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, min: float | None = None,
         max: float | None = None, exclusive_min: bool = False, words: tuple[str, ...] = ()) -> Any:
    """A config field with its help text and the values it allows (``words``: strings a number field also takes)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "exclusive_min": exclusive_min, "words": words}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class GradsConfig:
    """How per-example gradients are captured and stored."""

    batch_size: int = _opt(8, "examples per forward/backward when indexing", min=1)
    max_seq_length: int = _opt(1024, "tokens per example; longer examples are truncated", min=1)
    module_filter: str | None = _opt(None, "regex over full module names, e.g. 'down_proj' or 'layers\\.1[0-5]\\.'")
    # float16 halves the index at no measured cost (bench/projection.py); bfloat16 where float16 overflows.
    storage_dtype: str = _opt("float16", "dtype of stored gradients", choices=("float32", "float16", "bfloat16"))
    projection_dim: int | str | None = _opt(
        "auto", "stored width per example: auto (exact when small, else a sketch near 262,144 numbers whose widths "
        "follow each LoRA matrix's size), null (exact LoRA gradients) or a fixed width", min=1, words=("auto",))
    loss_reduction: str = _opt("sum", "per-example loss over supervised tokens", choices=("mean", "sum"))
    loss_mask: str = _opt("auto", "tokens the loss covers: auto (what the run that trained the adapter used, else "
                          "assistant), assistant (assistant turns), completion (all after the prompt) or all",
                          choices=("auto", "assistant", "completion", "all"))
    string_pairs: str = _opt("auto", "how prompt/completion rows of two plain strings are tokenized: auto (raw after "
                             "a TRL or unsloth run, else template), template (a user and an assistant turn through the "
                             "chat template) or raw (prompt + completion + EOS, no template: TRL's SFTTrainer)",
                             choices=("auto", "template", "raw"))
    shard_size: int = _opt(256, "examples per index shard", min=1)
    codec: str = _opt("npy", "storage codec for index shards")
    seed: int = _opt(0, "seed of the random projection", min=0)


@dataclass(frozen=True)
class EvaluationConfig:
    """How the capability is measured on the eval set."""

    metric: str = _opt("exact_match", "per-item score", choices=("exact_match", "contains", "token_f1", "loglik"))
    query_signal: str = _opt("auto", "query gradient",
                             choices=("classic", "contrastive", "divergence", "divergent-token", "margin", "auto"))
    require_significant: bool = _opt(True, "refuse to attribute when the delta's CI includes zero")
    bootstrap_samples: int = _opt(10000, "paired bootstrap resamples", min=100)
    confidence: float = _opt(0.95, "confidence level of the delta's interval", min=0.5, max=0.999)
    max_new_tokens: int = _opt(64, "tokens generated per eval item", min=1)
    batch_size: int = _opt(8, "eval items per generation batch", min=1)
    seed: int = _opt(0, "seed of the bootstrap", min=0)


@dataclass(frozen=True)
class AttributionConfig:
    """How blame is scored, aggregated and reported."""

    # kronecker ranked planted rows above diagonal on every tuning case, exact and projected (bench/results/kronecker.md)
    preconditioner: str = _opt("kronecker", "gradient preconditioner",
                               choices=("none", "diagonal", "kronecker", "block", "adam"))
    damping: float | None = _opt(None, "absolute damping; null means damping_ratio x mean eigenvalue", min=0.0)
    damping_ratio: float = _opt(0.1, "damping relative to the mean eigenvalue", min=0.0)
    normalize: bool = _opt(False, "unit-normalize train gradients (cosine scoring)")
    aggregation: str = _opt("mean", "how regressed items' scores combine", choices=("mean", "rank_vote"))
    top_k: int = _opt(20, "examples listed in the report", min=1)
    chunk_mb: float = _opt(256.0, "MiB of index rows decoded to float32 at a time (scoring, clusters, block stats); "
                           "peak memory is about twice this", min=0.0, exclusive_min=True)
    cluster_field: str | None = _opt(None, "dataset field naming each example's cluster (e.g. source)")
    num_clusters: int | None = _opt(None, "automatic clusters; null picks about sqrt(n/2)", min=2)
    permutations: int = _opt(1000, "random clusters per permutation test", min=10)
    fallback_examples: int = _opt(8, "training examples used as the target without an eval set", min=1)
    span_examples: int = _opt(5, "top examples drilled into by span", min=0)
    max_causes: int = _opt(3, "most causes the regressed items are split into by their query gradients (1: never)",
                           min=1)
    # 4 points of the run against the adapter alone: 0.90 / 0.75 (fact) and 0.85 / 0.50 (format) recall@k on the
    # lr-5e-4 tuning cases (bench/results/checkpoints.md); each point costs one more index, kept in the cache
    checkpoints: int = _opt(4, "points of the run scored, TracIn-CP: the adapter and the run's checkpoints nearest to "
                            "evenly spaced steps before it, weighted by learning rate (1: the adapter alone)", min=1)
    seed: int = _opt(0, "seed of permutations and clustering", min=0)

    @property
    def chunk_bytes(self) -> int:
        """``chunk_mb`` in bytes (at least one)."""
        return max(1, int(self.chunk_mb * (1 << 20)))


@dataclass(frozen=True)
class TrainConfig:
    """How `gradian train` fine-tunes (only to check Gradian itself)."""

    learning_rate: float = _opt(2e-4, "peak learning rate", min=0.0, exclusive_min=True, max=1.0)
    num_epochs: float = _opt(2.0, "epochs (ignored when max_steps is set)", min=0.0, exclusive_min=True)
    max_steps: int | None = _opt(None, "optimizer steps; overrides num_epochs", min=1)
    batch_size: int = _opt(8, "per-device batch size", min=1)
    gradient_accumulation_steps: int = _opt(1, "micro-batches per optimizer step", min=1)
    warmup_ratio: float = _opt(0.03, "fraction of steps spent warming up", min=0.0, max=1.0)
    scheduler: str = _opt("linear", "learning-rate schedule", choices=("linear", "cosine", "constant", "constant_with_warmup"))
    weight_decay: float = _opt(0.0, "AdamW weight decay", min=0.0)
    max_grad_norm: float = _opt(1.0, "gradient clipping norm", min=0.0, exclusive_min=True)
    max_seq_length: int = _opt(1024, "tokens per example", min=1)
    lora_r: int = _opt(8, "LoRA rank", min=1)
    lora_alpha: float = _opt(16.0, "LoRA alpha", min=0.0, exclusive_min=True)
    lora_dropout: float = _opt(0.0, "LoRA dropout", min=0.0, max=0.99)
    target_modules: tuple[str, ...] = _opt(ALL_LORA_PROJECTIONS, "module names LoRA is applied to")
    use_rslora: bool = _opt(False, "rank-stabilized LoRA scaling (alpha / sqrt(r))")
    logging_steps: int = _opt(1, "steps between log entries", min=1)
    checkpoints: int = _opt(4, "evenly spaced checkpoints kept, the last at the final step (adapter, optimizer and "
                               "trainer state each: what checkpoint-ensemble scoring reads)", min=1)
    seed: int = _opt(0, "training seed", min=0)


@dataclass(frozen=True)
class DiagnoseConfig:
    """Thresholds of the audit checks (see docs/checks.md)."""

    near_duplicate_threshold: float = _opt(0.85, "MinHash Jaccard at which two examples are near-duplicates", min=0.0, max=1.0)
    lr_warn: float = _opt(5e-4, "LoRA learning rate that warns", min=0.0)
    lr_error: float = _opt(1e-3, "LoRA learning rate that errors", min=0.0)
    lr_low: float = _opt(2e-5, "LoRA learning rate at or below which the run is too slow", min=0.0)
    near_duplicate_num_perm: int = _opt(128, "MinHash permutations for near-duplicate detection", min=16)
    near_duplicate_ngram: int = _opt(5, "word n-gram size of the MinHash shingles", min=1)
    exact_duplicate_error_fraction: float = _opt(0.05, "share of duplicated rows at which exact_duplicates is an error", min=0.0, max=1.0)
    overlap_ngram: int = _opt(12, "word n-gram an eval answer may not share with a training answer", min=1)
    truncated_error_fraction: float = _opt(0.10, "share of truncated rows at which truncated_answers is an error", min=0.0, max=1.0)
    short_answer_tokens: int = _opt(3, "answers under this many tokens are length outliers", min=0)
    long_answer_factor: float = _opt(20.0, "answers over this many times the median length are outliers", min=1.0)
    prompt_share: float = _opt(0.9, "share of an example's tokens taken by the prompt that counts as dominating", min=0.0, max=1.0)
    alpha_rank_max: float = _opt(4.0, "LoRA scale (alpha/r, alpha/sqrt(r) with rsLoRA) above which it is extreme", min=0.0)
    alpha_rank_min: float = _opt(0.25, "LoRA scale below which it is extreme", min=0.0)
    epochs_warn: float = _opt(3.0, "epochs above which too_many_epochs warns", min=0.0)
    epochs_error: float = _opt(5.0, "epochs at or above which too_many_epochs errors on a small dataset", min=0.0)
    epochs_error_max_rows: int = _opt(1000, "datasets under this many rows count as small", min=1)
    warmup_max_fraction: float = _opt(0.3, "share of total steps at or above which warmup dominates", min=0.0, max=1.0)
    large_batch: int = _opt(32, "effective batch (per device x accumulation x world) above which LoRA batches are large", min=1)
    max_length_truncated_fraction: float = _opt(0.05, "share of rows truncated by the run's max length that is a mismatch", min=0.0, max=1.0)
    loss_zero_consecutive: int = _opt(2, "consecutive logs of loss 0.0 that count as collapse", min=1)
    loss_spike_factor: float = _opt(2.0, "loss above this many times the rolling median is a spike", min=1.0)
    loss_spike_window: int = _opt(20, "logs in the rolling median of loss_spike", min=3)
    loss_spike_max_fraction: float = _opt(0.2, "share of spiking logs above which it is oscillation, not spikes", min=0.0, max=1.0)
    grad_norm_max: float = _opt(100.0, "grad_norm above which it explodes", min=0.0)
    grad_norm_median_factor: float = _opt(10.0, "grad_norm above this many times its median explodes", min=1.0)
    eval_rising_consecutive: int = _opt(2, "consecutive eval_loss rises (train loss falling) that warn", min=1)
    memorization_loss: float = _opt(0.1, "train loss below which the run memorizes", min=0.0)
    memorization_accuracy: float = _opt(0.99, "mean token accuracy at or above which the run memorizes", min=0.0, max=1.0)
    epoch_drop_fraction: float = _opt(0.3, "relative loss drop across an epoch boundary that is sharp", min=0.0, max=1.0)
    plateau_improvement: float = _opt(0.05, "relative loss improvement, first to last quarter, below which loss plateaus", min=0.0, max=1.0)
    adapter_zero_norm: float = _opt(1e-6, "lora_B norm at or below which a tensor is untrained", min=0.0)
    max_evidence: int = _opt(20, "evidence items kept per finding (the rest are counted)", min=1)


@dataclass(frozen=True)
class GradianConfig:
    """Every setting Gradian reads, in sections."""

    grads: GradsConfig = field(default_factory=GradsConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (tuples as lists), for YAML, JSON and manifests."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def section_hash(self, *sections: str) -> str:
        """A stable hash of the named sections, for cache keys."""
        data = {name: self.to_dict()[name] for name in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **sections: Any) -> GradianConfig:
        """A copy with whole sections replaced."""
        return dataclasses.replace(self, **sections)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(GradianConfig)}  # type: ignore[misc]


def allowed_values(f: dataclasses.Field, hint: Any) -> str:
    meta = f.metadata
    if meta.get("choices"):
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("min"), meta.get("max")
    kind = _type_name(hint)
    if meta.get("words"):  # "an integer >= 1, auto or null"
        number = _type_name(next(a for a in typing.get_args(hint) if a is not type(None)))
        others = ", ".join(meta["words"]) + (" or null" if _is_optional(hint) else "")
        return f"{number} {'>' if meta.get('exclusive_min') else '>='} {lo}, {others}" if lo is not None else f"{number}, {others}"
    if lo is not None and hi is not None:
        return f"{kind} in [{lo}, {hi}]"
    if lo is not None:
        return f"{kind} {'>' if meta.get('exclusive_min') else '>='} {lo}"
    return kind


def _type_name(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if _is_optional(hint):
        return f"{_type_name(args[0])} or null"
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _is_optional(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    return (origin is typing.Union or origin is types.UnionType) and type(None) in typing.get_args(hint)


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 reads 1e-4 (no dot) as a string; accept it as the number everyone means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _coerce(key: str, value: Any, f: dataclasses.Field, hint: Any) -> Any:
    """Check one value against its field's type and range; return it in the field's type."""
    declared = hint
    if _is_optional(hint):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if isinstance(value, str) and value in f.metadata.get("words", ()):
        return value
    ok = True
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        value = _yaml_float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif typing.get_origin(hint) is tuple:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    if ok:
        meta = f.metadata
        if meta.get("choices") and value not in meta["choices"]:
            ok = False
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and (value < lo or (meta.get("exclusive_min") and value == lo)):
            ok = False
        if hi is not None and value > hi:
            ok = False
    if not ok:
        raise ConfigError(f"config key {key} has the value {value!r}", f"{key} must be {allowed_values(f, declared)}")
    return value


# Keys that were replaced: an old config file is pointed at the new key instead of at a look-alike.
_REPLACED = {"attribution.chunk_size": "attribution.chunk_mb (a memory budget in MiB, not a row count)"}


def _unknown(key: str, known: list[str]) -> ConfigError:
    """An unknown section or key, with a did-you-mean taken only from the right level: sections for a section,
    the keys of the section named for a key (never a look-alike key of an unrelated section)."""
    import difflib

    if key in _REPLACED:
        return ConfigError(f"config key {key} no longer exists", f"use {_REPLACED[key]}")
    section, dot, name = key.partition(".")
    sections = list(SECTIONS)
    if section not in SECTIONS:
        guess = _SECTION_ALIASES.get(section.lower()) or next(iter(difflib.get_close_matches(section, sections, n=1)), None)
        what = f"config section {section}" if not dot else f"config key {key}: there is no section {section}"
        if guess is None:
            return ConfigError(f"unknown {what}", "the sections are " + ", ".join(sections))
        if dot and f"{guess}.{name}" in known:
            return ConfigError(f"unknown {what}", f"did you mean {guess}.{name}?")
        return ConfigError(f"unknown {what}", f"did you mean section {guess}?")
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    close = difflib.get_close_matches(name, names, n=1) or [n for n in names if name and (name in n or n in name)][:1]
    if close:
        return ConfigError(f"unknown config key {key}", f"did you mean {section}.{close[0]}?")
    return ConfigError(f"unknown config key {key}", f"the keys of {section} are " + ", ".join(names)
                       + " (gradian config --list shows them with their help)")


# Section names people write from other tools' configs.
_SECTION_ALIASES = {"eval": "evaluation", "training": "train", "trainer": "train", "lora": "train", "grad": "grads",
                    "gradients": "grads", "attribute": "attribution", "diagnostics": "diagnose", "audit": "diagnose"}


def known_keys() -> list[str]:
    """Every dotted config key, in declaration order."""
    return [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def build_config(data: dict[str, Any] | None) -> GradianConfig:
    """A validated GradianConfig from a nested dict such as a parsed YAML file."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("the config file is not a mapping of sections", "write it as `grads:`, `evaluation:` ... sections")
    sections = {}
    for name, values in data.items():
        if name not in SECTIONS:
            raise _unknown(str(name), known_keys())
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"config section {name} is not a mapping", f"write it as `{name}:` followed by indented keys")
        cls = SECTIONS[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in values.items():
            dotted = f"{name}.{key}"
            if key not in fields:
                raise _unknown(dotted, known_keys())
            kwargs[key] = _coerce(dotted, value, fields[key], hints[key])
        if name == "grads" and kwargs.get("module_filter"):  # a broken regex: refused here, before any model loads
            compile_module_filter(kwargs["module_filter"])
        sections[name] = cls(**kwargs)
    return GradianConfig(**sections)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split one ``--set section.key=value`` into its parts; the value is parsed as YAML."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        raise ConfigError(f"--set {text!r} is not section.key=value", "for example --set grads.batch_size=4")
    section, _, name = key.partition(".")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except RecursionError:  # a value can be 128 KiB of brackets on a command line
        raise ConfigError(f"--set {key} has a value nested too deep to read", "pass a plain value") from None
    return section, name, value


def load_config(path: Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> GradianConfig:
    """The config from an optional YAML file with ``--set`` overrides applied on top."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists() and not path.is_symlink():
            raise ConfigError(f"config file {path} does not exist", "pass the path of a YAML file to --config")
        data = load_yaml(path, "config file", ConfigError, hint="fix the YAML syntax at that line") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} is not a mapping of sections", "write it as `grads:`, `evaluation:` ... sections")
    return _overridden(data, overrides)


def with_overrides(config: GradianConfig, overrides: list[str] | tuple[str, ...]) -> GradianConfig:
    """``config`` with ``--set section.key=value`` overrides applied on top."""
    return _overridden(config.to_dict(), overrides) if overrides else config


def _overridden(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> GradianConfig:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for text in overrides:
        section, name, value = parse_override(text)
        if section not in SECTIONS:
            raise _unknown(f"{section}.{name}", known_keys())
        current = data.get(section)
        data[section] = dict(current) if isinstance(current, dict) else {}
        data[section][name] = value
    return build_config(data)


def compile_module_filter(module_filter: str | None) -> re.Pattern[str] | None:
    """The grads.module_filter regex, compiled; a broken regex is a ConfigError naming the key."""
    if module_filter is None or module_filter == "":
        return None
    try:
        return re.compile(module_filter)
    except re.error as exc:
        raise ConfigError(
            f"grads.module_filter {module_filter!r} is not a valid regular expression: {exc}",
            "use a Python regex searched in module names, e.g. 'down_proj' or 'layers\\.1[0-5]\\.'",
        ) from exc
