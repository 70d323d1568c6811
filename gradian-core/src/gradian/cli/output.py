"""How much a command prints: ``--format`` for its results, ``-q`` / ``-v`` for everything else on stderr.

Results go to stdout in the chosen format; notes, progress and timings go to stderr, and ``-q`` silences them
(errors still print). ``-v`` adds gradian's INFO log lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def print_result(fmt: str, data: Mapping[str, Any], text: str, markdown: str | None = None) -> None:
    """A command's result on stdout in ``fmt``: json (``data`` as one JSON document and nothing else), md
    (``markdown``, by default ``data`` as a key / value table) or table (``text``, the terminal lines)."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    elif fmt == "md":
        sys.stdout.write((markdown if markdown is not None else markdown_table(("key", "value"), flat_items(data)))
                         + "\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def flat_items(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Dotted (key, value) rows of nested dicts; lists as JSON."""
    if isinstance(data, Mapping):
        rows: list[tuple[str, str]] = []
        for key, value in data.items():
            rows += flat_items(value, f"{prefix}.{key}" if prefix else str(key))
        return rows or [(prefix, "{}")]
    if isinstance(data, (list, tuple)):
        return [(prefix, json.dumps(list(data), ensure_ascii=False, default=str))]
    return [(prefix, "null" if data is None else str(data))]


@contextlib.contextmanager
def libraries_quiet() -> Iterator[None]:
    """While a model loads and trains: transformers' loading bars and warnings off (back on with -v), and
    whatever a trainer prints on stdout (its log dicts) sent to stderr, so stdout holds only the result; with -q
    the trainer's own progress bar goes too. transformers' verbosity is restored afterwards; its progress bars stay
    off for the rest of the process (the CLI's bars are its own), as gradian index always left them."""
    import os

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    if not is_verbose():
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        with contextlib.ExitStack() as stack:
            sink = stack.enter_context(open(os.devnull, "w")) if is_quiet() else sys.stderr
            stack.enter_context(contextlib.redirect_stdout(sink))
            stack.enter_context(contextlib.redirect_stderr(sink))
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


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
