"""The terminal the commands print tables to."""

from __future__ import annotations

from typing import Any

PIPED_WIDTH = 140  # output piped into a file or an issue is read wide, not squeezed into 80 columns


def table_console(**kwargs: Any) -> Any:
    """A rich Console: the terminal's width when there is one, PIPED_WIDTH columns when piped."""
    from rich.console import Console

    console = Console(**kwargs)
    if console.is_terminal:
        return console
    return Console(width=PIPED_WIDTH, **kwargs)
