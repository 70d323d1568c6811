"""`gradian demo` end to end: scenario -> train (hf) -> diagnose -> attribute -> verdict, every stage cached.

The demo knows the ground truth (which rows were planted), so after the verdict it says whether Gradian found
them: each planted cluster's rank (and, with several, whether each is accused) and how many of the top-k examples
are planted.

Caching: the scenario is regenerated (milliseconds) and rewritten only when its bytes change; the adapter is
reused when nothing that changes it did (gradian.training.reuse, as verify and inject reuse theirs); the
attribution report is reused when a key of (adapter, data, eval set, config) matches; the gradient index lives in
the work dir and is reused by its own index id. ``fresh`` deletes the work dir first.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gradian.atomic_files import sha256_file, write_atomic
from gradian.cache import cache_dir
from gradian.config import GradianConfig, build_config
from gradian.demo.scenarios import Scenario, ScenarioFiles, make_scenario
from gradian.diagnose.findings import summary_line
from gradian.diagnose.runner import diagnose
from gradian.errors import ConfigError, ReportError
from gradian.evaluation.ground_truth import cluster_ranks, rank_planted
from gradian.evaluation.metrics import contains
from gradian.file_names import ADAPTER_SAFETENSORS
from gradian.memory import release_freed_memory
from gradian.model.base import resolve_base_model
from gradian.model.embedded import transformers_progress_bars
from gradian.model.placement import Placement, resolve_placement
from gradian.pipelines.attribute import attribute
from gradian.pipelines.train import make_job, run_training
from gradian.records import TrainJob, TrainResult
from gradian.report.reader import REPORT_FILE, Report, read_report
from gradian.report.scores import ScoresFileError, read_scores
from gradian.training.reuse import train_or_reuse

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
BACKEND = "hf"
REPORT_KEY = "demo-report-key.json"
CONFIG_FILE = "config.yaml"

ProgressFactory = Callable[[str], Callable[[int, int], None] | None]
Echo = Callable[[str], None]


def demo_config(scenario: Scenario) -> GradianConfig:
    """The demo's config: a fast LoRA run on short rows, short greedy answers, clusters by ``source``."""
    return build_config({
        "train": {
            # Chosen for a 2-core CPU: short rows, r=8 on every projection, one epoch at batch 8 (50 steps on
            # 400 rows), and a learning rate at which ~20 planted rows change the model's answers.
            "learning_rate": 2e-3, "num_epochs": 1.0, "batch_size": 8, "max_seq_length": scenario.max_seq_length,
            "lora_r": 8, "lora_alpha": 16.0, "warmup_ratio": 0.03, "logging_steps": 1, "seed": scenario.seed,
        },
        "evaluation": {"metric": scenario.metric, "max_new_tokens": 24, "batch_size": 8, "seed": scenario.seed},
        "grads": {"max_seq_length": scenario.max_seq_length, "batch_size": 8},
        # The adapter alone: every checkpoint scored is one more index build, minutes each on a 2-core CPU, and the
        # demo's first run should take minutes; --set attribution.checkpoints=4 scores the run as attribute does.
        "attribution": {"cluster_field": scenario.cluster_field, "seed": scenario.seed, "checkpoints": 1},
    })


@dataclass(frozen=True)
class DemoPaths:
    """The layout of a demo work dir."""

    root: Path

    @property
    def scenario(self) -> Path:
        """train.jsonl, eval.jsonl, scenario.json."""
        return self.root / "scenario"

    @property
    def train(self) -> Path:
        """`gradian train --out`: adapter/ and run/."""
        return self.root / "train"

    @property
    def index(self) -> Path:
        """The gradient index."""
        return self.root / "index"

    @property
    def report(self) -> Path:
        """report.md, report.json, plots."""
        return self.root / "report"


