"""A full disk for merklog subprocesses of the tests (a real one needs root: a small
tmpfs). Put this directory first on ``PYTHONPATH`` and set:

- ``MERKLOG_TEST_FULL_FLAG=PATH``: while the file PATH exists the disk is full: every
  write of blocks and every epoch's commit fails as SQLite fails it on a full disk
  (``database or disk is full``). The test creates the file to fill the disk and removes
  it to free space, while the process runs.
- ``MERKLOG_TEST_FULL_FIRST=SECONDS``: the process's first write of several blocks (a
  request's facts, not the single blocks a node writes as it starts) fails the
  same way after SECONDS in SQLite (the disk fills while it is written; its rollback
  frees the space, so the writes after it work).
- ``MERKLOG_TEST_FULL_LOG=PATH``: each failure injected by ``MERKLOG_TEST_FULL_FIRST`` is
  logged to PATH with the stack that met it, so a test can say which write took it.
- ``MERKLOG_TEST_STATVFS_FULL=1``: ``os.statvfs`` reports no free space (what a full
  disk shows besides its failing writes).

Only the fault is mocked: everything else (the node, the CLI, SQLite) is real.
"""

import os

_FLAG = os.environ.get("MERKLOG_TEST_FULL_FLAG")
_FIRST = os.environ.get("MERKLOG_TEST_FULL_FIRST")
_LOG = os.environ.get("MERKLOG_TEST_FULL_LOG")

if os.environ.get("MERKLOG_TEST_STATVFS_FULL"):
    _statvfs = os.statvfs

    def _full_statvfs(path):  # noqa: ANN001, ANN202 - os.statvfs's signature
        real = _statvfs(path)
        fields = list(real)
        fields[3] = fields[4] = 0  # f_bfree, f_bavail
        return os.statvfs_result(fields)

    os.statvfs = _full_statvfs

if _FLAG or _FIRST:
    import sqlite3
    import threading
    import time

    from merklog.node import epochstate
    from merklog.store.sqlite import SQLiteBlockStore

    _first = threading.Lock()  # held once the first write has failed

    def _full(blocks: list) -> bool:
        if _FLAG and os.path.exists(_FLAG):
            return True
        if _FIRST and len(blocks) > 1 and _first.acquire(blocking=False):
            if _LOG:
                import traceback

                with open(_LOG, "a") as log:
                    log.write(f"pid {os.getpid()}, {len(blocks)} blocks:\n")
                    log.write("".join(traceback.format_stack()[:-1]))
            time.sleep(float(_FIRST))
            return True
        return False

    def _failing(method):  # noqa: ANN001, ANN202 - wraps a store method
        def put(self, blocks):  # noqa: ANN001, ANN202
            blocks = list(blocks)
            if _full(blocks):
                raise sqlite3.OperationalError("database or disk is full")
            return method(self, blocks)

        return put

    SQLiteBlockStore.put_many = _failing(SQLiteBlockStore.put_many)
    SQLiteBlockStore.put_encoded = _failing(SQLiteBlockStore.put_encoded)
    _save = epochstate.save

    def _save_epoch(conn, state):  # noqa: ANN001, ANN202
        if _FLAG and os.path.exists(_FLAG):
            raise sqlite3.OperationalError("database or disk is full")
        return _save(conn, state)

    epochstate.save = _save_epoch
