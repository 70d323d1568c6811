"""Wires the `gradian` commands together and maps user errors to one line and exit code 2."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import typer

try:  # typer 0.2x vendors its own click; older typers use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

from gradian.errors import GradianError

# One module per command, each with a ``register(app)``. Command modules import heavy libraries
# inside their functions, so building this app (and `gradian --help`) never imports torch.
COMMAND_MODULES = (
    "gradian.cli.doctor_cmd",
    "gradian.cli.plugins_cmd",
    "gradian.cli.config_cmd",
    "gradian.cli.attribute_cmd",
    "gradian.cli.train_cmd",
    "gradian.cli.index_cmd",
    "gradian.cli.show_index_cmd",
    "gradian.cli.cache_cmd",
    "gradian.cli.diagnose_cmd",
    "gradian.cli.verify_cmd",
    "gradian.cli.export_cmd",
    "gradian.cli.inject_cmd",
    "gradian.cli.demo_cmd",
)

app = typer.Typer(
    name="gradian",
    help="Find the training data that broke your LoRA fine-tune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



def _print_version(value: bool) -> None:
    if value:
        from gradian import __version__

        typer.echo(f"gradian {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print results and errors only: no progress, notes or timings."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print gradian's INFO log lines on stderr."),
) -> None:
    """Find the training data that broke your LoRA fine-tune."""
    from gradian.cli.output import set_verbosity

    set_verbosity(quiet, verbose)


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def _fail(text: str, code: int = 2) -> int:
    print(f"gradian: error: {text}", file=sys.stderr)
    return code


# The arguments main() was called with (None: the process's own sys.argv), for reports that print the command.
_invoked_argv: list[str] | None = None


def invoked_command() -> list[str]:
    """The command line being run, as ``gradian`` and the arguments main() received (sys.argv when none)."""
    return ["gradian", *(sys.argv[1:] if _invoked_argv is None else _invoked_argv)]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and exit code 2."""
    global _invoked_argv
    from gradian.cli.output import set_verbosity

    _invoked_argv = list(argv) if argv is not None else None
    set_verbosity(False, False)  # the root callback sets this invocation's level; nothing carries over
    # transformers 5 warns about its own deprecated property on every model load; it says nothing to a user.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    try:
        with _interrupt_as_error(), _warnings_as_lines():
            result = app(args=argv, prog_name="gradian", standalone_mode=False)
    except GradianError as error:
        return _fail(error.one_line(), error.exit_code)
    except click_exceptions.UsageError as error:
        command = error.ctx.command_path if error.ctx is not None else "gradian"
        return _fail(f"{error.format_message()} (hint: run `{command} --help`)", error.exit_code)
    except click_exceptions.ClickException as error:
        return _fail(error.format_message(), error.exit_code)
    except _Interrupted as interrupted:
        return _fail(INTERRUPTED, 128 + interrupted.signum)
    except (typer.Abort, KeyboardInterrupt):
        return _fail(INTERRUPTED, 128 + signal.SIGINT)
    except RecursionError as error:  # a reader that missed a depth cap; GRADIAN_DEBUG=1 shows which
        return _internal_error(error, "input nested too deep (RecursionError)")
    except MemoryError as error:
        return _internal_error(error, "out of memory (MemoryError)")
    except Exception as error:  # the last-resort net: a bug must still end in one line, not a traceback
        return _internal_error(error, f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
    return result if isinstance(result, int) else 0


INTERRUPTED = "interrupted; finished work is kept and the next run resumes from it"


class _Interrupted(BaseException):
    """Ctrl-C or SIGTERM, raised as a type typer does not catch: typer turns KeyboardInterrupt into a silent exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# SIGTERM too: `timeout`, `kill` and batch schedulers stop a job with it, and without a handler Python dies on the
# spot, leaving every half-written file its `finally` blocks would have removed (a 1.2 GB kronecker fit, say).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _interrupt_as_error() -> Iterator[None]:
    """While a command runs, SIGINT and SIGTERM raise _Interrupted so main() can say what was kept."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _Interrupted(signum)

    previous = {signum: signal.signal(signum, _raise) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Python warnings during a command: gradian's own as one `gradian: warning:` line (not with -q), other
    libraries' (transformers, peft, torch) only with -v, so nothing but the error line precedes an error."""
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        yield


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    from pathlib import PurePath

    from gradian.cli.output import is_verbose, note

    text = " ".join(str(message).split())
    ours = any(part == "gradian" or part.startswith("gradian_") for part in PurePath(filename).parts)
    if ours:
        note(f"gradian: warning: {text}")
    elif is_verbose():
        note(f"gradian: warning from {PurePath(filename).name}:{lineno} ({category.__name__}): {text}")


def _internal_error(error: BaseException, what: str) -> int:
    """One line for an exception no user-error path caught; GRADIAN_DEBUG=1 re-raises it with its traceback."""
    if os.environ.get("GRADIAN_DEBUG", "") not in ("", "0"):
        raise error
    return _fail(f"internal error: {what} (hint: rerun with GRADIAN_DEBUG=1 and report it)", 2)
