"""Stopping an evaluation between two fixpoint rounds: when another thread asks, or when
it has grown the process past its memory budget.

A recursive stratum can take many rounds (a transitive closure over a long chain, a
recursion that computes values until :data:`~.errors.MAX_FIXPOINT_ITERATIONS`): a node
closing while such an epoch ran waited for it to end, 8-15 s where the Python API
promises about two. The caller runs the evaluation inside :func:`interruptible` with
an event; every evaluator calls :func:`check` once per round, which raises
:class:`~.errors.EvaluationInterrupted` once the event is set. The event is the calling
thread's (evaluations run on the thread that asks for them), so two nodes in one
process do not stop each other's.

The same per-round :func:`check` enforces the memory budget (ADR 0207). A recursion that
derives new values every round (a counter over a cycle, ``d(Y, D + 1) :- d(X, D),
edge(X, Y)``) never ends, and when each round derives many tuples it exhausts memory
long before the round limit: a node grew to 21 GB and stopped answering. At most every
:data:`CHECK_INTERVAL` seconds :func:`check` reads this process's resident memory
(``/proc/self/statm``) and raises :class:`~.errors.EvaluationTooLarge` once it is over
the budget: the one :func:`memory_budget` set on this thread, else the process default
(:func:`default_budget`: ``MERKLOG_EVAL_MEMORY_MB``, else half the machine's physical
memory, or of its cgroup's limit when lower). It also stops before an address-space
limit (``ulimit -v``) would make the next allocation fail with a bare MemoryError.
Where ``/proc`` is missing (not Linux) no budget is enforced.

A query (ADR 0210) has no rounds: its one join can build millions of rows in a few numpy
steps, and decoding, sorting and rendering them take longer than the join. Those steps
call :func:`check` per chunk of rows, and a join calls :func:`allocating` before it
builds its output, which refuses an output that would take the process past its budget
before it is allocated. A query stops for two reasons, its own (its client went away)
and its node's (closing): :func:`interruptible` takes further events with ``also``.
"""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import EvaluationInterrupted, EvaluationTooLarge

_local = threading.local()

#: The environment variable giving the default memory budget, in MiB (0 or unset: half
#: the physical memory). ``merklog eval --memory-mb`` reads it too.
ENV_MEMORY_MB = "MERKLOG_EVAL_MEMORY_MB"
#: Seconds between two reads of the process's memory: a round of a small recursion
#: takes microseconds, a read of /proc tens of them.
CHECK_INTERVAL = 0.01
#: Share of an address-space limit (``ulimit -v``) past which an evaluation stops: the
#: allocations of the next round would fail with MemoryError anywhere in the process.
ADDRESS_SPACE_SHARE = 0.9

_MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_next_read = 0.0


#: Why an evaluation stopped, when its caller does not say.
CLOSING = "its node is closing"


@contextmanager
def interruptible(
    event: threading.Event,
    reason: str = CLOSING,
    *,
    also: tuple[tuple[threading.Event, str], ...] = (),
) -> Iterator[None]:
    """Evaluations run on this thread inside the block stop at their next round (or
    chunk of rows) once ``event`` is set, or one of the events in ``also`` (pairs of an
    event and why it stops the evaluation). The events of an enclosing block no longer
    count inside: an epoch run for a query's first read stops when its node closes, not
    when that query's client goes away."""
    previous = getattr(_local, "stops", ())
    _local.stops = ((event, reason), *also)
    try:
        yield
    finally:
        _local.stops = previous


@contextmanager
def memory_budget(limit: int | None, setting: str) -> Iterator[None]:
    """Evaluations run on this thread inside the block stop once the process's resident
    memory exceeds ``limit`` bytes (None: :func:`default_budget`); ``setting`` is what
    raises it, named by the error (``node.eval_memory_mb``, ``--memory-mb``)."""
    previous = getattr(_local, "budget", None)
    _local.budget = (limit if limit is not None else default_budget()[0], setting)
    try:
        yield
    finally:
        _local.budget = previous


def check(rounds: int = 0, deriving: str = "") -> None:
    """Raise :class:`EvaluationInterrupted` if this thread's evaluation was asked to
    stop (see :func:`interruptible`), :class:`EvaluationTooLarge` if the process has
    grown past its memory budget (see :func:`memory_budget`); cheap enough for every
    round. ``rounds`` run so far and the relations ``deriving`` name the recursion in
    the error."""
    global _next_read
    for event, reason in getattr(_local, "stops", ()):
        if event.is_set():
            raise EvaluationInterrupted(f"the evaluation was stopped: {reason}")
    now = time.monotonic()
    if now < _next_read:
        return
    _next_read = now + CHECK_INTERVAL
    _check_memory(0, rounds, deriving)