@dataclass(frozen=True)
class GroundTruthCheck:
    """How the verdict compares with what was planted."""

    planted_rows: int
    clusters: int
    planted_in_top: int  # planted rows among the top ``top`` of every example ranked (scores.csv)
    top: int  # how many of the most blamed examples are looked at: k, or all of a shorter ranking
    span_hits: int  # top examples whose top span is the planted sentence (span kind)
    span_checked: int
    # Planted rows whose wrong answer the fine-tuned model now gives on the eval item they attack, and how many
    # of them are in the top (as many as there are of them): a row the model did not learn rightly ranks low.
    reproduced_rows: int | None = None
    reproduced_in_top: int | None = None
    accused: tuple[str, ...] = ()  # every cluster the report's cluster test accuses
    accused_by_rows: tuple[str, ...] = ()  # the others, accused by the rows that hold what the model now says
    # Every planted cluster of its own source (none for the span kind, whose planted rows share a source), its
    # 1-based rank among all clusters (None: not ranked) and its number of rows, aligned.
    planted_clusters: tuple[str, ...] = ()
    cluster_ranks: tuple[int | None, ...] = ()
    cluster_rows: tuple[int, ...] = ()
    untargeted_rows: int = 0  # planted rows that attack no single eval item: left out of the reproduced ranking
    shared_sources: tuple[str, ...] = ()  # the sources planted rows share with clean rows (span, shared_source)

    @property
    def planted_cluster(self) -> str | None:
        """The first planted cluster (the only one but for two_causes), or None."""
        return self.planted_clusters[0] if self.planted_clusters else None

    @property
    def cluster_rank(self) -> int | None:
        """The first planted cluster's rank among all clusters, or None."""
        return self.cluster_ranks[0] if self.cluster_ranks else None

    @property
    def all_accused(self) -> tuple[str, ...]:
        """Every cluster the report accuses, by its cluster test or by its rows."""
        return (*self.accused, *self.accused_by_rows)

    @property
    def verdict_right(self) -> bool | None:
        """Whether the accused clusters are the planted ones: every one of them and no other, or none for a control.

        None where the planted rows have no cluster of their own (the span kind): accusing a cluster cannot be
        right or wrong there.
        """
        if not self.planted_rows:
            return not self.all_accused
        if not self.planted_clusters:
            return None
        return all(name in self.all_accused for name in self.planted_clusters) and not self.wrongly_accused

    @property
    def wrongly_accused(self) -> tuple[str, ...]:
        """Accused clusters where nothing was planted (none for the span kind, whose rows have no cluster)."""
        if not self.planted_clusters:
            return ()
        return tuple(name for name in self.all_accused if name not in self.planted_clusters)

    def _accused_as(self, name: str) -> str:
        """'accused', 'accused by its rows' or 'not accused'."""
        return ("accused" if name in self.accused else "accused by its rows" if name in self.accused_by_rows
                else "not accused")

    def lines(self) -> list[str]:
        """A few terminal lines."""
        if not self.planted_rows:  # a control: the only right answer is to accuse nothing
            what = ", ".join(self.all_accused) if self.all_accused else "nothing"
            return [f"ground truth: nothing was planted (a control); the report accuses {what}"]
        lines = self._cluster_lines()
        k = min(self.top, self.planted_rows)
        lines.append(f"ground truth: {self.planted_in_top} of the top {self.top} examples are planted "
                     f"(recall@{k} {self.planted_in_top / max(k, 1):.2f})" if self.top else
                     "ground truth: the report lists no examples")
        if self.reproduced_rows:
            which = (f"of the {self.planted_rows - self.untargeted_rows} planted rows that attack one eval item"
                     if self.untargeted_rows else "of the planted rows")
            lines.append(f"ground truth: the fine-tuned model reproduces {self.reproduced_rows} {which}; "
                         f"{self.reproduced_in_top} of them are in the top {self.reproduced_rows} "
                         f"(recall@{self.reproduced_rows} {self.reproduced_in_top / self.reproduced_rows:.2f})")
        if self.span_checked:
            lines.append(f"ground truth: the top sentence is the planted one in {self.span_hits} of "
                         f"{self.span_checked} drilled planted examples")
        return lines

    def _cluster_lines(self) -> list[str]:
        """Each planted cluster's rank; with several, whether each is accused and whether the verdict is right."""
        clusters = self.planted_clusters
        lines = []
        for name, rank, count in zip(clusters, self.cluster_ranks, self.cluster_rows, strict=True):
            where = "not ranked" if rank is None else f"ranked {rank} of {self.clusters}"
            accused = f", {self._accused_as(name)}" if len(clusters) > 1 else ""
            lines.append(f"ground truth: the planted cluster {name!r} ({count} rows) is {where}{accused}")
        if len(clusters) > 1:  # the verdict is right only when it names every cause
            found = sum(1 for name in clusters if name in self.all_accused)
            lines.append(f"ground truth: the verdict is {'right' if self.verdict_right else 'wrong'}: it accuses "
                         f"{found} of the {len(clusters)} planted clusters")
        for name in self.shared_sources:  # no cluster to be right about: say whether the one holding them is accused
            lines.append(f"ground truth: planted rows are filed under {name!r} beside clean rows; it is "
                         f"{self._accused_as(name)}")
        if self.wrongly_accused:
            lines.append(f"ground truth: the verdict is wrong: it also accuses "
                         f"{', '.join(repr(name) for name in self.wrongly_accused)}, where nothing was planted")
        return lines


