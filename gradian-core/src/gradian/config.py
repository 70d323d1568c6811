"""GradianConfig from YAML and --set: the core's sections grads / evaluation / attribution / train, and the plugins'."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gradian.errors import ConfigError, PluginError
from gradian.plugins import CORE_DISTRIBUTION, get_plugins
from gradian.records import ConfigSection
from gradian.user_files import load_yaml

SectionT = TypeVar("SectionT")

ALL_LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# attribution.aggregation and attribution.ranking; scoring refuses any name attribution.aggregation.AGGREGATIONS lacks
AGGREGATION_CHOICES = ("mean", "harm", "smooth_max", "rank_vote")


def option(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, min: float | None = None,
           max: float | None = None, exclusive_min: bool = False, words: tuple[str, ...] = ()) -> Any:
    """A config field with its help text and the values it allows (``words``: strings a number field also takes)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "exclusive_min": exclusive_min, "words": words}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


_opt = option  # the short name the core's own sections below are written with


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
    # 0.75: +0.039 mean recall@k over the format and span tuning cases at the adapter alone, none more than a row
    # lower, fact and two causes +0.025, by a rule written first; held out 0.858 -> 0.875 over twelve cases
    # (docs/accuracy.md, bench/results/query_terms_tuning.md, bench/results/query_terms.md)
    generated_weight: float = _opt(0.75, "a paired query's weight on the generated answer's term, the rest on the "
                                   "wanted answer's: 0.5 weighs them equally, 1 asks only what taught the answer the "
                                   "model now gives", min=0.0, max=1.0)
    # 0.5: clean-7's false accusation at 0.75 gone (family-wise p 0.02 -> 0.44), the same accusation, recall@k and
    # AUPRC on all thirteen tuning and fresh cases, by the rule written in stop 59; held out, two planted hosts of
    # four no longer accused (docs/accuracy.md, "Adopted as the default")
    accusation_weight: float | None = _opt(0.5, "the generated weight of the queries the cluster and cause tests "
                                           "use (what is accused), the examples still ranked at generated_weight; "
                                           "null: generated_weight for both", min=0.0, max=1.0)
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
    # auto: at the adapter scored alone 0.610 -> 0.680 (tuning) and 0.670 -> 0.755 (held out) mean recall@k, none
    # lower; with 4 checkpoints it lost a planted row on a tuning case and, tested again, on an unseen one, so there
    # it stays diagonal (bench/results/kronecker_wide.md, bench/results/kronecker_wide_checkpoints.md)
    kronecker_wide: str = _opt("auto", "the kronecker fit's wide side (the hidden or MLP width): full fits it as a "
                               "matrix from every row of an exact index (cached beside it), diagonal from 64 sampled "
                               "rows as a projected index must; auto is full where the index is exact and the "
                               "adapter is scored alone (no checkpoints), else diagonal",
                               choices=("auto", "full", "diagonal"))  # attribution.preconditioners.KRONECKER_WIDE
    normalize: bool = _opt(False, "unit-normalize train gradients (cosine scoring)")
    aggregation: str = _opt("mean", "how regressed items' scores combine for the cluster tests and causes",
                            choices=AGGREGATION_CHOICES)
    # smooth_max ranked planted rows higher on the tuning cases (+0.08 recall@k, none lower), but clusters tested on
    # it accused a clean one on the clean control; the mean's accusations were right there (bench/results/aggregation.md)
    ranking: str = _opt("smooth_max", "how regressed items' scores combine into the ranking of examples",
                        choices=AGGREGATION_CHOICES)
    # kurtosis: 0.880 -> 0.910 mean recall@k over the five tuning cases built again (span-0 0.75 -> 0.85, span-1
    # 0.85 -> 0.90, fact-0, format-0, behaviour-0 the same), the bar written down before (bench/results/item_weights.md)
    item_weights: str = _opt("kurtosis", "how the ranking weighs the regressed items: kurtosis (by how few examples "
                             "carry each item's blame, so items the learning rate broke weigh little) or uniform",
                             choices=("uniform", "kurtosis"))  # attribution.aggregation.ITEM_WEIGHTS
    # 1.0: 0.838 -> 0.906 mean recall@k over eight seen planted cases, then 0.855 -> 0.962 over six fresh ones under
    # a rule written before they were scored, none lower (span 0.875 -> 0.900; bench/results/cluster_prior.md)
    cluster_prior: float = _opt(1.0, "share of an accused cluster's mean blame added to each member's blame in the "
                                "ranking of examples (the verdict as a prior on its rows; 0: each row by its own "
                                "blame alone); what is accused never changes", min=0.0)
    top_k: int = _opt(20, "examples listed in the report", min=1)
    chunk_mb: float = _opt(256.0, "MiB of index rows decoded to float32 at a time (scoring, clusters, block stats); "
                           "peak memory is about twice this", min=0.0, exclusive_min=True)
    cluster_field: str | None = _opt(None, "dataset field naming each example's cluster (e.g. source)")
    num_clusters: int | None = _opt(None, "automatic clusters; null picks about sqrt(n/2)", min=2)
    permutations: int = _opt(1000, "random clusters per permutation test", min=10)
    fallback_examples: int = _opt(8, "training examples used as the target without an eval set", min=1)
    span_examples: int = _opt(5, "top examples drilled into by span", min=0)
    # alone: the planted sentence first on 54/58 planted rows of five unseen span seeds against restricted's 45/58, and
    # on 25/25 of the reports' own drilled rows against 20/25, by a rule written before they were scored (tuning seeds:
    # restricted 27/28, alone 26/28; bench/results/spans_checkpoints.md)
    span_blame: str = _opt("alone", "a sentence's blame: restricted = of the loss of its own tokens in the whole "
                           "example; alone = of the example with that sentence as its answer; removed = the example's "
                           "blame minus its blame without it", choices=("restricted", "alone", "removed"))
    # behaviour tuning 0.70 -> 1.00 and 0.65 -> 0.90 recall@k; no shared reply on the fact, format and clean tuning
    # cases, and where the split does not hold nothing changes (bench/results/goal_table.md, docs/accuracy.md).
    # Leading a ranking that accuses nothing: the planted deflections filed under a clean source, 0.30 -> 0.95 and
    # 0.65 -> 0.80 (behaviour-4 and -10, where it was found), 0.70 -> 0.85 and 0.45 -> 0.90 (held-out behaviour-3, -5)
    canned_replies: bool = _opt(True, "the regressed items giving the answer most of them give word for word (a canned "
                                "reply) are tried as a cause of their own, queried with all of it from where it "
                                "leaves the wanted answer (divergent-token queries one token); kept where they "
                                "accuse a cluster the other items do not, or where nothing is accused and their blame "
                                "is clearly the more concentrated (they then lead the ranking), else nothing changes")
    max_causes: int = _opt(3, "most causes the regressed items are split into by their query gradients (1: never)",
                           min=1)
    # 4 points of the run against the adapter alone: 0.90 / 0.75 (fact) and 0.85 / 0.50 (format) recall@k on the
    # lr-5e-4 tuning cases (bench/results/checkpoints.md); each point costs one more index, kept in the cache
    checkpoints: int = _opt(4, "points of the run scored, TracIn-CP: the adapter and the run's checkpoints nearest to "
                            "evenly spaced steps before it, weighted by learning rate (1: the adapter alone)", min=1)
    # with no checkpoints kept, adapter alone 0.55 / 0.52 -> 0.70 / 0.75 mean recall@k / AUPRC at share 0.75 on the
    # lr-5e-4 tuning cases, beside 4 checkpoints only +0.025; off because it accuses the clean travel_chat on the
    # held-out clean-3 (bench/results/base_point.md)
    base_point: float = _opt(0.0, "share of the blame measured at the base model (the adapter with its B matrices "
                             "zeroed, the first point of every run; one more index): 0 leaves it out", min=0.0, max=1.0)
    seed: int = _opt(0, "seed of permutations and clustering", min=0)

    @property
    def chunk_bytes(self) -> int:
        """``chunk_mb`` in bytes (at least one)."""
        return max(1, int(self.chunk_mb * (1 << 20)))

    def wide_side(self, scored_alone: bool) -> str:
        """full or diagonal: kronecker_wide made concrete for a point scored alone or beside the run's checkpoints."""
        if self.kronecker_wide == "auto":
            return "full" if scored_alone else "diagonal"
        return self.kronecker_wide


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


