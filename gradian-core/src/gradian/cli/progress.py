"""Progress on stderr for long stages, shared by every command: rich bars on a terminal, plain lines otherwise.

A stage's bar appears at its first report, so input refused before any work leaves no empty bar behind, and
work finished in an earlier run (a resumed index) does not count toward the rate. A count that goes back starts a
new pass of the stage (``attribute`` builds one index per checkpoint under one "checkpoints" stage), whose rate and
ETA are its own. When stderr is not a terminal (CI logs, ``2> log``, a notebook) a bar would print nothing useful
until the end, so each stage prints a line at its first report, every LINE_INTERVAL seconds, and when it
completes. ``-q`` turns both off.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Tick = Callable[[int, int], None]
LINE_INTERVAL = 5.0  # seconds between two plain progress lines of one stage


@contextmanager
def stage_bars(enabled: bool = True) -> Iterator[Callable[[str], Tick | None]]:
    """A factory: ``bars(stage)`` gives a (done, total) callback drawing that stage's bar (or its lines)."""
    from gradian.cli.output import is_quiet

    if not enabled or is_quiet():
        yield lambda stage: None
        return
    if not sys.stderr.isatty():
        yield _Lines().stage
        return
    bars = _Bars()
    try:
        yield bars.stage
    finally:
        bars.close()


@contextmanager
def one_bar(description: str, enabled: bool = True) -> Iterator[Tick | None]:
    """A single (done, total) progress callback, or None when disabled."""
    with stage_bars(enabled) as bars:
        yield bars(description)


class _Lines:
    """Plain progress lines: ``gradian: index 120/800 (15%), 3.2 ex/s, ETA 0:03:32``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started: dict[str, tuple[float, int]] = {}  # stage -> (time, done) at its pass's first report
        self.printed: dict[str, float] = {}
        self.done: dict[str, int] = {}

    def stage(self, name: str) -> Tick:
        def update(done: int, total: int) -> None:
            now = self.clock()
            first = name not in self.started or done < self.done[name]
            self.done[name] = done
            if first:
                self.started[name] = (now, done)
            finished = total > 0 and done >= total
            if first or finished or now - self.printed.get(name, now) >= LINE_INTERVAL:
                self.printed[name] = now
                print(f"gradian: {name} {_line(done, total, now, *self.started[name])}", file=sys.stderr, flush=True)

        return update


def _line(done: int, total: int, now: float, since: float, first_done: int) -> str:
    """``done/total (pct)``, then the rate and ETA once there is one."""
    text = f"{done}/{total}" + (f" ({done / total:.0%})" if total else "")
    elapsed, counted = now - since, done - first_done
    if elapsed <= 0 or counted <= 0:
        return text
    rate = counted / elapsed
    minutes, seconds = divmod(int(round(max(0, total - done) / rate)), 60)
    return f"{text}, {rate:.2f} ex/s, ETA {minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


class _Bars:
    """One rich Progress, started on first use, with a task per stage."""

    def __init__(self) -> None:
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}
        self.done: dict[str, int] = {}

    def stage(self, name: str) -> Tick:
        def update(done: int, total: int) -> None:
            if self.progress is None:
                self._start()
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=total, completed=done, first=done)
            elif done < self.done[name]:  # a new pass: its own clock, so the rate is not the last pass's
                self.progress.reset(self.tasks[name], total=total, completed=done, first=done)
            self.done[name] = done
            self.progress.update(self.tasks[name], total=total, completed=done)

        return update

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[progress.description]{task.description:<22}"), BarColumn(),
                                 MofNCompleteColumn(), _rate_column(), TimeElapsedColumn(),
                                 console=Console(stderr=True))
        self.progress.start()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _rate_column() -> Any:
    """Examples/s and ETA over the whole stage so far (rich's own speed needs frequent updates; a batch can take minutes)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            done = task.completed - task.fields.get("first", 0)
            if not elapsed or done <= 0:
                return Text("-- ex/s  ETA --:--", style="progress.data.speed")
            rate = done / elapsed
            left = max(0.0, (task.total or 0) - task.completed) / rate
            minutes, seconds = divmod(int(round(left)), 60)
            return Text(f"{rate:.2f} ex/s  ETA {minutes // 60}:{minutes % 60:02d}:{seconds:02d}",
                        style="progress.data.speed")

    return RateColumn()
