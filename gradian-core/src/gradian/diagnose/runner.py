"""The diagnose runner: load the inputs, pick the checks, run those whose needs are met, collect findings."""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.config import GradianConfig
from gradian.data import scan_dataset
from gradian.data.loading import scan_eval_dataset
from gradian.diagnose.adapter import read_adapter
from gradian.diagnose.context import NEED_FLAGS, AuditContext
from gradian.errors import ConfigError, DatasetError, GradianError
from gradian.file_names import ADAPTER_CONFIG, ADAPTER_SAFETENSORS, TRAINER_STATE
from gradian.model.base import _load_tokenizer_from, local_base_model_named_by
from gradian.plugins import PluginSet, get_plugins
from gradian.records import FAMILIES, SEVERITIES, AuditCheck, Finding, Need, RunArtifact
from gradian.runs import read_run
from gradian.runs.training_format import TokenizerChoice
from gradian.user_files import DATASET_LIMIT, read_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FAIL_ON = ("error", "warning", "never")
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class SkippedCheck:
    """A selected check that did not run because an input it needs was not given."""

    id: str
    family: str
    missing: tuple[Need, ...]
    texts: tuple[str, ...] = ()  # each missing need in words (an input given but empty says so), when known

    def reason(self) -> str:
        """What to pass to run it."""
        return "needs " + " and ".join(dict.fromkeys(self.texts or (NEED_FLAGS[need] for need in self.missing)))


@dataclass(frozen=True)
class FailedCheck:
    """A check that raised instead of returning findings (a bug in the check, reported, never fatal)."""

    id: str
    error: str


@dataclass(frozen=True)
class DiagnoseReport:
    """Everything one diagnose run found, skipped and failed, with the inputs it read."""

    findings: tuple[Finding, ...]
    ran: tuple[str, ...]
    skipped: tuple[SkippedCheck, ...]
    failed: tuple[FailedCheck, ...]
    checks: Mapping[str, AuditCheck]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)
    run: RunArtifact | None = None

    def counts(self) -> dict[str, int]:
        """Number of findings per severity."""
        counts = {severity: 0 for severity in SEVERITIES}
        for finding in self.findings:
            counts[finding.severity] += 1
        return counts

    def flagged_steps(self) -> dict[str, list[int]]:
        """Steps named in the evidence of each finding (for plots)."""
        steps: dict[str, list[int]] = {}
        for finding in self.findings:
            found = sorted({step for evidence in finding.evidence for step in evidence.steps})
            if found:
                steps.setdefault(finding.check_id, []).extend(found)
        return steps


def resolve_selection(checks: Mapping[str, AuditCheck], select: Sequence[str] = (), ignore: Sequence[str] = ()) -> list[AuditCheck]:
    """The checks named by ``--select`` (all when empty) minus ``--ignore``; items are ids or families."""

    def expand(items: Sequence[str], flag: str) -> set[str]:
        chosen: set[str] = set()
        for item in (part.strip() for raw in items for part in raw.split(",")):
            if not item:
                continue
            if item in FAMILIES:
                chosen.update(cid for cid, check in checks.items() if check.family == item)
            elif item in checks:
                chosen.add(item)
            else:
                close = difflib.get_close_matches(item, list(checks) + list(FAMILIES), n=1)
                hint = f"did you mean {close[0]}?" if close else "run `gradian diagnose --list` to see the check ids"
                raise ConfigError(f"{flag}: {item!r} is neither a check id nor a family ({', '.join(FAMILIES)})", hint)
        return chosen

    selected = expand(select, "--select") if select else set(checks)
    selected -= expand(ignore, "--ignore")
    return [check for cid, check in checks.items() if cid in selected]


def _sort_key(checks: Mapping[str, AuditCheck]):
    order = {family: rank for rank, family in enumerate(FAMILIES)}

    def key(finding: Finding) -> tuple[int, int, str]:
        check = checks.get(finding.check_id)
        return (SEVERITY_RANK.get(finding.severity, 9), order.get(check.family, 9) if check else 9, finding.check_id)

    return key


