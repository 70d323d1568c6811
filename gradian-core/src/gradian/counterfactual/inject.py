"""`gradian inject`: plant a known-bad cluster in a dataset, train, attribute, and check that it is blamed.

The poison rows are appended to the dataset with ``<cluster field>: gradian-injected`` (the field is
``attribution.cluster_field``, ``source`` unless set); clean rows keep their own value of that field or get
``clean``. Attribution then clusters by that field, so the planted cluster is one cluster among the dataset's own
sources and has to stand out from them. The check passes when the report's verdict accuses the planted cluster
(family-wise permutation p below the report's alpha), first or beside a cluster of the dataset's own that is
significant too (a real cause already in the user's data); the command exits 1 when it does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gradian.atomic_files import write_atomic
from gradian.config import GradianConfig
from gradian.counterfactual.check_config import layered_config
from gradian.counterfactual.retrain import TrainedModel, train_model
from gradian.counterfactual.summary import WrittenResult, write_inject
from gradian.data import Dataset, load_dataset, load_eval_dataset, write_jsonl
from gradian.data.examples import Example, Fields, example_id
from gradian.errors import ConfigError, DatasetError
from gradian.evaluation.ground_truth import rank_planted
from gradian.model.placement import Placement, resolve_placement
from gradian.pipelines.attribute import ProgressFactory, attribute
from gradian.report import command_line

if TYPE_CHECKING:
    from gradian.report.reader import Report

INJECT_SCHEMA = "gradian.inject/1"
INJECTED_LABEL = "gradian-injected"
CLEAN_LABEL = "clean"
DEFAULT_CLUSTER_FIELD = "source"
COMBINED_DATASET = "train-injected.jsonl"
MODEL_DIR = "model"
REPORT_DIR = "report"
ATTRIBUTE_CONFIG = "attribute-config.yaml"  # the config the report was made with, for its reproducing command

Say = Callable[[str], None]


@dataclass(frozen=True)
class InjectPlan:
    """Every input of an injection test, checked, and the combined training set it will write."""

    base_model: str
    dataset: Path
    poison: Path
    eval_dataset: Path
    config: GradianConfig  # attribution.cluster_field set to ``cluster_field``; top_k at least k
    cluster_field: str
    label: str
    examples: tuple[Example, ...]  # clean rows then planted rows, each with the cluster field set
    n_clean: int
    k: int
    out: Path
    backend: str = "hf"
    trust_remote_code: bool = False
    placement: Placement = Placement("cpu", "float32")  # where the model is trained and attributed

    @property
    def n_planted(self) -> int:
        """How many poison rows were planted."""
        return len(self.examples) - self.n_clean

    @property
    def planted_ids(self) -> tuple[str, ...]:
        """Ids of the planted rows in the combined training set."""
        return tuple(example.id for example in self.examples[self.n_clean:])


@dataclass(frozen=True)
class InjectOutcome(WrittenResult):
    """What the injection test measured (the inject.json document) and where it wrote it."""

    @property
    def passed(self) -> bool:
        """True when the planted cluster was accused."""
        return bool(self.result["verdict"]["passed"])


def plan_inject(*, base_model: str | None, dataset: Path | None, poison: Path | None, eval_dataset: Path | None,
                out: Path | None, config_path: Path | None = None, overrides: Sequence[str] = (), k: int | None = None,
                label: str = INJECTED_LABEL, backend: str = "hf", trust_remote_code: bool = False,
                device: str = "auto", dtype: str = "auto") -> InjectPlan:
    """Check the inputs, read dataset and poison (same row format), and build the combined training set in memory."""
    placement = resolve_placement(device, dtype)  # a bad --device fails before anything is read

    for flag, value, what in (("--base-model", base_model, "the base model to fine-tune"),
                              ("--dataset", dataset, "the clean training data"),
                              ("--poison", poison, "the rows to plant (JSONL in the dataset's format)"),
                              ("--eval-dataset", eval_dataset, "eval items the poison should break, with the right answers"),
                              ("--out", out, "a directory for the model, the report, inject.md and inject.json")):
        if not value:
            raise ConfigError(f"gradian inject needs {flag}", f"pass {flag}: {what}")
    if k is not None and k < 1:
        raise ConfigError(f"--k is {k}", "pass a positive k, or leave it out to use the planted cluster's size")
    if not label.strip():
        raise ConfigError("--label is empty", f"pass a cluster name for the planted rows (default {INJECTED_LABEL})")
    if Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out {out} is a file", "pass a directory")
    config = layered_config(None, config_path=config_path, overrides=overrides)
    clean = load_dataset(dataset)
    poison_rows = _load_poison(Path(poison), clean)
    load_eval_dataset(eval_dataset)  # bad eval items fail now, not after training
    field = config.attribution.cluster_field or DEFAULT_CLUSTER_FIELD
    examples = combined_examples(clean, poison_rows, field=field, label=label)
    k = k if k is not None else len(poison_rows)
    attribution = dataclasses.replace(config.attribution, cluster_field=field,
                                      top_k=max(config.attribution.top_k, k))
    return InjectPlan(base_model=str(base_model), dataset=Path(dataset), poison=Path(poison),
                      eval_dataset=Path(eval_dataset), config=config.replace(attribution=attribution),
                      cluster_field=field, label=label, examples=tuple(examples), n_clean=len(clean), k=k,
                      out=Path(out), backend=backend, trust_remote_code=trust_remote_code, placement=placement)


def combined_examples(clean: Sequence[Example], poison: Sequence[Example], *, field: str,
                      label: str) -> list[Example]:
    """Clean rows (keeping their ``field`` value, else ``clean``) followed by the poison rows labelled ``label``."""
    combined = []
    for example in clean:
        value = example.fields.get(field)
        if value == label:
            raise DatasetError(f"{example.location}: a clean row already has {field}={label!r}, the planted cluster's name",
                               "pass another --label for the planted rows")
        if value is None or (isinstance(value, str) and not value.strip()):
            value = CLEAN_LABEL
        combined.append(dataclasses.replace(example, fields=Fields({**example.fields, field: value})))
    for offset, example in enumerate(poison):
        position = len(clean) + offset  # the id embeds the row's position in the combined file
        combined.append(dataclasses.replace(example, index=position,
                                            id=example_id(position, example.content_sha256),
                                            fields=Fields({**example.fields, field: label})))
    return combined


def run_inject(plan: InjectPlan, *, say: Say | None = None, progress: ProgressFactory | None = None,
               command: Sequence[str] | None = None) -> InjectOutcome:
    """Write the combined set, train on it, attribute with clusters by the planted field, and score the result."""
    say = say or (lambda text: None)
    plan.out.mkdir(parents=True, exist_ok=True)
    combined_path = write_jsonl(plan.examples, plan.out / COMBINED_DATASET)
    combined = load_dataset(combined_path)
    if combined.ids != tuple(example.id for example in plan.examples):
        raise DatasetError(f"{combined_path} does not read back as the rows written", "this is a bug in gradian inject")
    say(f"training on {len(combined)} rows ({plan.n_planted} planted as {plan.cluster_field}={plan.label}) "
        f"with {plan.backend}")
    model = train_model("injected", plan.out / MODEL_DIR, base_model=plan.base_model, dataset=combined_path,
                        config=plan.config, backend=plan.backend, trust_remote_code=plan.trust_remote_code,
                        placement=plan.placement)
    say("  " + ("reused the finished model from an earlier run" if model.reused else
                f"{model.steps} steps in {model.seconds:.1f} s, final loss "
                + ("n/a" if model.final_loss is None else f"{model.final_loss:.4f}")))
    say("attributing")
    # The report's provenance gets the `gradian attribute` command that reproduces it (with the config written
    # next to it), so `gradian verify --report` finds the model, the combined dataset and the eval set in it.
    config_path = plan.out / ATTRIBUTE_CONFIG
    write_atomic(config_path, yaml.safe_dump(plan.config.to_dict(), sort_keys=False).encode("utf-8"))
    report_dir = plan.out / REPORT_DIR
    attribute_command = ["gradian", "attribute", "--base-model", plan.base_model, "--adapter", str(model.adapter_dir),
                         "--dataset", str(combined_path), "--eval-dataset", str(plan.eval_dataset),
                         "--run", str(model.run_dir), "--out", str(report_dir), "--config", str(config_path)]
    outcome = attribute(base_model=plan.base_model, adapter=model.adapter_dir, dataset=combined_path,
                        out=report_dir, eval_dataset=plan.eval_dataset, run=model.run_dir,
                        config=plan.config, trust_remote_code=plan.trust_remote_code, progress=progress,
                        command=attribute_command, device=plan.placement.device, dtype=plan.placement.dtype)
    result = inject_result(plan, outcome.parsed, model=model, combined_path=combined_path,
                           report_dir=outcome.out_dir, command=command)
    json_path, markdown_path = write_inject(result, plan.out)
    return InjectOutcome(result=result, json_path=json_path, markdown_path=markdown_path)


def inject_metrics(report: Report, planted_ids: Sequence[str], label: str, k: int) -> dict[str, Any]:
    """The planted cluster's rank, whether it was accused, recall@k / precision@k and the first planted rank."""
    cluster = report.cluster(label)
    accused = report.verdict.accused_clusters  # read_report fills it from accused_cluster for an older report
    listed = sorted(report.top_examples, key=lambda row: row.rank)
    found = rank_planted([row.id for row in listed], planted_ids)  # a report ranks its examples 1..n, in order
    hits = found.hits_at(k)
    attributed = report.attributed
    return {
        "k": k,
        "n_planted": found.planted,
        "cluster_rank": cluster.rank if cluster else None,
        "n_clusters": len(report.clusters) if report.clusters else None,
        "cluster_p_adjusted": cluster.p_adjusted if cluster else None,
        "accused_cluster": report.verdict.accused_cluster,
        "accused_clusters": list(accused),
        "accused": label in accused,
        "recall_at_k": hits / found.planted if attributed and found.planted else None,
        "precision_at_k": hits / k if attributed else None,
        "hits_at_k": hits if attributed else None,
        "first_planted_rank": found.first_hit_rank,
        "ranked_listed": len(listed),
    }


