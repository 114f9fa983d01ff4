"""Progress bars for downloads and hashing, drawn by rich.

huggingface-hub reports progress through a tqdm class; `rich_tqdm_class` gives it one that
forwards to a rich Progress instead of drawing its own bar.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from tqdm.auto import tqdm as _tqdm


def byte_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


class ByteTask:
    """One bar of a rich Progress, fed byte counts."""

    def __init__(self, progress: Progress, description: str, total: int | None, completed: int = 0) -> None:
        self.progress = progress
        self.task: TaskID = progress.add_task(description, total=total, completed=completed)

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)


@contextmanager
def byte_task(console: Console, description: str, total: int | None) -> Iterator[ByteTask]:
    with byte_progress(console) as progress:
        yield ByteTask(progress, description, total)


def rich_tqdm_class(progress: Progress, description: str) -> type[_tqdm]:
    """A tqdm subclass that huggingface-hub can drive, drawing into `progress`."""

    class RichTqdm(_tqdm):  # type: ignore[misc]
        def __init__(self, *args, **kwargs) -> None:
            kwargs["disable"] = True
            total = kwargs.get("total")
            initial = kwargs.get("initial", 0) or 0
            super().__init__(*args, **kwargs)
            self._bar = ByteTask(progress, description, total, initial)

        def update(self, n: float | None = 1) -> bool | None:
            self._bar.advance(int(n or 0))
            return None

        def close(self) -> None:
            pass

    return RichTqdm
