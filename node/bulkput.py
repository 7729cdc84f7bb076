"""``merklog put -f`` on a home opened in this process: chunk k+1 is checked, encoded
and rendered while chunk k is stored (ADR 0143, ADR 0144).

A chunk's write is one transaction: the replica stores the facts' blocks, builds its
signed deltas (Python), stores its rows in a few large SQLite statements and commits
(SQLite's own work: no GIL held, :mod:`merklog.store.sqlrun`). The write
(:func:`~.writes.write_prepared`) runs on a worker thread; this thread reads and
prepares the next chunk (:func:`~.writes.prepare_asserts`) once the write has started
storing (``PreparedAsserts.storing``). While a put runs, the interpreter's switch
interval is short, so the writer gets the GIL back within microseconds whenever one of
its statements ends, instead of waiting up to 5 ms behind this thread's Python.

A chunk's text is rendered while its commit is on its way, or, when the commit was
over before the next chunk was ready, right after the next write is submitted. A
:class:`CommitGate` holds the first chunk's commit until the caller has read the rest
of its input (ADR 0144): ``put -f`` parses the rest of its file while that chunk is
being written, and a syntax error anywhere still writes nothing.

The chunks may also come prepared from another process (:class:`ReadyChunk`: ``put
-f``'s helper reads, checks, encodes and renders the chunks after the first, ADR 0147,
ADR 0149); this thread then only rebuilds them.

The output and its order are those of writing the chunks one after the other: a
chunk's text is handed out only after its transaction committed, and a chunk that
fails to prepare (a value or a ``.decl`` it breaks) or to write stops the put with
every chunk before it written and nothing after it. An interrupt (Ctrl-C) while a
write is in flight lets it finish and hands out its text (and that of a committed
chunk not yet handed out) before it stops the put; one that lands while the caller
prints a chunk stops the put there (the chunk in flight is stored, not printed:
running the put again prints it and adds nothing).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from merklog.store import Fact, Link

from . import writeaccess
from .errors import NodeError
from .writes import PreparedAsserts, prepare_asserts, write_prepared

#: The interpreter's switch interval while a put runs (seconds; CPython's default is
#: 0.005). Between its SQLite statements the writer needs the GIL for a moment; while
#: this thread runs Python, each such moment waited up to a whole interval (ADR 0144).
SWITCH_INTERVAL = 0.00005

#: ``render(chunk, cids)``: a chunk's output text from the chunk as given and its facts'
#: CIDs, made while the chunk's write is in SQLite.
Render = Callable[[list, list[Link]], str]


@dataclass
class ReadyChunk:
    """A chunk prepared elsewhere (``put -f``'s helper process, ADR 0147): its prepared
    asserts, or the error its preparation raised (the chunks before it are written and
    printed, as when it fails here). ``text``: its output, rendered by that process
    from the chunk as given (``put -f``'s helper, ADR 0149); None: rendered here from
    the prepared facts."""

    prepared: PreparedAsserts | None
    text: str | None = None
    refused: BaseException | None = None

    def pack(self) -> tuple:
        """Plain columns for a pickle: relations, argument tuples, the CIDs' digests
        back to back, the blocks, the text (a third of the bytes of pickling the facts
        and ``Link`` objects, and much faster to load)."""
        if self.prepared is None:
            return (None, None, None, None, self.text, self.refused)
        facts, encoded = self.prepared.facts, self.prepared.encoded
        digests = Link.dag_cbor_digests([cid for cid, _data in encoded])
        return (
            [f.rel for f in facts],
            [f.args for f in facts],
            digests,
            [data for _cid, data in encoded],
            self.text,
            None,
        )

    @classmethod
    def unpack(cls, packed: tuple) -> ReadyChunk:
        """The chunk :meth:`pack` gave (its facts and CIDs rebuilt without checks: they
        were checked and computed by the process that packed them)."""
        rels, args, digests, datas, text, refused = packed
        if rels is None:
            return cls(None, text, refused)
        new = tuple.__new__
        facts = [new(Fact, pair) for pair in zip(rels, args, strict=True)]
        cids = Link.dag_cbor_links(digests)
        return cls(PreparedAsserts(facts, list(zip(cids, datas, strict=True))), text)


class InputAborted(NodeError):
    """The first chunk's write was rolled back: the rest of the input failed (its own
    error is the one reported)."""


class CommitGate:
    """Holds the commit of a put's first chunk until its caller knows the rest of the
    input is good: :meth:`open` lets the write commit, :meth:`abort` rolls it back
    (:meth:`put_chunks` aborts it whenever it ends, which is a no-op once open)."""

    def __init__(self) -> None:
        self._decided = threading.Event()
        self._open = False

    def open(self) -> None:
        self._open = True
        self._decided.set()

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` was called (the first write may commit)."""
        return self._open

    def abort(self) -> None:
        self._decided.set()

    def __call__(self) -> None:
        """The first write's ``before_commit``, on the writer thread: wait for the
        decision; raise :class:`InputAborted` unless the gate was opened."""
        self._decided.wait()
        if not self._open:
            raise InputAborted("the rest of the input failed: the first chunk is not written")


@dataclass
class _InFlight:
    """A chunk being written: the chunk as given, its prepared facts, its write and its
    output text (rendered once the write is in SQLite)."""

    chunk: list
    prepared: PreparedAsserts
    write: Future[Link | None]
    text: str | None = None

    def rendered(self, render: Render) -> str:
        if self.text is None:
            given = self.chunk
            if isinstance(given, ReadyChunk):
                if given.text is not None:
                    self.text = given.text
                    return self.text
                given = self.prepared.facts  # the chunk as given: its checks changed nothing
            self.text = render(given, [cid for cid, _data in self.prepared.encoded])
        return self.text


def _prepared(node: Any, chunk: list | ReadyChunk) -> PreparedAsserts:
    """A chunk's prepared asserts: prepared here, or taken from a :class:`ReadyChunk`
    (whose preparation's error is raised here, counted as a refused write)."""
    if not isinstance(chunk, ReadyChunk):
        return prepare_asserts(node, chunk)
    if chunk.prepared is None:
        node.metrics.rejected.inc()
        raise chunk.refused or NodeError("a chunk of the put was not prepared")
    return chunk.prepared


def put_chunks(
    node: Any,
    chunks: Iterable[list],
    render: Render,
    gate: CommitGate | None = None,
    render_early: bool = False,
) -> Iterator[tuple[int, str]]:
    """Assert each of ``chunks`` (facts or anything ``Node.write`` takes, or a
    :class:`ReadyChunk` prepared elsewhere) in its own durable write of ``node``, in
    order; yields ``(facts in the chunk, its text)`` once the chunk committed, the text
    ``render(chunk, cids)`` unless a ReadyChunk brought its own. A freshly joined home
    syncs first, as ``Node.write`` does.
    ``gate``: the first chunk's write commits only once it is opened (the ``chunks``
    iterator opens it once it knows its remaining chunks are good).
    ``render_early``: a chunk prepared here is rendered as soon as its write is in
    SQLite, before the next chunk is asked for (when the chunks after it come prepared
    from another process, this thread would only wait for them meanwhile)."""
    writeaccess.sync_before_first_write_here(node)
    held = gate  # aborted whenever this ends: a no-op once the chunks opened it
    flight: list[_InFlight] = []  # the chunk being written, until it committed
    said: list[_InFlight] = []  # a committed chunk, until its text is handed out
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    with (
        _restored_switch_interval(switch),
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="put") as pool,
    ):
        try:
            todo = iter(chunks)
            while True:
                if flight:
                    # Nothing of the next chunk, not even its reading, competes with the
                    # write's Python: go on once the write is in SQLite (or over).
                    flight[0].prepared.storing.wait()
                    if render_early and not isinstance(flight[0].chunk, ReadyChunk):
                        flight[0].rendered(render)
                try:
                    chunk = next(todo, None)  # may read the rest of the input (ADR 0144)
                except Exception:
                    # A chunk that could not be read (its helper died, ADR 0147): the
                    # chunk in flight is written and said so, unless it is a first chunk
                    # still held, which rolls back.
                    if flight and (held is None or held.opened):
                        yield _committed(flight, render)
                    raise
                if chunk is None:
                    break
                try:
                    prepared = _prepared(node, chunk)
                except Exception:
                    if flight:  # the chunk before is written, and said so
                        yield _committed(flight, render)
                    raise
                if flight:
                    if not flight[0].write.done():
                        flight[0].rendered(render)  # while its commit is on its way
                    flight[0].write.result()  # a failed write raises
                    said.append(flight.pop())
                if gate is not None:
                    prepared.before_commit, gate = gate, None  # the first write only
                flight.append(
                    _InFlight(chunk, prepared, pool.submit(write_prepared, node, prepared))
                )
                if said:  # its write was over before this chunk was ready: rendered now
                    yield len(said[0].prepared.facts), said[0].rendered(render)
                    said.pop()
            if flight:
                yield _committed(flight, render)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (the CLI's handler)
            if held is not None:
                held.abort()  # a first write still held (its input unread) rolls back
            for entry in said:  # committed: said before the chunk in flight
                yield len(entry.prepared.facts), entry.rendered(render)
            if flight:  # the write in flight finishes (the pool waits for it): print it
                try:
                    yield _committed(flight, render)
                except InputAborted:
                    pass  # the interrupt stopped the input's reading: nothing was written
            raise
        finally:
            if held is not None:
                held.abort()  # before the pool waits for a write the gate holds


@contextmanager
def _restored_switch_interval(previous: float) -> Iterator[None]:
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _committed(flight: list[_InFlight], render: Render) -> tuple[int, str]:
    """Wait for the write in flight to commit (its error raises), then take it out."""
    entry = flight[0]
    text = entry.rendered(render)
    entry.write.result()
    flight.pop()
    return len(entry.prepared.facts), text
