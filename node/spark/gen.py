"""Generate realistic replicated logs for tests and benchmarks.

Several simulated peers each create deltas on their own heads (Lamport clock =
1 + max parent clock), assert facts drawn from a shared pool (so concurrent
peers assert the same fact), retract facts they see (observing exactly the
asserting deltas they know of, as the OR-set requires), and now and then pull
another peer's deltas. Each peer's *view* (the deltas it holds) is a
causally-closed subset of the whole log, so exporting every view gives merged
inputs with many duplicates and concurrent assert/retract pairs.

The deltas are not signed (Spark jobs trust exports from replicas that already
verified them); their CIDs are real CIDs of their DAG-CBOR blocks.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from merklog.store import Fact, Link, encode, fact_cid, make_fact


@dataclass(slots=True)
class SimDelta:
    cid: Link
    dataset: Link
    author: bytes
    seq: int
    clock: int
    parents: tuple[Link, ...]
    ops: tuple[dict[str, Any], ...]


@dataclass
class SimPeer:
    author: bytes
    known: set[Link] = field(default_factory=set)
    order: list[Link] = field(default_factory=list)  # causal delivery order
    heads: set[Link] = field(default_factory=set)
    seq: int = 0
    tags: dict[Fact, set[Link]] = field(default_factory=dict)  # live OR-set tags
    removed: set[tuple[Link, Fact]] = field(default_factory=set)


def _pool(rng: random.Random, size: int) -> list[Fact]:
    """A fact pool: mostly edge/2 over small ints (dense, so closure is interesting),
    plus label/2 strings, and a few facts using every value type."""
    n_nodes = max(4, int(size**0.5) + 2)
    facts: set[Fact] = set()
    while len(facts) < size:
        r = rng.random()
        if r < 0.7:
            facts.add(make_fact("edge", (rng.randrange(n_nodes), rng.randrange(n_nodes))))
        elif r < 0.9:
            facts.add(make_fact("label", (rng.randrange(n_nodes), f"n{rng.randrange(8)}")))
        else:
            facts.add(
                make_fact(
                    "misc",
                    (
                        rng.randrange(-(2**63), 2**63),
                        rng.choice([0.5, -1.25, 1e300, 3.0]),
                        rng.choice(["", "é✓", 'q"uote']),
                        bytes(rng.randrange(256) for _ in range(rng.randrange(4))),
                        rng.random() < 0.5,
                        Link.for_dag_cbor(bytes([rng.randrange(256)])),
                    ),
                )
            )
    return sorted(facts, key=lambda f: str(fact_cid(f)))


class Simulation:
    """A set of peers editing one dataset; ``deltas`` holds every delta ever made."""

    def __init__(
        self,
        peers: int = 3,
        pool: int = 60,
        seed: int = 0,
        dataset: Link | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.dataset = dataset or Link.for_dag_cbor(encode({"kind": "dataset", "nonce": seed}))
        self.pool = _pool(self.rng, pool)
        self.cids = {f: fact_cid(f) for f in self.pool}
        self.peers = [SimPeer(author=bytes([i + 1]) * 32) for i in range(peers)]
        self.deltas: dict[Link, SimDelta] = {}

    # ------------------------------------------------------------ peer actions

    def _deliver(self, peer: SimPeer, delta: SimDelta) -> None:
        peer.known.add(delta.cid)
        peer.order.append(delta.cid)
        peer.heads.difference_update(delta.parents)
        peer.heads.add(delta.cid)
        for op in delta.ops:
            fact = op.get("fact_obj")
            if op["op"] == "assert":
                if (delta.cid, fact) not in peer.removed:
                    peer.tags.setdefault(fact, set()).add(delta.cid)
            elif op["op"] == "retract":
                live = peer.tags.get(fact, set())
                for obs in op["observed"]:
                    peer.removed.add((obs, fact))
                    live.discard(obs)
                if not live:
                    peer.tags.pop(fact, None)

    def write(self, peer_index: int, n_ops: int, retract_rate: float = 0.3) -> SimDelta:
        """Peer creates one delta with ``n_ops`` ops on its current heads."""
        peer = self.peers[peer_index]
        rng = self.rng
        ops: list[dict[str, Any]] = []
        touched: set[Fact] = set()
        for _ in range(n_ops):
            if peer.tags and rng.random() < retract_rate:
                fact = rng.choice(sorted(peer.tags, key=lambda f: str(self.cids[f])))
                if fact in touched:
                    continue
                observed = sorted(peer.tags[fact], key=lambda link: link.raw)
                ops.append({"op": "retract", "fact_obj": fact, "observed": observed})
            else:
                fact = rng.choice(self.pool)
                if fact in touched:
                    continue
                ops.append({"op": "assert", "fact_obj": fact})
            touched.add(fact)
        parents = tuple(sorted(peer.heads, key=lambda link: link.raw))
        clock = 1 + max((self.deltas[p].clock for p in parents), default=0)
        peer.seq += 1
        block = {
            "kind": "delta",
            "dataset": self.dataset,
            "author": peer.author,
            "seq": peer.seq,
            "clock": clock,
            "parents": list(parents),
            "ops": [
                {"op": o["op"], "fact": self.cids[o["fact_obj"]]}
                | ({"observed": list(o["observed"])} if o["op"] == "retract" else {})
                for o in ops
            ],
        }
        delta = SimDelta(
            Link.for_dag_cbor(encode(block)),
            self.dataset,
            peer.author,
            peer.seq,
            clock,
            parents,
            tuple(ops),
        )
        self.deltas[delta.cid] = delta
        self._deliver(peer, delta)
        return delta

    def pull(self, into: int, source: int) -> int:
        """``into`` receives every delta ``source`` has (in ``source``'s causal order)."""
        dst, src = self.peers[into], self.peers[source]
        n = 0
        for cid in src.order:
            if cid not in dst.known:
                self._deliver(dst, self.deltas[cid])
                n += 1
        return n

    def run(
        self,
        steps: int,
        ops_per_delta: tuple[int, int] = (1, 6),
        sync_rate: float = 0.25,
        retract_rate: float = 0.3,
    ) -> Simulation:
        """Random interleaving of writes and pulls."""
        rng = self.rng
        n = len(self.peers)
        for _ in range(steps):
            p = rng.randrange(n)
            if n > 1 and rng.random() < sync_rate:
                self.pull(p, rng.choice([q for q in range(n) if q != p]))
            else:
                self.write(p, rng.randint(*ops_per_delta), retract_rate)
        return self

    def sync_all(self) -> None:
        """Everyone pulls from everyone: all views become the whole log."""
        for i in range(len(self.peers)):
            for j in range(len(self.peers)):
                if i != j:
                    self.pull(i, j)

    # ------------------------------------------------------------ views

    def log_rows(self, peer_index: int | None = None) -> Iterator[dict[str, Any]]:
        """Export rows (the shape of ``Replica.iter_log()``) of one peer's view, or of everything."""
        cids = self.peers[peer_index].order if peer_index is not None else list(self.deltas)
        for cid in cids:
            d = self.deltas[cid]
            base = {
                "dataset": d.dataset,
                "delta_cid": d.cid,
                "author": d.author,
                "clock": d.clock,
                "seq": d.seq,
                "parents": list(d.parents),
            }
            if not d.ops:
                yield base | {"op_index": 0, "op": "none"}
            for i, op in enumerate(d.ops):
                fact = op["fact_obj"]
                yield base | {
                    "op_index": i,
                    "op": op["op"],
                    "relation": fact.rel,
                    "args": fact.args,
                    "fact_cid": self.cids[fact],
                    "observed": op.get("observed"),
                }

    def visible(self, peer_index: int) -> set[Fact]:
        """A peer's visible facts (its incrementally maintained OR-set)."""
        return set(self.peers[peer_index].tags)


def reference_visible(rows: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> set[Fact]:
    """The OR-set definition applied literally to log rows (any order, duplicates allowed):
    a fact is visible iff some assert of it is not listed in any retract's ``observed``."""
    asserts: set[tuple[Link, Fact]] = set()
    removed: set[tuple[Link, Fact]] = set()
    for row in rows:
        if row["op"] not in ("assert", "retract"):
            continue
        fact = Fact(row["relation"], tuple(row["args"]))
        if row["op"] == "assert":
            asserts.add((row["delta_cid"], fact))
        else:
            removed.update((obs, fact) for obs in row["observed"])
    return {fact for tag, fact in asserts if (tag, fact) not in removed}