def _plugin_defaults() -> dict[str, Any]:
    return {name: section.settings() for name, section in plugin_sections().items()}


@dataclass(frozen=True)
class GradianConfig:
    """Every setting Gradian reads, in sections: the core's typed, each plugin's read as ``config.<name>`` too."""

    grads: GradsConfig = field(default_factory=GradsConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # Section name -> settings of every installed plugin's section (defaults unless set), declared through the
    # gradian_config_sections hook. Left out of the hash: a dict cannot be hashed, and equal configs still hash equal.
    plugin_sections: Mapping[str, Any] = field(default_factory=_plugin_defaults, hash=False)

    def __getattr__(self, name: str) -> Any:
        """A plugin's section as an attribute, like the core's own (called only when no attribute has the name)."""
        found = self.__dict__.get("plugin_sections", {})
        if name in found:
            return found[name]
        raise AttributeError(f"GradianConfig has no section {name!r} (no installed plugin declares it)")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (tuples as lists), the core's sections then the plugins', for YAML, JSON and manifests."""
        data = {name: dataclasses.asdict(getattr(self, name)) for name in CORE_SECTIONS}
        data.update((name, dataclasses.asdict(values)) for name, values in self.plugin_sections.items())
        return json.loads(json.dumps(data))

    def section_hash(self, *sections: str) -> str:
        """A stable hash of the named sections, for cache keys."""
        data = {name: self.to_dict()[name] for name in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **replaced: Any) -> GradianConfig:
        """A copy with whole sections replaced, the core's or a plugin's."""
        core = {name: values for name, values in replaced.items() if name in CORE_SECTIONS}
        plugin = {name: values for name, values in replaced.items() if name not in CORE_SECTIONS}
        unknown = sorted(set(plugin) - set(self.plugin_sections))
        if unknown:
            raise TypeError(f"GradianConfig has no section {unknown[0]!r}")
        return dataclasses.replace(self, **core, plugin_sections={**self.plugin_sections, **plugin})


# The core's own sections; plugins add theirs through the gradian_config_sections hook.
CORE_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(GradianConfig)  # type: ignore[misc]
                                  if f.name != "plugin_sections"}
SECTIONS_HOOK = "gradian_config_sections"

# Sections of Gradian's own plugin distributions, so that a config naming one without it installed says what to install.
_SECTION_HOMES = {"diagnose": "gradian-checks"}


def plugin_sections() -> dict[str, ConfigSection]:
    """The config sections installed plugins declare, by name; one that takes a core name is refused."""
    plugins = get_plugins()
    declared = plugins.config_sections()
    for name in declared:
        if name in CORE_SECTIONS or name == "plugin_sections" or hasattr(GradianConfig, name):
            owner = plugins.distribution_of(SECTIONS_HOOK, name)
            raise PluginError(f"{SECTIONS_HOOK}: {name!r} is registered by both {CORE_DISTRIBUTION} and {owner}",
                              f"uninstall {owner}")
    return declared


def sections() -> dict[str, ConfigSection]:
    """Every config section by name: the core's own, then those installed plugins declare."""
    core = {name: ConfigSection(name, (cls.__doc__ or "").strip(), cls) for name, cls in CORE_SECTIONS.items()}
    return {**core, **plugin_sections()}


def section_owner(name: str) -> str:
    """The distribution that declares a config section."""
    if name in CORE_SECTIONS:
        return CORE_DISTRIBUTION
    plugins = get_plugins()
    plugins.config_sections()  # collected first: the manager learns each record's distribution when it collects
    return plugins.distribution_of(SECTIONS_HOOK, name)


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
        ok = ok and math.isfinite(value)  # nan passes every range check, and no key means anything by inf
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
    if key in _REPLACED:
        return ConfigError(f"config key {key} no longer exists", f"use {_REPLACED[key]}")
    section, dot, name = key.partition(".")
    declared = sections()
    names = list(declared)
    if section not in declared:
        home = _SECTION_HOMES.get(section)
        if home is not None:
            return ConfigError(f"config {'key ' + key if dot else 'section ' + section} belongs to {home}, which is not "
                               "installed or whose plugin did not load",
                               f"pip install {home}, or remove the {section} settings; `gradian plugins` says why an "
                               "installed plugin did not load")
        aliases = {**_SECTION_ALIASES, **{alias: s.name for s in declared.values() for alias in s.aliases}}
        guess = aliases.get(section.lower()) or next(iter(difflib.get_close_matches(section, names, n=1)), None)
        what = f"config section {section}" if not dot else f"config key {key}: there is no section {section}"
        if guess is None:
            return ConfigError(f"unknown {what}", "the sections are " + ", ".join(names))
        if dot and f"{guess}.{name}" in known:
            return ConfigError(f"unknown {what}", f"did you mean {guess}.{name}?")
        return ConfigError(f"unknown {what}", f"did you mean section {guess}?")
    names = [f.name for f in dataclasses.fields(declared[section].settings)]
    close = difflib.get_close_matches(name, names, n=1) or [n for n in names if name and (name in n or n in name)][:1]
    if close:
        return ConfigError(f"unknown config key {key}", f"did you mean {section}.{close[0]}?")
    return ConfigError(f"unknown config key {key}", f"the keys of {section} are " + ", ".join(names)
                       + " (gradian config --list shows them with their help)")


# Names people write for the core's sections from other tools' configs (a plugin's section declares its own).
_SECTION_ALIASES = {"eval": "evaluation", "training": "train", "trainer": "train", "lora": "train", "grad": "grads",
                    "gradients": "grads", "attribute": "attribution"}


def known_keys() -> list[str]:
    """Every dotted config key, the core's then the plugins', in declaration order."""
    return [f"{name}.{f.name}" for name, section in sections().items() for f in dataclasses.fields(section.settings)]


def build_config(data: dict[str, Any] | None) -> GradianConfig:
    """A validated GradianConfig from a nested dict such as a parsed YAML file."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("the config file is not a mapping of sections", "write it as `grads:`, `evaluation:` ... sections")
    declared = sections()
    built = {}
    for name, values in data.items():
        if name not in declared:
            raise _unknown(str(name), known_keys())
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"config section {name} is not a mapping", f"write it as `{name}:` followed by indented keys")
        built[name] = _build_section(name, declared[name].settings, values)
    plugin = {name: built[name] if name in built else section.settings()
              for name, section in declared.items() if name not in CORE_SECTIONS}
    return GradianConfig(**{name: built[name] for name in CORE_SECTIONS if name in built}, plugin_sections=plugin)


def _build_section(name: str, cls: type[SectionT], values: dict[Any, Any]) -> SectionT:
    """One section's settings from its keys, each checked against its field."""
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
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split one ``--set section.key=value`` into its parts; the value is parsed as YAML."""
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
    declared = sections()
    for text in overrides:
        section, name, value = parse_override(text)
        if section not in declared:
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