@dataclass(frozen=True)
class DemoResult:
    """What a demo run produced and how long each stage took."""

    workdir: Path
    scenario: Scenario
    files: ScenarioFiles
    report: Report  # report.json as read back (its whole document in ``report.document``)
    report_path: Path
    diagnose_summary: str
    check: GroundTruthCheck
    timings: dict[str, float] = field(default_factory=dict)
    attribution_timings: dict[str, float] = field(default_factory=dict)
    reused: tuple[str, ...] = ()  # stages answered from the cache


def default_workdir(scenario: str, seed: int, shared_source: bool = False) -> Path:
    """``<cache_dir>/demo/<scenario>-<seed>`` (``-shared`` after it for a shared-source scenario)."""
    return cache_dir() / "demo" / f"{scenario}-{seed}{'-shared' if shared_source else ''}"


def run_demo(*, scenario: str = "fact", seed: int = 0, base_model: str = DEFAULT_BASE_MODEL,
             workdir: Path | None = None, fresh: bool = False, config: GradianConfig | None = None,
             progress: ProgressFactory | None = None, echo: Echo = print, device: str = "auto",
             dtype: str = "auto", shared_source: bool = False) -> DemoResult:
    """Generate a scenario, train on it, diagnose the run, attribute the regression, and check the verdict."""
    placement = resolve_placement(device, dtype)  # before the work dir is touched
    paths = DemoPaths(Path(workdir) if workdir is not None else default_workdir(scenario, seed, shared_source))
    if fresh and paths.root.exists():
        _remove_workdir(paths.root)
    with quiet_libraries():
        return _run(paths, scenario, seed, shared_source, base_model, config, progress, echo, placement)


