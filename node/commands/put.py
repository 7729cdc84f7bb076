"""``merklog put`` / ``merklog retract``: write facts in Datalog syntax, print their CIDs.

The whole input is parsed before anything commits (a syntax error anywhere writes
nothing and names its ``LINE:COL``), and written in chunks: each chunk is one durable
write, and a progress bar on a terminal counts facts.

- On a stopped home a chunk is ``LOCAL_CHUNK_FACTS`` facts, one transaction each:
  fewer, larger commits rewrite fewer B-tree pages (docs/adr/0050); an input of 20,000
  to 800,000 lines into a home holding fewer facts is cut in quarters instead, so its
  first write starts sooner (ADR 0194). ``put`` checks,
  encodes and renders chunk k+1 while chunk k is in SQLite (:mod:`merklog.node.bulkput`,
  ADR 0143). An input longer than one chunk whose first chunk's lines are one fact each
  starts that chunk's write once those lines are read, and reads the rest meanwhile;
  the write's commit waits until the rest has parsed, and rolls back if it does not
  (ADR 0144). ``retract`` writes its chunks inline.
- Through a running node a chunk is one HTTP request of at most ``CHUNK_FACTS``
  facts / ``CHUNK_BYTES`` bytes of text (and a quarter of its body limit, so JSON
  escaping cannot push a body over it). Each request is one transaction on the node,
  whose commit rewrites most leaf pages of the random-key B-trees however few facts it
  holds: 200k-fact requests cost the node a third less CPU per fact than 20k ones at
  1M facts (ADR 0081); a put of 20,000 to 800,000 facts into a node holding fewer is
  sent in quarters, so the node decodes one request while it writes another from the
  first on (ADR 0194). A file with one
  fact per line is sent as its own lines (the node parses them as the client did);
  other inputs are sent as each parsed fact's rendering. ``put`` keeps
  ``PUT_IN_FLIGHT`` requests in flight (the node decodes one while it writes another)
  and prints a chunk's CIDs while the next one is written; ``retract`` keeps one (ADR
  0119, ADR 0212). An input
  longer than one request is read in two halves at once: a forked helper reads the
  second half and renders its facts while this process reads the first, and nothing
  is sent before both halves have read (ADR 0157).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import click

from merklog.node.cli import State, pass_state

if TYPE_CHECKING:
    from merklog.node.bulkput import CommitGate
    from merklog.node.helperproc import Helper
    from merklog.node.target import Target

CHUNK_FACTS = 200_000
CHUNK_BYTES = 4 << 20
#: Through a running node, an input longer than this many characters is read in two halves
#: at once, one of them by a helper process (ADR 0157).
SPLIT_FROM_CHARS = CHUNK_BYTES
#: Requests a put through a running node keeps in flight (ADR 0119, ADR 0212). A node
#: answers a write after the epoch that saw it, and that epoch's save waits for the
#: write after it to commit: with two in flight, the request after next was sent only
#: then, and the node idled while it decoded that body (~0.8 s per two requests at 1M
#: facts). With three, that body is decoded while the write before it runs.
PUT_IN_FLIGHT = 3
#: Inputs this large show a progress bar on a terminal.
BAR_FACTS = 20_000
#: Facts per transaction on a stopped home (the progress bar advances per chunk).
LOCAL_CHUNK_FACTS = 200_000
#: A write this large on a stopped home gives its own process a page cache of
#: ``BULK_CACHE_MB`` MiB (ADR 0110: ~9% less CPU at 1M facts than the 128 MiB default).
BULK_CACHE_FACTS = 100_000
BULK_CACHE_MB = 512
#: ... and lets its WAL grow to this many MiB before a checkpoint (ADR 0152).
BULK_WAL_MB = 1024
#: The write answer put asks for: CIDs alone, in input order (it renders the facts itself).
CIDS = "cids"


def chunks(
    facts: list, max_facts: int = CHUNK_FACTS, max_bytes: int | None = CHUNK_BYTES
) -> Iterator:
    """Consecutive slices of ``facts`` within both bounds (Datalog text size estimated
    from the rendering each fact is sent as). ``max_bytes=None``: count facts only (a
    write in this process sends no text, so rendering each fact would be wasted)."""
    if max_bytes is None:
        for start in range(0, len(facts), max_facts):
            yield facts[start : start + max_facts]
        return
    start = size = 0
    for i, fact in enumerate(facts):
        n = len(str(fact)) + 2
        if i > start and (i - start >= max_facts or size + n > max_bytes):
            yield facts[start:i]
            start, size = i, 0
        size += n
    if start < len(facts):
        yield facts[start:]


def _write(
    state: State, facts: tuple[str, ...], file: object, retract: bool, quiet: bool = False
) -> None:
    """Read, write and print ``facts`` with the cyclic GC paused throughout: the parsed
    facts, the results and the output lines are millions of objects and no cycles. In
    the console-script process the heap is frozen before the collector comes back, so
    re-enabling it does not start a collection over all of them just before the process
    exits (7% of ``put -f`` of 1M facts, ADR 0110)."""
    import gc

    from merklog.node import cli
    from merklog.store.gcpause import gc_paused

    with gc_paused():
        try:
            _write_paused(state, facts, file, retract, quiet)
        finally:
            if cli.ONE_SHOT:
                gc.freeze()


def _write_paused(
    state: State, facts: tuple[str, ...], file: object, retract: bool, quiet: bool
) -> None:
    from merklog.engine.errors import EngineError
    from merklog.node.cliutil import facts_text, in_file
    from merklog.node.errors import NodeError
    from merklog.node.factplace import name_place
    from merklog.node.failures import NotVisible
    from merklog.replication.errors import TooLarge

    text = facts_text(facts, file)
    try:
        missing = _write_text(state, text, retract, quiet)
    except (EngineError, NodeError, TooLarge) as exc:
        # a fact refused after it parsed: where it is in the file, or in the arguments
        # (their LINE:COL, as a syntax error in them says it)
        name_place(exc, text)
        in_file(exc, facts, file)  # FILE:LINE:COL where it points into the file
        raise
    if missing:
        shown = ", ".join(item["fact"] for item in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise NotVisible(f"not visible, nothing to retract: {shown}{more}")


def _write_text(state: State, text: str, retract: bool, quiet: bool = False) -> list[dict]:
    """Write ``text`` to the target; the facts a retract found not visible. ``quiet``:
    render and print no ``CID<TAB>fact`` line."""
    from rich.console import Console

    from merklog.node.cliutil import target
    from merklog.node.target import LocalTarget

    console = Console(stderr=True)
    with target(state) as t:
        # A large put on a stopped home starts writing its first chunk before the rest
        # of the input is read (ADR 0144), which a helper process reads and prepares
        # (ADR 0147); through a running node a helper reads the second half of a large
        # input (ADR 0157); anything else is read whole first.
        local = isinstance(t, LocalTarget)
        end = _head_end(text, lambda: _home_facts(t)) if local and not retract else None
        # The helper starts reading while this process reads the first chunk or half.
        helper = _start_helper(t.node, text, end, quiet) if end is not None else None
        if not local:
            helper = _start_half_reader(text, quiet)
        try:
            head = _head(text, end)
            if local and head is None and helper is not None:  # not the bulk shape
                helper.close()  # read whole here
                helper = None
            return _write_target(state, t, text, head, helper, retract, console, quiet)
        finally:
            if helper is not None:
                helper.close()


def _write_target(
    state: State,
    t: Target,
    text: str,
    head: tuple[list, int] | None,
    helper: Helper | None,
    retract: bool,
    console: Any,
    quiet: bool = False,
) -> list[dict]:
    """Write ``text`` to ``t`` with a progress bar on a terminal (see :func:`_write`);
    returns the facts a retract found not visible; prints nothing per fact when
    ``quiet``. ``helper``: on a stopped home, the one that prepares a put's later chunks
    (:func:`_start_helper`); through a running node, the one that reads the second half
    of the input (:func:`_start_half_reader`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from merklog.engine.factreader import read_fact_lines
    from merklog.node.target import LocalTarget, load_config

    verb = "retract" if retract else "put"
    local_put = isinstance(t, LocalTarget) and not retract
    bulk = parsed = None
    rendered: Sequence[str] = []  # the second half's facts as text, when a helper read it
    if head is None and helper is not None and not isinstance(t, LocalTarget):
        halves = _read_halves(text, helper)
        if halves is not None:
            parsed, lines, rendered = halves
            bulk = (parsed, lines)
            if quiet:  # only their count is used (the helper rendered nothing)
                rendered = [""] * len(rendered)
        else:  # not one fact per line: the parser reads the whole text (its error places)
            parsed = _parse(text)
    elif head is None:
        bulk = read_fact_lines(text)  # one fact per line: the facts and their own lines
        parsed = bulk[0] if bulk is not None else _parse(text)
    size = len(parsed) + len(rendered) if parsed is not None else text.count("\n") + 1
    with Progress(
        TextColumn(verb),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("facts"),
        # the bar moves by chunk, and a put of one chunk (into a home larger than its
        # input, ADR 0194) by none: the elapsed time shows it is at work meanwhile
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal or size < BAR_FACTS,
    ) as bar:
        task = bar.add_task(verb, total=size)
        if isinstance(t, LocalTarget) and size >= BULK_CACHE_FACTS:
            t.node.store.set_cache_mb(BULK_CACHE_MB)  # this process only, freed at its exit
            t.node.store.set_wal_checkpoint_mb(BULK_WAL_MB)
        if not local_put:
            assert parsed is not None
            # Through a running node each chunk is one request: stay under its body
            # limit. The body is UTF-8 JSON, so a character of the text (as sized by
            # ``_wire_sizes``) takes at most 4 bytes (4 in UTF-8, 2 for an escaped quote).
            max_bytes = min(
                CHUNK_BYTES,
                (int(load_config(state.home, state.overrides).get("node.max_body")) - 4096) // 4,
            )
            return _write_chunks(
                t, parsed, bulk, max_bytes, retract, bar, task, rendered, text, quiet
            )
        # Chunk k+1 is checked and encoded while chunk k is in SQLite (ADR 0143).
        from merklog.node.bulkput import CommitGate, put_chunks

        gate = None
        if head is None:
            local: Iterator = chunks(parsed or [], LOCAL_CHUNK_FACTS, None)
        else:
            gate = CommitGate()

            def total(n: int) -> None:
                bar.update(task, total=n)

            local = (
                _chunks_from_helper(helper, head, gate, total)
                if helper is not None
                else _chunks_while_reading(text, head, gate, total)
            )
        # With a helper, this thread renders the first chunk while it is written.
        render = _silent if quiet else _render
        for count, out in put_chunks(t.node, local, render, gate, helper is not None):
            if out:
                click.echo(out)
            bar.advance(task, count)
    return []


def _parse(text: str) -> list:
    """The facts of ``text`` by the full parser (what the line reader does not take), which
    names the ``LINE:COL`` of an error. Imported here: a put of lines through a running
    node never loads the parser, the engine's checks or the node's write path."""
    from merklog.node.queries import parse_facts

    return parse_facts(text)


#: A large put on a stopped home reads the rest of its input in pieces of about this many
#: characters (whole lines) while its first chunk is written.
READ_PIECE_CHARS = 256 << 10


#: A put of this many lines or more into a home that holds fewer facts is cut into
#: chunks (requests through a running node) of a ``HEAD_SHARE`` of its lines, so that its
#: first write starts sooner (ADR 0194).
SPLIT_FROM_LINES = 20_000
HEAD_SHARE = 0.25


def _quartered(lines: int, known: Callable[[], int]) -> bool:
    """Whether a put of ``lines`` facts is cut in quarters (ADR 0194): from
    ``SPLIT_FROM_LINES`` lines on, into a home that holds fewer facts than that
    (``known()``, asked only then). Each commit rewrites a share of the home's CID
    indexes, so into a larger home three more commits cost more than the earlier start
    saves (100k facts into a 600k-fact home: 2.43 s in quarters, 2.30 s whole)."""
    return lines >= SPLIT_FROM_LINES and known() < lines


def _head_lines(text: str, known: Callable[[], int]) -> int | None:
    """How many lines of ``text`` its first chunk takes on a stopped home: a
    ``HEAD_SHARE`` of them (``LOCAL_CHUNK_FACTS`` at most) when it is cut in quarters
    (:func:`_quartered`), else ``LOCAL_CHUNK_FACTS`` when there are more; None for an
    input of one chunk (read whole first). A quarter measured best at 50k-200k facts:
    the writer starts on the first quarter while the helper prepares the next."""
    n = text.count("\n") + (not text.endswith("\n"))
    if _quartered(n, known):
        return min(LOCAL_CHUNK_FACTS, math.ceil(n * HEAD_SHARE))
    if n > LOCAL_CHUNK_FACTS:
        return LOCAL_CHUNK_FACTS
    return None


def _chunk_facts(text: str, end: int) -> int:
    """The facts per chunk of a put whose first chunk's lines end at ``end``: as many as
    those lines (:func:`_head_lines`)."""
    return text.count("\n", 0, end)


def _head_end(text: str, known: Callable[[], int]) -> int | None:
    """Where the rest of ``text`` starts after its first chunk's lines
    (:func:`_head_lines`; ``known()``: the facts the home holds), when it has more lines
    than those; else None."""
    import re

    head = _head_lines(text, known)
    if head is None:
        return None
    lines = re.compile(f"(?:[^\n]*\n){{{head}}}").match(text)
    if lines is None or lines.end() >= len(text):
        return None
    return lines.end()


def _head(text: str, end: int | None) -> tuple[list, int] | None:
    """The facts of the first chunk's lines of ``text`` (:func:`_head_lines`) and the offset
    where the rest starts (``end``, :func:`_head_end`), when ``text`` has more lines and
    those have the bulk shape (one fact per line,
    :func:`~merklog.engine.factreader.read_fact_lines`); else None.
    The first chunk is then whole, and the chunks after it fall where they would if the
    input were read first (every transaction costs a pass over the B-trees, ADR 0050)."""
    from merklog.engine.factreader import read_fact_lines

    if end is None:
        return None
    head = read_fact_lines(text[:end])
    return (head[0], end) if head is not None and head[0] else None


def _chunks_while_reading(
    text: str, head: tuple[list, int], gate: CommitGate, total: Callable[[int], None]
) -> Iterator[list]:
    """The chunks of a put whose first chunk is written while the rest of ``text`` is
    read: the first chunk from ``head``; then the rest is parsed (a syntax error names its
    ``LINE:COL`` in the whole text, and the first chunk, held by ``gate``, rolls back),
    ``gate`` opens and the remaining chunks follow. ``total(n)``: the input's fact count,
    once known."""
    facts, end = head
    yield facts  # at most LOCAL_CHUNK_FACTS (_head_lines): one per line
    rest = _read_rest(text, end)
    gate.open()
    total(len(facts) + len(rest))
    yield from chunks(rest, _chunk_facts(text, end), None)


def _read_rest(text: str, end: int) -> list:
    """The facts of ``text`` after its first chunk's lines, which end at ``end`` and hold
    one fact each (see :func:`_chunks_while_reading`)."""
    from merklog.engine.factreader import read_fact_lines
    from merklog.node.queries import parse_facts

    head_end = end
    rest: list = []
    bulk = True
    while bulk and end < len(text):
        # In pieces of whole lines: each C call of the reader holds the GIL for a few
        # milliseconds only, so the write's Python between its statements is not held up.
        cut = text.find("\n", end + READ_PIECE_CHARS) + 1 or len(text)
        piece = read_fact_lines(text[end:cut])
        bulk = piece is not None
        rest.extend(piece[0] if piece is not None else ())
        end = cut
    if not bulk:
        # The rest is not one fact per line: the parser reads the whole text (its error
        # positions are the text's), and its first facts are the head's.
        head = read_fact_lines(text[:head_end])
        rest = parse_facts(text)[len(head[0]) if head is not None else 0 :]
    return rest


def _start_helper(node: Any, text: str, end: int, quiet: bool = False) -> Helper | None:
    """A helper process that reads, checks and encodes the chunks after the first, whose
    lines end at ``end`` (ADR 0147), when a helper may fork here; else None. Started
    before this process reads the first chunk or starts any thread (the progress
    bar's, the writes')."""
    import logging

    from merklog.node import helperproc

    log = logging.getLogger(__name__)
    if not helperproc.available():
        log.debug("put: the rest of the input is read in this process")
        return None
    helper = helperproc.Helper(lambda: _rest_in_helper(node, text, end, quiet))
    log.info("put: helper process %d reads and prepares the rest of the input", helper.pid)
    return helper


def _rest_in_helper(node: Any, text: str, end: int, quiet: bool = False) -> Iterator:
    """The helper's items: the number of facts after the first chunk (once the whole
    rest has parsed: a syntax error is raised instead), then each later chunk checked,
    encoded and rendered (not rendered when ``quiet``: its text is empty), packed
    (:class:`~merklog.node.bulkput.ReadyChunk`); a chunk that fails to prepare is the
    last, carrying its error."""
    from merklog.node.bulkput import ReadyChunk
    from merklog.node.writes import prepare_asserts

    rest = _read_rest(text, end)
    yield len(rest)
    for chunk in chunks(rest, _chunk_facts(text, end), None):
        try:
            prepared = prepare_asserts(node, chunk)
        except Exception as exc:  # noqa: BLE001 - put_chunks raises it in its turn
            yield ReadyChunk(None, None, exc).pack()
            return
        # Its text too (the input as given): the writing process then runs no Python of
        # its own beside the writes but their unpacking (ADR 0149). Rendered once the
        # chunk is sent, while it is being written; in the chunk when the checks
        # normalised a value (the writing process could not render it as given).
        if quiet:
            yield ReadyChunk(prepared, "").pack()
            continue
        cids = [cid for cid, _data in prepared.encoded]
        if prepared.facts is not chunk:
            yield ReadyChunk(prepared, _render(chunk, cids)).pack()
            continue
        yield ReadyChunk(prepared).pack()
        yield _render(chunk, cids)


def _halfway(text: str) -> int | None:
    """Where the second half of ``text`` starts (after the line that crosses its middle),
    when ``text`` is long enough to be read in two halves (:data:`SPLIT_FROM_CHARS`)."""
    if len(text) < SPLIT_FROM_CHARS:
        return None
    mid = text.find("\n", len(text) // 2) + 1
    return mid if 0 < mid < len(text) else None


def _start_half_reader(text: str, quiet: bool = False) -> Helper | None:
    """A helper process that reads the second half of ``text`` (:func:`_halfway`) while
    this process reads the first, when ``text`` is that long and a helper may fork here;
    else None. Started before any thread (the progress bar's, the requests'). ``quiet``:
    it renders nothing (:func:`_half_count_in_helper`)."""
    import logging

    from merklog.node import helperproc

    mid = _halfway(text)
    if mid is None or not helperproc.available():
        return None
    read = _half_count_in_helper if quiet else _half_in_helper
    helper = helperproc.Helper(lambda: read(text, mid))
    logging.getLogger(__name__).info(
        "put: helper process %d reads the second half of the input", helper.pid
    )
    return helper


def _half_in_helper(text: str, mid: int) -> Iterator:
    """The helper's items: None when ``text[mid:]`` is not one fact per line (then the
    whole text is not either, and this process parses it); else the number of its facts,
    once they have read, then their rendering (:func:`~merklog.store.codec.fact_texts`),
    what ``put`` prints beside each CID."""
    from merklog.engine.factreader import read_fact_lines
    from merklog.store.codec import fact_texts

    second = read_fact_lines(text[mid:])
    if second is None:
        yield None
        return
    yield len(second[0])
    yield fact_texts(second[0])


def _half_count_in_helper(text: str, mid: int) -> Iterator:
    """:func:`_half_in_helper` for ``put -q``: None, or the number of facts of
    ``text[mid:]``, and no rendering."""
    from merklog.engine.factreader import read_fact_lines

    second = read_fact_lines(text[mid:])
    yield None if second is None else len(second[0])


class HelperTexts(Sequence[str]):
    """The second half's facts as ``put`` prints them, rendered by the helper that read
    that half (:func:`_half_in_helper`), taken from it on first use: the first requests
    leave before the helper's rendering of 500,000 facts has been pickled and read back,
    and their answers are printed before any of these texts is. The count is known at
    once. A helper that dies before it sent them is replaced by reading that half
    here (it read without error, so it reads the same facts again)."""

    def __init__(self, count: int, helper: Helper, text: str, mid: int) -> None:
        self._count = count
        self._items = iter(helper)
        self._text = text
        self._mid = mid
        self._texts: list[str] | None = None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if self._texts is None:
            self._texts = self._take()
        return self._texts[index]

    def _take(self) -> list[str]:
        from merklog.engine.factreader import read_fact_lines
        from merklog.node.helperproc import HelperError
        from merklog.store.codec import fact_texts

        try:
            texts = next(self._items)
        except HelperError:
            second = read_fact_lines(self._text[self._mid :])
            if second is None:  # it read as facts in the helper: never seen
                raise RuntimeError("the second half of the input no longer reads") from None
            texts = fact_texts(second[0])
        if len(texts) != self._count:
            raise RuntimeError(f"{len(texts)} facts rendered for {self._count} read")
        return texts


def _read_halves(text: str, helper: Helper) -> tuple[list, list[str], Sequence[str]] | None:
    """What :func:`~merklog.engine.factreader.read_fact_lines` gives for ``text``, read in
    two halves at once (:func:`_start_half_reader`): the first half's facts, the lines of
    all of them, and the second half's facts rendered (:class:`HelperTexts`); None when
    ``text`` is not one fact per line. One fact per line is a property of each line, so
    the whole text has it exactly when both halves do, and their facts and lines follow
    each other. Nothing is sent before both halves have read: a syntax error anywhere
    still writes nothing. A helper that dies is replaced by reading its half here."""
    from merklog.engine.factreader import read_fact_lines
    from merklog.node.helperproc import HelperError
    from merklog.store.codec import fact_texts

    mid = _halfway(text)
    assert mid is not None  # the helper reads from there
    first = read_fact_lines(text[:mid])
    if first is None:  # the helper is closed by the caller, its half unread here
        return None
    rendered: Sequence[str]
    try:
        count = next(iter(helper))
        if count is None:
            return None
        rendered = HelperTexts(count, helper, text, mid)
    except HelperError:
        second = read_fact_lines(text[mid:])
        if second is None:
            return None
        count, rendered = len(second[0]), fact_texts(second[0])
    lines = first[1] + [line for line in text[mid:].split("\n") if line]
    if not len(lines) == len(first[0]) + count == len(first[1]) + len(rendered):
        return None  # never seen: the parser reads the whole text
    return first[0], lines, rendered


def _chunks_from_helper(
    helper: Helper, head: tuple[list, int], gate: CommitGate, total: Callable[[int], None]
) -> Iterator:
    """:func:`_chunks_while_reading`, the rest read and prepared by ``helper``: the first
    chunk from ``head`` (prepared here, its write starts at once), then the helper's. The
    text the helper sends after a chunk is set on that chunk before the next one is
    handed out, which is before :func:`~merklog.node.bulkput.put_chunks` renders it."""
    from merklog.node.bulkput import ReadyChunk

    facts, _end = head
    yield facts
    items = iter(helper)
    rest = next(items)  # raises the rest's syntax error: the held first write rolls back
    gate.open()
    total(len(facts) + rest)
    last = None
    for item in items:
        if isinstance(item, str):  # the text of the chunk before, rendered while it is written
            if last is not None:
                last.text = item
            continue
        last = ReadyChunk.unpack(item)
        yield last


def _write_chunks(
    t: Target,
    parsed: list,
    bulk: tuple | None,
    max_bytes: int,
    retract: bool,
    bar: Any,
    task: Any,
    rendered: Sequence[str],
    text: str = "",
    quiet: bool = False,
) -> list[dict]:
    """Retract on a home opened here, or put and retract through a running node, chunk by
    chunk; prints each chunk's ``CID<TAB>fact`` lines (none when ``quiet``); returns the
    facts not visible.
    ``rendered``: the text of facts that follow ``parsed`` (:func:`_read_halves`);
    ``text``: the whole input."""
    from merklog.node.target import LocalTarget

    if isinstance(t, LocalTarget):
        parts: Iterator = ((c, None, []) for c in chunks(parsed, LOCAL_CHUNK_FACTS, None))
    else:
        lines = bulk[1] if bulk is not None else None
        six = lines is not None and _six_fold(text)
        total = len(parsed) + len(rendered)
        most = CHUNK_FACTS if retract else _request_facts(total, lambda: _home_facts(t))
        parts = _remote_chunks(parsed, lines, max_bytes, rendered, six, most)
    # A running node's put keeps PUT_IN_FLIGHT requests in flight, so the node decodes
    # one body while it writes another and this process renders an answer meanwhile; its
    # retract keeps one (chunks observe each other in order). A retract on a home opened
    # here writes inline.
    writers = 0 if isinstance(t, LocalTarget) else (1 if retract else PUT_IN_FLIGHT)

    def write(chunk: list, lines: list[str] | None, _rendered: list[str]) -> dict:
        # The answer lists CIDs alone, in input order: the facts are rendered here,
        # not by the node and then decoded from its JSON (ADR 0082).
        if lines is not None:  # the input's own lines of these facts
            body = "\n".join(lines) + "\n"
            return t.write("", body, CIDS) if retract else t.write(body, "", CIDS)
        return t.write_facts([], chunk, CIDS) if retract else t.write_facts(chunk, [], CIDS)

    missing: list[dict] = []
    unevaluated = None
    for (chunk, _lines, done), result in pipelined(write, parts, writers):
        unevaluated = result.get("not_evaluated") or unevaluated
        gone = {item["cid"] for item in result.get("not_visible") or []}
        missing.extend(result.get("not_visible") or [])
        if quiet:
            text = ""
        else:
            text = _render(chunk, result["retracted" if retract else "asserted"], gone, done)
        if text:
            click.echo(text)
        bar.advance(task, len(chunk) + len(done))
    if unevaluated:  # stored all the same: a note, not a failure
        click.echo(f"note: {unevaluated}", err=True)
    return missing


def _silent(chunk: list, cids: list) -> str:
    """The text of a chunk under ``--quiet``: none (nothing rendered)."""
    return ""


def _render(
    chunk: list, cids: list, gone: set | frozenset = frozenset(), rendered: list[str] = ()
) -> str:
    """The ``CID<TAB>fact`` lines of a chunk, the facts as given, without those whose CID
    (as text) is in ``gone`` (retracts of facts that were not visible). Rendered in bulk
    (:func:`~merklog.store.codec.fact_texts`, :meth:`~merklog.store.Link.texts`): the
    same text as one ``str`` per CID and fact. ``rendered``: the text of more facts of
    the chunk, after those of ``chunk`` (rendered by a helper, :func:`_read_halves`)."""
    from merklog.store import Link
    from merklog.store.codec import fact_texts

    # CIDs as Links (written here) or as text (a running node's answer).
    texts = Link.texts(cids) if set(map(type, cids)) == {Link} else list(map(str, cids))
    facts = fact_texts(chunk) + list(rendered) if rendered else fact_texts(chunk)
    pairs = zip(texts, facts, strict=True)
    return "\n".join(
        [f"{c}\t{f}" for c, f in pairs if c not in gone] if gone else map("\t".join, pairs)
    )


def pipelined(
    write: Callable[..., dict], parts: Iterator, writers: int
) -> Iterator[tuple[tuple, dict]]:
    """``(part, write(*part))`` for each of ``parts``, in input order, with at most
    ``writers`` writes in flight on worker threads. A part is sent only once the write
    before it returned, and before the caller renders that write's answer: while chunk
    k's CIDs are rendered and printed, chunk k+1 is already being written (SQLite and a
    socket wait release the GIL, so the two share the cores instead of taking turns).

    ``writers=0``: each write runs inline, before its answer is yielded. With one writer
    the writes are exactly as serial as that: nothing after a failed chunk is sent.
    With two, the chunk after a failed one may already be in flight."""
    if writers == 0:
        for part in parts:
            yield part, write(*part)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    todo = iter(parts)
    pending: deque = deque()

    def refill() -> None:
        while len(pending) < writers:
            part = next(todo, None)
            if part is None:
                return
            pending.append((part, pool.submit(write, *part)))

    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="put") as pool:
        try:
            refill()
            while pending:
                part, fut = pending.popleft()
                result = fut.result()
                refill()  # the next write starts before this answer is rendered
                yield part, result
        finally:
            for _part, fut in pending:
                fut.cancel()  # a part still queued is never written


#: Control characters JSON writes as a six-character ``\\u00XX`` escape (tab and carriage
#: return take two; a line holds no line feed).
_SIX_FOLD = bytes(c for c in range(32) if c not in (9, 10, 13))


def _six_fold(text: str) -> bool:
    """Whether ``text`` holds a raw control character that JSON escapes in six bytes (a
    string literal may hold one). One C pass over its UTF-8 bytes, ~0.05 s per 1M facts."""
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw.translate(None, _SIX_FOLD)) != len(raw)


