"""`gradian train`: build a TrainJob, find its backend through the trainer hook, run it, publish its output.

Gradian trains only to check itself (counterfactual retraining, the injection test). Backends are
plugins (gradian-trainer-hf / -trl / -unsloth) reached through ``get_plugins().trainers()``; this
module never imports one until the job runs, and never imports trl or unsloth itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gradian.config import GradianConfig, build_config
from gradian.errors import DatasetError, ModelError, PluginError, TrainingError
from gradian.model.placement import resolve_placement
from gradian.plugins import get_plugins
from gradian.records import TrainerSpec, TrainJob, TrainResult, load_object
from gradian.training.arguments import check_training_placement
from gradian.training.data import check_training_data
from gradian.training.output import ADAPTER_DIR, RUN_DIR, check_output_dir, staged_output, write_job_files
from gradian.user_files import absent

DEFAULT_BACKEND = "hf"
# Where a backend that is not installed would come from, for the "pip install" hint: the naming convention of
# Gradian's trainer plugins, so the core names no plugin distribution.
BACKEND_DISTRIBUTION = "gradian-trainer-{name}"


def make_job(
    base_model: str | None,
    dataset: Path | None,
    out: Path | None,
    config: GradianConfig | None = None,
    *,
    drop_ids: Iterable[str] = (),
    extra_datasets: Iterable[Path] = (),
    trust_remote_code: bool = False,
    device: str = "auto",
    dtype: str = "auto",
) -> TrainJob:
    """A validated TrainJob; the config defaults to GradianConfig(), ``device`` and ``dtype`` to this machine's auto."""
    placement = resolve_placement(device, dtype)  # a bad --device fails before anything is read
    check_training_placement(placement)

    if not base_model:
        raise ModelError("no base model given", "pass --base-model (a local model dir, or smollm2-135m-instruct)")
    if dataset is None:
        raise DatasetError("no training dataset given", "pass --dataset with the JSONL (or JSON, parquet) to train on")
    if out is None:
        raise TrainingError("no output directory given", "pass --out DIR; the adapter goes to DIR/adapter, the run to DIR/run")
    for path in (Path(dataset), *map(Path, extra_datasets)):
        if not path.exists():
            raise DatasetError(f"dataset {path} {absent(path)}", "check the path")
    return TrainJob(
        base_model=str(base_model),
        dataset=Path(dataset),
        out=Path(out),
        config=config if config is not None else GradianConfig(),
        drop_ids=frozenset(drop_ids),
        extra_datasets=tuple(Path(p) for p in extra_datasets),
        trust_remote_code=trust_remote_code,
        device=placement.device,
        dtype=placement.dtype,
    )


def resolve_backend(name: str) -> TrainerSpec:
    """The backend's TrainerSpec; a one-line error when it is unknown, not installed or cannot run here."""
    plugins = get_plugins()
    trainers = plugins.trainers()
    spec = trainers.get(name)
    if spec is None:
        installed = ", ".join(sorted(trainers)) or "none"
        distribution = BACKEND_DISTRIBUTION.format(name=name)
        failure = next((f for f in plugins.failures if f.distribution == distribution), None)
        if failure is not None:
            raise PluginError(f"the {name} backend's plugin ({distribution}) failed to load: {failure.error}",
                              f"reinstall it: pip install --force-reinstall {distribution}")
        raise PluginError(f"training backend {name!r} is not installed (installed backends: {installed})",
                          f"pass --backend with one of them, or install the plugin that registers {name!r} "
                          f"(Gradian's own are named gradian-trainer-<backend>: pip install {distribution})")
    reason = spec.unavailable_reason()
    if reason:
        raise TrainingError(f"the {name} training backend cannot run here: {reason}",
                            "use --backend hf, which runs on CPU or GPU" if name != "hf" else "run gradian doctor")
    return spec


@contextlib.contextmanager
def job_environment() -> Iterator[None]:
    """Off the Hub while a training job runs; the caller's environment and torch determinism flags afterwards."""
    # peft asks the Hub whether the base model's config exists on every adapter save whose base is not a local dir
    # (Trainer checkpoints included), reading HF_HUB_OFFLINE at call time; transformers' full_determinism sets
    # CUDA_LAUNCH_BLOCKING and friends and torch's deterministic mode. None of it may outlive the job in a notebook.
    import torch  # only here: the unsloth plugin reads and writes job files through this module, torch-free

    saved = dict(os.environ)
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update({name: value for name, value in saved.items() if os.environ.get(name) != value})
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def run_training(job: TrainJob, backend: str = DEFAULT_BACKEND, *, overwrite: bool = False) -> TrainResult:
    """Train with the named backend into a staging dir and publish ``<out>/adapter`` and ``<out>/run``."""
    spec = resolve_backend(backend)
    check_output_dir(job.out, overwrite)  # before loading anything: refusing takes a second, not a model load
    check_training_data(job)  # every row read and checked, and data with nothing to learn refused, before the model
    trainer = load_object(spec.load)()
    started = time.monotonic()
    with staged_output(job.out, overwrite) as staged, job_environment():
        result = trainer.train(dataclasses.replace(job, out=staged.staging))
        write_job_files(staged.run_dir, job, backend, result.notes)
    return dataclasses.replace(
        result,
        adapter_dir=job.out / ADAPTER_DIR,
        run_dir=job.out / RUN_DIR,
        seconds=time.monotonic() - started,
        backend=backend,
    )


# --- a job as JSON, for backends that train in another process (unsloth) -----------------------


def job_to_dict(job: TrainJob) -> dict[str, Any]:
    """A TrainJob as plain JSON-able data; ``job_from_dict`` rebuilds an equal job."""
    return {
        "base_model": job.base_model,
        "dataset": str(job.dataset),
        "out": str(job.out),
        "config": job.config.to_dict(),
        "drop_ids": sorted(job.drop_ids),
        "extra_datasets": [str(p) for p in job.extra_datasets],
        "trust_remote_code": job.trust_remote_code,
        "device": job.device,
        "dtype": job.dtype,
    }


def job_from_dict(data: dict[str, Any]) -> TrainJob:
    """The TrainJob that ``job_to_dict`` wrote, with its config validated again."""
    return TrainJob(
        base_model=data["base_model"],
        dataset=Path(data["dataset"]),
        out=Path(data["out"]),
        config=build_config(data["config"]),
        drop_ids=frozenset(data.get("drop_ids", ())),
        extra_datasets=tuple(Path(p) for p in data.get("extra_datasets", ())),
        trust_remote_code=bool(data.get("trust_remote_code", False)),
        device=str(data.get("device", "cpu")),
        dtype=str(data.get("dtype", "float32")),
    )
