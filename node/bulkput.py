"""``merklog put -f`` on a home opened in this process: chunk k+1 is checked, encoded
and rendered while chunk k is stored (ADR 0143).

A chunk's write is one transaction: the replica builds its signed deltas (Python), then
stores its blocks and rows in a few large SQLite statements and commits (SQLite's own
work: no GIL held, :mod:`merklog.store.sqlrun`). The write
(:func:`~.writes.write_prepared`) runs on a worker thread; this thread prepares the
next chunk (:func:`~.writes.prepare_asserts`) only once the write has reached its
SQLite part (``PreparedAsserts.storing``), so the two threads' Python does not compete
for the GIL and the writer, which is the longer of the two, is never slowed down by it.

The output and its order are those of writing the chunks one after the other: a
chunk's text is handed out only after its transaction committed, and a chunk that
fails to prepare (a value or a ``.decl`` it breaks) or to write stops the put with
every chunk before it written and nothing after it. An interrupt (Ctrl-C) while a
write is in flight lets it finish and hands out its text before it stops the put; one
that lands while the caller prints a chunk stops the put there (the chunk in flight is
stored, not printed: running the put again prints it and adds nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from merklog.store import Link

from . import writeaccess
from .writes import PreparedAsserts, prepare_asserts, write_prepared

#: ``render(chunk, cids)``: a chunk's output text from the chunk as given and its facts'
#: CIDs, made while the chunk before is stored.
Render = Callable[[list, list[Link]], str]


#: A chunk being written: its prepared facts, its output text and its write.
_InFlight = tuple[PreparedAsserts, str, "Future[Link | None]"]


def put_chunks(node: Any, chunks: Iterable[list], render: Render) -> Iterator[tuple[int, str]]:
    """Assert each of ``chunks`` (facts or anything ``Node.write`` takes) in its own
    durable write of ``node``, in order; yields ``(facts in the chunk, render(...))``
    once the chunk committed. A freshly joined home syncs first, as ``Node.write`` does."""
    writeaccess.sync_before_first_write_here(node)
    flight: list[_InFlight] = []  # the chunk being written, until its text is handed out
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="put") as pool:
        try:
            for chunk in chunks:
                if flight:
                    flight[0][0].storing.wait()  # the write is in SQLite now, or over
                try:
                    prepared = prepare_asserts(node, chunk)
                    text = render(chunk, [cid for cid, _data in prepared.encoded])
                except Exception:
                    if flight:  # the chunk before is written, and said so
                        yield _committed(flight)
                    raise
                done = _committed(flight) if flight else None  # a failed write's error raises
                flight.append((prepared, text, pool.submit(write_prepared, node, prepared)))
                if done is not None:
                    yield done
            if flight:
                yield _committed(flight)
        except KeyboardInterrupt:
            if flight:  # the write in flight finishes (the pool waits for it): print it
                yield _committed(flight)
            raise


def _committed(flight: list[_InFlight]) -> tuple[int, str]:
    """Wait for the write in flight to commit (its error raises), then take it out."""
    prepared, text, future = flight[0]
    future.result()
    flight.pop()
    return len(prepared.facts), text