def _wire_sizes(lines: list[str], six_fold: bool) -> Iterable[int]:
    """Each line's size for cutting requests: its length, or, when the input holds raw
    control characters (``six_fold``), the length of its JSON
    escaping (each line's: the rare input that has them pays ~1 µs a line), up to six
    times longer: 1 MB of them made a 6 MB body, and a request of 4 MiB of text a 413
    from a node that takes those facts. Either way a request's UTF-8 JSON body is at
    most four bytes per counted character."""
    if not six_fold:
        return map(len, lines)
    import json

    return (len(json.dumps(line, ensure_ascii=False)) - 2 for line in lines)


def _request_facts(total: int, known: Callable[[], int]) -> int:
    """The facts per request of a put of ``total`` facts through a running node: a
    quarter of them when it is cut in quarters (:func:`_quartered`; ``CHUNK_FACTS`` at
    most), so the node decodes the next request while it writes one from the start
    (ADR 0194)."""
    if _quartered(total, known):
        return min(CHUNK_FACTS, math.ceil(total * HEAD_SHARE))
    return CHUNK_FACTS


def _home_facts(t: Target) -> int:
    """How many facts the target's home holds, which sizes its CID indexes: counted in
    the home opened here (an index count), asked of a running node (its status)."""
    from merklog.node.target import LocalTarget
    from merklog.replication.bulk import fact_count

    if isinstance(t, LocalTarget):
        return fact_count(t.node.replica)
    return int(t.status().get("facts") or 0)


