"""The state every part of a replica works on, declared once.

:class:`~merklog.replication.replica.Replica` is assembled from three parts
(acceptance, the OR-set, reconciliation), each a mixin over the same attributes;
this base class declares those attributes so each part type-checks against one
definition. :meth:`Replica.open <merklog.replication.replica.Replica.open>` sets them.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from merklog.store import BlockStore, Link

from .blocks import Genesis
from .identity import Identity


class ReplicaState:
    """Attributes shared by the replica's parts (set by ``Replica.open``)."""

    conn: sqlite3.Connection
    blockstore: BlockStore
    identity: Identity
    genesis: Genesis
    dataset: Link
    ds: int
    _lock: Any
    _subscribers: list[Any]
    _on_new: dict[Any, Any]
    _changes: dict[Link, list[Any]]
    #: During a local bulk write (``Replica.write_many``): the fact/delta blocks and the
    #: ``repl_assert`` rows of its deltas, inserted once, sorted, when the call ends.
    _deferred: Any
