"""Reader for Hugging Face Trainer run dirs (also what TRL and unsloth write).

Reads ``trainer_state.json`` (top level, else the latest ``checkpoint-N/``), ``training_args.bin``
through the restricted unpickler (never torch.load), ``adapter_config.json`` and, as a fallback, the
model card README's "Training hyperparameters" / "Training results" / "Framework versions" sections.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradian.data.formats import json_type
from gradian.errors import RunDirError
from gradian.file_names import ADAPTER_CONFIG, TRAINER_STATE, TRAINING_ARGS
from gradian.records import MetricPoint, RunArtifact, RunLogReaderSpec
from gradian.runs.artifact_builder import (
    ArtifactBuilder,
    as_float,
    as_int,
    metric_point,
    read_json_file,
)
from gradian.runs.restricted_unpickler import PickledObject, class_name, load_restricted, to_plain
from gradian.user_files import load_yaml

README = "README.md"

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_STEP_KEY = re.compile(r'"step"\s*:\s*(-?\d+)')


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``checkpoint-N`` dirs, oldest first."""
    found = []
    for child in run_dir.iterdir() if run_dir.is_dir() else ():
        match = _CHECKPOINT.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def find_file(run_dir: Path, name: str) -> Path | None:
    """``name`` at the top level, else in the latest checkpoint that has it."""
    if (run_dir / name).is_file():
        return run_dir / name
    for checkpoint in reversed(checkpoints(run_dir)):
        if (checkpoint / name).is_file():
            return checkpoint / name
    return None


def has_training_hyperparameters(readme: Path) -> bool:
    """Whether a model card has the Trainer's "Training hyperparameters" section."""
    try:
        return "training hyperparameters" in readme.read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        return False


def sniff(path: Path) -> float:
    """Confidence that ``path`` is a Hugging Face Trainer output dir."""
    if (path / TRAINER_STATE).is_file():
        return 0.8
    if find_file(path, TRAINER_STATE) is not None:
        return 0.7
    if (path / TRAINING_ARGS).is_file():
        return 0.6
    if (path / README).is_file() and has_training_hyperparameters(path / README):
        return 0.3
    return 0.0


# --- trainer_state.json -------------------------------------------------------------------------


def _entry_lines(text: str, count: int) -> list[int | None]:
    """The line of each log_history entry's "step" key, when the file lets us find them all."""
    start = text.find('"log_history"')
    if start < 0:
        return [None] * count
    positions = [m.start() for m in _STEP_KEY.finditer(text, start)]
    if len(positions) < count:
        return [None] * count
    lines, line, cursor = [], 1 + text.count("\n", 0, start), start
    for position in positions[:count]:
        line += text.count("\n", cursor, position)
        cursor = position
        lines.append(line)
    return lines


def metrics_from_log_history(history: list[Any], text: str, path: Path | None = None) -> tuple[list[MetricPoint], bool]:
    """Train and eval points from ``log_history``, and whether the final summary entry is there.

    An entry that is not an object, or logged at a negative step, is a RunDirError naming the file: no trainer
    writes either, so the file was damaged or is not a trainer state.
    """
    points, finished = [], False
    lines = _entry_lines(text, len(history))
    where = path if path is not None else TRAINER_STATE
    for number, (entry, line) in enumerate(zip(history, lines, strict=True), start=1):
        if not isinstance(entry, Mapping):
            kind = json_type(entry).split(" ")[-1]  # "a string" -> "string"
            raise RunDirError(f"{where}: log_history entry {number} is a JSON {kind}, not an object",
                              "log_history is the list of logged dicts transformers.Trainer writes; restore the "
                              "file from the latest checkpoint-N/ copy")
        if "train_runtime" in entry or "train_loss" in entry:
            finished = True
            continue
        step = as_int(entry.get("step"))
        if step is None:
            continue
        if step < 0:
            raise RunDirError(f"{where}{f':{line}' if line else ''}: log_history entry {number} is logged at step "
                              f"{step}; optimizer steps are never negative",
                              "the file was edited or damaged; restore it from the latest checkpoint-N/ copy")
        # TRL logs eval_mean_token_accuracy next to eval_loss; keep train accuracy only on train points.
        point = metric_point({k: v for k, v in entry.items() if not k.startswith("eval_") or k == "eval_loss"},
                             step, line)
        if point.loss is None and point.eval_loss is None and point.grad_norm is None:
            continue
        points.append(point)
    return points, finished


