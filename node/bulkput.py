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
every chunk before it written and nothing after it.
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


def put_chunks(node: Any, chunks: Iterable[list], render: Render) -> Iterator[tuple[int, str]]:
    """Assert each of ``chunks`` (facts or anything ``Node.write`` takes) in its own
    durable write of ``node``, in order; yields ``(facts in the chunk, render(...))``
    once the chunk committed. A freshly joined home syncs first, as ``Node.write`` does."""
    writeaccess.sync_before_first_write_here(node)
    pending: tuple[PreparedAsserts, str, Future[Link | None]] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="put") as pool:
        for chunk in chunks:
            if pending is not None:
                pending[0].storing.wait()  # the write is in SQLite now, or over
            try:
                prepared = prepare_asserts(node, chunk)
                text = render(chunk, [cid for cid, _data in prepared.encoded])
            except BaseException:
                if pending is not None:  # the chunk before is written, and said so
                    yield _committed(pending)
                raise
            if pending is not None:
                done = _committed(pending)  # raises if that write failed: nothing more sent
                pending = (prepared, text, pool.submit(write_prepared, node, prepared))
                yield done
            else:
                pending = (prepared, text, pool.submit(write_prepared, node, prepared))
        if pending is not None:
            yield _committed(pending)


def _committed(pending: tuple[PreparedAsserts, str, Future[Link | None]]) -> tuple[int, str]:
    prepared, text, future = pending
    future.result()
    return len(prepared.facts), text
