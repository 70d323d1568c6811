"""`gradian export`: the training dataset minus the rows a report blames, in the dataset's own format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from gradian.cli.options import FormatOption

ReportOption = Annotated[Optional[Path], typer.Option("--report", help="The --out directory of a gradian attribute run.")]
DropOption = Annotated[Optional[str], typer.Option(
    "--drop", help="What to drop: accused (the accused clusters' members), top:K (the K most blamed examples) or "
                   "a file of example ids, one per line.")]
OutOption = Annotated[Optional[Path], typer.Option("--out", help="The file to write (a directory for a saved HF dataset); never the input.")]
DatasetOption = Annotated[Optional[Path], typer.Option("--dataset", help="The training data (default: the one the report names); it must be the bytes the report was made from.")]
OverwriteFlag = Annotated[bool, typer.Option("--overwrite", help="Replace --out when it exists.")]


def export(report: ReportOption = None, drop: DropOption = None, out: OutOption = None,
           dataset: DatasetOption = None, overwrite: OverwriteFlag = False,
           output_format: FormatOption = "table") -> None:
    """Write the training data without the rows a report blames, ready to retrain on."""
    from gradian.cli.output import output_format as check_format
    from gradian.errors import ConfigError
    from gradian.report.drop_set import DROP_HELP
    from gradian.report.export import export_without, summary_lines

    fmt = check_format(output_format)
    for value, flag, hint in ((report, "--report", "pass the --out directory of a gradian attribute run"),
                              (drop, "--drop", f"pass {DROP_HELP}"),
                              (out, "--out", "pass the file to write, e.g. --out clean.jsonl")):
        if value is None:
            raise ConfigError(f"gradian export needs {flag}", hint)
    result = export_without(report, drop, out, dataset=dataset, overwrite=overwrite)
    if fmt == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    elif fmt == "md":
        typer.echo("\n".join(f"- {line}" for line in summary_lines(result)))
    else:
        typer.echo("\n".join(summary_lines(result)))


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("export")(export)
