"""``put`` on a stopped home across two processes (ADR 0138).

The writing process is the bottleneck of a large ``put -f``: SQLite's inserts and the
replica's bookkeeping hold the GIL, so a writer thread gains nothing (ADR 0119). After
the whole input is parsed, a forked child (it inherits the parsed facts copy-on-write,
nothing is pickled) does the rest of the per-fact work that needs no store:

- it checks and encodes chunk k+1 (``check_facts``, then ``encode_facts``: blocks and
  CIDs) and sends it packed, three buffers per chunk, through a pipe, while the parent
  writes chunk k;
- it renders chunk k's ``CID<TAB>fact`` lines meanwhile and prints them once the parent
  says chunk k is committed, so every printed CID is durable and the output is in input
  order, byte-identical to the one-process path.

The parent trusts the child's blocks (the same program, forked from it) and re-encodes
nothing; it still checks declarations and every writer-side limit on the write. If the
child cannot check a chunk, the parent writes that chunk and the rest itself, so the
error is exactly the one-process path's. The child ignores SIGINT and ends when either
pipe closes (the parent stopped, failed or was killed), so no child outlives the command.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

from merklog.store import Fact, Link, check_facts, encode_facts

from .failures import Failure

#: Chunk header: status, facts, block bytes.
_HEAD = struct.Struct("<BQQ")
_OK, _UNCHECKED, _CHECKED_AS_IS = 0, 1, 2
_CID_BYTES = 36


class EncoderDied(Failure):
    """The forked encoding process ended before the write did."""


def _read_exact(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``, or None at end of file before them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return buf


def _write_all(fd: int, *parts: bytes | bytearray | memoryview) -> None:
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


def _pack(chunk: list[Fact]) -> tuple[int, list[Link], list[bytes]]:
    """Check and encode ``chunk``: (status, CIDs, blocks). Status says whether
    ``check_facts`` returned the chunk itself (the parent may skip its own check)."""
    checked = check_facts(chunk)
    encoded = encode_facts(checked)
    status = _CHECKED_AS_IS if checked is chunk else _OK
    return status, [c for c, _d in encoded], [d for _c, d in encoded]


def _child(parts: Sequence[list[Fact]], data_w: int, ack_r: int) -> None:
    """The child's loop: send chunk k encoded, print chunk k-1 once it is committed,
    render chunk k. Ends quietly when the parent closes either pipe."""
    import click

    previous: str | None = None
    for chunk in parts:
        try:
            status, cids, blocks = _pack(chunk)
        except Exception:  # the parent's own check says why, in input order
            _write_all(data_w, _HEAD.pack(_UNCHECKED, len(chunk), 0))
            status = _UNCHECKED
        else:
            import numpy as np

            sizes = struct.pack(f"<{len(blocks)}I", *map(len, blocks))
            raw = b"".join(c.raw for c in cids)
            # The CID order the store inserts in, so the writer sorts nothing.
            order = np.argsort(np.frombuffer(raw, dtype=f"S{_CID_BYTES}"), kind="stable")
            body = b"".join(blocks)
            _write_all(
                data_w,
                _HEAD.pack(status, len(chunk), len(body)),
                raw,
                sizes,
                order.astype("<u4").tobytes(),
                body,
            )
        if previous is not None:
            if not os.read(ack_r, 1):
                return  # the parent stopped before committing chunk k-1
            click.echo(previous)
        if status == _UNCHECKED:
            return
        previous = "\n".join([f"{c}\t{f}" for c, f in zip(cids, chunk, strict=True)])
    if previous is not None and os.read(ack_r, 1):
        click.echo(previous)


def _unpack(fd: int) -> tuple[int, list[Link], list[bytes], list[int]] | None:
    """One chunk from the child: (status, CIDs, blocks, their CID order); None if the
    child is gone."""
    import numpy as np

    head = _read_exact(fd, _HEAD.size)
    if head is None:
        return None
    status, n, size = _HEAD.unpack(head)
    if status == _UNCHECKED:
        return status, [], [], []
    buf = _read_exact(fd, n * (_CID_BYTES + 8) + size)
    if buf is None:
        return None
    raws = np.frombuffer(buf, dtype=f"V{_CID_BYTES}", count=n).tolist()
    ends = np.cumsum(np.frombuffer(buf, dtype="<u4", count=n, offset=n * _CID_BYTES))
    positions = np.frombuffer(buf, dtype="<u4", count=n, offset=n * (_CID_BYTES + 4))
    if n and (int(positions.max()) >= n or int(np.bincount(positions).max()) != 1):
        raise EncoderDied("the encoding process sent a chunk whose order is no permutation")
    order = positions.tolist()
    body = bytes(memoryview(buf)[n * (_CID_BYTES + 8) :])
    starts = [0, *ends[:-1].tolist()]
    blocks = [body[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]
    return status, list(map(Link._trusted, raws)), blocks, order


def put_forked(
    parts: list[list[Fact]],
    write: Callable[[list[Fact], list[Link], list[bytes], list[int], bool], Any],
    done: Callable[[list[Fact]], None],
    serial: Callable[[list[Fact]], None],
) -> None:
    """Write ``parts`` (chunks of parsed facts) in order with a forked encoder/printer.

    ``write(chunk, cids, blocks, order, valid)`` writes one chunk durably (``cids``,
    ``blocks``: its encoding; ``order``: the positions of ``cids`` in CID order; ``valid``: ``check_facts`` returned the chunk itself);
    ``done(chunk)`` is called after each chunk the child prints; ``serial(chunk)``
    writes and prints a chunk in this process (after the child could not check one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    data_r, data_w = os.pipe()
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never touches the store
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.close(data_r)
            os.close(ack_w)
            _child(parts, data_w, ack_r)
            sys.stdout.flush()
        except BaseException:  # a closed pipe: the parent stopped and reports why
            code = 1
        os._exit(code)
    os.close(data_w)
    os.close(ack_r)
    reaped = False
    k = 0
    try:
        for k, chunk in enumerate(parts):
            got = _unpack(data_r)
            if got is None:
                raise EncoderDied(_died(pid, k, len(parts)))
            status, cids, blocks, order = got
            if status == _UNCHECKED:
                _close(data_r, ack_w)
                data_r = ack_w = -1
                _reap(pid)  # it printed every chunk before this one
                reaped = True
                for rest in parts[k:]:
                    serial(rest)
                return
            write(chunk, cids, blocks, order, status == _CHECKED_AS_IS)
            _write_all(ack_w, b"\x01")
            done(chunk)
        _close(ack_w)
        ack_w = -1
        status_code = _reap(pid)
        reaped = True
        if status_code != 0:
            raise EncoderDied(_died(pid, len(parts), len(parts), status_code))
    except BrokenPipeError:
        raise EncoderDied(_died(pid, k + 1, len(parts))) from None
    finally:
        _close(data_r, ack_w)
        if not reaped:
            _reap(pid)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _reap(pid: int) -> int:
    """Wait for the child; its wait status (0: it printed everything and ended)."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _died(pid: int, k: int, total: int, status: int | None = None) -> str:
    """The error line for a child that ended early."""
    if status is None:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            got, status = pid, 0
        if got == 0:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
    how = (
        f"killed by signal {os.WTERMSIG(status)}"
        if os.WIFSIGNALED(status)
        else f"exit status {os.WEXITSTATUS(status)}"
    )
    return (
        f"the encoding process ended ({how}); chunks written: {k} of {total} "
        "(each written chunk's printed CIDs are durable, the rest of the input is not written)"
    )