def run_checks(ctx: AuditContext, checks: Iterable[AuditCheck], inputs: Mapping[str, Any] | None = None) -> DiagnoseReport:
    """Run every check whose needs the context meets; the rest are reported as skipped."""
    started = time.perf_counter()
    checks = list(checks)
    have = ctx.available()
    findings: list[Finding] = []
    ran, skipped, failed = [], [], []
    timings: dict[str, float] = {}
    for check in checks:
        missing = tuple(need for need in sorted(check.needs) if need not in have)
        if missing:
            skipped.append(SkippedCheck(check.id, check.family, missing, tuple(ctx.need_text(n) for n in missing)))
            continue
        began = time.perf_counter()
        try:
            produced = list(check.run(ctx) or ())
        except GradianError:
            raise  # the user's input is at fault (a model that does not load, ...): one line, exit 2
        except Exception as error:  # a buggy check is reported, and the others still run
            failed.append(FailedCheck(check.id, f"{type(error).__name__}: {error}".splitlines()[0]))
            continue
        finally:
            timings[check.id] = time.perf_counter() - began
        ran.append(check.id)
        for finding in produced:
            if finding.severity not in SEVERITIES:
                failed.append(FailedCheck(check.id, f"finding with unknown severity {finding.severity!r}"))
                continue
            findings.append(finding)
    findings.sort(key=_sort_key({c.id: c for c in checks}))
    return DiagnoseReport(
        findings=tuple(findings), ran=tuple(ran), skipped=tuple(skipped), failed=tuple(failed),
        checks={c.id: c for c in checks}, inputs=dict(inputs or {}), seconds=time.perf_counter() - started,
        timings=timings, run=ctx.run,
    )


def exit_code(report: DiagnoseReport, fail_on: str) -> int:
    """1 when a finding at or above ``fail_on`` exists (or a check crashed and fail_on is not never), else 0."""
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r} is unknown", f"use one of: {', '.join(FAIL_ON)}")
    if fail_on == "never":
        return 0
    threshold = SEVERITY_RANK[fail_on]
    if report.failed or any(SEVERITY_RANK[f.severity] <= threshold for f in report.findings):
        return 1
    return 0


