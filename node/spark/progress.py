"""Progress of running Spark jobs on the terminal, like the other long commands (rich).

A classic session is polled through ``SparkContext.statusTracker()`` (active
stages and their task counts); a Spark Connect session reports progress itself
through ``registerProgressHandler``. Nothing is drawn when stderr is not a
terminal, so scripted output stays clean.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .session import is_connect


def _describe(label: str, stages: list[tuple[int, int, int]]) -> tuple[str, int, int]:
    """``(description, done tasks, total tasks)`` of ``(stage id, done, total)`` stages."""
    done = sum(d for _s, d, _t in stages)
    total = sum(t for _s, _d, t in stages)
    ids = ", ".join(str(s) for s, _d, _t in sorted(stages))
    return (f"{label} · stage {ids} · tasks" if stages else label), done, total


@contextmanager
def spark_progress(spark: Any, label: str, console: Console | None = None) -> Iterator[None]:
    """Show the tasks of the running Spark stages under ``label`` while the block runs."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def show(stages: list[tuple[int, int, int]]) -> None:
            text, done, total = _describe(label, stages)
            bar.update(task, description=text, completed=done, total=total or None)

        if is_connect(spark):

            def handler(stages: Iterable[Any] | None, *_rest: Any, **_kw: Any) -> None:
                show(
                    [
                        (s.stage_id, s.num_completed_tasks, s.num_tasks)
                        for s in stages or ()
                        if not s.done
                    ]
                )

            spark.registerProgressHandler(handler)
            try:
                yield
            finally:
                spark.removeProgressHandler(handler)
            return
        tracker = spark.sparkContext.statusTracker()
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.3):
                infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                show([(i.stageId, i.numCompletedTasks, i.numTasks) for i in infos if i])

        thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
