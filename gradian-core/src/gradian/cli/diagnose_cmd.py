"""`gradian diagnose`: the audit checks over a dataset, a run directory and an adapter, in seconds on a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gradian.cli.options import (
    AdapterOption,
    BaseModelOption,
    ConfigOption,
    DatasetOption,
    EvalDatasetOption,
    RunOption,
    SetOption,
    TokenizerOption,
    TrustRemoteCodeFlag,
    check_tokenizer_dir,
)

FORMATS = ("table", "json", "md")
RUN_CONFIG_HELP = ("The axolotl YAML or LLaMA-Factory training_args.yaml the run was trained with, when it is kept "
                   "outside --run (e.g. configs/lora.yml); it is read with the run dir.")
FAIL_ON_HELP = ("Exit 1 when a finding at or above this severity exists (or a check crashed): error (default), "
                "warning, or never. User errors exit 2.")


def diagnose(
    dataset: DatasetOption = None,
    run: RunOption = None,
    run_format: Annotated[Optional[str], typer.Option("--run-format", help="Read --run with this reader (default: auto-detect); see --list.")] = None,
    run_config: Annotated[Optional[Path], typer.Option("--run-config", help=RUN_CONFIG_HELP)] = None,
    adapter: AdapterOption = None,
    base_model: BaseModelOption = None,
    eval_dataset: EvalDatasetOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    output_format: Annotated[str, typer.Option("--format", help="table, json or md.")] = "table",
    fail_on: Annotated[str, typer.Option("--fail-on", help=FAIL_ON_HELP)] = "error",
    list_checks: Annotated[bool, typer.Option("--list", help="List every audit check (third-party ones too) and the run-log readers, then exit.")] = False,
    select: Annotated[Optional[list[str]], typer.Option("--select", help="Run only these check ids or families (repeatable, or comma-separated).")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", help="Skip these check ids or families (repeatable, or comma-separated).")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Write loss / grad-norm / learning-rate PNGs with flagged steps marked into this directory (needs matplotlib).")] = None,
    tokenizer: TokenizerOption = None,
    trust_remote_code: TrustRemoteCodeFlag = False,
) -> int:
    """Audit the training data, the run's config and its training dynamics (every registered check; docs/checks.md lists them)."""
    import json
    import sys

    from gradian.cli.console import table_console
    from gradian.cli.options import load_cli_config
    from gradian.errors import ConfigError
    from gradian.plugins import get_plugins

    if output_format not in FORMATS:
        raise ConfigError(f"--format {output_format!r} is unknown", f"use one of: {', '.join(FORMATS)}")
    console = table_console(soft_wrap=False)
    plugins = get_plugins()
    if list_checks:
        return _list(plugins, output_format, console)
    from gradian.diagnose.findings import render_table, to_json, to_markdown
    from gradian.diagnose.runner import FAIL_ON, exit_code
    from gradian.diagnose.runner import diagnose as run_diagnose

    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r} is unknown", f"use one of: {', '.join(FAIL_ON)}")
    cfg = load_cli_config(config, set_)
    check_tokenizer_dir(tokenizer)
    if plots is not None:  # before any check runs: a bad --plots must not come after the findings
        from gradian.output_location import check_output_dir

        if run is None:
            raise ConfigError("--plots needs --run (the curves come from the run's logs)", "add --run DIR")
        check_output_dir(plots, "--plots")
    report = run_diagnose(dataset=dataset, run=run, run_format=run_format, run_config=run_config, adapter=adapter,
                          base_model=base_model, eval_dataset=eval_dataset, config=cfg, select=tuple(select or ()), ignore=tuple(ignore or ()),
                          tokenizer_dir=tokenizer, trust_remote_code=trust_remote_code, plugins=plugins)
    if output_format == "json":
        sys.stdout.write(json.dumps(to_json(report), indent=2, ensure_ascii=False) + "\n")
    elif output_format == "md":
        sys.stdout.write(to_markdown(report) + "\n")
    else:
        render_table(report, console)
    if plots is not None:
        if report.run is None:
            raise ConfigError("--plots needs --run (the curves come from the run's logs)", "add --run DIR")
        from gradian.diagnose.plots import write_plots

        written = write_plots(report, report.run, plots)
        print(f"gradian: wrote {len(written)} plots to {plots}", file=sys.stderr)
    return exit_code(report, fail_on)


def _list(plugins, output_format: str, console) -> int:
    import json
    import sys

    from gradian.diagnose.findings import render_check_list

    checks = plugins.audit_checks()
    readers = plugins.run_log_readers()
    distributions = {cid: plugins.distribution_of("gradian_audit_checks", cid) for cid in checks}
    if output_format == "json":
        data = {
            "checks": [{"id": c.id, "family": c.family, "severity": c.severity, "needs": sorted(c.needs),
                        "summary": c.summary, "fix": c.fix, "distribution": distributions[c.id]} for c in checks.values()],
            "readers": [{"name": r.name, "summary": r.summary, "looks_for": list(r.looks_for),
                         "distribution": plugins.distribution_of("gradian_run_log_readers", r.name)} for r in readers.values()],
        }
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    render_check_list(checks, distributions, console)
    console.print("run-log readers (--run-format): " + ", ".join(
        f"{name} ({plugins.distribution_of('gradian_run_log_readers', name)})" for name in sorted(readers)), markup=False)
    return 0


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("diagnose")(diagnose)