def checkpoint_finished(global_step: int | None, max_steps: int | None) -> bool:
    """Whether a run whose latest state is a checkpoint's reached its planned last step."""
    # The final summary entry is logged after the last checkpoint is saved, so no checkpoint ever has it; most
    # scripts never call save_state(), and a checkpoint at max_steps is then the only proof the run finished.
    return global_step is not None and max_steps is not None and max_steps > 0 and global_step >= max_steps


def apply_trainer_state(builder: ArtifactBuilder, path: Path) -> None:
    """Metrics, global step, planned steps/epochs and the final-summary flag from trainer_state.json."""
    state = read_json_file(path, TRAINER_STATE)
    if not isinstance(state, Mapping):
        raise RunDirError(f"{path}:1: not a trainer state (a JSON {type(state).__name__})",
                          "trainer_state.json is the object transformers.Trainer writes")
    history = state.get("log_history")
    if not isinstance(history, list):
        raise RunDirError(f"{path}: has no log_history list", "trainer_state.json is the object transformers.Trainer writes")
    text = path.read_text(encoding="utf-8")
    points, finished = metrics_from_log_history(history, text, path)
    source = builder.where(path)
    builder.set_metrics(points, source)
    builder.global_step = as_int(state.get("global_step"))
    max_steps = as_int(state.get("max_steps"))
    for key, value in (("global_step", builder.global_step), ("max_steps", max_steps)):
        if value is not None and value < 0:
            raise RunDirError(f"{path}: {key} is {value}; a step count is never negative",
                              "the file was edited or damaged; restore it from the latest checkpoint-N/ copy")
    builder.finished = finished if path.parent == builder.path else checkpoint_finished(builder.global_step, max_steps)
    builder.sources[TRAINER_STATE] = builder.where(path)
    found = text.find('"global_step"')
    builder.sources["global_step"] = builder.where(path, text.count("\n", 0, found) + 1 if found >= 0 else None)
    builder.set("max_steps", max_steps if max_steps and max_steps > 0 else None, source)
    builder.set("num_epochs", state.get("num_train_epochs"), source)


# --- training_args.bin --------------------------------------------------------------------------


def read_training_args(path: Path) -> tuple[dict[str, Any], str]:
    """The fields of a pickled TrainingArguments (and its class name), read without executing anything."""
    try:
        obj = load_restricted(path)
        is_args = isinstance(obj, PickledObject) and "learning_rate" in obj and "output_dir" in obj
        plain = to_plain(obj) if is_args else None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            UnicodeDecodeError, OSError, MemoryError, RecursionError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunDirError(f"{path}: not a readable pickle ({reason})",
                          "training_args.bin is truncated or not written by transformers; delete it or restore it") from None
    if plain is None:
        raise RunDirError(f"{path}: holds a {class_name(obj)}, not a TrainingArguments",
                          "training_args.bin must be the file transformers.Trainer saves; move the other file away")
    return plain, class_name(obj)


def framework_of(class_qualname: str, args: Mapping[str, Any]) -> str:
    """Which library's arguments class this is."""
    lowered = class_qualname.lower()
    for name in ("unsloth", "axolotl", "llamafactory", "trl"):
        if name in lowered:
            return name
    if "dataset_text_field" in args or "completion_only_loss" in args:
        return "trl"
    return "transformers"


def loss_mask_of(args: Mapping[str, Any]) -> str | None:
    """The loss-mask mode from TRL's and the plain format's argument names."""
    if args.get("assistant_only_loss") is True:
        return "assistant_only"
    if args.get("train_on_inputs") is True or args.get("completion_only_loss") is False:
        return "all"
    if isinstance(args.get("loss_mask"), str):
        return args["loss_mask"]
    if "completion_only_loss" in args or args.get("train_on_inputs") is False:
        # TRL: None means "completion only for prompt-completion data"; conversational data is all tokens.
        return "completion_only"
    return None


def precision_of(args: Mapping[str, Any]) -> str | None:
    """bf16 / fp16 / fp32 from the Trainer's flags (or a plain ``precision``)."""
    if isinstance(args.get("precision"), str):
        return args["precision"]
    if args.get("bf16") is True:
        return "bf16"
    if args.get("fp16") is True:
        return "fp16"
    if "bf16" in args or "fp16" in args:
        return "fp32"
    return None


