"""Queries are bounded like epochs (ADR 0210): a query stops when its caller goes away or
its node closes, and fails at the node's memory budget (``node.eval_memory_mb``).

A query's evaluation is one join, not a recursion, but one join of two relations of a
few thousand facts is millions of rows: on a node of 2,000 facts ``n(X), n(Y)`` ran for
~60 s after its HTTP client had left and grew the node to 1.5 GB. :func:`bounded_call`
runs a query under the engine's interrupt checks (:mod:`merklog.engine.interrupt`) with
the node's memory budget; the steps after the join (decoding, sorting, rendering the
rows) check too, per chunk of :data:`CHUNK` rows (:func:`plain_sorted`,
:func:`render_json`). A query over the budget raises :class:`QueryTooLarge` once what
it took is freed and given back to the system, as an epoch over it does (ADR 0207).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from operator import itemgetter
from typing import Any, TypeVar

from merklog.engine import interrupt
from merklog.engine.arith import sort_key
from merklog.engine.errors import EvaluationInterrupted, EvaluationTooLarge
from merklog.engine.values import row_from_engine

from .failures import ExitCode, Failure
from .programs import MEMORY_SETTING, memory_limit

T = TypeVar("T")

#: Rows converted, sorted or rendered between two interrupt checks.
CHUNK = 1 << 16
#: Why a query stopped, as counted in ``merklog_queries_stopped_total{reason}``.
CLIENT_GONE = "client gone"
TOO_LARGE = "too large"
CLOSING = "node closing"
_NARROW = (
    "narrow the query (bind a variable to a constant, e.g. n(1, Y), or join its atoms"
    " on a common variable), or raise node.eval_memory_mb"
)


class QueryTooLarge(Failure):
    """A query whose evaluation or answer would take the process past its memory budget
    (``node.eval_memory_mb``): refused, and what it took given back. Over HTTP a 422
    ``query too large``; the CLI's exit 2 (over a limit)."""

    exit_code = ExitCode.BAD_INPUT
    http_status = 422

    @classmethod
    def of(cls, exc: EvaluationTooLarge | MemoryError) -> QueryTooLarge:
        """The error of a query stopped by ``exc`` (the budget check, or an allocation
        the process could not make)."""
        mib = 1024 * 1024
        if isinstance(exc, EvaluationTooLarge) and exc.limit:
            what = "address-space limit" if exc.setting == "ulimit -v" else "memory budget"
            grown = (
                f"answering it would grow this process to {-(-exc.size // mib):,} MB, past its"
                f" {what} of {exc.limit // mib:,} MB ({exc.setting})"
            )
        else:
            grown = "the process could not allocate what answering it takes"
        return cls(f"the query is too large: {grown}; {_NARROW}")


def bounded_call(
    node: Any,
    fn: Callable[..., T],
    *args: Any,
    stop: threading.Event | None = None,
) -> T:
    """``fn(*args)`` (a query and what renders its answer) on this thread, stopped at its
    next check once ``node`` closes or ``stop`` is set (its caller went away:
    :class:`~merklog.engine.errors.EvaluationInterrupted`), and under the node's memory
    budget (:class:`QueryTooLarge` past it). When it stops, its memory is freed before
    the error is raised: a full collection for what its frames left in cycles, and the
    C heap trimmed (:func:`~merklog.engine.interrupt.release_memory`), or the node kept
    1 GB of a 1.5 GB query for good. The stop is counted by reason."""
    stops: tuple[tuple[threading.Event, str], ...] = ()
    if stop is not None:
        stops = ((stop, "its client went away"),)
    failed: BaseException
    reason: str
    with ExitStack() as stack:
        stack.enter_context(
            interrupt.interruptible(node.epochs.stopping, interrupt.CLOSING, also=stops)
        )
        budget = memory_limit(node.config)  # the epochs' (ADR 0207)
        stack.enter_context(interrupt.memory_budget(budget, MEMORY_SETTING))
        try:
            return fn(*args)
        except (EvaluationTooLarge, MemoryError) as exc:
            failed, reason = QueryTooLarge.of(exc), TOO_LARGE
        except EvaluationInterrupted as exc:
            failed = exc
            reason = CLIENT_GONE if stop is not None and stop.is_set() else CLOSING
    failed.__traceback__ = None  # the query's frames go now
    del fn, args
    interrupt.release_memory()
    node.metrics.queries_stopped.labels(reason).inc()
    raise failed


def plain_sorted(rows: Iterable[tuple]) -> list[tuple]:
    """Distinct engine-form ``rows`` as plain values, in the answer's order (that of
    :func:`merklog.engine.batch.sort_rows`), with an interrupt check every :data:`CHUNK`
    rows. Sorted in runs of :data:`CHUNK` rows, merged pairwise: the order and its cost
    are those of one sort, but no step runs for longer than merging two runs; sorting
    four million rows in one call took half a minute, deaf to the query's client
    leaving. Rows whose every column holds one type of int, str or bytes are their own
    sort keys (their order is the keys' order), the common case, sorted without keys."""
    rows = list(rows)
    natural = _naturally_ordered(rows)
    runs: list[list[Any]] = []
    for start in range(0, len(rows), CHUNK):
        interrupt.check()
        part = rows[start : start + CHUNK]
        if natural:
            part.sort()
        else:
            part = [(tuple(map(sort_key, row)), row_from_engine(row)) for row in part]
            part.sort(key=_KEY)
        runs.append(part)
    del rows
    while len(runs) > 1:
        merged = []
        for i in range(0, len(runs), 2):
            interrupt.check()
            if i + 1 == len(runs):
                merged.append(runs[i])
                continue
            pair = runs[i] + runs[i + 1]
            runs[i] = runs[i + 1] = []
            pair.sort(key=None if natural else _KEY)  # two sorted runs: one merge
            merged.append(pair)
        runs = merged
    if not runs:
        return []
    return runs[0] if natural else [row for _key, row in runs[0]]


_KEY = itemgetter(0)
#: Types whose values order as their sort keys do (:func:`~merklog.engine.arith.sort_key`)
#: and that are plain values in engine form too.
_NATURAL = frozenset((int, str, bytes))


def _naturally_ordered(rows: list[tuple]) -> bool:
    """Whether ``rows`` (of one length) hold one type of :data:`_NATURAL` per column."""
    if not rows:
        return True
    width = len(rows[0])
    seen: list[set[type]] = [set() for _ in range(width)]
    for start in range(0, len(rows), CHUNK):
        interrupt.check()
        part = rows[start : start + CHUNK]
        if any(len(row) != width for row in part):
            return False
        for j, types in enumerate(seen):
            types.update(map(type, map(itemgetter(j), part)))
            if len(types) > 1 or not types <= _NATURAL:
                return False
    return True


def render_json(columns: list[str], rows: list[tuple], epoch: int, cell: Callable) -> str:
    """``{"columns", "rows", "epoch"}`` as JSON text, rendered :data:`CHUNK` rows at a
    time with an interrupt check between (``cell`` renders one value as JSON data)."""
    parts = [f'{{"columns": {json.dumps(columns)}, "rows": [']
    for start in range(0, len(rows), CHUNK):
        interrupt.check()
        part = json.dumps([[cell(v) for v in r] for r in rows[start : start + CHUNK]])
        parts.append(("" if start == 0 else ", ") + part[1:-1])
    parts.append(f'], "epoch": {json.dumps(epoch)}}}')
    return "".join(parts)
