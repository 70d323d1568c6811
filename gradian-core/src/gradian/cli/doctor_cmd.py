"""`gradian doctor`: versions, devices, determinism, backends and plugins, to paste into an issue."""

from __future__ import annotations

import json
import sys

import typer

from gradian.cli.options import ConfigOption, FormatOption, JsonFlag, SetOption


def doctor(config: ConfigOption = None, set_: SetOption = None, json_output: JsonFlag = False,
           output_format: FormatOption = "table") -> None:
    """Report the environment Gradian runs in; warns about problems, never fails."""
    from gradian.cli.options import load_cli_config
    from gradian.cli.output import output_format as check_format
    from gradian.doctor import collect, render

    fmt = check_format(output_format, json_output)
    report = collect(load_cli_config(config, set_))
    if fmt == "json":
        typer.echo(json.dumps(report, indent=2, default=str))
        return
    if fmt == "md":  # the plain text in a fenced block: what an issue wants pasted
        typer.echo("```text\n" + render(report, color=False, width=100).rstrip("\n") + "\n```")
        return
    color = sys.stdout.isatty()
    width = typer.get_terminal_size()[0] if color else 100
    typer.echo(render(report, color=color, width=max(width, 80)), nl=False)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("doctor")(doctor)
