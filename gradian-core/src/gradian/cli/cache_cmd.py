"""`gradian cache`: list what the cache dir holds (indexes, converted models, half-built dirs) and prune it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path, PurePath
from typing import Annotated, Any, Optional

import typer

from gradian.cli.options import JsonFlag

FORMATS = ("table", "json", "md")
WIDE_COLUMNS = 120  # below this the tables drop their dates and fold an index's details into one column
FormatOption = Annotated[str, typer.Option("--format", help="How results are printed: table, json or md.")]

cache_app = typer.Typer(
    help="List what Gradian's cache dir holds (gradient indexes, converted models, half-built dirs), or prune it.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@cache_app.callback()
def cache(ctx: typer.Context, output_format: FormatOption = "table", json_output: JsonFlag = False) -> None:
    """List what Gradian's cache dir holds (gradient indexes, converted models, half-built dirs), or prune it."""
    if ctx.invoked_subcommand is None:
        list_cache(output_format, json_output)


@cache_app.command("list")
def list_cache(output_format: FormatOption = "table", json_output: JsonFlag = False) -> None:
    """Every entry of the cache dir with its size and age; indexes with what built them."""
    import time

    from gradian.cache import cache_dir
    from gradian.cache_entries import list_entries

    output_format = _check_format("json" if json_output else output_format)
    root = cache_dir()
    entries = list_entries(root)
    now = time.time()
    if output_format == "json":
        typer.echo(json.dumps({"cache_dir": str(root), "entries": [e.to_dict(now) for e in entries],
                               "total_bytes": sum(e.size_bytes for e in entries)}, indent=2))
        return
    if output_format == "md":
        typer.echo(f"# gradian cache `{root}`\n\n" + _markdown_entries(entries, now)
                   + f"\n\n{total_line(entries, root) if entries else 'empty'}")
        return
    from gradian.cli.console import table_console

    console = table_console()
    if not entries:
        where = "is empty" if root.is_dir() else "does not exist yet"
        console.print(f"gradian cache: {root} {where}", markup=False, highlight=False)
        return
    indexes = [e for e in entries if e.kind == "index" and e.index is not None]
    others = [e for e in entries if e not in indexes]
    wide = console.width >= WIDE_COLUMNS
    if indexes:
        console.print(index_table(indexes, now, wide))
    if others:
        console.print(other_table(others, now, wide))
    typer.echo(total_line(entries, root))  # one line, never wrapped: scripts and issues read it


@cache_app.command("prune")
def prune(
    older_than: Annotated[Optional[str], typer.Option("--older-than", help="Entries older than this age: 7d, 12h, 30m (an index's age is from its manifest's created time).", show_default=False)] = None,
    ids: Annotated[Optional[list[str]], typer.Option("--id", help="The entry with this id or id prefix (repeatable); `gradian cache list` shows the ids.", show_default=False)] = None,
    partial: Annotated[bool, typer.Option("--partial", help="Half-built dirs and files: killed index builds, model conversions and Kronecker fits (a build running now loses its finished shards).")] = False,
    everything: Annotated[bool, typer.Option("--all", help="Every entry Gradian recognises (dirs it did not write are left alone).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be removed and remove nothing.")] = False,
    output_format: FormatOption = "table",
) -> None:
    """Remove cached entries by age, id, or half-built state; print what went and the bytes freed."""
    import time

    from gradian.cache import cache_dir
    from gradian.cache_entries import list_entries, parse_age, remove_entries, select_entries
    from gradian.errors import GradianError

    fmt = _check_format(output_format)
    age = parse_age(older_than) if older_than is not None else None
    root = cache_dir()
    entries = list_entries(root)
    now = time.time()
    chosen = select_entries(entries, older_than=age, ids=tuple(ids or ()), partial=partial, everything=everything,
                            now=now)
    if everything:
        _left_alone([e for e in entries if not e.removable])
    if not chosen or dry_run:
        text = (f"gradian cache: nothing to remove{f' (no entry older than {older_than})' if age else ''}"
                if not chosen else "\n".join([*(f"would remove {_describe(e, now)}" for e in chosen),
                                               f"would free {_size(sum(e.size_bytes for e in chosen))} "
                                               f"({_count(len(chosen))}) from {root}; nothing removed (--dry-run)"]))
        _print_pruned(fmt, root, chosen, [], dry_run, now, text)
        return
    removed, failed = remove_entries(chosen, root)
    text = "\n".join([*(f"removed {_describe(e, now)}" for e in removed),
                      f"freed {_size(sum(e.size_bytes for e in removed))} ({_count(len(removed))}) from {root}"])
    _print_pruned(fmt, root, removed, failed, dry_run, now, text)
    if failed:
        entry, reason = failed[0]
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        raise GradianError(f"could not remove {entry.path}{more}: {reason}",
                           "check the permissions of the cache dir; entries not removed are still listed by "
                           "`gradian cache list`")


