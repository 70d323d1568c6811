"""`gradian verify`: drop the accused clusters (or the K most blamed examples, or listed ids), retrain, re-evaluate,
and compare with random drops of the same size.

The "full" model the recovery is measured from is the report's own adapter by default (what the user actually
shipped). With ``retrain_full`` it is retrained on the whole dataset with the same backend, config and seed as the
dropped models, so the comparison holds everything but the dropped examples fixed: use it whenever the adapter
was trained by another trainer or config, since then part of any difference is the trainer, not the data.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gradian.config import GradianConfig
from gradian.counterfactual.check_config import layered_config, run_train_section
from gradian.counterfactual.controls import control_sets
from gradian.counterfactual.retrain import TrainedModel, train_model
from gradian.counterfactual.summary import WrittenResult, verify_result, write_verify
from gradian.data import Dataset, load_dataset, load_eval_dataset
from gradian.data.examples import Example
from gradian.errors import ConfigError, DatasetError
from gradian.evaluation import evaluate_capability
from gradian.evaluation.capability import CapabilityResult
from gradian.model.base import base_model_for
from gradian.model.loaded import LoadedModel
from gradian.model.placement import Placement, resolve_placement
from gradian.report import command_line
from gradian.report.drop_set import (
    DropChoice,
    DropSet,
    ReportInputs,
    VerifyInputError,
    check_same_dataset,
    cluster_drop_set,
    file_drop_set,
    parse_drop,
    report_inputs,
    top_drop_set,
)
from gradian.report.reader import CauseRow
from gradian.training.output import RUN_DIR

VERIFY_SCHEMA = "gradian.verify/1"
MODELS_DIR = "models"
FULL_FROM_ADAPTER = "the original adapter"
FULL_RETRAINED = "retrained on the full dataset"

Say = Callable[[str], None]


@dataclass(frozen=True)
class VerifyPlan:
    """Every input of a verify run, resolved and checked before anything trains."""

    base_model: str
    dataset: Path
    dataset_sha256: str
    eval_dataset: Path
    adapter: Path | None  # the original adapter: the full model unless retrain_full
    retrain_full: bool
    config: GradianConfig
    config_sources: tuple[str, ...]
    drop: DropSet
    controls: tuple[tuple[str, ...], ...]
    control_seed: int
    n_examples: int
    out: Path
    backend: str = "hf"
    report_dir: Path | None = None
    causes: tuple[CauseRow, ...] = ()  # the report's split of the regressed items, measured per cause
    trust_remote_code: bool = False
    placement: Placement = Placement("cpu", "float32")  # where every model is trained and evaluated

    @property
    def full_model(self) -> str:
        """Which model the recovery is measured from."""
        return FULL_RETRAINED if self.retrain_full else FULL_FROM_ADAPTER


@dataclass(frozen=True)
class VerifyOutcome(WrittenResult):
    """What verify measured (the verify.json document) and where it wrote it."""

    @property
    def confirmed(self) -> bool:
        """True when dropping recovered significantly more than nothing and than every control."""
        return bool(self.result["verdict"]["confirmed"])


def plan_verify(*, out: Path | None, report_dir: Path | None = None, drop: str | Path | None = None,
                cluster: str | None = None, base_model: str | None = None, adapter: Path | None = None,
                dataset: Path | None = None, eval_dataset: Path | None = None, config_path: Path | None = None,
                overrides: Sequence[str] = (), controls: int = 1, backend: str = "hf", retrain_full: bool = False,
                trust_remote_code: bool = False, device: str = "auto", dtype: str = "auto") -> VerifyPlan:
    """Resolve the inputs (flags first, then what the report names), the config and the drop sets; train nothing."""
    placement = resolve_placement(device, dtype)  # a bad --device fails before anything is read

    if report_dir is None and drop is None:
        raise ConfigError("gradian verify needs --report DIR (an attribution report) or --drop ids.txt",
                          "pass the --out directory of gradian attribute, or a file with one example id per line")
    if drop is not None and cluster is not None:
        raise ConfigError("pass either --drop or --cluster, not both", "--cluster names a cluster of the --report")
    choice = parse_drop(str(drop)) if drop is not None else None
    if choice is not None and choice.kind != "file" and report_dir is None:
        raise ConfigError(f"--drop {drop} needs --report", "pass the attribution report whose blame to drop by, "
                          "or --drop ids.txt with the example ids to drop")
    if cluster is not None and report_dir is None:
        raise ConfigError("--cluster needs --report", "pass the attribution report whose cluster to drop")
    if controls < 0:
        raise ConfigError(f"--controls is {controls}", "pass 0 or more random controls (default 1)")
    if out is None:
        raise ConfigError("gradian verify needs --out", "pass a directory for verify.md, verify.json and the retrained models")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file", "pass a directory")
    report = report_inputs(report_dir) if report_dir is not None else None
    dataset_path = Path(_required(dataset, report, "dataset", "the exact training data, in the same order"))
    eval_path = Path(_required(eval_dataset, report, "eval_dataset", "the eval set the report was measured on"))
    for flag, path, given in (("--dataset", dataset_path, dataset), ("--eval-dataset", eval_path, eval_dataset)):
        if given is None and not path.exists():
            raise DatasetError(f"the report names {flag} {path}, which does not exist here", f"pass {flag}")
    adapter_path = _adapter(adapter, report, retrain_full)
    base = _base_model(base_model, report, adapter_path)
    config, sources = _config(report, adapter_path, config_path, overrides)
    examples = load_dataset(dataset_path)
    check_same_dataset(report, examples)
    load_eval_dataset(eval_path)  # bad eval items fail now, not after minutes of training
    drop_set = _drop_set(choice, report, examples, str(dataset_path), cluster, config)
    if len(drop_set) >= len(examples):
        raise VerifyInputError(f"the drop set holds all {len(examples)} examples, so nothing is left to train on",
                               "drop a smaller cluster, or fewer examples")
    seed = config.attribution.seed
    return VerifyPlan(base_model=base, dataset=dataset_path, dataset_sha256=examples.sha256, eval_dataset=eval_path,
                      adapter=adapter_path, retrain_full=retrain_full or adapter_path is None, config=config,
                      config_sources=sources, drop=drop_set,
                      controls=control_sets(examples.ids, drop_set.ids, controls, seed=seed),
                      control_seed=seed, n_examples=len(examples), out=Path(out), backend=backend,
                      report_dir=Path(report_dir) if report_dir is not None else None,
                      causes=report.report.causes if report is not None else (),
                      trust_remote_code=trust_remote_code, placement=placement)


def _drop_set(choice: DropChoice | None, report: ReportInputs | None, examples: Dataset, dataset_label: str,
              cluster: str | None, config: GradianConfig) -> DropSet:
    """What ``--drop`` (or, without it, the report's accused clusters or ``--cluster``) names, on ``examples``."""
    if choice is not None and choice.kind == "file":
        return file_drop_set(choice.path, examples, dataset_label)
    assert report is not None  # plan_verify refused top:K and accused without --report
    if choice is not None and choice.kind == "top":
        return top_drop_set(report, examples, choice.top, dataset_label)
    return cluster_drop_set(report, examples, cluster=cluster, chunk_bytes=config.attribution.chunk_bytes)


def run_verify(plan: VerifyPlan, *, say: Say | None = None, command: Sequence[str] | None = None) -> VerifyOutcome:
    """Train the dropped, control (and full) models, evaluate them all, and write verify.json and verify.md."""
    say = say or (lambda text: None)
    plan.out.mkdir(parents=True, exist_ok=True)
    eval_items = load_eval_dataset(plan.eval_dataset)
    models_dir = plan.out / MODELS_DIR

    def train(name: str, drop_ids: Sequence[str]) -> TrainedModel:
        say(f"training {name} ({len(drop_ids)} of {plan.n_examples} examples dropped) with {plan.backend}")
        model = train_model(name, models_dir / name, base_model=plan.base_model, dataset=plan.dataset,
                            config=plan.config, drop_ids=drop_ids, backend=plan.backend,
                            trust_remote_code=plan.trust_remote_code, placement=plan.placement)
        say(f"  {name}: " + ("reused the finished model from an earlier run" if model.reused else
                             f"{model.steps} steps in {model.seconds:.1f} s, final loss {_loss(model.final_loss)}"))
        return model

    trained: list[tuple[str, TrainedModel | None, Path]] = []
    if plan.retrain_full:
        full = train("full", ())
        trained.append(("full", full, full.adapter_dir))
    else:
        trained.append(("full", None, plan.adapter))
    dropped = train("dropped", plan.drop.ids)
    trained.append(("dropped", dropped, dropped.adapter_dir))
    for number, ids in enumerate(plan.controls, start=1):
        control = train(f"control-{number}", ids)
        trained.append((f"control-{number}", control, control.adapter_dir))
    evaluations = {}
    for name, _, adapter_dir in trained:
        say(f"evaluating {name} on {len(eval_items)} eval items ({plan.config.evaluation.metric})")
        evaluations[name] = evaluate_adapter(plan.base_model, adapter_dir, eval_items, plan.config,
                                             trust_remote_code=plan.trust_remote_code, placement=plan.placement)
    result = verify_result(plan, {name: model for name, model, _ in trained}, evaluations,
                           command=command_line(command) if command is not None else None)
    json_path, markdown_path = write_verify(result, plan.out)
    return VerifyOutcome(result=result, json_path=json_path, markdown_path=markdown_path)


def evaluate_adapter(base_model: str, adapter: Path, eval_items: Sequence[Example], config: GradianConfig, *,
                     trust_remote_code: bool = False, placement: Placement | None = None) -> CapabilityResult:
    """The eval set scored with the adapter off (base) and on: a CapabilityResult with per-item scores."""
    placement = placement or resolve_placement()
    loaded = LoadedModel.load(base_model, adapter, trust_remote_code=trust_remote_code, device=placement.device,
                              dtype=placement.dtype)
    try:
        return evaluate_capability(loaded, eval_items, config.evaluation, max_seq_length=config.grads.max_seq_length)
    finally:
        del loaded
        gc.collect()  # one model at a time: a 1B base twice over is what runs a laptop out of memory


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _required(given: str | Path | None, report: ReportInputs | None, key: str, what: str) -> str:
    flag = "--" + key.replace("_", "-")
    if given is not None:
        return str(given)
    named = report.named(key) if report is not None else None
    if named:
        return named
    where = "the report does not name it" if report is not None else "there is no --report to take it from"
    raise ConfigError(f"gradian verify needs {flag} ({where})", f"pass {flag}: {what}")


def _base_model(given: str | None, report: ReportInputs | None, adapter: Path | None) -> str:
    """--base-model, else the one the report names, else the one the adapter names when it is on this machine."""
    if given is None and adapter is not None and (report is None or not report.named("base_model")):
        return base_model_for(None, adapter, "verify")
    return _required(given, report, "base_model", "the base model the adapter was trained from")


def _adapter(given: Path | None, report: ReportInputs | None, retrain_full: bool) -> Path | None:
    """The original adapter, when there is one to compare with; None means the full model is retrained."""
    if given is not None:
        if not Path(given).is_dir():
            raise ConfigError(f"--adapter {given} is not a directory", "pass the PEFT adapter directory of the fine-tune")
        return Path(given)
    named = report.named("adapter") if report is not None else None
    if named is None:
        return None
    if not Path(named).is_dir():
        if retrain_full:
            return None  # not needed: the full model is retrained
        raise ConfigError(f"the report's adapter {named} does not exist here",
                          "pass --adapter, or --retrain-full to retrain the full model instead")
    return Path(named)


def _config(report: ReportInputs | None, adapter: Path | None, config_path: Path | None,
            overrides: Sequence[str]) -> tuple[GradianConfig, tuple[str, ...]]:
    """The report's config, with the train section of the adapter's own gradian run when there is one, then flags."""
    sources = ["the report's config"] if report is not None else ["defaults"]
    train_section, train_path = None, None
    run_dirs = [Path(report.named("run"))] if report is not None and report.named("run") else []
    if adapter is not None:
        run_dirs.append(adapter.parent / RUN_DIR)  # the layout gradian train writes: OUT/adapter next to OUT/run
    for run_dir in run_dirs:
        train_section, train_path = run_train_section(run_dir)
        if train_section is not None:
            sources.append(f"train section of {train_path} (the adapter's own training run)")
            break
    if config_path is not None:
        sources.append(f"--config {config_path}")
    if overrides:
        sources.append("--set " + " ".join(overrides))
    config = layered_config(report.config if report is not None else None, train_section=train_section,
                            config_path=config_path, overrides=overrides)
    return config, tuple(sources)
