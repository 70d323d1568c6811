"""Assemble a RunArtifact from several files, remembering which file each field came from."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gradian.errors import RunDirError
from gradian.records import MetricPoint, RunArtifact, RunConfig
from gradian.user_files import load_json, read_bytes, value_problem

_CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
_INT_FIELDS = {"warmup_steps", "max_steps", "per_device_batch_size", "gradient_accumulation_steps", "world_size",
               "max_length", "lora_r", "seed"}
_FLOAT_FIELDS = {"learning_rate", "warmup_ratio", "num_epochs", "max_grad_norm", "val_set_size", "lora_alpha",
                 "lora_dropout"}
_BOOL_FIELDS = {"packing", "padding_free", "use_rslora", "group_by_length"}
_TUPLE_FIELDS = {"lora_target_modules", "modules_to_save"}


def as_float(value: Any) -> float | None:
    """A number from JSON/YAML/pickle values ("1e-4" strings included); None when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def as_int(value: Any) -> int | None:
    """An integer from a number or numeric string (2.0 -> 2); None otherwise."""
    number = as_float(value)
    if number is None or not math.isfinite(number) or number != int(number):
        return None
    return int(number)


def as_bool(value: Any) -> bool | None:
    """A boolean from true/false, 0/1 or "true"/"false" strings; None otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no"):
        return value.strip().lower() in ("true", "yes")
    return None


def as_names(value: Any) -> tuple[str, ...] | None:
    """Module names from a list or a comma-separated string; None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple, set)):
        return tuple(sorted(str(v) for v in value)) if isinstance(value, set) else tuple(str(v) for v in value)
    return None


def _coerce(name: str, value: Any) -> Any:
    if name in _INT_FIELDS:
        return as_int(value)
    if name in _FLOAT_FIELDS:
        return as_float(value)
    if name in _BOOL_FIELDS:
        return as_bool(value)
    if name in _TUPLE_FIELDS:
        return as_names(value)
    return None if value is None else str(value)


class ArtifactBuilder:
    """Collects config fields and metrics from the files of one run directory."""

    def __init__(self, path: Path, reader: str) -> None:
        self.path = path
        self.reader = reader
        self.config: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.metrics: tuple[MetricPoint, ...] = ()
        self.global_step: int | None = None
        self.finished: bool | None = None
        self.adapter_config: dict[str, Any] = {}
        self.adapter_dir: Path | None = None
        self.framework_versions: dict[str, str] = {}

    def where(self, file: Path, line: int | None = None) -> str:
        """A file's path as the user named the run dir (plus :line), as evidence shows it."""
        return f"{file}:{line}" if line else str(file)

    def set(self, name: str, value: Any, source: str, *, override: bool = False) -> None:
        """Record one RunConfig field; the first value found wins unless ``override``."""
        if name not in _CONFIG_FIELDS:
            raise KeyError(name)
        value = _coerce(name, value)
        if value is None or (name in self.config and not override):
            return
        self.config[name] = value
        self.sources[name] = source

    def set_many(self, values: Mapping[str, Any], source: str, *, override: bool = False) -> None:
        """Record several RunConfig fields from one file."""
        for name, value in values.items():
            self.set(name, value, source, override=override)

    def set_metrics(self, points: Iterable[MetricPoint], source: str) -> None:
        """Use these points as the run's metric series."""
        self.metrics = tuple(points)
        if self.metrics:
            self.sources["metrics"] = source

    def build(self) -> RunArtifact:
        """The finished, frozen RunArtifact."""
        return RunArtifact(
            path=self.path,
            reader=self.reader,
            config=RunConfig(**self.config),
            metrics=self.metrics,
            global_step=self.global_step,
            finished=self.finished,
            adapter_config=dict(self.adapter_config),
            adapter_dir=self.adapter_dir,
            framework_versions=dict(self.framework_versions),
            sources=dict(self.sources),
        )


def read_json_file(path: Path, what: str) -> Any:
    """Parse a JSON file; a truncated, invalid, too deep or non-regular one is a RunDirError naming file:line."""
    return load_json(path, what, RunDirError,
                     hint=f"{what} is truncated or was edited by hand; restore it from the latest checkpoint-N/ copy")


def jsonl_lines(path: Path, hint: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSON Lines log; a broken line is a RunDirError."""
    text = read_bytes(path, "log", RunDirError).decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise RunDirError(f"{path}:{number}: not valid JSON ({error.msg})", hint) from None
        except RecursionError:
            raise RunDirError(f"{path}:{number}: the line is nested too deep to read", hint) from None
        except ValueError:  # an integer past Python's 4300-digit conversion limit
            raise RunDirError(f"{path}:{number}: the line holds an integer too long to read", hint) from None
        problem = value_problem(value, line)
        if problem:
            raise RunDirError(f"{path}:{number}: the line {problem}", hint)
        yield number, value


def metric_point(entry: Mapping[str, Any], step: int, line: int | None, aliases: Mapping[str, str] = {}) -> MetricPoint:
    """A MetricPoint from one logged dict; ``aliases`` maps the logger's names to ours (lr -> learning_rate)."""
    values = {aliases.get(key, key): value for key, value in entry.items()}

    def number(key: str) -> float | None:
        return as_float(values.get(key))

    return MetricPoint(
        step=step,
        epoch=number("epoch"),
        loss=number("loss"),
        grad_norm=number("grad_norm"),
        learning_rate=number("learning_rate"),
        eval_loss=number("eval_loss"),
        mean_token_accuracy=number("mean_token_accuracy"),
        num_tokens=number("num_tokens"),
        line=line,
    )


def merge_series(primary: Iterable[MetricPoint], secondary: Iterable[MetricPoint]) -> tuple[MetricPoint, ...]:
    """Points of ``primary``, with fields it lacks filled from ``secondary`` at the same step and kind."""
    def kind(point: MetricPoint) -> str:
        return "eval" if point.eval_loss is not None and point.loss is None else "train"

    extra = {(p.step, kind(p)): p for p in secondary}
    merged = []
    seen = set()
    for point in primary:
        other = extra.get((point.step, kind(point)))
        seen.add((point.step, kind(point)))
        if other is not None:
            fills = {f.name: getattr(other, f.name) for f in dataclasses.fields(MetricPoint)
                     if f.name != "line" and getattr(point, f.name) is None and getattr(other, f.name) is not None}
            point = dataclasses.replace(point, **fills)
        merged.append(point)
    # Points only the secondary file has keep no line: evidence names the primary file.
    merged.extend(dataclasses.replace(p, line=None) for key, p in extra.items() if key not in seen)
    return tuple(sorted(merged, key=lambda p: (p.step, kind(p) == "eval")))
