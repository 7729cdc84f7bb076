"""A sync cancelled while a worker thread reads its spooled response (the node stops, a
sync task is cancelled): the spool is closed only once that thread is done with it."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

import pytest

from merklog.replication.client import _reading


def test_a_cancelled_read_finishes_before_its_spool_is_closed(caplog) -> None:
    """Before, the caller's ``finally`` closed the spool while the thread still read it:
    the thread failed with 'I/O operation on closed file', which asyncio logged as
    'Future exception was never retrieved'."""
    outcome: list[object] = []
    started = threading.Event()

    def read_slowly(spool: tempfile.SpooledTemporaryFile) -> bytes:
        started.set()
        time.sleep(0.3)
        try:
            data = spool.read()
        except ValueError as exc:  # closed under it
            outcome.append(exc)
            raise
        outcome.append(data)
        return data

    async def sync_like() -> None:
        spool = tempfile.SpooledTemporaryFile(max_size=1 << 20)
        spool.write(b"a CAR body")
        spool.seek(0)
        try:
            await _reading(read_slowly, spool)
        finally:
            spool.close()

    async def main() -> None:
        task = asyncio.ensure_future(sync_like())
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # the cancellation still reaches it
            await task

    asyncio.run(main())
    assert outcome == [b"a CAR body"]
    assert "never retrieved" not in caplog.text
