"""Reader for LLaMA-Factory output dirs: ``trainer_log.jsonl`` and the YAML/JSON config LLaMA-Factory
was run with (``training_args.yaml`` from LlamaBoard, or the user's config copied beside it), on top of
the Hugging Face Trainer files it writes underneath."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradian.errors import RunDirError
from gradian.records import MetricPoint, RunArtifact, RunLogReaderSpec
from gradian.runs.artifact_builder import (
    ArtifactBuilder,
    as_bool,
    as_int,
    jsonl_lines,
    merge_series,
    metric_point,
)
from gradian.runs.hf_trainer import config_from_hf_args, fill_from_hf_files
from gradian.user_files import parse_json, parse_yaml, read_bytes

TRAINER_LOG = "trainer_log.jsonl"
# Keys only a LLaMA-Factory config has; two of them make a YAML/JSON file its config.
LLAMAFACTORY_KEYS = frozenset({
    "stage", "finetuning_type", "lora_rank", "lora_target", "cutoff_len", "template", "train_on_prompt",
    "neat_packing", "val_size", "dataset_dir", "quantization_bit", "additional_target",
})
_SKIP = {"trainer_state.json", "adapter_config.json", "all_results.json", "train_results.json", "eval_results.json",
         "config.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "generation_config.json"}


def sniff(path: Path) -> float:
    """Confidence that ``path`` is a LLaMA-Factory output dir."""
    if (path / TRAINER_LOG).is_file():
        return 0.95
    return 0.75 if find_config(path) is not None else 0.0


def _load(path: Path) -> Any:
    """The parsed candidate config, or None when it is not one (unreadable, a FIFO, too big or deep, invalid)."""
    try:
        text = read_bytes(path, "config", RunDirError).decode("utf-8", errors="replace")
        if path.suffix == ".json":
            return parse_json(text, path, "config", RunDirError)
        return parse_yaml(text, path, "config", RunDirError)
    except RunDirError:
        return None


def find_config(run_dir: Path) -> tuple[Mapping[str, Any], Path] | None:
    """The LLaMA-Factory config in the run dir (``training_args.yaml`` first), if any."""
    candidates = [run_dir / "training_args.yaml"] + sorted(
        p for p in run_dir.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.name not in _SKIP
    ) if run_dir.is_dir() else []
    for path in candidates:
        if path.is_file():
            data = _load(path)
            if looks_like_llamafactory(data):
                return data, path
    return None


def looks_like_llamafactory(data: Any) -> bool:
    """Whether parsed YAML/JSON is a LLaMA-Factory config (two LLaMA-Factory-only keys)."""
    return isinstance(data, Mapping) and len(LLAMAFACTORY_KEYS & set(data)) >= 2


def config_from_llamafactory(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """RunConfig fields from LLaMA-Factory's key names (HF TrainingArguments names included)."""
    out = config_from_hf_args(cfg)
    rank = as_int(cfg.get("lora_rank"))
    finetuning = str(cfg.get("finetuning_type", "lora"))
    if finetuning == "lora" and cfg.get("quantization_bit") is not None:
        finetuning = "qlora"
    target = cfg.get("lora_target", "all")
    packing = as_bool(cfg.get("packing"))
    train_on_prompt = as_bool(cfg.get("train_on_prompt"))
    val_size = cfg.get("val_size", 0.0)
    out.update({
        "max_length": cfg.get("cutoff_len", 2048),  # LLaMA-Factory's default cutoff_len
        "lora_r": rank if rank is not None else 8,
        "lora_alpha": cfg.get("lora_alpha", (rank or 8) * 2),  # its default is twice the rank
        "lora_dropout": cfg.get("lora_dropout", 0.0),
        "lora_target_modules": ["all-linear"] if target == "all" else target,
        "use_rslora": cfg.get("use_rslora"),
        "modules_to_save": cfg.get("additional_target"),
        "packing": packing,
        "packing_strategy": "neat_packing" if as_bool(cfg.get("neat_packing")) else ("concat" if packing else None),
        "padding_free": as_bool(cfg.get("neat_packing")) if packing else None,
        "loss_mask": "all" if train_on_prompt else "completion_only",
        "val_set_size": val_size,
        "finetuning_type": finetuning,
        "framework": "llamafactory",
        "chat_template": cfg.get("template"),
    })
    if finetuning not in ("lora", "qlora"):
        for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
            out[key] = None
    if not val_size and cfg.get("eval_dataset") is None:
        out["eval_strategy"] = "no"
    return out


def read_trainer_log(path: Path) -> tuple[list[MetricPoint], int | None, int | None]:
    """Points from trainer_log.jsonl, and its last current_steps and total_steps."""
    points, last, total = [], None, None
    hint = "trainer_log.jsonl has one JSON object per line; remove the broken line"
    for number, entry in jsonl_lines(path, hint):
        if not isinstance(entry, Mapping):
            continue
        step = as_int(entry.get("current_steps"))
        total = as_int(entry.get("total_steps")) or total
        if step is None:
            continue
        last = step
        point = metric_point(entry, step, number, aliases={"lr": "learning_rate"})
        if point.loss is not None or point.eval_loss is not None:
            points.append(point)
    return points, last, total


def read(path: Path) -> RunArtifact:
    """Read a LLaMA-Factory output dir into a RunArtifact."""
    return read_with_config(Path(path), find_config(Path(path)))


def read_with_config(path: Path, found: tuple[Mapping[str, Any], Path] | None) -> RunArtifact:
    """Read a LLaMA-Factory output dir with the config ``found`` (contents and file, in the dir or not)."""
    builder = ArtifactBuilder(Path(path), "llamafactory")
    if found is not None:
        cfg, file = found
        builder.set_many(config_from_llamafactory(cfg), builder.where(file))
        builder.sources["llamafactory_config"] = builder.where(file)
    builder.set("framework", "llamafactory", builder.where(builder.path))
    fill_from_hf_files(builder)
    log = builder.path / TRAINER_LOG
    if log.is_file():
        points, last, total = read_trainer_log(log)
        # trainer_log.jsonl is written as training goes (it survives a crash) but has no grad_norm:
        # it leads, and trainer_state.json fills what it lacks.
        builder.metrics = merge_series(points, builder.metrics)
        builder.sources["metrics"] = builder.where(log)
        if last is not None and (builder.global_step is None or last > builder.global_step):
            builder.global_step = last
            builder.finished = False if total is None or last < total else builder.finished
        builder.set("max_steps", total, builder.where(log))
        if builder.finished is None and total is not None and last is not None:
            builder.finished = last >= total and (builder.path / "train_results.json").is_file()
    if builder.finished is None and (builder.path / "train_results.json").is_file():
        builder.finished = True
    return builder.build()


READER = RunLogReaderSpec(
    name="llamafactory",
    summary="LLaMA-Factory output: trainer_log.jsonl + its YAML/JSON config (+ Trainer files)",
    sniff=sniff,
    read=read,
    looks_for=("trainer_log.jsonl", "training_args.yaml (LLaMA-Factory keys)"),
)
