"""What an epoch leaves for the next one, persisted so a restart resumes it.

One row in the store's SQLite file holds the last committed epoch number, the
digest of the program that ran it, and the ``@next`` tuples it derived (true at
the following epoch) and the ``@async`` tuples already queued while their rule
body keeps holding (so a restart, which re-derives everything, does not send
them again), as one DAG-CBOR value. The node writes it in the same
transaction that acknowledges the epoch's inbox messages and queues its
``@async`` outbox, so after ``kill -9`` the node resumes from exactly one
committed epoch: the stored facts come back from the replica's visible set, the
carry-over from here.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from merklog.engine.rows import RowSet, engine_rows
from merklog.engine.values import row_from_engine, row_to_engine
from merklog.store import Fact, decode, encode

#: An ``@async`` tuple by value identity: its relation and its engine-form row, so
#: ``m(1)``, ``m(1.0)`` and ``m(true)`` are three keys (``Fact`` equality would merge them).
SentKey = tuple[str, tuple]


def sent_key(fact: Fact) -> SentKey:
    """The identity key of an ``@async`` fact (plain or engine-form args alike)."""
    return (fact.rel, row_to_engine(tuple(fact.args)))


SCHEMA = "CREATE TABLE IF NOT EXISTS node_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), data BLOB)"


@dataclass
class EpochState:
    """The last committed epoch, its program digest and its ``@next`` tuples."""

    epoch: int = 0
    program: str = ""
    next: dict[str, set[tuple]] = field(default_factory=dict)
    #: ``@async`` tuples already queued whose body still held: not re-sent after a restart.
    sent: set[SentKey] = field(default_factory=set)
    #: The replica's heads (binary CIDs, sorted) when the epoch is a start that read the
    #: stored facts at them and had no events, so that it is the program over exactly
    #: those heads; None otherwise. A later start at the same heads with the same
    #: program is the same epoch again (ADR 0209).
    heads: list[bytes] | None = None

    def encode(self) -> bytes:
        rels = {rel: sorted([list(r) for r in rows], key=repr) for rel, rows in self.next.items()}
        sent = sorted([[rel, list(row_from_engine(row))] for rel, row in self.sent], key=repr)
        obj = {"epoch": self.epoch, "program": self.program, "next": rels, "sent": sent}
        if self.heads is not None:  # a key merklog before ADR 0209 reads past
            obj["heads"] = list(self.heads)
        return encode(obj)

    @classmethod
    def decode(cls, data: bytes) -> EpochState:
        obj = decode(data)
        # Engine-form sets: @next tuples p(1) and p(true) are two tuples, not one.
        nxt = {
            rel: RowSet(engine_rows(tuple(r) for r in rows)) for rel, rows in obj["next"].items()
        }
        # Same layout as before keys were typed: DAG-CBOR keeps 1, 1.0 and true apart.
        sent = {sent_key(Fact(rel, tuple(args))) for rel, args in obj.get("sent", [])}
        heads = obj.get("heads")
        heads = [bytes(h) for h in heads] if isinstance(heads, list) else None
        return cls(int(obj["epoch"]), str(obj["program"]), nxt, sent, heads)


def ensure(conn: sqlite3.Connection) -> None:
    conn.execute(SCHEMA)


def load(conn: sqlite3.Connection) -> EpochState:
    """The persisted state, or a fresh one (epoch 0, no carry-over)."""
    ensure(conn)
    row = conn.execute("SELECT data FROM node_epoch WHERE id = 1").fetchone()
    return EpochState.decode(bytes(row[0])) if row else EpochState()


def save(conn: sqlite3.Connection, state: EpochState) -> None:
    """Write ``state`` (call inside the epoch's transaction)."""
    conn.execute(
        "INSERT INTO node_epoch (id, data) VALUES (1, ?)"
        " ON CONFLICT(id) DO UPDATE SET data = excluded.data",
        (state.encode(),),
    )
