"""Error lines and exit statuses that must not depend on which path a command takes
(a stopped home or a running node), and that stay one line whatever a peer, a codec or
SQLite says (docs/operations.md, "Exit status"). Real homes, real ``merklog``
subprocesses, real nodes and HTTP servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from merklog.node.failures import ExitCode

from .conftest import Cli
from .test_cli_errors import assert_fails, merklog


def _forged_car(home: Path, out: Path) -> None:
    """A CAR of one delta on top of ``home``'s heads, signed by a key that is no writer."""
    import merklog as api
    import merklog.store.car as car
    from merklog.replication.blocks import build_delta
    from merklog.replication.identity import Identity
    from merklog.store import encode_fact, make_fact

    with api.open(home) as node:
        replica = node.replica
        heads = replica.heads()
        clock = 1 + max(replica._clock_of(h) or 0 for h in heads)
        cid, data = encode_fact(make_fact("forged", [1]))
        delta = build_delta(
            Identity.generate(), replica.dataset, 1, clock, heads, [{"op": "assert", "fact": cid}]
        )
    with open(out, "wb") as f:
        car.write_car(f, [delta.cid], [(cid, data), (delta.cid, delta.data)])


def test_importing_a_delta_by_a_non_writer_is_bad_input_stopped_or_running(
    tmp_path: Path, node_factory
) -> None:
    """A CAR holding a delta whose author is not a writer was exit 7 ("this node's key is
    not a writer": ask for a grant) on a stopped home, and exit 2 with another line
    through a running node. The fault is in the file: exit 2, one line naming it, the
    same on both paths, and nothing is written."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "a(1).")
    forged = tmp_path / "forged.car"
    _forged_car(home, forged)
    stopped = assert_fails(
        merklog(home, "import", str(forged)), ExitCode.BAD_INPUT, str(forged), "is not a writer"
    )
    node = node_factory(home).start()
    running = assert_fails(merklog(home, "import", str(forged)), ExitCode.BAD_INPUT)
    assert running == stopped
    status, body = node.request("POST", "/v1/query", {"q": "forged(X)"})
    assert status in (200, 404) and "forged" not in str(body.get("rows", "")), body
