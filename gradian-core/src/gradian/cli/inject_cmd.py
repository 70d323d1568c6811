"""`gradian inject`: plant a known-bad cluster, train, attribute; exit 1 when the planted cluster is not blamed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gradian.cli.options import (
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

PoisonOption = Annotated[Optional[Path], typer.Option("--poison", help="Rows to plant (JSONL in the dataset's row format).")]
OutOption = Annotated[Optional[Path], typer.Option("--out", help="Directory for the combined dataset, model, report, inject.md and inject.json.")]
KOption = Annotated[Optional[int], typer.Option("--k", help="k of recall@k (default: the number of planted rows).")]
LabelOption = Annotated[str, typer.Option("--label", help="Cluster name of the planted rows, in attribution.cluster_field (default field: source).")]

# Exit code when the planted cluster is not blamed (user errors stay 2).
NOT_BLAMED_EXIT = 1


def inject(
    base_model: BaseModelOption = None,
    dataset: DatasetOption = None,
    poison: PoisonOption = None,
    eval_dataset: EvalDatasetOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    out: OutOption = None,
    backend: BackendOption = "hf",
    k: KOption = None,
    label: LabelOption = "gradian-injected",
    trust_remote_code: TrustRemoteCodeFlag = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    output_format: FormatOption = "table",
) -> None:
    """Plant a known-bad cluster, train and attribute; exit 0 when the verdict accuses it, 1 when it does not."""
    from gradian.cli.app import invoked_command
    from gradian.cli.output import libraries_quiet, note
    from gradian.cli.output import output_format as check_format
    from gradian.cli.progress import stage_bars
    from gradian.cli.verify_cmd import check_before_retraining, print_outcome
    from gradian.counterfactual.inject import plan_inject, run_inject

    fmt = check_format(output_format)
    check_before_retraining(device, dtype, backend, out)
    plan = plan_inject(base_model=base_model, dataset=dataset, poison=poison, eval_dataset=eval_dataset, out=out,
                       config_path=config, overrides=set_ or (), k=k, label=label, backend=backend,
                       trust_remote_code=trust_remote_code, device=device, dtype=dtype)
    # Trainers print their log dicts to stdout; stdout is kept for the verdict, so scripts can read it.
    with stage_bars() as bars, libraries_quiet():
        outcome = run_inject(plan, say=note, progress=bars, command=invoked_command())
    print_outcome(outcome, fmt, "inject")
    if not outcome.passed:
        raise typer.Exit(NOT_BLAMED_EXIT)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("inject")(inject)
