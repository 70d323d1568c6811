"""`gradian plugins`: installed plugins, their distributions, versions, hooks and load status."""

from __future__ import annotations

import json

import typer

from gradian.cli.options import FormatOption, JsonFlag


def plugins(json_output: JsonFlag = False, output_format: FormatOption = "table") -> None:
    """List installed plugins, the records they register, and any that failed to load."""
    from gradian.cli.output import output_format as check_format
    from gradian.plugins import get_plugins

    fmt = check_format(output_format, json_output)
    plugin_set = get_plugins()
    records = plugin_set.records_by_plugin()
    rows = plugin_set.infos()
    if fmt == "md":
        typer.echo(_markdown(rows, records))
        return
    if fmt == "json":
        payload = [
            {**row.__dict__, "hooks": list(row.hooks), "records": records.get(row.name, {})} for row in rows
        ]
        typer.echo(json.dumps(payload, indent=2))
        return
    from rich.table import Table

    from gradian.cli.console import table_console

    table = Table(title="Gradian plugins")
    for column in ("name", "distribution", "version", "hooks", "records", "status"):
        table.add_column(column)
    for row in rows:
        registered = records.get(row.name, {})
        summary = ", ".join(f"{len(v)} {k.removeprefix('gradian_').replace('_', ' ')}" for k, v in registered.items())
        status = "loaded" if row.status == "loaded" else f"[red]failed[/red]: {row.error}"
        hooks = "\n".join(h.removeprefix("gradian_") for h in row.hooks)
        table.add_row(row.name, row.distribution, row.version, hooks, summary, status)
    table_console().print(table)


def _markdown(rows: list, records: dict) -> str:
    from gradian.cli.output import markdown_table

    return markdown_table(("name", "distribution", "version", "hooks", "records", "status"), [
        (row.name, row.distribution, row.version, ", ".join(h.removeprefix("gradian_") for h in row.hooks),
         ", ".join(f"{len(v)} {k.removeprefix('gradian_').replace('_', ' ')}" for k, v in records.get(row.name, {}).items()),
         "loaded" if row.status == "loaded" else f"failed: {row.error}") for row in rows])


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("plugins")(plugins)
