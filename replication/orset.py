"""The add-wins observed-remove set (OR-set) over the replica's tables (docs/crdt.md).

A fact is visible while some assert of it is not observed by any retract:
``repl_assert.killed`` caches "a retract observes this assert", so the visible set
is ``SELECT DISTINCT fact FROM repl_assert WHERE killed = 0`` (facts named by their
``repl_fact`` id, ADR 0132: a lookup by CID goes through ``repl_fact`` once). Applying an accepted
delta updates that cache and records the net visible changes of the transaction;
subscribers hear them only after it committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter, itemgetter
from typing import Any

from merklog.store import Fact, Link
from merklog.store.sqlrun import run_cte

from . import relindex
from .assertrows import insert_asserts
from .blocks import (
    decode_fact_fast,
    fast_link,
)
from .factset import FactSet
from .sqlutil import chunks as _chunks
from .sqlutil import sorted_blob
from .state import ReplicaState

#: From this many CIDs on, a visibility lookup sends them as one blob (``_LIVE_RUN``).
_BLOB_LOOKUP = 1000
#: The live asserts of a sorted run of CIDs (``?1`` blob length, ``?2`` CID length,
#: ``?3`` ds, ``?4`` the CIDs back to back): the run drives, one key probe per CID.
_LIVE_RUN = run_cte("?1", "?2") + """
SELECT f.cid, a.delta FROM run CROSS JOIN repl_fact AS f CROSS JOIN repl_assert AS a
WHERE f.cid = substr(?4, run.i + 1, ?2) AND a.ds = ?3 AND a.fact = f.id AND a.killed = 0
"""

#: Callback signature for visible-set changes: (+1 | -1, fact, fact CID).
ChangeCallback = Callable[[int, Fact, Link], None]
#: Told many facts that became visible at once (each +1): ``callback(facts)``.
NewFactsCallback = Callable[[list[Fact]], None]


def _raw_of(link: Link) -> bytes:
    return link.raw


_raw_attr = attrgetter("raw")
_row_fact = itemgetter(0)


class ORSet(ReplicaState):
    """The visible set of a replica: reads, subscriptions and the updates of accepted deltas."""

    def visible_cids(self) -> set[Link]:
        return set(map(fast_link, self._visible_raw()))

    def _visible_raw(self) -> list[bytes]:
        """The raw CID bytes of every visible fact, sorted (byte order is Link order)."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT DISTINCT f.cid FROM repl_assert a JOIN repl_fact f ON f.id = a.fact"
                " WHERE a.ds = ? AND a.killed = 0",
                (self.ds,),
            ).fetchall()
        return sorted(bytes(r[0]) for r in rows)

    def visible_among(self, cids: Iterable[Link]) -> set[Link]:
        """Which of these fact CIDs are visible now."""
        with self._lock:
            return set(self._live_asserts_many(cids))

    def visible(self) -> Iterator[tuple[Link, Fact]]:
        """Every visible fact with its CID (sorted by CID).

        A bulk read: the CIDs are sorted as bytes and the blocks fetched in batches
        (``BlockStore.get_many``, one ``IN (...)`` query per few hundred facts on
        SQLite), not one lookup per fact, so opening a home over a million stored
        facts does not pay a SQLite round trip and a generic CID parse per fact."""
        cids = map(fast_link, self._visible_raw())
        for cid, data in self.blockstore.get_many(cids):
            yield cid, decode_fact_fast(data)

    def visible_facts(self) -> FactSet:
        """Every visible fact, keyed by CID (:class:`~.factset.FactSet`): ``p(1)``,
        ``p(1.0)`` and ``p(true)`` stay three facts, as they are three CIDs."""
        return FactSet(self.visible())

    def subscribe(
        self, callback: ChangeCallback, on_new: NewFactsCallback | None = None
    ) -> Callable[[], None]:
        """Call ``callback(+1|-1, fact, cid)`` for every committed visible-set change.
        ``on_new(facts)``: told a bulk local write's new facts in one call instead (each
        +1; one change entry and callback per fact were ~12% of a 1M ``put -f``'s write, ADR 0138)."""
        self._subscribers.append(callback)
        if on_new is not None:
            self._on_new[callback] = on_new

        def unsubscribe() -> None:
            self._subscribers.remove(callback)
            self._on_new.pop(callback, None)

        return unsubscribe

    def _live_asserts(self, fact: Link) -> list[Link]:
        return self._live_asserts_many([fact]).get(fact, [])

    def _live_asserts_many(self, facts: Iterable[Link]) -> dict[Link, list[Link]]:
        """For each of ``facts`` that is visible: its live asserting deltas, sorted."""
        out: dict[Link, list[Link]] = {}
        for fact, delta in self._live_rows(list(map(_raw_attr, facts))):
            out.setdefault(fast_link(bytes(fact)), []).append(fast_link(bytes(delta)))
        for observed in out.values():
            observed.sort()
        return out

    def _visible_raws(self, raws: list[bytes]) -> set[bytes]:
        """Which of these raw fact CIDs are visible: a bulk write's filter, which needs
        neither a Link per fact nor the asserting deltas."""
        return set(map(_row_fact, self._live_rows(raws)))

    def _live_rows(self, raws_in: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """The live ``repl_assert`` rows ``(fact, delta)`` of these raw fact CIDs.

        The CIDs are probed in sorted order (an in-order walk of ``repl_assert``'s key);
        a bulk lookup sends each run of equal-length CIDs as one blob that SQLite cuts
        itself (no bound parameter per CID, ADR 0110)."""
        sizes = set(map(len, raws_in))
        runs: dict[int, set[bytes]] = {}
        if len(sizes) == 1:  # the bulk case: C-level passes, no Python step per CID
            runs[sizes.pop()] = set(raws_in)
        else:
            for raw in raws_in:
                run = runs.get(len(raw))
                if run is None:
                    runs[len(raw)] = {raw}
                else:
                    run.add(raw)
        for size, run in runs.items():
            if len(run) >= _BLOB_LOOKUP and size > 0:
                blob, _count = sorted_blob(list(run), size)  # a set: unique already
                yield from self.conn.execute(_LIVE_RUN, (len(blob), size, self.ds, blob))
            else:
                raws = sorted(run)
                for chunk in _chunks(raws):
                    yield from self.conn.execute(
                        "SELECT f.cid, a.delta FROM repl_fact f CROSS JOIN repl_assert a"
                        f" WHERE f.cid IN ({','.join('?' * len(chunk))})"
                        " AND a.ds = ? AND a.fact = f.id AND a.killed = 0",
                        (*chunk, self.ds),
                    )

    def _apply_asserts(
        self,
        delta: Link,
        asserted: list[Link],
        facts: dict[Link, tuple[bytes, Fact]] | list[tuple[Link, bytes, Fact]],
        visible_at_start: set[Link] | None = None,
    ) -> None:
        """Record ``delta``'s asserts and note the facts they make visible.

        ``visible_at_start`` (a local write, see ``Replica.write_many``; ``facts`` is then
        the ``(CID, block, fact)`` list aligned with ``asserted``): every asserted fact
        outside it was invisible before this delta, so only the ones in it are looked
        up; ``None`` (a replicated delta, ``facts`` by CID): all of them are."""
        if not asserted:
            return
        conn, ds = self.conn, self.ds
        killed = {
            bytes(r[0])
            for r in conn.execute(
                "SELECT fact FROM repl_retract WHERE ds = ? AND observed = ?", (ds, delta.raw)
            )
        }
        live = [f for f in asserted if f.raw not in killed] if killed else asserted
        if visible_at_start is None:
            live = ask = sorted(live, key=_raw_of)  # changes noted in CID order, as before
        else:
            ask = sorted((f for f in live if f in visible_at_start), key=_raw_of)
        visible_before: set[bytes] = set()
        for chunk in _chunks(ask):
            marks = ",".join("?" * len(chunk))
            visible_before.update(
                bytes(r[0])
                for r in conn.execute(
                    f"SELECT f.cid FROM repl_fact f WHERE f.cid IN ({marks})"
                    " AND EXISTS (SELECT 1 FROM repl_assert a"
                    " WHERE a.ds = ? AND a.fact = f.id AND a.killed = 0)",
                    (*[f.raw for f in chunk], ds),
                )
            )
        draw = delta.raw
        if killed:
            rows = [(ds, f.raw, draw, 1 if f.raw in killed else 0) for f in asserted]
        else:
            rows = [(ds, f.raw, draw, 0) for f in asserted]
        deferred = self._deferred
        if deferred is not None and deferred.asserts is not None:
            deferred.asserts.extend(rows)  # inserted once, sorted, when the write ends
        else:
            insert_asserts(conn, rows)  # sorted, one statement per run (ADR 0110)
        # The per-relation index (ADR 0095) is insert-only and nothing in a local write
        # reads it: a local write stores its rows once, sorted, when it ends (ADR 0110).
        if deferred is not None:
            deferred.relations.extend(self._relations_of(asserted, facts))
        else:
            relindex.record(conn, self._relations_of(asserted, facts))
        changes = self._changes
        if isinstance(facts, list):  # local: aligned with asserted
            for f, (_c, _d, fact) in zip(asserted, facts, strict=True):
                if (killed and f.raw in killed) or (visible_before and f.raw in visible_before):
                    continue
                entry = changes.get(f)
                if entry is None:
                    changes[f] = [1, fact]
                else:
                    entry[0] += 1
                    entry[1] = fact
            return
        for f in live:
            if f.raw in visible_before:
                continue
            got = facts.get(f)
            entry = changes.get(f)
            if entry is None:
                changes[f] = [1, got[1] if got else None]
            else:
                entry[0] += 1
                if got:
                    entry[1] = got[1]

    def _relations_of(
        self,
        asserted: list[Link],
        facts: dict[Link, tuple[bytes, Fact]] | list[tuple[Link, bytes, Fact]],
    ) -> list[tuple[int, str, bytes]]:
        """``repl_rel_fact`` rows of ``asserted``: the relation from the fact at hand, or
        from the stored block for a fact the batch did not carry (already stored)."""
        ds = self.ds
        if isinstance(facts, list):
            return [
                (ds, fact.rel, f.raw) for f, (_c, _d, fact) in zip(asserted, facts, strict=True)
            ]
        rows = []
        for f in asserted:
            got = facts.get(f)
            rel = got[1].rel if got is not None else decode_fact_fast(self.blockstore.get(f)).rel
            rows.append((ds, rel, f.raw))
        return rows

    def _apply_retract(self, delta: Link, fact: Link, observed: list[Link]) -> None:
        conn, ds = self.conn, self.ds
        conn.executemany(
            "INSERT OR IGNORE INTO repl_retract VALUES (?, ?, ?, ?)",
            [(ds, fact.raw, obs.raw, delta.raw) for obs in observed],
        )
        killed = 0
        for obs in observed:
            killed += conn.execute(
                "UPDATE repl_assert SET killed = 1 WHERE ds = ?"
                " AND fact = (SELECT id FROM repl_fact WHERE cid = ?) AND delta = ?"
                " AND killed = 0",
                (ds, fact.raw, obs.raw),
            ).rowcount
        if killed:
            still = conn.execute(
                "SELECT 1 FROM repl_assert WHERE ds = ?"
                " AND fact = (SELECT id FROM repl_fact WHERE cid = ?) AND killed = 0 LIMIT 1",
                (ds, fact.raw),
            ).fetchone()
            if still is None:
                self._note(fact, -1, None)

    def _note(self, cid: Link, weight: int, fact: Fact | None) -> None:
        entry = self._changes.get(cid)
        if entry is None:
            self._changes[cid] = [weight, fact]
        else:
            entry[0] += weight
            if fact is not None:
                entry[1] = fact

    def _emit_new(self, cids: list[Link], facts: list[Fact]) -> None:
        """Notify subscribers (after the commit, unlocked) that ``facts`` (``cids``) became
        visible, each once: in one call to a subscriber's ``on_new``, else fact by fact."""
        if not facts:
            return
        for callback in list(self._subscribers):
            on_new = self._on_new.get(callback)
            if on_new is not None:
                on_new(facts)
                continue
            for cid, fact in zip(cids, facts, strict=True):
                callback(1, fact, cid)

    def _emit(self, changes: dict[Link, list[Any]] | None = None) -> None:
        """Notify subscribers of committed net changes (after the lock is released)."""
        if changes is None:
            with self._lock:
                changes, self._changes = self._changes, {}
        if not self._subscribers:
            return
        for cid, (weight, fact) in changes.items():
            if weight == 0:
                continue
            if fact is None:
                fact = decode_fact_fast(self.blockstore.get(cid))
            for callback in list(self._subscribers):
                callback(weight, fact, cid)
