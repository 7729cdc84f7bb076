"""The loaded program lives in the home, as a content-addressed block.

``merklog load FILE`` (and ``POST /v1/program``, ``node run --program FILE``) check
the program first; only a program that passed every check is stored: its text
goes into a DAG-CBOR block ``{"kind": "program", "source", "text"}`` in the node's
block store and the block's CID into the one-row table ``node_program``, both in
one transaction. So the swap is atomic, an invalid program never replaces the
running one, and editing or deleting the source file afterwards changes nothing:
every later command and restart evaluates the stored block.

Homes from before this rule recorded only a file path (``node.program``); on open
such a file is read once and stored, if it still exists and passes the checks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merklog.store import BlockNotFound, Link, decode, encode

log = logging.getLogger(__name__)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS node_program"
    " (id INTEGER PRIMARY KEY CHECK (id = 1), cid BLOB NOT NULL)"
)


@dataclass(frozen=True)
class StoredProgram:
    """A program as stored in the home: its block CID, source name and text."""

    cid: Link
    source: str
    text: str


def program_block(text: str, source: str) -> tuple[Link, bytes]:
    """The block (CID, bytes) holding a program's text."""
    data = encode({"kind": "program", "source": source, "text": text})
    return Link.for_dag_cbor(data), data


def stored(conn: Any, store: Any) -> StoredProgram | None:
    """The program stored in the home, or None."""
    conn.execute(SCHEMA)
    row = conn.execute("SELECT cid FROM node_program WHERE id = 1").fetchone()
    if row is None:
        return None
    cid = Link(bytes(row[0]))
    obj = decode(store.get(cid))  # the store re-hashes: a damaged block raises
    return StoredProgram(cid, str(obj["source"]), str(obj["text"]))


def save(conn: Any, store: Any, transaction: Any, text: str, source: str) -> Link:
    """Store a (checked) program and make it the home's program, atomically."""
    cid, data = program_block(text, source)
    conn.execute(SCHEMA)
    with transaction:
        store.put(cid, data)
        conn.execute("INSERT OR REPLACE INTO node_program (id, cid) VALUES (1, ?)", (cid.raw,))
    return cid


def restore(node: Any, legacy_path: Path | None) -> None:
    """Load the home's stored program into ``node``; else migrate a legacy file path."""
    from . import wiring

    try:
        found = stored(wiring.store_conn(node.store), node.store)
    except BlockNotFound:
        log.error("the stored program's block is missing; running without a program")
        found = None
    if found is not None:
        node.load_program(found.text, found.source, persist=False)
        return
    if legacy_path is None or not legacy_path.exists():
        return
    try:
        node.load_program(legacy_path.read_text(), source=str(legacy_path))
    except Exception as exc:  # an old path that no longer checks: run without it
        log.warning("not loading %s: %s", legacy_path, exc)
