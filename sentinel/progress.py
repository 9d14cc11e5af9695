"""Progress of long phases: a rich progress bar on a terminal, one plain line per phase in a log.

`phase(console, label, total)` is a context manager yielding `update(completed)`. On a terminal it
draws a transient bar; when the console is not a terminal (output redirected to a file, CI), the bar
would print nothing useful, so the phase prints a plain line when it starts (the label and the
total), one every `LOG_EVERY_S` seconds while it runs (the count so far), and one when it ends
(the count done and the seconds it took).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LOG_EVERY_S = 30.0


@contextmanager
def phase(console: Console, label: str, total: int) -> Iterator[Callable[[int], None]]:
    if not console.is_terminal:
        done = [0]
        start = time.perf_counter()
        stop = threading.Event()

        def heartbeat() -> None:  # a log sees the phase is alive, however long one step takes
            while not stop.wait(LOG_EVERY_S):
                console.print(f"{label}: {done[0]}/{total} after "
                              f"{time.perf_counter() - start:.0f}s", highlight=False, markup=False)

        def note(completed: int) -> None:
            done[0] = completed

        console.print(f"{label}: {total} to do", highlight=False, markup=False)
        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            yield note
        finally:
            stop.set()
            beat.join()
        console.print(f"{label}: {done[0]}/{total} in {time.perf_counter() - start:.1f}s",
                      highlight=False, markup=False)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(label, total=total)
        yield lambda completed: progress.update(bar, completed=completed)
