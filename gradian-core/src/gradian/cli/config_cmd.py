"""`gradian config`: the effective configuration after --config and --set, or every key with help."""

from __future__ import annotations

from typing import Annotated

import typer

from gradian.cli.options import ConfigOption, SetOption


def config(
    config: ConfigOption = None,
    set_: SetOption = None,
    list_keys: Annotated[bool, typer.Option("--list", help="List every key with its default and allowed values.")] = False,
) -> None:
    """Print the configuration a command would run with (YAML), or list every key."""
    import dataclasses
    import typing

    import yaml

    from gradian.cli.options import load_cli_config
    from gradian.config import SECTIONS, allowed_values

    if list_keys:
        for section, cls in SECTIONS.items():
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                typer.echo(f"{section}.{f.name} = {default!r}  [{allowed_values(f, hints[f.name])}]  {f.metadata['help']}")
        return
    cfg = load_cli_config(config, set_)
    typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("config")(config)
