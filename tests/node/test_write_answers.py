"""Answers to writes on a running node: concurrent writes share one delta, each gets its
own facts' CIDs whoever encoded them, and an answer waits for the epoch that evaluates
it and for nothing else: not for another write's transaction (ADR 0145)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from merklog.node import storage
from merklog.node.node import Node
from merklog.store import encode_facts, fact_cid

PROGRAM = "seen(X)@next :- ev(X).\nboth(X) :- ev(X), seen(X).\n"


class Holder:
    """Holds what ``take()`` enters on a thread of its own, the way another write's
    thread holds the store, from :meth:`start` until :meth:`stop`."""

    def __init__(self, take: Callable[[], AbstractContextManager]) -> None:
        self.take = take
        self.taken, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with self.take():
            self.taken.set()
            self.release.wait(60)

    def start(self) -> Holder:
        self.thread.start()
        assert self.taken.wait(10)
        return self

    def stop(self) -> None:
        self.release.set()
        self.thread.join(10)


def test_a_write_is_answered_while_another_transaction_holds_the_store(tmp_path: Path) -> None:
    async def main() -> None:
        async with Node.open(tmp_path / "h", node__epoch_interval=0.05) as node:
            node.load_program(PROGRAM, "p.dl")
            await node.write_async(node.coerce_facts(["ev(0)."]), [])
            await node.settled()
            epoch = node.epoch
            # No epoch runs until the store is held, so the one that evaluates this write
            # meets the store busy when it starts and when it saves its state.
            no_epoch = Holder(lambda: node.epochs.mutex).start()
            busy = None
            try:
                result = await node.write_async(node.coerce_facts(["ev(1).", "ev(1.0)."]), [])
                assert len(result.asserted) == 2
                busy = Holder(lambda: storage.transaction(node.store)).start()
                no_epoch.stop()
                await asyncio.wait_for(node.settled(), 5)  # before: until the store was free
                assert node.epoch > epoch
                assert busy.thread.is_alive()  # the store is still held
            finally:
                no_epoch.stop()
                if busy is not None:
                    busy.stop()
            # The store is free again: the epoch saved its state, queries answer.
            await node.settled()
            assert sorted(node.query("ev(X)").rows, key=repr) == [(0,), (1,), (1.0,)]
            # ev(1) and ev(1.0) were seen from the epoch after theirs: two more rows.
            for _ in range(100):
                if len(node.query("both(X)").rows) == 3:
                    break
                await asyncio.sleep(0.05)
            assert sorted(node.query("both(X)").rows, key=repr) == [(0,), (1,), (1.0,)]

    asyncio.run(main())


def test_concurrent_writes_share_a_delta_and_each_gets_its_own_cids(tmp_path: Path) -> None:
    """Requests encode their asserts on their own threads (``POST /v1/facts``); the Python
    API's ``write_async`` need not. Queued together they make one write."""
    texts = [["v(1).", 'v("1").'], ["v(1.0).", "v(true)."], ['v(x"01").', "v(1)."]]

    async def main() -> None:
        async with Node.open(tmp_path / "h") as node:
            batches = [node.coerce_facts(t) for t in texts]
            results = await asyncio.gather(
                node.write_async(batches[0], [], encode_facts(batches[0])),
                node.write_async(batches[1], []),  # not encoded by the caller
                node.write_async(batches[2], [], encode_facts(batches[2])),
            )
            for facts, result in zip(batches, results, strict=True):
                assert [c for c, _f in result.asserted] == [fact_cid(f) for f in facts]
                assert [f for _c, f in result.asserted] == facts
            assert len({r.delta for r in results}) == 1  # one delta for the three
            await node.settled()
            rows = node.query("v(X)").rows
            assert sorted(map(repr, rows)) == sorted(
                map(repr, [(1,), ("1",), (1.0,), (True,), (b"\x01",)])
            )

    asyncio.run(main())


def test_a_queued_retract_observes_an_assert_queued_before_it(tmp_path: Path) -> None:
    """Requests queued together share a delta until one retracts a fact that an earlier
    one asserts: a retract in the same delta would not observe that assert, so the batch
    is cut there and the retract, in the next delta, removes it."""

    async def main() -> None:
        async with Node.open(tmp_path / "h") as node:
            [old] = node.coerce_facts(["v(2)."])
            await node.write_async([old], [])
            adds = node.coerce_facts(["v(1).", 'v("1").'])
            unrelated = node.coerce_facts(["v(2)."])  # visible before: no conflict
            conflicting = node.coerce_facts(["v(1)."])
            results = await asyncio.gather(
                node.write_async(adds, []),
                node.write_async([], unrelated),
                node.write_async([], conflicting),
            )
            assert results[0].delta == results[1].delta
            assert results[2].delta != results[0].delta
            assert [f for _c, f in results[2].retracted] == conflicting
            await node.settled()
            assert [repr(r) for r in node.query("v(X)").rows] == [repr(("1",))]

    asyncio.run(main())


def test_a_request_no_receiver_takes_fails_alone_not_the_requests_queued_with_it(
    tmp_path: Path,
) -> None:
    """Three requests queued together share one write; the second holds a fact over the
    1 MiB limit every peer keeps. That request alone is refused (TooLarge, the HTTP
    API's 400): the two others, of mixed-type values, are written, each with its own
    CIDs, and their facts are visible. The same misfit queued alone is refused alike."""
    from merklog.replication.errors import TooLarge

    async def main() -> None:
        async with Node.open(tmp_path / "h") as node:
            good = [node.coerce_facts(["v(1).", 'v("1").']), node.coerce_facts(["v(1.0)."])]
            huge = node.coerce_facts(['blob("' + "x" * (1 << 20) + '").'])
            results = await asyncio.gather(
                node.write_async(good[0], [], encode_facts(good[0])),
                node.write_async(huge, [], encode_facts(huge)),
                node.write_async(good[1], []),  # not encoded by the caller
                return_exceptions=True,
            )
            assert isinstance(results[1], TooLarge), results[1]
            assert "over the 1048576-byte limit" in str(results[1])
            for facts, result in zip(good, (results[0], results[2]), strict=True):
                assert not isinstance(result, BaseException), result
                assert [c for c, _f in result.asserted] == [fact_cid(f) for f in facts]
            alone = await asyncio.gather(node.write_async(huge, []), return_exceptions=True)
            assert isinstance(alone[0], TooLarge)
            await node.settled()
            rows = node.query("v(X)").rows
            assert sorted(map(repr, rows)) == sorted(map(repr, [(1,), ("1",), (1.0,)]))
            assert node.status()["facts"] == 3  # no blob fact

    asyncio.run(main())
