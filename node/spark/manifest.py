"""Snapshot manifest blocks: what a compacted snapshot holds and which deltas it covers.

A manifest is one DAG-CBOR block (encoded with :func:`merklog.store.encode`)::

    {"kind": "snapshot", "format": "merklog-snapshot/1",
     "dataset": <dataset CID link>,
     "heads": [<delta CID links>],        # the frontier the snapshot covers (sorted)
     "deltas": <int>, "max_clock": <int>, "facts": <int>, "support": <int>,
     "files": [{"role": "facts"|"deltas"|"acl"|"genesis", "path": <str>, "cid": <CID link>,
                "rows": <int>, "bytes": <int>}],
     "signer": <32-byte Ed25519 key>, "sig": <64 bytes>}

``sig`` is the Ed25519 signature over the encoding of the block without ``sig``
(the same rule as deltas). Each file is named by the CIDv1 (raw codec,
sha2-256) of its bytes (the genesis block by its dag-cbor CID, i.e. the dataset id),
so a peer fetching it from anywhere verifies it before use.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from merklog.replication.identity import Identity, verify_signature
from merklog.store import InvalidBlock, Link, decode, encode

FORMAT = "merklog-snapshot/1"
RAW = 0x55
KEYS = {
    "kind",
    "format",
    "dataset",
    "heads",
    "deltas",
    "max_clock",
    "facts",
    "support",
    "files",
    "signer",
    "sig",
}


class ManifestError(InvalidBlock):
    """A manifest (or a file it names) is malformed, unsigned or does not verify."""


def file_link(path: Path, role: str = "") -> tuple[Link, int]:
    """Raw-codec CID of a file's bytes (streamed) and its size; the genesis file is a
    DAG-CBOR block and is named by its dag-cbor CID (the dataset id)."""
    if role == "genesis":
        data = path.read_bytes()
        return Link.for_dag_cbor(data), len(data)
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return Link(bytes([0x01, RAW, 0x12, 0x20]) + h.digest()), size


def build_manifest(
    identity: Identity,
    dataset: Link,
    heads: list[Link],
    files: list[dict[str, Any]],
    deltas: int,
    max_clock: int,
    facts: int,
    support: int,
) -> tuple[Link, bytes, dict[str, Any]]:
    """Build and sign a manifest; returns ``(cid, block bytes, decoded object)``."""
    body: dict[str, Any] = {
        "kind": "snapshot",
        "format": FORMAT,
        "dataset": dataset,
        "heads": sorted(heads, key=lambda link: link.raw),
        "deltas": deltas,
        "max_clock": max_clock,
        "facts": facts,
        "support": support,
        "files": sorted(files, key=lambda f: (f["role"], f["path"])),
        "signer": identity.public_key,
    }
    body["sig"] = identity.sign(encode(body))
    data = encode(body)
    return Link.for_dag_cbor(data), data, body


def parse_manifest(data: bytes, cid: Link | None = None) -> dict[str, Any]:
    """Decode, shape-check and signature-check a manifest block."""
    if cid is not None and not cid.verifies(data):
        raise ManifestError(f"manifest block does not hash to {cid}")
    obj = decode(data)
    if not isinstance(obj, dict) or set(obj) != KEYS or obj.get("kind") != "snapshot":
        raise ManifestError("a snapshot manifest is a map with keys " + ", ".join(sorted(KEYS)))
    if obj["format"] != FORMAT:
        raise ManifestError(f"unsupported snapshot format {obj['format']!r} (want {FORMAT})")
    if not isinstance(obj["dataset"], Link) or not all(isinstance(h, Link) for h in obj["heads"]):
        raise ManifestError("manifest dataset and heads must be CID links")
    for f in obj["files"]:
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("cid"), Link)
            or not isinstance(f.get("path"), str)
        ):
            raise ManifestError("each manifest file entry needs a path and a CID link")
        if Path(f["path"]).is_absolute() or ".." in Path(f["path"]).parts:
            raise ManifestError(f"manifest file path {f['path']!r} must be relative, without '..'")
    unsigned = {k: v for k, v in obj.items() if k != "sig"}
    if not verify_signature(obj["signer"], obj["sig"], encode(unsigned)):
        raise ManifestError("manifest signature does not verify")
    if encode(obj) != bytes(data):
        raise ManifestError("manifest block is not canonical DAG-CBOR")
    return obj


def verify_files(manifest: dict[str, Any], root: Path) -> None:
    """Check that every file the manifest names exists under ``root`` with its CID."""
    for f in manifest["files"]:
        path = root / f["path"]
        if not path.is_file():
            raise ManifestError(f"snapshot file {f['path']} is missing")
        link, _size = file_link(path, f["role"])
        if link != f["cid"]:
            raise ManifestError(f"snapshot file {f['path']} does not hash to {f['cid']}")