def _remote_chunks(
    parsed: list,
    lines: list[str] | None,
    max_bytes: int,
    rendered: Sequence[str] = (),
    six_fold: bool = False,
    max_facts: int = CHUNK_FACTS,
) -> Iterator:
    """``(facts, lines, rendered)`` per request to a running node, each of at most
    ``max_facts`` facts and ``max_bytes`` bytes: ``lines`` are the
    input's own lines of the request's facts when the input has one fact per line (no
    rendering, no size estimate per fact), else None (each fact is sent as its
    rendering). With ``rendered`` (the text of the facts after ``parsed``, which
    ``lines`` cover too), a request's facts are its part of ``parsed`` and then its
    part of ``rendered``."""
    if lines is None:
        yield from ((c, None, []) for c in chunks(parsed, max_facts, max_bytes))
        return
    known = len(parsed)

    def part(start: int, end: int) -> tuple[list, list[str], list[str]]:
        # A request of first-half facts only takes none of ``rendered`` (the helper's
        # texts are taken when the first request that needs them is cut).
        lo, hi = max(start - known, 0), max(end - known, 0)
        after = list(rendered[lo:hi]) if hi > lo else []
        return parsed[start:end], lines[start:end], after

    start = size = 0
    for i, n in enumerate(_wire_sizes(lines, six_fold)):
        if i > start and (i - start >= max_facts or size + n + 1 > max_bytes):
            yield part(start, i)
            start, size = i, 0
        size += n + 1
    if start < len(lines):
        yield part(start, len(lines))


