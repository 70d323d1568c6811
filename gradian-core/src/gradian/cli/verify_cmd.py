"""`gradian verify`: drop the accused clusters (or the K most blamed examples), retrain, re-evaluate, next to random drops of the same size."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gradian.cli.options import (
    AdapterOption,
    BackendOption,
    BaseModelOption,
    ConfigOption,
    DatasetOption,
    DeviceOption,
    DtypeOption,
    EvalDatasetOption,
    FormatOption,
    SetOption,
    TrustRemoteCodeFlag,
)

ReportOption = Annotated[Optional[Path], typer.Option("--report", help="Attribution report dir (the --out of gradian attribute); every cluster it accuses is dropped and its inputs are the defaults.")]
DropOption = Annotated[Optional[str], typer.Option("--drop", help="What to drop instead of the report's accused clusters: top:K (the report's K most blamed examples) or a text file of example ids, one per line.")]
ClusterOption = Annotated[Optional[str], typer.Option("--cluster", help="Drop this cluster of the --report instead of the accused ones.")]
ControlsOption = Annotated[int, typer.Option("--controls", help="Random drop sets of the same size to compare with (seeded by attribution.seed).")]
OutOption = Annotated[Optional[Path], typer.Option("--out", help="Directory for verify.md, verify.json and the retrained models.")]
RetrainFullFlag = Annotated[bool, typer.Option("--retrain-full", help="Retrain the full dataset with the same backend and config instead of using the original adapter, so only the dropped examples differ.")]


def verify(
    report: ReportOption = None,
    drop: DropOption = None,
    cluster: ClusterOption = None,
    base_model: BaseModelOption = None,
    adapter: AdapterOption = None,
    dataset: DatasetOption = None,
    eval_dataset: EvalDatasetOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    controls: ControlsOption = 1,
    out: OutOption = None,
    backend: BackendOption = "hf",
    retrain_full: RetrainFullFlag = False,
    trust_remote_code: TrustRemoteCodeFlag = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    output_format: FormatOption = "table",
) -> None:
    """Check an attribution by retraining without the accused cluster: how much of the lost capability comes back."""
    from gradian.cli.app import invoked_command
    from gradian.cli.output import libraries_quiet, note
    from gradian.cli.output import output_format as check_format
    from gradian.counterfactual.verify import plan_verify, run_verify

    fmt = check_format(output_format)
    check_before_retraining(device, dtype, backend, out)
    plan = plan_verify(out=out, report_dir=report, drop=drop, cluster=cluster, base_model=base_model,
                       adapter=adapter, dataset=dataset, eval_dataset=eval_dataset, config_path=config,
                       overrides=set_ or (), controls=controls, backend=backend, retrain_full=retrain_full,
                       trust_remote_code=trust_remote_code, device=device, dtype=dtype)
    # Trainers print their log dicts to stdout; stdout is kept for the verdict, so scripts can read it.
    with libraries_quiet():
        outcome = run_verify(plan, say=note, command=invoked_command())
    print_outcome(outcome, fmt, "verify")


def check_before_retraining(device: str, dtype: str, backend: str, out: Path | None) -> None:
    """What verify and inject refuse before anything is read or trained: the placement, the backend, --out."""
    from gradian.model.placement import resolve_placement
    from gradian.output_location import check_output_dir
    from gradian.pipelines.train import resolve_backend

    resolve_placement(device, dtype)  # a device or dtype this machine cannot run
    resolve_backend(backend)  # an unknown or missing backend
    if out is not None:  # a bad --out must not come after training
        check_output_dir(out, "--out")


def print_outcome(outcome: Any, fmt: str, name: str) -> None:
    """verify's or inject's result on stdout: its JSON document, its Markdown page, or the verdict lines."""
    from gradian.cli.output import note, print_result

    verdict = outcome.result["verdict"]
    markdown = outcome.markdown_path.read_text(encoding="utf-8").rstrip("\n") if fmt == "md" else None
    print_result(fmt, outcome.result, f"{verdict['headline']}\n{verdict['summary']}\n{name}: {outcome.markdown_path}",
                 markdown)
    if fmt != "table":
        note(f"{name}: {outcome.markdown_path}")


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("verify")(verify)
