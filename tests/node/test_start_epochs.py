"""A start over the heads and program the saved epoch was evaluated over is that epoch
again (ADR 0209).

Every command on a stopped home opens the node, and its first epoch reads the stored
facts again: ``status`` showed epoch 7, a ``query`` then wrote epoch 8 to the home, and
every restart of ``node run`` did the same, although nothing had changed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import merklog

CLOSURE = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\n"


def _saved(home: Path) -> bytes:
    """The saved epoch state, as another process reads it."""
    conn = sqlite3.connect(f"file:{home / 'store.sqlite'}?mode=ro", uri=True)
    try:
        return bytes(conn.execute("SELECT data FROM node_epoch").fetchone()[0])
    finally:
        conn.close()


def _open_and_read(home: Path) -> tuple[int, list]:
    with merklog.open(home) as node:
        rows = node.query("p(1, X)").rows
        return node.status()["epoch"], rows


def test_reads_and_restarts_of_an_unchanged_home_keep_its_epoch(tmp_path: Path) -> None:
    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.load_program(CLOSURE, "closure.dl")
        node.write(asserts=[("e", (1, 2)), ("e", (2, 3)), ("e", (2.0, 4))])
    first, rows = _open_and_read(home)  # the first start after writes: one epoch saved
    assert rows == [(2,), (3,)]  # e(2.0, 4) does not join p(1, 2): 2.0 is not 2
    saved = _saved(home)
    for _ in range(3):  # reads, restarts: the same epoch, nothing written
        assert _open_and_read(home) == (first, rows)
        assert _saved(home) == saved
    with merklog.open(home) as node:  # a write is a new epoch, and so is the start after it
        node.write(asserts=[("e", (3, 1.0))])
        assert node.query("p(1, X)").rows == [(1.0,), (2,), (3,)]
    epoch, rows = _open_and_read(home)
    assert epoch > first and rows == [(1.0,), (2,), (3,)]
    assert _open_and_read(home) == (epoch, rows)


def test_a_new_program_or_a_new_delta_is_a_new_epoch_at_start(tmp_path: Path) -> None:
    """Same heads, another program: a new epoch. A grant (a delta that changes no fact,
    but moves the heads): a new epoch too, then the same one again."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.write(asserts=[("e", (1, 2))])
        node.load_program(CLOSURE, "closure.dl")
    first, _ = _open_and_read(home)
    assert _open_and_read(home)[0] == first
    with merklog.open(home) as node:
        node.load_program(CLOSURE + "q(X) :- p(X, _).\n", "q.dl")
    loaded, _ = _open_and_read(home)
    assert loaded > first
    assert _open_and_read(home)[0] == loaded
    key = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    with merklog.open(home) as node:
        node.grant(key.hex())
    granted, rows = _open_and_read(home)
    assert granted > loaded and rows == [(2,)]
    assert _open_and_read(home) == (granted, rows)