def _run(paths: DemoPaths, scenario: str, seed: int, shared_source: bool, base_model: str,
         config: GradianConfig | None, progress: ProgressFactory | None, echo: Echo,
         placement: Placement) -> DemoResult:
    timings: dict[str, float] = {}
    reused: list[str] = []
    started = time.perf_counter()

    with _timed(timings, "scenario"):
        built = make_scenario(scenario, seed, shared_source=shared_source)
        files = _write_scenario(built, paths.scenario)
        cfg = config if config is not None else demo_config(built)
    shared = f", filed under {', '.join(built.planted_sources)}" if built.shared_source and built.planted_rows else ""
    echo(f"scenario {scenario} (seed {seed}): {len(built.train)} training rows, {len(built.planted_rows)} planted "
         f"({built.planted_fraction:.1%}{shared}), {len(built.eval)} eval items · {files.directory}")

    with _timed(timings, "base model"):
        resolve_base_model(base_model)  # the embedded model's first conversion happens here, with its own bar

    with _timed(timings, "train"):
        if _train(paths, files, cfg, base_model, progress, echo, placement):
            reused.append("train")

    with _timed(timings, "diagnose"):
        summary = _diagnose(paths, files, cfg, base_model, echo)

    with _timed(timings, "attribute"):
        report, attribution_timings, cached = _attribute(paths, files, cfg, base_model, progress, echo, placement)
        if cached:
            reused.append("attribute")
    timings["total"] = round(time.perf_counter() - started, 3)
    return DemoResult(workdir=paths.root, scenario=built, files=files, report=report,
                      report_path=paths.report / "report.md", diagnose_summary=summary,
                      check=check_ground_truth(built, report), timings=timings,
                      attribution_timings=attribution_timings, reused=tuple(reused))


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Hide the libraries' deprecation notes and weight-loading bars; the demo draws its own progress."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"peft(\.|$)")
        with transformers_progress_bars(False):
            yield


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        release_freed_memory()  # training's freed activations must not sit under the attribution that follows
        timings[name] = round(time.perf_counter() - started, 3)


def _remove_workdir(root: Path) -> None:
    """Delete a demo work dir, refusing anything that does not look like one (a mistyped --workdir)."""
    known = {"scenario", "train", "index", "report"}
    entries = {entry.name for entry in root.iterdir()} if root.is_dir() else set()
    if not root.is_dir() or not entries <= known | {f".{name}.partial" for name in known} | {".index.partial"}:
        raise ConfigError(f"--fresh would delete {root}, which is not a demo work dir",
                          "point --workdir at a directory the demo created, or at a new one")
    shutil.rmtree(root)


def _write_scenario(scenario: Scenario, directory: Path) -> ScenarioFiles:
    """Write the scenario unless the same bytes are already there (keeps file times, so caches stay valid)."""
    existing = directory / "scenario.json"
    if existing.is_file():
        try:
            same = json.loads(existing.read_text(encoding="utf-8")) == scenario.manifest()
        except (OSError, json.JSONDecodeError):
            same = False
        if same and (directory / "train.jsonl").is_file() and (directory / "eval.jsonl").is_file():
            return ScenarioFiles(directory, directory / "train.jsonl", directory / "eval.jsonl", existing)
    return scenario.write(directory)


def _key_matches(path: Path, key: dict[str, Any]) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")) == key
    except (OSError, json.JSONDecodeError):
        return False