def config_from_hf_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """RunConfig fields from TrainingArguments / SFTConfig names (old and new TRL names alike)."""
    out: dict[str, Any] = {
        "learning_rate": args.get("learning_rate"),
        "lr_scheduler": args.get("lr_scheduler_type"),
        "num_epochs": args.get("num_train_epochs"),
        "per_device_batch_size": args.get("per_device_train_batch_size"),
        "gradient_accumulation_steps": args.get("gradient_accumulation_steps"),
        "world_size": args.get("world_size"),
        "max_grad_norm": args.get("max_grad_norm"),
        "max_length": args.get("max_length", args.get("max_seq_length")),
        "packing": args.get("packing"),
        "packing_strategy": args.get("packing_strategy"),
        "padding_free": args.get("padding_free"),
        "loss_mask": loss_mask_of(args),
        "precision": precision_of(args),
        "eval_strategy": args.get("eval_strategy", args.get("evaluation_strategy")),
        "seed": args.get("seed"),
        "group_by_length": args.get("group_by_length"),
        "val_set_size": args.get("val_set_size"),
        "finetuning_type": args.get("finetuning_type"),
        "chat_template": args.get("chat_template_path"),  # TRL SFTConfig: the template it trained with instead
    }
    max_steps = as_int(args.get("max_steps"))
    out["max_steps"] = max_steps if max_steps and max_steps > 0 else None
    # transformers 5 folds warmup_ratio into warmup_steps: a value below 1 is a ratio.
    warmup = as_float(args.get("warmup_steps"))
    if warmup is not None and 0 < warmup < 1:
        out["warmup_ratio"] = warmup
    else:
        out["warmup_steps"] = warmup
        out["warmup_ratio"] = args.get("warmup_ratio")
    lora = args.get("lora")
    if isinstance(lora, Mapping):
        out.update(config_from_adapter_config(lora))
    return out


def apply_training_args(builder: ArtifactBuilder, path: Path, *, override: bool = False) -> None:
    """Config fields from training_args.bin."""
    args, qualname = read_training_args(path)
    source = builder.where(path)
    builder.set_many(config_from_hf_args(args), source, override=override)
    builder.set("framework", framework_of(qualname, args), source, override=override)


# --- adapter_config.json ------------------------------------------------------------------------


def config_from_adapter_config(adapter: Mapping[str, Any]) -> dict[str, Any]:
    """LoRA fields of RunConfig from a peft adapter_config.json (or the plain format's ``lora``)."""
    targets = adapter.get("target_modules")
    peft_type = str(adapter.get("peft_type") or "LORA").upper()
    return {
        "lora_r": adapter.get("r", adapter.get("lora_r")),
        "lora_alpha": adapter.get("lora_alpha"),
        "lora_dropout": adapter.get("lora_dropout"),
        "lora_target_modules": [targets] if isinstance(targets, str) and "," not in targets else targets,
        "use_rslora": adapter.get("use_rslora"),
        "modules_to_save": adapter.get("modules_to_save"),
        "finetuning_type": "lora" if peft_type == "LORA" else peft_type.lower(),
    }


def apply_adapter_config(builder: ArtifactBuilder) -> None:
    """The adapter_config.json in the run dir: top level, else a final adapter already found (gradian train's
    sibling adapter/), else the latest checkpoint's."""
    path = find_file(builder.path, ADAPTER_CONFIG)
    if path is None or (path.parent != builder.path and builder.adapter_dir is not None):
        return
    adapter = read_json_file(path, ADAPTER_CONFIG)
    if not isinstance(adapter, Mapping):
        raise RunDirError(f"{path}:1: not a JSON object", "adapter_config.json is the file peft writes")
    builder.adapter_config = dict(adapter)
    builder.adapter_dir = path.parent
    builder.sources["adapter_config"] = builder.where(path)
    builder.set_many(config_from_adapter_config(adapter), builder.where(path))
    if adapter.get("peft_version"):
        builder.framework_versions.setdefault("PEFT", str(adapter["peft_version"]))


# --- gradian train's own files ------------------------------------------------------------------

GRADIAN_TRAIN_CONFIG = "gradian-train.yaml"
GRADIAN_JOB = "gradian-job.json"


def apply_gradian_train(builder: ArtifactBuilder) -> None:
    """What `gradian train` records beside the Trainer files: its train.* config and the sibling adapter/ dir."""
    path = builder.path / GRADIAN_TRAIN_CONFIG
    if not path.is_file():
        return
    config = load_yaml(path, "gradian train config", RunDirError, hint="restore the file gradian train wrote")
    train = config.get("train") if isinstance(config, Mapping) else None
    if not isinstance(train, Mapping):
        return
    source = builder.where(path)
    builder.set_many({
        "max_length": train.get("max_seq_length"),
        "lora_r": train.get("lora_r"),
        "lora_alpha": train.get("lora_alpha"),
        "lora_dropout": train.get("lora_dropout"),
        "lora_target_modules": train.get("target_modules"),
        "use_rslora": train.get("use_rslora"),
        "loss_mask": "assistant_only",  # gradian train trains on core's encode() mask
        "finetuning_type": "lora",
        "framework": "gradian",
    }, source)
    sibling = builder.path.parent / "adapter"
    if (builder.path / GRADIAN_JOB).is_file() and (sibling / ADAPTER_CONFIG).is_file() and builder.adapter_dir is None:
        adapter = read_json_file(sibling / ADAPTER_CONFIG, ADAPTER_CONFIG)
        if isinstance(adapter, Mapping):
            builder.adapter_config = dict(adapter)
            builder.adapter_dir = sibling
            builder.sources["adapter_config"] = builder.where(sibling / ADAPTER_CONFIG)
            builder.set_many(config_from_adapter_config(adapter), builder.where(sibling / ADAPTER_CONFIG))


