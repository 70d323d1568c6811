"""`gradian demo`: plant a known-bad cluster, fine-tune the embedded model on it, and watch Gradian find it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gradian.cli.options import DeviceOption, DtypeOption, FormatOption

SCENARIO_HELP = ("fact (a wrong capital rule, the default), format (answers switch to French), span "
                 "(one wrong sentence inside long entries), behaviour (one topic answered with a canned "
                 "deflection), two_causes (the capital rule and the French answers, two planted clusters), rare "
                 "(the capital rule at 1% of 2,000 rows) or clean (nothing planted: a control).")


def demo(
    scenario: Annotated[str, typer.Option("--scenario", help=SCENARIO_HELP)] = "fact",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the scenario and of training.", min=0)] = 0,
    shared_source: Annotated[bool, typer.Option(
        "--shared-source", help="File the planted rows under a clean source (geography_qa, explanations), as span "
                                "does: no cluster holds them alone, so the ranking must find them among clean rows.")] = False,
    base_model: Annotated[str, typer.Option("--base-model", help="Base model (default: the embedded SmolLM2-135M-Instruct; a local model dir works too).")] = "smollm2-135m-instruct",
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="Work dir (default: <cache>/demo/<scenario>-<seed>, -shared after it with --shared-source); every stage is cached there.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete the work dir first and redo every stage.")] = False,
    overrides: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override one key of the demo's config, e.g. --set train.learning_rate=5e-4 (repeatable); "
                      "a changed train key retrains.")] = None,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    output_format: FormatOption = "table",
) -> None:
    """Run the whole workflow on a planted regression: train -> diagnose -> attribute -> verdict (CPU, minutes)."""
    import contextlib

    from gradian.cli.attribute_cmd import echo_next_step, verdict_text
    from gradian.cli.output import libraries_quiet, note, print_result
    from gradian.cli.output import output_format as check_format
    from gradian.cli.progress import stage_bars
    from gradian.config import with_overrides
    from gradian.demo.run import demo_config, run_demo
    from gradian.demo.scenarios import SCENARIOS, make_scenario
    from gradian.errors import ConfigError
    from gradian.model.placement import resolve_placement

    fmt = check_format(output_format)
    placement = resolve_placement(device, dtype)  # before anything is written: a bad --device leaves no work dir
    if scenario not in SCENARIOS:
        raise ConfigError(f"--scenario {scenario!r} is unknown", f"use one of: {', '.join(SCENARIOS)}")
    built = make_scenario(scenario, seed, shared_source=shared_source)
    config = with_overrides(demo_config(built), overrides or [])  # a bad key: before any work
    from gradian.model.base import resolve_base_model
    from gradian.output_location import check_output_dir

    if workdir is not None:
        check_output_dir(workdir, "--workdir")
    resolve_base_model(base_model)  # a base model that is not there: before the scenario is written
    structured = fmt != "table"  # json / md: the stage lines and the trainer's output on stderr, the result on stdout
    with stage_bars() as bars, libraries_quiet() if structured else contextlib.nullcontext():
        result = run_demo(scenario=scenario, seed=seed, shared_source=shared_source, base_model=base_model,
                          workdir=workdir, fresh=fresh, config=config, progress=bars,
                          echo=note if structured else typer.echo, device=placement.device, dtype=placement.dtype)
    if structured:
        data = {"report_path": str(result.report_path), "check": result.check.lines(), "timings": result.timings,
                "reused": list(result.reused), "report": result.report.document}
        markdown = result.report_path.read_text(encoding="utf-8") if result.report_path.suffix == ".md" else None
        print_result(fmt, data, "", markdown)
        return
    typer.echo("")
    typer.echo(verdict_text(result.report))
    for line in result.check.lines():
        typer.echo(line)
    typer.echo("time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.timings.items())
               + (f" (reused: {', '.join(result.reused)})" if result.reused else ""))
    if result.attribution_timings:
        typer.echo("attribute stages: " + ", ".join(f"{name} {seconds:.0f} s"
                                                     for name, seconds in result.attribution_timings.items()))
    typer.echo(f"report: {result.report_path}")
    echo_next_step(result.report.document, result.report_path.parent)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("demo")(demo)
