"""Progress bars on stderr for long stages (rich), shared by every command.

A stage's bar appears at its first report, so input refused before any work leaves no empty bar behind, and
work finished in an earlier run (a resumed index) does not count toward the rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Tick = Callable[[int, int], None]


@contextmanager
def stage_bars(enabled: bool = True) -> Iterator[Callable[[str], Tick | None]]:
    """A factory: ``bars(stage)`` gives a (done, total) callback drawing that stage's bar."""
    if not enabled:
        yield lambda stage: None
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


class _Bars:
    """One rich Progress, started on first use, with a task per stage."""

    def __init__(self) -> None:
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def stage(self, name: str) -> Tick:
        def update(done: int, total: int) -> None:
            if self.progress is None:
                self._start()
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=total, completed=done, first=done)
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
