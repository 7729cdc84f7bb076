"""A worker process of a replica export: ``python -m merklog.node.spark.exportshare``.

:func:`merklog.node.spark.export.export_replica` starts one per share of the fact CID
range but its own (ADR 0191). The request arrives as one JSON object, its argument (the
store file, the dataset, the staging folders, the partition count, the share). The
worker reads its share's fact blocks and visible CIDs, then waits for a line on stdin:
the exporting process has read every delta once and written this share's ops to the
request's ``log`` file. The answer leaves pickled on stdout: ``("done", ShareResult fields)`` or ``("raised",
exception)``, an exception that does not pickle as a :class:`~merklog.store.StoreError`
with its message. The worker only reads the store (on its own SQLite connection: WAL
readers do not block each other) and writes its own part files.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

from merklog.replication.blocks import parse_genesis
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import Link, StoreError
from merklog.store.sqlite import SQLiteBlockStore

from .export import ShareLog, StageProgress, export_share, share_at, share_log_from_file


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Export the share ``request`` names; its :class:`~.export.ShareResult` as a dict."""
    store = SQLiteBlockStore(request["store"])
    try:
        dataset = Link.parse(request["dataset"])
        genesis = parse_genesis(dataset, store.get(dataset))
        # a replica needs an identity only to sign writes: this one only reads
        shared = store.shared_sqlite()
        replica = Replica(shared.conn, store, Identity.generate(), genesis)
        bounds = tuple(bytes.fromhex(b) for b in request["bounds"])
        w, k, tmp = int(request["worker"]), int(request["k"]), Path(request["tmp"])
        share = share_at(w, bounds)

        def log() -> ShareLog:
            line = sys.stdin.buffer.readline()  # the exporting process has read the deltas
            if not line:
                raise StoreError("the exporting process stopped before reading the log")
            deltas = int(json.loads(line)["deltas"])
            return share_log_from_file(Path(request["log"]), deltas, tmp, k)

        tell = _teller(request.get("progress_fd"))
        return asdict(export_share(replica, Path(request["new"]), tmp, k, share, log, tell))
    finally:
        store.close()


def _teller(fd: int | None) -> StageProgress | None:
    """The share's progress as ``STAGE COUNT`` lines on ``fd`` (the exporting process
    relays them), or None without one. A line that cannot be written (that process
    gave up) is dropped: its own answer is what counts."""
    if fd is None:
        return None
    out = os.fdopen(int(fd), "wb", buffering=0)

    def tell(stage: str, added: int) -> None:
        with suppress(OSError):
            out.write(f"{stage} {added}\n".encode("ascii"))

    return tell


def _answer(kind: str, payload: Any) -> bytes:
    try:
        return pickle.dumps((kind, payload))
    except Exception:  # an exception that does not pickle: its message, as a StoreError
        return pickle.dumps(("raised", StoreError(str(payload))))


def main() -> None:
    # Ctrl-C reaches the whole process group: stopping is the parent's to handle
    # (it ends this process), so this one does not also print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        answer = _answer("done", run(json.loads(sys.argv[1])))
    except Exception as exc:
        answer = _answer("raised", exc)
    sys.stdout.buffer.write(answer)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
