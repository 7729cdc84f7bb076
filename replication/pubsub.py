"""Head exchange over a publish/subscribe channel (IPFS pubsub), as pure protocol: no I/O.

A peer announces its heads on one topic per dataset (:func:`topic_for`) as a signed
DAG-CBOR message (:func:`make_announcement`)::

    {"kind": "heads", "dataset": CID, "heads": [CID…], "key": bytes(32), "time": int,
     "sig": Ed25519(DAG-CBOR of the same map without "sig")}

A receiver accepts it (:func:`parse_announcement`) only if it decodes, is for its
dataset, carries a valid signature, and the key may write to the dataset as far as the
receiver knows (owner, or granted in its accepted log): anyone can publish on a topic,
so a forged or unauthorised announcement is dropped before it costs a single fetch.

The blocks behind announced heads are found by :class:`HeadFetch`, a walk that asks
for what the replica lacks (unknown deltas, their unknown parents and asserted facts)
and hands back every fetched block in an order :meth:`Replica.apply_blocks` accepts
(clock order, each delta after its fact blocks). Acceptance is the replica's own, the
same as for HTTP sync: the announcement only says where to look.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import libipld

from merklog.store import Link, encode

from .blocks import parse_delta
from .errors import MalformedBlock
from .identity import Identity, verify_signature

#: Largest announcement accepted (heads of a busy DAG stay far below this).
MAX_ANNOUNCEMENT = 64 * 1024
#: Most heads one announcement may name.
MAX_HEADS = 1024


def topic_for(dataset: Link) -> str:
    """The pubsub topic carrying head announcements of ``dataset``."""
    return f"/merklog/heads/{dataset}"


@dataclass(frozen=True)
class Announcement:
    """A verified head announcement."""

    dataset: Link
    heads: tuple[Link, ...]
    key: bytes
    time: int


def make_announcement(identity: Identity, dataset: Link, heads: Sequence[Link]) -> bytes:
    """The signed announcement of ``heads`` by ``identity`` (bytes to publish).

    At most :data:`MAX_HEADS` heads, which every receiver takes (QA: an import of 5,000
    concurrent deltas left 5,000 heads, and each announcement of them all was refused by
    every peer, over the count and over :data:`MAX_ANNOUNCEMENT` bytes). With more, each
    announcement names one window of them, the windows taking turns second by second,
    so that every head is announced within a few rounds; a write joins them meanwhile."""
    stamp = time.time_ns()
    ordered = sorted(heads)
    if len(ordered) > MAX_HEADS:
        windows = -(-len(ordered) // MAX_HEADS)
        start = (stamp // 1_000_000_000 % windows) * MAX_HEADS
        ordered = ordered[start : start + MAX_HEADS]
    unsigned = {
        "kind": "heads",
        "dataset": dataset,
        "heads": ordered,
        "key": identity.public_key,
        "time": stamp,
    }
    return encode({**unsigned, "sig": identity.sign(encode(unsigned))})


def parse_announcement(
    data: bytes, dataset: Link, may_write: Callable[[bytes], bool]
) -> Announcement:
    """Verify an announcement for ``dataset``; MalformedBlock says why it is refused."""
    if len(data) > MAX_ANNOUNCEMENT:
        raise MalformedBlock(f"announcement of {len(data)} bytes is over {MAX_ANNOUNCEMENT}")
    try:
        obj = libipld.decode_dag_cbor(data)
    except Exception as exc:  # noqa: BLE001 - any decoding failure means garbage
        raise MalformedBlock(f"announcement is not DAG-CBOR: {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") != "heads":
        raise MalformedBlock("not a head announcement")
    if set(obj) != {"kind", "dataset", "heads", "key", "time", "sig"}:
        raise MalformedBlock("announcement has missing or extra fields")
    key, sig, stamp = obj["key"], obj["sig"], obj["time"]
    if not isinstance(key, bytes) or not isinstance(sig, bytes) or not isinstance(stamp, int):
        raise MalformedBlock("announcement key, sig or time has the wrong type")
    try:
        if not isinstance(obj["heads"], list):
            raise TypeError("heads must be a list")
        ds = _link(obj["dataset"])
        heads = tuple(_link(h) for h in obj["heads"])
    except (TypeError, ValueError) as exc:
        raise MalformedBlock(f"announcement holds a bad CID: {exc}") from None
    if ds != dataset:
        raise MalformedBlock(f"announcement is for dataset {ds}, not {dataset}")
    if not heads or len(heads) > MAX_HEADS:
        raise MalformedBlock(f"announcement names {len(heads)} heads (1 to {MAX_HEADS})")
    unsigned = {"kind": "heads", "dataset": ds, "heads": list(heads), "key": key, "time": stamp}
    if not verify_signature(key, sig, encode(unsigned)):
        raise MalformedBlock("announcement signature does not verify")
    if not may_write(key):
        raise MalformedBlock(f"announcement by {key.hex()[:16]}…, not a writer of {dataset}")
    return Announcement(ds, heads, key, stamp)


def _link(value: object) -> Link:
    """A decoded DAG-CBOR link (libipld hands links over as raw CID bytes)."""
    if not isinstance(value, bytes):
        raise TypeError(f"not a link: {type(value).__name__}")
    return Link(value)


class HeadFetch:
    """The blocks to fetch for announced heads, and the order to apply them in.

    Drive it with ``while (want := fetch.wanted()): for cid in want: fetch.receive(cid,
    get(cid))``; then ``fetch.blocks()``. ``known(cid)`` says whether the replica
    already accepted a delta. Fact blocks the store holds are not fetched again
    (``have_block``). Every received block is checked against its CID by the replica
    when applied; here a delta is parsed to find its parents and facts.
    """

    def __init__(
        self,
        heads: Iterable[Link],
        known: Callable[[Link], bool],
        have_block: Callable[[Link], bool],
        max_deltas: int = 1_000_000,
    ) -> None:
        self._known = known
        self._have = have_block
        self._max = max_deltas
        self._deltas: dict[Link, tuple[int, bytes, list[Link]]] = {}
        self._facts: dict[Link, bytes] = {}
        self._want: dict[Link, str] = {h: "delta" for h in heads if not known(h)}
        self._asked: set[Link] = set(self._want)

    def wanted(self) -> list[Link]:
        """CIDs to fetch next (empty when the walk is complete)."""
        return list(self._want)

    def receive(self, cid: Link, data: bytes) -> None:
        """A fetched block (already verified against ``cid`` by the store)."""
        kind = self._want.pop(cid, None)
        if kind is None:
            return
        if kind == "fact":
            self._facts[cid] = data
            return
        delta = parse_delta(cid, data)
        if len(self._deltas) >= self._max:
            raise MalformedBlock(f"more than {self._max} deltas behind the announced heads")
        self._deltas[cid] = (delta.clock, data, list(dict.fromkeys(delta.asserted)))
        for parent in delta.parents:
            self._ask(parent, "delta", self._known)
        for fact in delta.asserted:
            self._ask(fact, "fact", self._have)

    def _ask(self, cid: Link, kind: str, present: Callable[[Link], bool]) -> None:
        if cid not in self._asked:
            self._asked.add(cid)
            if not present(cid):
                self._want[cid] = kind

    def blocks(self) -> list[tuple[Link, bytes]]:
        """Fetched blocks in apply order: by (clock, CID), each delta after its new facts."""
        out: list[tuple[Link, bytes]] = []
        for cid, (_clock, data, facts) in sorted(
            self._deltas.items(), key=lambda item: (item[1][0], item[0].raw)
        ):
            out.extend((f, self._facts[f]) for f in facts if f in self._facts)
            out.append((cid, data))
        return out
