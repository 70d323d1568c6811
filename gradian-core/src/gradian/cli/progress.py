"""Progress bars on stderr for long stages (rich), shared by the commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


@contextmanager
def stage_bars(enabled: bool = True) -> Iterator[Callable[[str], Callable[[int, int], None] | None]]:
    """A factory: ``bars(stage)`` gives a (done, total) callback drawing one bar per stage."""
    if not enabled:
        yield lambda stage: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class SpeedColumn(ProgressColumn):
        """Items per second."""

        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("-- /s" if speed is None else f"{speed:.2f}/s", style="progress.data.speed")

    columns = (TextColumn("[progress.description]{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
               SpeedColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with ExitStack() as stack:
        bar = stack.enter_context(Progress(*columns, console=Console(stderr=True), transient=False))
        tasks: dict[str, Any] = {}

        def factory(stage: str) -> Callable[[int, int], None]:
            def update(done: int, total: int) -> None:
                if stage not in tasks:  # work already done (a resumed index) is not part of the speed
                    tasks[stage] = bar.add_task(stage, total=total, completed=done)
                    return
                bar.update(tasks[stage], total=total, completed=done)

            return update

        yield factory