def register(cli: click.Group) -> None:
    @cli.command("put")
    @click.argument("facts", nargs=-1)
    @FILE
    @QUIET
    @pass_state
    def put(state: State, facts: tuple[str, ...], file: object, quiet: bool) -> None:
        """Assert FACTS such as 'edge(1, 2).'; prints "CID<TAB>fact" for each."""
        _write(state, facts, file, retract=False, quiet=quiet)

    @cli.command("retract")
    @click.argument("facts", nargs=-1)
    @FILE
    @QUIET
    @pass_state
    def retract(state: State, facts: tuple[str, ...], file: object, quiet: bool) -> None:
        """Retract FACTS (every currently visible assertion of each); prints
        "CID<TAB>fact" for each."""
        _write(state, facts, file, retract=True, quiet=quiet)


def _one_file(ctx: click.Context, param: click.Parameter, files: tuple[object, ...]) -> object:
    """The one ``-f FILE`` given (None: none). A second ``-f`` is refused: click kept
    only the last one, so ``put -f A -f B`` silently wrote B alone."""
    if len(files) > 1:
        raise click.BadParameter(
            f"given {len(files)} times: give one file (join several: `cat A B | merklog"
            f" {ctx.info_name} -f -`)",
            ctx=ctx,
            param=param,
        )
    return files[0] if files else None


#: ``-f FILE``: once (:func:`_one_file`).
FILE = click.option(
    "-f",
    "--file",
    type=click.File("r"),
    multiple=True,
    callback=_one_file,
    help="Read facts from a file (- = stdin); give it once.",
)

#: ``-q``: for a bulk load whose CIDs nobody reads (a million lines on a terminal take
#: longer to scroll past than the put takes to write). Errors are still printed, and the
#: exit status is the same.
QUIET = click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print no CID<TAB>fact lines (errors and the exit status are unchanged).",
)
