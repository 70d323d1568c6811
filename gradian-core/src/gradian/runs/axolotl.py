"""Reader for axolotl output dirs: the axolotl YAML config (a file, or the block axolotl embeds in the
model card README) on top of the Hugging Face Trainer files axolotl writes underneath."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradian.errors import RunDirError
from gradian.records import RunArtifact, RunLogReaderSpec
from gradian.runs.artifact_builder import ArtifactBuilder, as_bool, as_float
from gradian.runs.hf_trainer import README, fill_from_hf_files
from gradian.user_files import parse_yaml, read_bytes

# Keys only an axolotl config has; two of them (with base_model) make a YAML an axolotl config.
AXOLOTL_KEYS = frozenset({
    "sequence_len", "sample_packing", "train_on_inputs", "lora_target_linear", "micro_batch_size",
    "num_epochs", "val_set_size", "lora_target_modules", "datasets", "adapter", "lr_scheduler",
    "pad_to_sequence_len", "eval_sample_packing",
})
_YAML_BLOCK = re.compile(r"```ya?ml\s*\n(.*?)```", re.DOTALL)


def looks_like_axolotl(data: Any) -> bool:
    """Whether parsed YAML is an axolotl config (base_model plus two axolotl-only keys)."""
    return isinstance(data, Mapping) and "base_model" in data and len(AXOLOTL_KEYS & set(data)) >= 2


def _load_yaml(text: str) -> Any:
    """Parsed YAML, or None when the text is not plain YAML (invalid, tagged or nested too deep)."""
    try:
        return parse_yaml(text, Path("config"), "config", RunDirError)
    except RunDirError:
        return None


def _read(path: Path) -> str:
    """The file's text (undecodable bytes replaced); empty when it is too big to be a config or a README."""
    try:
        return read_bytes(path, "config", RunDirError).decode("utf-8", errors="replace")
    except RunDirError:
        return ""


def find_config(run_dir: Path) -> tuple[Mapping[str, Any], Path, int] | None:
    """The axolotl config and where it is (file, first line): a YAML file in the dir, else the README block."""
    for path in sorted(run_dir.glob("*.y*ml")):
        if path.is_file() and path.suffix in (".yml", ".yaml"):
            data = _load_yaml(_read(path))
            if looks_like_axolotl(data):
                return data, path, 1
    readme = run_dir / README
    if readme.is_file():
        text = _read(readme)
        for match in _YAML_BLOCK.finditer(text):
            data = _load_yaml(match.group(1))
            if looks_like_axolotl(data):
                return data, readme, text.count("\n", 0, match.start(1)) + 1
    return None


def sniff(path: Path) -> float:
    """Confidence that ``path`` is an axolotl output dir (an axolotl config is present)."""
    found = find_config(path)
    if found is None:
        return 0.0
    return 0.9 if found[1].name != README else 0.85


def config_from_axolotl(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """RunConfig fields from axolotl's key names."""
    adapter = cfg.get("adapter")
    targets = cfg.get("lora_target_modules")
    if as_bool(cfg.get("lora_target_linear")):
        targets = ["all-linear"]
    packing = as_bool(cfg.get("sample_packing"))
    # axolotl's multipack keeps samples apart only through a varlen attention path.
    isolated = any(as_bool(cfg.get(key)) for key in ("flash_attention", "flex_attention"))
    precision = "bf16" if as_bool(cfg.get("bf16")) else "fp16" if as_bool(cfg.get("fp16")) else None
    train_on_inputs = as_bool(cfg.get("train_on_inputs"))
    out: dict[str, Any] = {
        "learning_rate": cfg.get("learning_rate"),
        "lr_scheduler": cfg.get("lr_scheduler"),
        "warmup_steps": cfg.get("warmup_steps"),
        "warmup_ratio": cfg.get("warmup_ratio"),
        "num_epochs": cfg.get("num_epochs"),
        "max_steps": cfg.get("max_steps"),
        "per_device_batch_size": cfg.get("micro_batch_size"),
        "gradient_accumulation_steps": cfg.get("gradient_accumulation_steps"),
        "max_grad_norm": cfg.get("max_grad_norm"),
        "max_length": cfg.get("sequence_len"),
        "packing": packing,
        "packing_strategy": "multipack" if packing else None,
        "padding_free": isolated if packing else None,
        "loss_mask": None if train_on_inputs is None else ("all" if train_on_inputs else "completion_only"),
        "precision": precision,
        "val_set_size": as_float(cfg.get("val_set_size")) if "val_set_size" in cfg else None,
        "lora_r": cfg.get("lora_r"),
        "lora_alpha": cfg.get("lora_alpha"),
        "lora_dropout": cfg.get("lora_dropout"),
        "lora_target_modules": targets,
        "use_rslora": cfg.get("peft_use_rslora"),
        "modules_to_save": cfg.get("lora_modules_to_save"),
        "seed": cfg.get("seed"),
        "group_by_length": cfg.get("group_by_length"),
        "finetuning_type": ("qlora" if adapter == "qlora" or as_bool(cfg.get("load_in_4bit")) else str(adapter))
        if adapter else "full",
        "framework": "axolotl",
        "chat_template": cfg.get("chat_template"),
        "dataset_type": dataset_type(cfg),
    }
    if "val_set_size" in cfg and not as_float(cfg.get("val_set_size")) and not cfg.get("test_datasets"):
        out["eval_strategy"] = "no"
    return out


def dataset_type(cfg: Mapping[str, Any]) -> str | None:
    """The prompt format of the first training dataset (``datasets: [{path, type}]``), when it names one."""
    datasets = cfg.get("datasets")
    first = datasets[0] if isinstance(datasets, list) and datasets else None
    kind = first.get("type") if isinstance(first, Mapping) else None
    return kind if isinstance(kind, str) and kind else None


def read(path: Path) -> RunArtifact:
    """Read an axolotl output dir: its config wins for config fields, the Trainer files give the logs."""
    found = find_config(Path(path))
    if found is None:
        raise RunDirError(f"{path}: no axolotl config (YAML with base_model and axolotl keys) found",
                          "pass the axolotl YAML you trained with: --run-config configs/lora.yml")
    return read_with_config(Path(path), *found)


def read_with_config(path: Path, cfg: Mapping[str, Any], file: Path, line: int) -> RunArtifact:
    """Read an axolotl output dir with the config ``cfg`` (found at ``file``:``line``, in the dir or not)."""
    builder = ArtifactBuilder(Path(path), "axolotl")
    builder.set_many(config_from_axolotl(cfg), builder.where(file, line))
    builder.sources["axolotl_config"] = builder.where(file, line)
    fill_from_hf_files(builder)
    return builder.build()


READER = RunLogReaderSpec(
    name="axolotl",
    summary="axolotl output: the axolotl YAML (or the copy in the model card README) + Trainer logs",
    sniff=sniff,
    read=read,
    looks_for=("*.yml / *.yaml axolotl config", "README.md with an axolotl ```yaml block"),
)