# --- README.md (model card) ---------------------------------------------------------------------

_README_KEYS = {
    "learning_rate": "learning_rate",
    "train_batch_size": "per_device_batch_size",
    "seed": "seed",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "lr_scheduler_type": "lr_scheduler",
    "lr_scheduler_warmup_steps": "warmup_steps",
    "lr_scheduler_warmup_ratio": "warmup_ratio",
    "num_epochs": "num_epochs",
    "training_steps": "max_steps",
    "num_devices": "world_size",
}


def readme_sections(text: str) -> dict[str, list[tuple[int, str]]]:
    """Lines of each markdown section, keyed by lower-cased heading, with 1-based line numbers."""
    sections: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            current = sections.setdefault(line.lstrip("#").strip().lower(), [])
            continue
        if current is not None:
            current.append((number, line))
    return sections


def apply_readme(builder: ArtifactBuilder, readme: Path) -> None:
    """Hyperparameters, framework versions and (when no state file) the results table of a model card."""
    text = readme.read_text(encoding="utf-8", errors="replace")
    sections = readme_sections(text)
    for number, line in sections.get("training hyperparameters", []):
        key, sep, value = line.strip().lstrip("-").partition(":")
        key, value = key.strip(), value.strip()
        if sep and key in _README_KEYS:
            builder.set(_README_KEYS[key], value, builder.where(readme, number))
        elif sep and key == "mixed_precision_training":
            builder.set("precision", "mixed" if value else None, builder.where(readme, number))
    for _, line in sections.get("framework versions", []):
        parts = line.strip().lstrip("-").strip().rsplit(" ", 1)
        if len(parts) == 2:
            builder.framework_versions.setdefault(parts[0], parts[1])
    if not builder.metrics:
        points = _results_table(sections.get("training results", []))
        builder.set_metrics(points, builder.where(readme))


def _results_table(lines: list[tuple[int, str]]) -> list[MetricPoint]:
    """Points from the model card's "| Training Loss | Epoch | Step | Validation Loss |" table."""
    rows = [(n, [cell.strip() for cell in line.strip().strip("|").split("|")]) for n, line in lines if line.strip().startswith("|")]
    if len(rows) < 2:
        return []
    header = [h.lower() for h in rows[0][1]]
    points = []
    for number, cells in rows[2:]:
        row = dict(zip(header, cells, strict=False))
        step = as_int(row.get("step"))
        if step is None:
            continue
        points.append(MetricPoint(step=step, epoch=as_float(row.get("epoch")), loss=as_float(row.get("training loss")),
                                  eval_loss=as_float(row.get("validation loss")), line=number))
    return points


# --- the reader ---------------------------------------------------------------------------------


def fill_from_hf_files(builder: ArtifactBuilder) -> None:
    """Everything a Trainer output dir offers, in order of trust: state, gradian train's config, args, adapter
    config, README."""
    state = find_file(builder.path, TRAINER_STATE)
    if state is not None:
        apply_trainer_state(builder, state)
    apply_gradian_train(builder)
    args = find_file(builder.path, TRAINING_ARGS)
    if args is not None:
        apply_training_args(builder, args)
    apply_adapter_config(builder)
    readme = builder.path / README
    if readme.is_file():
        apply_readme(builder, readme)


def read(path: Path) -> RunArtifact:
    """Read a Hugging Face Trainer output dir into a RunArtifact."""
    builder = ArtifactBuilder(Path(path), "hf-trainer")
    fill_from_hf_files(builder)
    builder.set("framework", "transformers", builder.where(builder.path))
    return builder.build()


READER = RunLogReaderSpec(
    name="hf-trainer",
    summary="transformers.Trainer output (also TRL, unsloth): trainer_state.json, training_args.bin, README",
    sniff=sniff,
    read=read,
    looks_for=("trainer_state.json", "checkpoint-*/trainer_state.json", "training_args.bin",
               "README.md with 'Training hyperparameters'"),
)