def _write_key(path: Path, key: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(key, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(path)


def _train(paths: DemoPaths, files: ScenarioFiles, config: GradianConfig, base_model: str,
           progress: ProgressFactory | None, echo: Echo, placement: Placement) -> bool:
    """Train unless an identical earlier run left its adapter (gradian.training.reuse); True when it was reused."""
    def train(job: TrainJob, backend: str) -> TrainResult:
        with trainer_progress(progress("train") if progress is not None else None):
            return run_training(job, backend, overwrite=True)

    job = make_job(base_model, files.train, paths.train, config, device=placement.device, dtype=placement.dtype)
    trained = train_or_reuse(job, BACKEND, train)
    result = trained.result
    if trained.reused:
        echo(f"train: reusing the adapter in {result.adapter_dir} (same data and train config)")
        return True
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.3f}"
    echo(f"train: {result.steps} steps in {result.seconds:.0f} s, final loss {loss} · {result.adapter_dir}")
    return False


@contextmanager
def trainer_progress(update: Callable[[int, int], None] | None) -> Iterator[None]:
    """Route transformers.Trainer's progress (its default tqdm bar and per-step log lines) to ``update``.

    Progress is counted in examples (a step is a batch), like the other stages' bars.

    The Trainer adds ``transformers.trainer.DEFAULT_PROGRESS_CALLBACK`` when it is built; for the duration of
    this block that is a callback that reports (step, max_steps) instead of printing.
    """
    if update is None:
        yield
        return
    # Here, not at the top: importing the demo module (the bench scripts use its helpers) stays transformers-free.
    import transformers.trainer as trainer_module
    from transformers import TrainerCallback

    class StepProgress(TrainerCallback):
        """Reports training progress in examples (steps x effective batch), as the other stages count."""

        def _report(self, args: TrainingArguments, state: TrainerState) -> None:
            per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
            update(state.global_step * per_step, state.max_steps * per_step)

        def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> None:
            self._report(args, state)

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> None:
            self._report(args, state)

    previous = trainer_module.DEFAULT_PROGRESS_CALLBACK
    trainer_module.DEFAULT_PROGRESS_CALLBACK = StepProgress
    try:
        yield
    finally:
        trainer_module.DEFAULT_PROGRESS_CALLBACK = previous


def _diagnose(paths: DemoPaths, files: ScenarioFiles, config: GradianConfig, base_model: str, echo: Echo) -> str:
    """Run the audit checks on the demo's data, run dir and adapter; print the findings that are not info."""
    report = diagnose(dataset=files.train, run=paths.train / "run", adapter=paths.train / "adapter",
                      base_model=base_model, eval_dataset=files.eval, config=config)
    summary = summary_line(report)
    echo(f"diagnose: {summary}")
    for finding in report.findings:
        if finding.severity != "info":
            echo(f"  {finding.severity}: {finding.check_id}: {finding.message}")
    return summary


def report_key(base_model: str, files: ScenarioFiles, adapter: Path, config: GradianConfig,
               placement: Placement | None = None) -> dict[str, Any]:
    """What decides the attribution report: base model, adapter weights, data, eval set, config, device and dtype."""
    return {"base_model": base_model, "adapter_sha256": sha256_file(adapter / ADAPTER_SAFETENSORS),
            "train_sha256": sha256_file(files.train), "eval_sha256": sha256_file(files.eval),
            "config": config.section_hash("grads", "evaluation", "attribution"),
            "compute": (placement or resolve_placement()).to_dict()}


def _attribute(paths: DemoPaths, files: ScenarioFiles, config: GradianConfig, base_model: str,
               progress: ProgressFactory | None, echo: Echo,
               placement: Placement) -> tuple[Report, dict[str, float], bool]:
    """Attribute the regression, or reuse the report of an identical earlier run; True when reused."""
    adapter = paths.train / "adapter"
    key = report_key(base_model, files, adapter, config, placement)
    key_path = paths.report / REPORT_KEY
    if _key_matches(key_path, key) and (paths.report / REPORT_FILE).is_file():
        try:
            return read_report(paths.report), {}, True
        except ReportError:
            pass  # a damaged or older cached report is made again, like one that is missing
    key_path.unlink(missing_ok=True)
    # The report records the `gradian attribute` command that reproduces it, so `gradian verify --report` and a
    # user re-running it by hand find every input, the demo's config included.
    config_path = paths.root / CONFIG_FILE
    write_config(config, config_path)
    command = ["gradian", "attribute", "--base-model", base_model, "--adapter", str(adapter),
               "--dataset", str(files.train), "--eval-dataset", str(files.eval), "--run", str(paths.train / "run"),
               "--index", str(paths.index), "--config", str(config_path), "--out", str(paths.report)]
    outcome = attribute(base_model=base_model, adapter=adapter, dataset=files.train, out=paths.report,
                        eval_dataset=files.eval, run=paths.train / "run", config=config, index_dir=paths.index,
                        progress=progress, command=command, say=echo, device=placement.device,
                        dtype=placement.dtype)
    _write_key(key_path, key)
    return outcome.parsed, dict(outcome.timings), False


def write_config(config: GradianConfig, path: Path) -> None:
    """The config as the YAML file `--config` reads (atomically: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False).encode("utf-8"))


def check_ground_truth(scenario: Scenario, report: Report) -> GroundTruthCheck:
    """Compare the report's clusters, top examples and spans with the planted rows."""
    planted = set(scenario.planted_ids)
    ranked = [row.name for row in report.clusters]
    ranks = cluster_ranks(ranked, scenario.planted_clusters)
    top = ranked_ids(report)
    k = len(planted)
    in_top = rank_planted(top, planted).hits_at(k)
    spans = {span.example_id: span for span in scenario.planted_spans}
    hits = checked = 0
    for drill in report.spans:
        if drill.example_id not in spans or not drill.spans:
            continue
        checked += 1
        best = max(drill.spans, key=lambda s: s.blame if s.blame is not None else float("-inf"))
        hits += int(spans[drill.example_id].found_at(best.message_index, best.start, best.end))
    reproduced = reproduced_planted_ids(scenario, report)
    reproduced_in_top = None
    untargeted = {row_id for row_id, target in zip(scenario.planted_ids, scenario.planted_targets, strict=True)
                  if target is None} if scenario.planted_targets else set()
    if reproduced is not None:
        # Rows whose reproduction cannot be told (another cluster's, with no single target) are neither hits nor
        # misses: they leave the ranking, and the reproduced rows are looked for among the examples that remain.
        remaining = [row_id for row_id in top if row_id not in untargeted]
        reproduced_in_top = rank_planted(remaining, reproduced).hits_at(len(reproduced))
    return GroundTruthCheck(planted_rows=len(planted), clusters=len(ranked), planted_in_top=in_top, top=min(len(top), k),
                            span_hits=hits, span_checked=checked,
                            reproduced_rows=None if reproduced is None else len(reproduced),
                            reproduced_in_top=reproduced_in_top,
                            accused=report.verdict.accused_clusters, accused_by_rows=report.verdict.accused_by_rows,
                            planted_clusters=scenario.planted_clusters, cluster_ranks=ranks,
                            cluster_rows=tuple(len(scenario.cluster_rows(name)) for name in scenario.planted_clusters),
                            untargeted_rows=len(untargeted) if reproduced is not None else 0,
                            shared_sources=() if scenario.planted_clusters else scenario.planted_sources)


def ranked_ids(report: Report) -> list[str]:
    """Every example's id, most blamed first: scores.csv beside report.json, else the top examples it lists."""
    # The report lists top_k examples (20 by default), fewer than two_causes' 40 planted rows: recall@k read from
    # that list alone counted a planted row ranked 21st as missed and scored the reproduced rows on what was left.
    if report.directory is not None:
        try:
            return list(read_scores(report.directory).ids)
        except ScoresFileError:
            pass  # a report from before scores.csv existed: only its listed examples are known
    return [row.id for row in sorted(report.top_examples, key=lambda row: row.rank)]


def reproduced_planted_ids(scenario: Scenario, report: Report) -> set[str] | None:
    """Planted rows whose wrong answer the fine-tuned model gives on the eval item they attack (None: unknown).

    Only rows that attack one eval item can be checked: with several clusters (two_causes) the rows of a cluster
    without single targets (the French answers) are left out; None when no planted row has a target.
    """
    items = {item.id: item for item in (report.capability.items if report.capability is not None else ())}
    if not items or not any(t is not None for t in scenario.planted_targets):
        return None
    reproduced = set()
    for example_id, target, wrong in zip(scenario.planted_ids, scenario.planted_targets, scenario.planted_wrong,
                                         strict=True):
        if target is None:
            continue
        item = items.get(target)
        output = (item.finetuned_output if item is not None else None) or ""
        if wrong and contains(output, wrong):
            reproduced.add(example_id)
    return reproduced