def check_reading(name: str) -> None:
    """Raise :class:`EvaluationTooLarge` if this thread's reading of the fact file
    ``name`` has grown the process past its memory budget (see :func:`memory_budget`):
    read in steps, a file that never ends (``/dev/zero``) grew the process until the
    kernel killed it, 22 GB on a 24 GB machine (QA)."""
    sizes = _memory()
    if sizes is None:
        return
    limit, setting = getattr(_local, "budget", None) or default_budget()
    if sizes[0] > limit:
        raise EvaluationTooLarge.reading(limit, sizes[0], setting, name)


#: An allocation at least this large is checked against the budget whenever it is made.
LARGE_ALLOCATION = 64 * _MIB


def allocating(nbytes: int) -> None:
    """:func:`check`, before an evaluation allocates about ``nbytes`` at once (a join's
    output): one that would take the process past its memory budget raises
    :class:`EvaluationTooLarge` before it is made, whenever it comes. A cross product of
    two 20,000-row relations is 6 GB in one numpy step, between two round checks."""
    check()
    if nbytes >= LARGE_ALLOCATION:
        _check_memory(nbytes, 0, "")


def _check_memory(extra: int, rounds: int, deriving: str) -> None:
    """Raise :class:`EvaluationTooLarge` if the process, grown by ``extra`` bytes, is
    past its budget or near its address-space limit."""
    sizes = _memory()
    if sizes is None:
        return
    resident, virtual = sizes[0] + extra, sizes[1] + extra
    budget = getattr(_local, "budget", None) or default_budget()
    limit, setting = budget
    if resident > limit:
        if extra:
            raise EvaluationTooLarge.before_join(limit, resident, setting)
        raise EvaluationTooLarge.over(limit, resident, rounds, deriving, setting)
    space = _address_space()
    if space is not None and virtual > space * ADDRESS_SPACE_SHARE:
        if extra:
            raise EvaluationTooLarge.before_join(
                space, virtual, "ulimit -v", what="address-space limit"
            )
        raise EvaluationTooLarge.over(
            space, virtual, rounds, deriving, "ulimit -v", what="address-space limit"
        )


def _memory() -> tuple[int, int] | None:
    """This process's resident and virtual size in bytes (None where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    return int(fields[1]) * _PAGE, int(fields[0]) * _PAGE


def resident_bytes() -> int | None:
    """This process's resident memory in bytes now (None where /proc is missing)."""
    sizes = _memory()
    return None if sizes is None else sizes[0]


def release_memory() -> None:
    """Give the memory a failed evaluation took back to the system: a full collection
    first (what is left of it in reference cycles, its frames and the errors they
    caught, waits for one, which an idle node may not run for hours), then the C
    library's trim where it has one (glibc's ``malloc_trim``): freed, it stayed resident,
    and counted against the next evaluation's budget. Best effort."""
    global _trim
    gc.collect()
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim: Any = None


def _address_space() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


_default: tuple[int, str] | None = None


def default_budget() -> tuple[int, str]:
    """The memory budget of an evaluation no :func:`memory_budget` covers, in bytes, and
    the setting that gives it: ``MERKLOG_EVAL_MEMORY_MB`` when set to a positive number,
    else half of the memory this process may use (the machine's physical memory, or its
    cgroup's limit when lower). Read once."""
    global _default
    if _default is None:
        text = os.environ.get(ENV_MEMORY_MB, "").strip()
        try:
            mb = float(text) if text else 0.0
        except ValueError:
            mb = 0.0  # the CLI refuses it with a clear line; the library keeps the default
        if mb > 0:
            _default = (int(mb * _MIB), ENV_MEMORY_MB)
        else:
            _default = (available_memory() // 2, ENV_MEMORY_MB)
    return _default


def available_memory() -> int:
    """The memory this process may use at most, in bytes: the machine's physical memory,
    or the memory limit of its cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)
    when that is lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = 8 * 1024 * _MIB
    for limit in _cgroup_limits():
        if 0 < limit < total:
            total = limit
    return total


def _cgroup_limits() -> Iterator[int]:
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            files = [f"/sys/fs/cgroup{path}/memory.max", "/sys/fs/cgroup/memory.max"]
        elif "memory" in controllers.split(","):
            files = [
                f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ]
        else:
            continue
        for name in files:
            try:
                with open(name) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdigit():
                yield int(text)
            break


__all__ = [
    "CLOSING",
    "ENV_MEMORY_MB",
    "allocating",
    "available_memory",
    "check",
    "default_budget",
    "interruptible",
    "memory_budget",
    "release_memory",
    "resident_bytes",
]
