"""`gradian config`: the effective configuration after --config and --set, or every key with help and owner."""

from __future__ import annotations

from typing import Annotated

import typer

from gradian.cli.options import ConfigOption, FormatOption, SetOption


def config(
    config: ConfigOption = None,
    set_: SetOption = None,
    list_keys: Annotated[bool, typer.Option("--list", help="List every key with its default, allowed values and the distribution that owns it.")] = False,
    output_format: FormatOption = "table",
) -> None:
    """Print the configuration a command would run with (YAML; --format json or md), or list every key."""
    import dataclasses
    import typing

    import yaml

    from gradian.cli.options import load_cli_config
    from gradian.cli.output import flat_items, markdown_table, print_result
    from gradian.cli.output import output_format as check_format
    from gradian.config import allowed_values, section_owner, sections

    fmt = check_format(output_format)
    if list_keys:
        keys, owned, lines = [], [], []
        for name, section in sections().items():
            owner = section_owner(name)
            owned.append({"section": name, "owner": owner, "summary": section.summary})
            lines.append(f"[{name}] from {owner}: {section.summary}")
            hints = typing.get_type_hints(section.settings)
            for f in dataclasses.fields(section.settings):
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                keys.append({"key": f"{name}.{f.name}", "default": default, "allowed": allowed_values(f, hints[f.name]),
                             "help": f.metadata["help"], "owner": owner})
                lines.append(f"{name}.{f.name} = {default!r}  [{keys[-1]['allowed']}]  {f.metadata['help']}")
        markdown = markdown_table(("key", "default", "allowed", "help", "owner"),
                                  [(k["key"], repr(k["default"]), k["allowed"], k["help"], k["owner"]) for k in keys])
        print_result(fmt, {"sections": owned, "keys": keys}, "\n".join(lines), markdown)
        return
    data = load_cli_config(config, set_).to_dict()
    print_result(fmt, data, yaml.safe_dump(data, sort_keys=False).rstrip(),
                 markdown_table(("key", "value"), flat_items(data)))


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("config")(config)
