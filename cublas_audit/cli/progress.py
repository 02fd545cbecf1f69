"""The rich progress bars on stderr of the commands that run cases (sweep, map, candidates)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def _cases_per_second_column() -> Any:
    """A rich progress column: the cases finished per second (rich's own speed estimate)."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class CasesPerSecond(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(f"{task.speed:.1f} cases/s" if task.speed else "", style="cyan")

    return CasesPerSecond()


class Bars:
    """The rich progress bars on stderr: one per GPU that works (`hooks(name)`), each with its
    cases per second. The display starts when the first starts its cases, so every check before
    that prints its error alone."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True)
        self.started = False
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        self.bar = Progress(
            *columns, _cases_per_second_column(), TimeRemainingColumn(), console=self.console
        )

    def hooks(self, name: str = "") -> Any:
        from cublas_audit.run.sweep import Progress as Hooks

        prefix = f"{name} " if name else ""
        task = self.bar.add_task(prefix or "sweep", total=None, visible=False)

        def start(total: int) -> None:  # a map's follow-up starts a second count on one bar
            self.started = True
            self.bar.start()
            self.bar.reset(task, total=total, visible=True)

        return Hooks(
            start=start,
            current=lambda case_id: self.bar.update(task, description=prefix + case_id),
            advance=lambda case_id: self.bar.advance(task),
            note=lambda message: self.console.print(prefix + message, style="yellow", markup=False),
        )

    def for_gpu(self, gpu: Any) -> Any:
        return self.hooks(f"gpu{gpu.index}")


def with_progress(work: Callable[[Bars], R]) -> R:
    """Runs `work(bars)` and stops the display however it ends: a display that started, only
    (rich's stop ends a display off a terminal with an empty line, which would otherwise stand
    before the one-line error of a check that failed before the first case)."""
    bars = Bars()
    try:
        return work(bars)
    finally:
        if bars.started:
            bars.bar.stop()
