"""Reads answer the last completed epoch while the next one evaluates (ADR 0205).

``node.query()`` and ``node.status()`` took the epoch mutex, which an epoch holds while
it evaluates: in ``async with``, a one-row query waited 13 s for an epoch (and froze
the event loop meanwhile), and so did a query or status during a program load. Here an
evaluation is held in the middle of its recursion, from inside the engine's round
check, until the test lets it go; every read must return while it is still held, and
answer the epoch before it, whole.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import merklog
from merklog.engine import interrupt
from merklog.node.failures import UnknownRelation

CLOSURE = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\n"
CHAIN = [("e", (i, i + 1)) for i in range(30)]
#: Seconds an evaluation is held at most: only a read that waits for it takes that long.
HOLD = 30.0


class Hold:
    """Holds the next evaluation on a thread other than the test's at its ``at``-th
    fixpoint round after :meth:`arm` (its recursion half done) until :attr:`release` is
    set, or :data:`HOLD` seconds have passed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.evaluating = threading.Event()  # an evaluation is held
        self.waiting = threading.Event()  # ... and still is
        self.release = threading.Event()
        self._rounds: int | None = None
        real = interrupt.check

        def check(*args: object, **kwargs: object) -> None:  # the evaluators' arguments
            if (
                self._rounds is not None
                and threading.current_thread() is not threading.main_thread()
            ):
                self._rounds -= 1
                if not self._rounds:
                    self._rounds = None
                    self.waiting.set()
                    self.evaluating.set()
                    self.release.wait(HOLD)
                    self.waiting.clear()
            real(*args, **kwargs)

        monkeypatch.setattr(interrupt, "check", check)

    def arm(self, at: int = 2) -> None:
        self._rounds = at


def test_queries_and_status_answer_the_last_epoch_while_the_next_one_evaluates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In ``async with``: a write's epoch is held mid-recursion; a query, a query of a
    relation whose first fact that epoch takes, ``relation`` and ``status`` answer at
    once, on the event loop, with the epoch before and its numbers; the live query
    started before gets the epoch's change once it is released."""
    hold = Hold(monkeypatch)

    async def main() -> dict:
        # No idle epochs: the only one after the write is the write's.
        settings = {"node.epoch_interval": 3600.0}
        async with merklog.open(memory=True, settings=settings) as node:
            node.load_program(CLOSURE, "closure.dl")
            node.write(asserts=CHAIN)
            await node.settled()
            seen: list = []
            node.subscribe("p(0, X)", lambda *event: seen.append(event))
            out = {"before": node.query("p(0, X)"), "status_before": node.status()}
            hold.arm()
            node.write(asserts=[("e", (30, 31)), ("fresh", (1,))])
            assert await asyncio.to_thread(hold.evaluating.wait, HOLD)
            out["during"] = node.query("p(0, X)")
            out["fresh"] = node.query("fresh(X)")
            out["relation"] = node.relation("p")
            out["status"] = node.status()
            out["held"] = hold.waiting.is_set()  # still evaluating when the reads returned
            hold.release.set()
            await node.settled()
            out["after"] = node.query("p(0, X)")
            out["fresh_after"] = node.query("fresh(X)")
            out["seen"] = seen
            return out

    out = asyncio.run(main())
    assert out["held"], "the reads waited for the epoch that was evaluating"
    before, during, after = out["before"], out["during"], out["after"]
    assert before.rows == [(x,) for x in range(1, 31)]
    assert (during.rows, during.epoch) == (before.rows, before.epoch)
    assert (out["fresh"].rows, out["fresh"].epoch) == ([], before.epoch)  # known, no rows yet
    assert len(out["relation"]) == 30 * 31 // 2
    status, status_before = out["status"], out["status_before"]
    for field in ("epoch", "facts", "derived", "program", "engine"):
        assert status[field] == status_before[field], field
    assert (status["epoch"], status["facts"]) == (before.epoch, 30)
    assert (after.rows, after.epoch) == (before.rows + [(31,)], before.epoch + 1)
    assert out["fresh_after"].rows == [(1,)]
    assert out["seen"] == [("result", before.rows, []), ("delta", [(31,)], [])]


def test_a_query_during_a_program_load_answers_the_program_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load holds the epoch mutex while its first epoch evaluates the new program over
    every stored fact; a query on another thread meanwhile answers the program before
    (a relation only the new program has is not known yet), then the new one."""
    hold = Hold(monkeypatch)
    with merklog.open(memory=True) as node:
        node.load_program(CLOSURE, "closure.dl")
        node.write(asserts=CHAIN)
        before = node.query("p(0, X)")
        hold.arm()
        loader = threading.Thread(
            target=node.load_program, args=(CLOSURE + "q(X) :- p(0, X), X > 20.\n", "q.dl")
        )
        loader.start()
        try:
            assert hold.evaluating.wait(HOLD)
            during = node.query("p(0, X)")
            status = node.status()
            try:
                node.query("q(X)")
            except UnknownRelation:
                new_known = False
            else:
                new_known = True
            held = hold.waiting.is_set()
        finally:
            hold.release.set()
            loader.join(HOLD)
        assert held, "the query waited for the load"
        assert not new_known, "a relation of the program being loaded was known"
        assert (during.rows, during.epoch) == (before.rows, before.epoch)
        assert status["epoch"] == before.epoch
        after = node.query("q(X)")
        assert (after.rows, after.epoch) == ([(x,) for x in range(21, 31)], before.epoch + 1)


def test_a_live_query_stops_at_once_while_an_epoch_evaluates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``unsubscribe`` (which the SSE handler calls on the event loop when its client goes)
    returns while an epoch is held mid-recursion, and that epoch delivers nothing to the
    live query it dropped; one still subscribed gets the epoch's change. It waited for
    the epoch mutex, so a client that went away froze every request until the epoch
    ended."""
    hold = Hold(monkeypatch)

    async def main() -> dict:
        async with merklog.open(memory=True, settings={"node.epoch_interval": 3600.0}) as node:
            node.load_program(CLOSURE, "closure.dl")
            node.write(asserts=CHAIN)
            await node.settled()
            dropped: list = []
            kept: list = []
            sub = node.subscribe("p(0, X)", lambda *event: dropped.append(event))
            node.subscribe("p(0, X)", lambda *event: kept.append(event))
            hold.arm()
            node.write(asserts=[("e", (30, 31))])
            assert await asyncio.to_thread(hold.evaluating.wait, HOLD)
            node.unsubscribe(sub)
            held = hold.waiting.is_set()  # the epoch was still evaluating when it returned
            gauge = b"merklog_subscribers 1.0" in node.metrics.render()
            hold.release.set()
            await node.settled()
            return {"held": held, "dropped": dropped, "kept": kept, "gauge": gauge}

    out = asyncio.run(main())
    assert out["held"], "unsubscribe waited for the epoch that was evaluating"
    initial = ("result", [(x,) for x in range(1, 31)], [])
    assert out["dropped"] == [initial]
    assert out["kept"] == [initial, ("delta", [(31,)], [])]
    assert out["gauge"], "merklog_subscribers still counts the live query that stopped"
