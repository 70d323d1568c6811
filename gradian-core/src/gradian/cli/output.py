"""How much a command prints: ``--format`` for its results, ``-q`` / ``-v`` for everything else on stderr.

Results go to stdout in the chosen format; notes, progress and timings go to stderr, and ``-q`` silences them
(errors still print). ``-v`` adds gradian's INFO log lines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from gradian.errors import ConfigError

FORMATS = ("table", "json", "md")
QUIET, NORMAL, VERBOSE = 0, 1, 2

_level = NORMAL


def set_verbosity(quiet: bool, verbose: bool) -> None:
    """Set the level for this invocation from the global -q / -v flags."""
    global _level
    if quiet and verbose:
        raise ConfigError("-q/--quiet and -v/--verbose contradict each other", "pass one of them")
    _level = QUIET if quiet else VERBOSE if verbose else NORMAL
    _log_to_stderr(_level == VERBOSE)


def is_quiet() -> bool:
    """Whether -q was given: no progress, no notes."""
    return _level == QUIET


def is_verbose() -> bool:
    """Whether -v was given: gradian's INFO log lines too."""
    return _level == VERBOSE


def note(line: str) -> None:
    """A line for the person at the terminal (not a result): stderr, unless -q."""
    if _level != QUIET:
        print(line, file=sys.stderr, flush=True)


def output_format(value: str, json_alias: bool = False) -> str:
    """The --format of a command's results; the older --json flag is an alias for --format json."""
    if value not in FORMATS:
        raise ConfigError(f"--format {value!r} is unknown", f"use one of: {', '.join(FORMATS)}")
    if json_alias and value not in ("table", "json"):
        raise ConfigError(f"--json and --format {value} contradict each other", "pass one of them")
    return "json" if json_alias else value


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; pipes and newlines in cells cannot break it."""
    def cell(value: Any) -> str:
        return " ".join(str(value).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _log_to_stderr(enabled: bool) -> None:
    """gradian's INFO log lines on stderr for -v; undone for the next invocation in the same process (tests)."""
    logger = logging.getLogger("gradian")
    for handler in [h for h in logger.handlers if getattr(h, "_gradian_verbose", False)]:
        logger.removeHandler(handler)
    if not enabled:
        logger.setLevel(logging.NOTSET)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gradian: %(name)s: %(message)s"))
    handler._gradian_verbose = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