def _print_pruned(fmt: str, root: Path, entries: list[Any], failed: list[Any], dry_run: bool, now: float,
                  text: str) -> None:
    """What prune removed (or would remove) on stdout in ``fmt``."""
    from gradian.cli.output import print_result

    data = {"cache_dir": str(root), "dry_run": dry_run, "removed": [] if dry_run else [e.to_dict(now) for e in entries],
            "would_remove": [e.to_dict(now) for e in entries] if dry_run else [],
            "freed_bytes": 0 if dry_run else sum(e.size_bytes for e in entries),
            "failed": [{"path": str(e.path), "reason": str(reason)} for e, reason in failed]}
    title = "would remove (--dry-run)" if dry_run else "removed"
    print_result(fmt, data, text, f"## {title}\n\n" + _markdown_entries(entries, now))


def _markdown_entries(entries: list[Any], now: float) -> str:
    """Cache entries as a Markdown table: kind, id, size, age, what."""
    from gradian.cli.output import markdown_table

    rows = [(e.kind, e.id, _size(e.size_bytes), _age(e.age_seconds(now)), _what(e)) for e in entries]
    return markdown_table(("kind", "id", "size", "age", "what"), rows)


def _what(entry: Any) -> str:
    summary = entry.index
    return entry.note or (f"{summary.num_examples} examples x {summary.dim}, {_built_from(summary)}" if summary else "")


def index_table(entries: list[Any], now: float, wide: bool = True) -> Any:
    """One row per finished gradient index: id, size, created, age, shape, and what built it."""
    from rich.table import Table

    table = Table(title="gradient indexes", title_justify="left", box=None, pad_edge=False, header_style="bold")
    _add_columns(table, [("id", "left"), ("size", "right"), *([("created", "left")] if wide else []), ("age", "right")],
                 entries)
    if wide:
        for name, justify in (("examples", "right"), ("dim", "right"), ("grads", "left"), ("dtype", "left")):
            table.add_column(name, justify=justify, no_wrap=True)
        table.add_column("base + adapter, data", overflow="fold", min_width=16)
    else:  # a narrow terminal: the shape and the inputs share one folded column, two lines per index
        table.add_column("shape / base + adapter, data", overflow="fold", min_width=16)
    for entry in entries:
        summary = entry.index
        grads = "projected" if summary.projected else "exact"
        cells = [entry.id, _size(entry.size_bytes), *([_when(entry.timestamp)] if wide else []),
                 _age(entry.age_seconds(now))]
        if wide:
            cells += [str(summary.num_examples), str(summary.dim), grads, summary.storage_dtype, _built_from(summary)]
        else:
            cells.append(f"{summary.num_examples} x {summary.dim}, {grads}, {summary.storage_dtype}\n"
                         f"{_built_from(summary)}")
        table.add_row(*cells)
    return table


