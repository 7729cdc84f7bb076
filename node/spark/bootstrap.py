"""Replica ⇄ Spark: bootstrap a fresh replica from a snapshot, prune (``export_replica``
is re-exported from :mod:`.export`).

``install_snapshot`` gives an empty replica the OR-set state a snapshot holds
(visible facts with their supporting assert tags, the covered deltas' ids,
clocks and parents, the grant/revoke history) without any delta block. Sync then
only ever sends what came after the snapshot heads: a peer computes "what the
caller lacks" from the caller's heads, and the covered ids answer "is this
parent known?" for every later delta.

The tables themselves are written by :mod:`merklog.replication.snapshot`, so
this module never touches the replication schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from merklog.replication.errors import InvalidDelta
from merklog.replication.replica import Replica
from merklog.replication.snapshot import AclEntry, CoveredDelta, install_snapshot_state
from merklog.store import Fact, Link

from .export import export_replica
from .manifest import ManifestError, parse_manifest, verify_files
from .schema import decode_args


@dataclass
class Snapshot:
    """A verified snapshot directory (one dataset)."""

    root: Path
    manifest_cid: Link
    manifest: dict[str, Any]

    def _table(self, role: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for f in self.manifest["files"]:
            if f["role"] == role:
                rows.extend(pq.read_table(self.root / f["path"]).to_pylist())
        return rows

    def facts(self) -> Iterator[tuple[Link, Fact, list[Link]]]:
        """``(fact CID, fact, support)``; each CID is recomputed from the fact and checked."""
        for row in self._table("facts"):
            fact = Fact(row["relation"], decode_args(row["args"]))
            yield Link(row["fact_cid"]), fact, [Link(s) for s in row["support"]]

    def deltas(self) -> list[dict[str, Any]]:
        return self._table("deltas")

    def acl(self) -> list[dict[str, Any]]:
        return self._table("acl")

    @property
    def heads(self) -> list[Link]:
        return list(self.manifest["heads"])

    @property
    def dataset(self) -> Link:
        return self.manifest["dataset"]

    def genesis_block(self) -> bytes | None:
        """The dataset's genesis block if the snapshot carries it (verified by its CID)."""
        for f in self.manifest["files"]:
            if f["role"] == "genesis":
                return (self.root / f["path"]).read_bytes()
        return None


def load_snapshot(root: str | Path, trusted: set[bytes] | None = None) -> Snapshot:
    """Read and verify a snapshot directory: manifest signature, signer, every file's CID."""
    root = Path(root)
    data = (root / "manifest.cbor").read_bytes()
    cid = Link.for_dag_cbor(data)
    expected = root / "MANIFEST_CID"
    if expected.exists() and Link.parse(expected.read_text().strip()) != cid:
        raise ManifestError(f"manifest.cbor does not hash to the CID in {expected}")
    manifest = parse_manifest(data, cid)
    if trusted is not None and manifest["signer"] not in trusted:
        raise ManifestError(f"snapshot signed by untrusted key {manifest['signer'].hex()}")
    verify_files(manifest, root)
    return Snapshot(root, cid, manifest)


def install_snapshot(replica: Replica, snap: Snapshot) -> int:
    """Bootstrap an empty replica of the same dataset from ``snap``; returns visible facts."""
    if snap.manifest["dataset"] != replica.dataset:
        raise ManifestError(
            f"snapshot is of dataset {snap.manifest['dataset']}, replica is {replica.dataset}"
        )
    deltas = snap.deltas()
    if len(deltas) != snap.manifest["deltas"]:
        raise ManifestError("snapshot deltas table does not match the manifest count")
    covered = [
        CoveredDelta(
            cid=Link(d["delta_cid"]),
            author=d["author"],
            seq=d["seq"],
            clock=d["clock"],
            parents=tuple(Link(p) for p in d["parents"]),
        )
        for d in deltas
    ]
    acl = [
        AclEntry(
            key=a["key"],
            delta=Link(a["delta_cid"]),
            clock=a["clock"],
            grant=a["op"] == "grant",
        )
        for a in snap.acl()
    ]
    try:
        return install_snapshot_state(replica, snap.facts(), covered, acl, snap.heads)
    except InvalidDelta as exc:
        raise ManifestError(str(exc)) from exc


def prune_replica(replica: Replica, snap: Snapshot) -> int:
    """Delete the delta blocks a snapshot covers from the replica's block store.

    The OR-set state (support tags, visible counts) and the covered ids, clocks
    and parents stay, so acceptance and future retracts behave exactly as before;
    what goes is the ability to *serve* those delta blocks, which is safe once
    they are causally stable (every writer has built on them: see docs/spark.md). A
    snapshot covering a delta that is not stable in this replica (by the authors and
    parents it holds) is refused, deleting nothing.
    """
    if snap.manifest["dataset"] != replica.dataset:
        raise ManifestError("snapshot and replica are of different datasets")
    missing = [h for h in snap.heads if not replica.has_delta(h)]
    if missing:
        raise ManifestError(f"replica lacks {len(missing)} snapshot head(s); sync before pruning")
    cids = [Link(d["delta_cid"]) for d in snap.deltas()]
    from .compact import stable_deltas

    stable = stable_deltas(replica.delta_graph())
    unstable = [c for c in cids if c.raw not in stable]
    if unstable:
        raise ManifestError(
            f"{len(unstable)} of the snapshot's {len(cids)} deltas are not causally stable"
            " in this replica (a writer has not built on them yet, as when the snapshot was"
            " made without --prune, or before this replica saw newer writers): a peer that"
            " lacks them could no longer sync; make the snapshot with `compact --prune` of"
            " current exports"
        )
    return replica.drop_covered(cids)


__all__ = ["Snapshot", "export_replica", "install_snapshot", "load_snapshot", "prune_replica"]