def inject_result(plan: InjectPlan, report: Report, *, model: TrainedModel, combined_path: Path, report_dir: Path,
                  command: Sequence[str] | None = None) -> dict[str, Any]:
    """The inject.json document."""
    metrics = inject_metrics(report, plan.planted_ids, plan.label, plan.k)
    headline, summary = inject_verdict(report, metrics, plan.label)
    capability = report.capability
    return {
        "schema": INJECT_SCHEMA,
        "verdict": {"passed": metrics["accused"], "headline": headline, "summary": summary,
                    "report_kind": report.verdict.kind},
        "metrics": metrics,
        "capability": {"metric": capability.metric, "n_items": capability.n_items,
                       "n_regressed": capability.n_regressed, "base_mean": capability.base_mean,
                       "finetuned_mean": capability.finetuned_mean, "delta": capability.delta,
                       "ci_low": capability.ci_low, "ci_high": capability.ci_high,
                       "significant": capability.significant} if capability else None,
        "clusters": [dataclasses.asdict(row) for row in report.clusters],  # the report's rows, as it wrote them
        "planted_ids": list(plan.planted_ids),
        "inputs": {"base_model": plan.base_model, "dataset": str(plan.dataset), "poison": str(plan.poison),
                   "eval_dataset": str(plan.eval_dataset), "combined_dataset": str(combined_path),
                   "n_clean": plan.n_clean, "n_planted": plan.n_planted, "cluster_field": plan.cluster_field,
                   "label": plan.label, "backend": plan.backend, "device": plan.placement.device,
                   "dtype": plan.placement.dtype, "report": str(report_dir)},
        "training": model.to_dict(),
        "config": plan.config.to_dict(),
        "command": command_line(command) if command is not None else None,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def inject_verdict(report: Report, metrics: dict[str, Any], label: str) -> tuple[str, str]:
    """The PASS / FAIL headline and the line of numbers under it."""
    if not report.attributed:
        return (f"FAIL: the planted cluster `{label}` caused no significant regression, so nothing was blamed.",
                report.verdict.summary
                + " Plant more rows, train longer, or use an eval set the poison actually breaks.")
    rank = metrics["cluster_rank"]
    where = f"rank {rank} of {metrics['n_clusters']}" if rank else "not ranked"
    numbers = (f"recall@{metrics['k']} = {metrics['recall_at_k']:.2f} ({metrics['hits_at_k']} of the top {metrics['k']} "
               f"examples are planted), first planted example at rank {_rank(metrics['first_planted_rank'], metrics)}.")
    others = ", ".join(f"`{name}`" for name in metrics["accused_clusters"] if name != label)
    if metrics["accused"]:
        beside = f"; the report also accuses {others}" if others else ""
        return (f"PASS: the planted cluster `{label}` is blamed ({where}, family-wise p = "
                f"{metrics['cluster_p_adjusted']:.3g}{beside}).", numbers)
    why = f"the report accuses {others} instead" if others else "the report accuses no cluster"
    return f"FAIL: the planted cluster `{label}` is not blamed ({where}; {why}).", numbers


def _rank(rank: int | None, metrics: dict[str, Any]) -> str:
    return str(rank) if rank is not None else f"beyond the {metrics['ranked_listed']} listed"


def _load_poison(path: Path, clean: Dataset) -> list[Example]:
    """The poison rows; they must be in the dataset's row format (so they differ in content, not in shape)."""
    if not path.exists():
        raise DatasetError(f"--poison file {path} does not exist", "pass a JSONL file of the rows to plant")
    poison = load_dataset(path)
    clean_formats = {example.format for example in clean}
    other = next((example for example in poison if example.format not in clean_formats), None)
    if other is not None:
        raise DatasetError(
            f"{other.location}: the poison row is in format {other.format!r}, but --dataset {clean.path} is in "
            f"{' / '.join(repr(f) for f in sorted(clean_formats))}",
            "write the poison rows in the dataset's format, so the planted rows differ in content, not in shape")
    return list(poison)