def other_table(entries: list[Any], now: float, wide: bool = True) -> Any:
    """One row per other entry: converted models, half-built dirs, demo work dirs, things Gradian did not write."""
    from rich.table import Table

    table = Table(title="other entries", title_justify="left", box=None, pad_edge=False, header_style="bold")
    table.add_column("kind", no_wrap=True)
    _add_columns(table, [("id", "left"), ("size", "right"), *([("modified", "left")] if wide else []),
                         ("age", "right")], entries)
    table.add_column("what", overflow="fold", min_width=16)
    for entry in entries:
        what = ", ".join(part for part in (entry.note, f"from {entry.built_from}" if entry.built_from else "") if part)
        if not entry.removable:
            what = "not written by Gradian; never removed" + (f" ({what})" if what else "")
        table.add_row(entry.kind, entry.id, _size(entry.size_bytes), *([_when(entry.timestamp)] if wide else []),
                      _age(entry.age_seconds(now)), what)
    return table


def _add_columns(table: Any, columns: list[tuple[str, str]], entries: list[Any]) -> None:
    """Columns never cut: the id is what `prune --id` takes, so it is shown whole however narrow the terminal."""
    for name, justify in columns:
        width = max(len(e.id) for e in entries) if name == "id" else None
        table.add_column(name, justify=justify, no_wrap=True, min_width=width)


def total_line(entries: list[Any], root: Path) -> str:
    """The total at the bottom: bytes by kind and in all."""
    counts = Counter(e.kind for e in entries)
    sizes: Counter[str] = Counter()
    for entry in entries:
        sizes[entry.kind] += entry.size_bytes
    parts = [f"{counts[kind]} {kind if counts[kind] == 1 else _plural(kind)} {_size(sizes[kind])}"
             for kind in ("index", "model", "partial", "demo", "other") if counts[kind]]
    return f"total {_size(sum(sizes.values()))} in {root}: " + ", ".join(parts)


def _built_from(summary: Any) -> str:
    """``base + adapter, data``, paths cut to their last parts (--format json has them whole)."""
    text = _short(summary.base_model, 1)
    if summary.adapter:
        text += f" + {_short(summary.adapter, 2)}"
    return text + (f", {_short(summary.dataset, 1)}" if summary.dataset else "")


def _short(value: str | None, keep: int) -> str:
    """A path cut to its last ``keep`` parts; a hub id like org/name is kept whole."""
    if not value:
        return "?"
    parts = PurePath(value).parts
    if not value.startswith(("/", "~", ".")) or len(parts) <= keep:
        return value
    return "/".join(parts[-keep:])


def _describe(entry: Any, now: float) -> str:
    summary = entry.index
    what = entry.note or (f"{summary.num_examples} examples x {summary.dim}, {_built_from(summary)}" if summary else "")
    return f"{entry.kind} {entry.id}  {_size(entry.size_bytes)}  {_age(entry.age_seconds(now))} old" + (
        f"  ({what})" if what else "")


def _left_alone(others: list[Any]) -> None:
    if others:
        names = ", ".join(e.id for e in others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        typer.echo(f"left alone (not written by Gradian): {names}", err=True)


def _check_format(output_format: str) -> str:
    from gradian.errors import ConfigError

    if output_format not in FORMATS:
        raise ConfigError(f"--format {output_format!r} is unknown", f"use one of: {', '.join(FORMATS)}")
    return output_format


def _size(size: int) -> str:
    from rich.filesize import decimal

    return decimal(size)


def _when(seconds: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def _age(seconds: float) -> str:
    """Compact age: 45s, 12m, 5h, 3d, 6w."""
    for unit, length in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{int(seconds // length)}{unit}"
    return f"{int(seconds)}s"


def _count(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _plural(kind: str) -> str:
    return {"index": "indexes", "other": "other"}.get(kind, kind + "s")


def register(app: typer.Typer) -> None:
    """Add the command group to the app."""
    app.add_typer(cache_app, name="cache")
