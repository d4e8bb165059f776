"""A transient progress line on stderr while a build runs, for builds that take over a second.

The derivation reports each step through `report(done, total, what)`; nothing is shown unless
a `progress_line()` context is active, stderr is a terminal, and the build has run for
`DELAY` seconds.  The line is erased when the context exits, so what a build prints to stdout
(and to a captured or redirected stderr) is unchanged.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, TextIO

DELAY = 1.0  # seconds before the line appears

Reporter = Callable[[int, int, str], None]
_REPORTER: ContextVar[Reporter | None] = ContextVar("derivc_progress", default=None)


def report(done: int, total: int, what: str) -> None:
    """`done` of `total` units finished, `what` runs now (no-op outside progress_line)."""
    reporter = _REPORTER.get()
    if reporter is not None:
        reporter(done, total, what)


@contextmanager
def progress_line(title: str, stream: TextIO | None = None, delay: float | None = None) -> Iterator[None]:
    """Show `title` and the reported progress on `stream` (stderr) if it is a terminal."""
    stream = sys.stderr if stream is None else stream
    delay = DELAY if delay is None else delay
    progress = _make_progress(stream, delay) if _is_tty(stream) else None
    if progress is None:
        yield
        return
    task = progress.add_task(title, total=None)

    def update(done: int, total: int, what: str) -> None:  # the last unit: writing the build
        progress.update(task, completed=done, total=total + 1, description=f"{title}: {what}")

    token = _REPORTER.set(update)
    progress.start()
    try:
        yield
    finally:
        _REPORTER.reset(token)
        progress.stop()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False


def _make_progress(stream: TextIO, delay: float) -> Any:
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None

    class DelayedProgress(Progress):
        """Renders nothing until `delay` seconds have passed: quick builds print no line."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.started_at = time.monotonic()
            super().__init__(*args, **kwargs)

        def get_renderables(self) -> Any:
            if time.monotonic() - self.started_at >= delay:
                yield from super().get_renderables()

    return DelayedProgress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(file=stream, force_terminal=True), transient=True, refresh_per_second=8,
    )
