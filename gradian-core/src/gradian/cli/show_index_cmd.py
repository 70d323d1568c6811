"""`gradian show-index DIR`: the block list and the manifest of a gradient index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gradian.cli.options import FormatOption, JsonFlag

# Long lists already shown elsewhere (the block table) or only useful in --json.
_SUMMARIZED = {"blocks", "stat_blocks", "spec.grads.lora_blocks", "spec.grads.projection.sketches"}


def show_index(
    directory: Annotated[Path, typer.Argument(help="An index directory written by gradian index.", show_default=False)],
    json_output: JsonFlag = False,
    verify: Annotated[bool, typer.Option("--verify", help="Also check every shard against its sha256.")] = False,
    output_format: FormatOption = "table",
) -> None:
    """Print an index's LoRA blocks and its manifest (what it was built from, and how)."""
    from gradian.cli.output import output_format as check_format
    from gradian.index.store import Index

    fmt = check_format(output_format, json_output)
    index = Index.open(directory)
    if verify:
        index.verify()
    if fmt == "json":
        typer.echo(json.dumps(index.describe(), indent=2, sort_keys=True))
        return
    if fmt == "md":
        typer.echo(index_markdown(index, verified=verify))
        return
    from gradian.cli.console import table_console

    console = table_console()
    console.print(f"[bold]gradient index[/bold] {index.path}")
    console.print(block_table(index))
    console.print(manifest_table(index.describe(), verified=verify))


def block_table(index: Any) -> Any:
    """The stored LoRA blocks, one row per A/B matrix, with shapes, offsets and whether block stats exist."""
    from rich.table import Table

    with_matrix = {b.name for b in index.manifest.stat_blocks if b.has_matrix}
    table = Table(title=f"{len(index.blocks) // 2} LoRA blocks, {index.dim} numbers per example")
    for column in ("block", "matrix", "shape", "stored", "offset", "width", "block stats"):
        table.add_column(column, justify="right" if column in ("offset", "width") else "left")
    for block in index.blocks:
        table.add_row(block.module, block.matrix, "x".join(map(str, block.shape)),
                      "x".join(map(str, block.stored_shape)), str(block.offset), str(block.width),
                      "yes" if block.module in with_matrix else "no (too wide)")
    return table


def index_markdown(index: Any, verified: bool = False) -> str:
    """The block list and the flattened manifest as Markdown tables."""
    from gradian.cli.output import markdown_table

    blocks = markdown_table(("block", "matrix", "shape", "stored", "offset", "width"), [
        (b.module, b.matrix, "x".join(map(str, b.shape)), "x".join(map(str, b.stored_shape)), b.offset, b.width)
        for b in index.blocks])
    manifest = markdown_table(("key", "value"), _flatten(index.describe()))
    title = "manifest.json" + (" (every checksum verified)" if verified else "")
    return (f"# gradient index `{index.path}`\n\n## {len(index.blocks) // 2} LoRA blocks, {index.dim} numbers per "
            f"example\n\n{blocks}\n\n## {title}\n\n{manifest}")


def manifest_table(manifest: dict[str, Any], verified: bool = False) -> Any:
    """The manifest as dotted key / value rows; long lists are counted (``--json`` prints them whole)."""
    from rich.table import Table

    table = Table(title="manifest.json" + (" (every checksum verified)" if verified else ""))
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for key, value in _flatten(manifest):
        table.add_row(key, value)
    return table


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if prefix in _SUMMARIZED and isinstance(value, list):
        return [(prefix, f"{len(value)} entries (see the block table, or --json)")]
    if isinstance(value, dict):
        if not value:
            return [(prefix, "{}")]
        rows = []
        for key in sorted(value):
            rows += _flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
        return rows
    if prefix == "shards" and isinstance(value, list):
        return [(f"shards[{s['number']}]", f"{s['file']} rows {s['start']}..{s['start'] + s['rows'] - 1} "
                 f"sha256 {s['sha256'][:16]}…") for s in value]
    if isinstance(value, list):
        return [(prefix, json.dumps(value))]
    return [(prefix, "null" if value is None else str(value))]


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("show-index")(show_index)
