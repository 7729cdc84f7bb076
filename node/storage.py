"""The home's block store and the SQLite connection the node's own tables share with it.

``open_store`` creates the store file owner-only before SQLite opens it (see
:mod:`merklog.node.files`); ``store_conn`` is the connection of the SQLite store (or,
for a memory store, one in-memory SQLite database) that the replica, the ``@async``
outbox/inbox, the epoch state and the stored program all use, so one
``transaction`` commits them together.
"""

from __future__ import annotations

import weakref
from typing import Any

from merklog.store import BlockStore, MemoryBlockStore

from .config import Config
from .errors import NodeInputError
from .files import private_dir, private_file, tighten


def open_store(cfg: Config) -> BlockStore:
    """The configured block store (SQLite file by default; ``ipfs``: blocks on a daemon,
    indexes and replica tables in the local SQLite file)."""
    backend = cfg.get("store.backend")
    if backend == "memory":
        return MemoryBlockStore()
    if backend not in ("sqlite", "ipfs"):
        raise NodeInputError(f"store.backend must be sqlite, ipfs or memory, got {backend!r}")
    path = cfg.path("store.path")
    assert path is not None
    if backend == "ipfs":
        check_store(cfg)  # the daemon answers, before any file is created
    if not path.parent.exists():  # never chmod a directory the user chose and made
        private_dir(path.parent)
    private_file(path)  # SQLite gives -wal and -shm the database file's mode
    for suffix in ("-wal", "-shm"):
        tighten(path.with_name(path.name + suffix))
    if backend == "ipfs":
        from merklog.store.ipfs_home import IPFSHomeStore

        return IPFSHomeStore(
            path, cfg.get("store.ipfs_api"), timeout=cfg.get("store.ipfs_timeout"), check=False
        )
    from merklog.store.sqlite import SQLiteBlockStore

    return SQLiteBlockStore(path)


def check_store(cfg: Config) -> None:
    """Raise StoreError/NodeInputError if the configured store cannot be used (today: an
    IPFS daemon that is unreachable, slow or not an IPFS API); creates nothing."""
    backend = cfg.get("store.backend")
    if backend not in ("sqlite", "ipfs", "memory"):
        raise NodeInputError(f"store.backend must be sqlite, ipfs or memory, got {backend!r}")
    if backend == "ipfs":
        from merklog.store.ipfs import IPFSBlockStore, api_multiaddr

        remote = IPFSBlockStore(
            api_multiaddr(cfg.get("store.ipfs_api")), timeout=cfg.get("store.ipfs_timeout")
        )
        try:
            remote.ping()
        finally:
            remote.close()


#: The SQLite connection made for each store that offers none (memory, IPFS): the
#: replica, the ``@async`` outbox/inbox and the epoch state share it.
_OWN: weakref.WeakKeyDictionary[BlockStore, Any] = weakref.WeakKeyDictionary()


def _conn(store: BlockStore) -> Any:
    """The store's shared SQLite connection (``shared_sqlite()``), or one in-memory SQLite
    database made once for a store that offers none."""
    offer = store.shared_sqlite()
    if offer is not None:
        return offer.conn
    conn = _OWN.get(store)
    if conn is None:
        from merklog.replication.txn import connect

        conn = _OWN[store] = connect(":memory:")
    return conn


def transaction(store: BlockStore) -> Any:
    """One atomic, durable section on the store's SQLite connection (nestable)."""
    from merklog.replication.txn import transaction as _tx

    return _tx(_conn(store), store)


def store_conn(store: BlockStore) -> Any:
    """The SQLite connection node-side tables (epoch state) live in."""
    return _conn(store)
