"""Reader for Gradian's plain run format, for custom training loops: ``run.json`` + ``metrics.jsonl``.

The format is documented in docs/run-format.md: ``run.json`` holds the config under Hugging Face
TrainingArguments names (plus a ``lora`` block in peft's adapter_config names); ``metrics.jsonl`` holds one
logged entry per line (``step``, ``loss``, ``grad_norm``, ``learning_rate``, ``epoch``, ``eval_loss``,
``mean_token_accuracy``); a line with ``train_runtime`` (or ``"status": "finished"`` in run.json) marks a
finished run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gradian.errors import RunDirError
from gradian.records import MetricPoint, RunArtifact, RunLogReaderSpec
from gradian.runs.artifact_builder import ArtifactBuilder, as_int, jsonl_lines, metric_point, read_json_file
from gradian.runs.hf_trainer import apply_adapter_config, config_from_hf_args

RUN_JSON = "run.json"
METRICS_JSONL = "metrics.jsonl"
STATUSES = ("finished", "running", "crashed", "stopped")


def sniff(path: Path) -> float:
    """Confidence that ``path`` is in the plain format."""
    if (path / RUN_JSON).is_file() and (path / METRICS_JSONL).is_file():
        return 1.0
    if (path / RUN_JSON).is_file() or (path / METRICS_JSONL).is_file():
        return 0.5
    return 0.0


def read_metrics(path: Path) -> tuple[list[MetricPoint], bool]:
    """Points from metrics.jsonl, and whether a final ``train_runtime`` line is there."""
    points, finished = [], False
    for number, entry in jsonl_lines(path, "metrics.jsonl has one JSON object per line (docs/run-format.md)"):
        if not isinstance(entry, Mapping):
            raise RunDirError(f"{path}:{number}: a JSON {type(entry).__name__}, not an object",
                              "metrics.jsonl has one JSON object per line (docs/run-format.md)")
        if "train_runtime" in entry:
            finished = True
            continue
        step = as_int(entry.get("step"))
        if step is None:
            raise RunDirError(f"{path}:{number}: has no integer 'step'",
                              "every metrics.jsonl line needs the optimizer step it was logged at")
        points.append(metric_point(entry, step, number))
    return points, finished


def read(path: Path) -> RunArtifact:
    """Read a plain-format run dir into a RunArtifact."""
    builder = ArtifactBuilder(Path(path), "plain")
    run_json = builder.path / RUN_JSON
    status = None
    if run_json.is_file():
        run = read_json_file(run_json, RUN_JSON)
        if not isinstance(run, Mapping):
            raise RunDirError(f"{run_json}:1: not a JSON object", "run.json is an object (docs/run-format.md)")
        config = run.get("config", {})
        if not isinstance(config, Mapping):
            raise RunDirError(f"{run_json}: 'config' is not an object", "run.json's config is an object of HF names")
        merged = dict(config)
        if isinstance(run.get("lora"), Mapping):
            merged["lora"] = run["lora"]
        source = builder.where(run_json)
        builder.set_many(config_from_hf_args(merged), source)
        builder.set("framework", run.get("framework", "custom"), source)
        status = run.get("status")
        if status is not None and status not in STATUSES:
            raise RunDirError(f"{run_json}: status {status!r} is unknown", f"status is one of {', '.join(STATUSES)}")
        builder.global_step = as_int(run.get("global_step"))
        versions = run.get("framework_versions")
        if isinstance(versions, Mapping):
            builder.framework_versions.update({str(k): str(v) for k, v in versions.items()})
    metrics = builder.path / METRICS_JSONL
    finished_line = False
    if metrics.is_file():
        points, finished_line = read_metrics(metrics)
        builder.set_metrics(points, builder.where(metrics))
        if builder.global_step is None and points:
            builder.global_step = max(p.step for p in points)
    builder.finished = (status == "finished") if status is not None else finished_line
    apply_adapter_config(builder)
    return builder.build()


READER = RunLogReaderSpec(
    name="plain",
    summary="Gradian's plain format for custom loops: run.json + metrics.jsonl (docs/run-format.md)",
    sniff=sniff,
    read=read,
    looks_for=("run.json + metrics.jsonl",),
)