def ensure_utf8(path: Path, what: str = "dataset") -> None:
    """A text dataset that is not UTF-8 is an input error (file:line), not a row to report."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() == ".parquet":
        return
    data = read_bytes(path, what, DatasetError, limit=DATASET_LIMIT)  # bounded: /dev/zero or 20 GiB never fill memory
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DatasetError(f"{path}:{line}: the {what} is not UTF-8 (byte 0x{data[error.start]:02x})",
                           "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def run_inputs(artifact: RunArtifact, run_config: Path | None = None) -> dict[str, Any]:
    """What the report says about the run dir: its reader, and the files the config and the logs came from."""
    described: dict[str, Any] = {"path": str(artifact.path), "reader": artifact.reader,
                                 "logged_points": len(artifact.metrics), "global_step": artifact.global_step}
    if run_config is not None:
        described["run_config"] = str(run_config)
    # A state read from checkpoint-N/ (no top-level trainer_state.json) is named, so steps are not taken as final.
    if artifact.sources.get(TRAINER_STATE):
        described["trainer_state"] = artifact.sources[TRAINER_STATE]
    return described


def base_model_from_adapter(adapter_dir: Path | None, inputs: dict[str, Any]) -> str | None:
    """The base model the adapter names, when it is on this machine (diagnose runs without one otherwise)."""
    named = local_base_model_named_by(adapter_dir) if adapter_dir is not None else None
    if named is not None:
        inputs["base_model"] = named
        inputs["base_model_from"] = str(adapter_dir / ADAPTER_CONFIG)
    return named


def build_context(
    config: GradianConfig,
    *,
    dataset: Path | None = None,
    eval_dataset: Path | None = None,
    run: Path | None = None,
    run_format: str | None = None,
    run_config: Path | None = None,
    adapter: Path | None = None,
    base_model: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    tokenizer_dir: Path | None = None,
    trust_remote_code: bool = False,
    plugins: PluginSet | None = None,
) -> tuple[AuditContext, dict[str, Any]]:
    """Load every input that was given into an AuditContext, and describe the inputs for the report."""
    inputs: dict[str, Any] = {}
    if tokenizer_dir is not None and tokenizer is None:  # --tokenizer: what the template and loss checks render with
        tokenizer = _load_tokenizer_from(Path(tokenizer_dir).expanduser(), trust_remote_code=trust_remote_code)
        inputs["tokenizer"] = str(tokenizer_dir)
    scan = eval_scan = artifact = adapter_info = None
    if dataset is not None:
        ensure_utf8(Path(dataset))
        scan = scan_dataset(dataset)
        inputs["dataset"] = {"path": str(dataset), "rows": scan.rows, "bad_rows": len(scan.problems)}
    if eval_dataset is not None:
        ensure_utf8(Path(eval_dataset), "eval dataset")
        eval_scan = scan_eval_dataset(eval_dataset)
        eval_scan.raise_first()
        inputs["eval_dataset"] = {"path": str(eval_dataset), "rows": eval_scan.rows}
    if run is not None:
        readers = (plugins or get_plugins()).run_log_readers()
        artifact = read_run(Path(run), run_format, readers, run_config)
        inputs["run"] = run_inputs(artifact, run_config)
    if adapter is not None:
        adapter_info = read_adapter(Path(adapter))
        inputs["adapter"] = {"path": str(adapter), "tensors": len(adapter_info.tensors)}
    elif artifact is not None and artifact.adapter_dir is not None and (artifact.adapter_dir / ADAPTER_SAFETENSORS).is_file():
        adapter_info = read_adapter(artifact.adapter_dir)
        inputs["adapter"] = {"path": str(artifact.adapter_dir), "tensors": len(adapter_info.tensors),
                             "found_in_run_dir": True}
    if base_model is None:
        adapter_dir = Path(adapter) if adapter is not None else (artifact.adapter_dir if artifact is not None else None)
        base_model = base_model_from_adapter(adapter_dir, inputs)
    else:
        inputs["base_model"] = str(base_model)
    ctx = AuditContext(config, dataset=scan, eval_dataset=eval_scan, run=artifact, adapter=adapter_info,
                       base_model=base_model, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
    if tokenizer_dir is not None:
        ctx.tokenizer_choice = TokenizerChoice(f"the tokenizer given ({tokenizer_dir})")
    return ctx, inputs


def diagnose(
    *,
    dataset: Path | str | None = None,
    run: Path | str | None = None,
    run_format: str | None = None,
    run_config: Path | str | None = None,
    adapter: Path | str | None = None,
    base_model: str | None = None,
    eval_dataset: Path | str | None = None,
    config: GradianConfig | None = None,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    tokenizer_dir: Path | str | None = None,
    trust_remote_code: bool = False,
    plugins: PluginSet | None = None,
) -> DiagnoseReport:
    """Run the audit checks on whatever inputs are given (Python API of `gradian diagnose`)."""
    if dataset is None and run is None and adapter is None:
        raise DatasetError("diagnose needs something to audit", "pass --dataset, and --run for config and dynamics checks")
    if run_config is not None and run is None:
        raise ConfigError(f"--run-config {run_config} needs --run", "add --run with the output_dir the run wrote")
    started = time.perf_counter()
    plugins = plugins or get_plugins()
    checks = resolve_selection(plugins.audit_checks(), select, ignore)
    ctx, inputs = build_context(
        config or GradianConfig(),
        dataset=Path(dataset) if dataset is not None else None,
        eval_dataset=Path(eval_dataset) if eval_dataset is not None else None,
        run=Path(run) if run is not None else None,
        run_format=run_format,
        run_config=Path(run_config) if run_config is not None else None,
        adapter=Path(adapter) if adapter is not None else None,
        base_model=base_model,
        tokenizer=tokenizer,
        tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir is not None else None,
        trust_remote_code=trust_remote_code,
        plugins=plugins,
    )
    report = run_checks(ctx, checks, inputs)
    return dataclasses.replace(report, seconds=time.perf_counter() - started)
