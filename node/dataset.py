"""The node's replica of its dataset: create, join or open it, and apply batches of
replicated deltas as one step for the epoch loop."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

from merklog.replication.blocks import parse_genesis
from merklog.replication.errors import MalformedBlock
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import BlockNotFound, BlockStore, Fact, Link, decode, decode_fact

from .config import Config
from .errors import NodeInputError
from .failures import ExitCode, Failure
from .storage import store_conn


def create_dataset(store: BlockStore, identity: Identity, name: str) -> Link:
    """A new dataset owned by ``identity``; returns its genesis CID."""
    replica = Replica.create(store_conn(store), store, identity, name or "merklog")
    return replica.dataset


def open_replica(
    store: BlockStore,
    dataset: Link,
    identity: Identity,
    on_change: Callable[[Fact, int], None],
    on_new: Callable[[list[Fact]], None] | None = None,
) -> Replica:
    """The dataset's replica, telling ``on_change(fact, weight)`` every visible change
    (``on_new(facts)`` the new facts of a bulk local write, each +1, at once).

    The home was made with the dataset's genesis block in its store, so a store without
    it is damaged: :class:`BlockNotFound` (exit 5, ``fsck --repair-from`` fetches it
    again), where the replica's "genesis block … is not known" read as a wrong dataset."""
    genesis = store.get(dataset)
    replica = Replica.open(store_conn(store), store, identity, dataset, genesis)
    replica.subscribe(lambda weight, fact, _cid: on_change(fact, weight), on_new)
    return replica


def genesis_from_ipfs(cfg: Config, dataset_id: str) -> tuple[Link, bytes]:
    """A dataset's id and genesis block fetched through the configured IPFS daemon
    (which finds it on the peers it is connected to), verified against the id."""
    if cfg.get("store.backend") != "ipfs":
        raise NodeInputError(
            f"{dataset_id!r} is not an http(s) URL; joining by dataset id needs --store ipfs"
        )
    from merklog.store.ipfs import IPFSBlockStore, api_multiaddr

    try:
        dataset = Link.parse(dataset_id)
    except ValueError as exc:
        raise NodeInputError(f"not a URL or a dataset id: {dataset_id!r} ({exc})") from None
    remote = IPFSBlockStore(
        api_multiaddr(cfg.get("store.ipfs_api")), timeout=cfg.get("store.ipfs_timeout")
    )
    try:
        data = remote.get(dataset)
    except BlockNotFound:  # not the home's damage: there is no home yet
        raise Failure(
            f"the IPFS daemon at {cfg.get('store.ipfs_api')} found no dataset {dataset} within"
            f" {cfg.get('store.ipfs_timeout'):g} s: check the id, or connect the daemon to a"
            " peer that has it",
            ExitCode.NOT_FOUND,
        ) from None
    finally:
        remote.close()
    try:
        parse_genesis(dataset, data)
    except MalformedBlock:
        # The id of a fact or a delta: bad input, said as such (it said "a genesis block
        # is a map {kind: 'dataset', …}", exit 1).
        raise NodeInputError(
            f"{dataset} is not a dataset id: it names {_kind_of(data)}, not a genesis block"
            " (a dataset's id is in `merklog status` of a home that follows it)"
        ) from None
    return dataset, data


def _kind_of(data: bytes) -> str:
    """What a block that is no genesis block is, for the error: a fact, a delta, …"""
    with suppress(ValueError):  # InvalidBlock: any block that is no fact
        decode_fact(data)
        return "a fact"
    try:
        obj = decode(data)
    except ValueError:
        return "a block that is not DAG-CBOR"
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind == "delta":
        return "a delta"
    return f"a block of kind {kind!r}" if isinstance(kind, str) else "another kind of block"


def join_dataset(store: BlockStore, identity: Identity, dataset: Link, genesis: bytes) -> Link:
    replica = Replica.open(store_conn(store), store, identity, dataset, genesis)
    return replica.dataset


class AtomicApply:
    """A replica whose ``apply_blocks`` runs through ``run(fn, *args)`` (the node uses it
    to hand all visible changes of one applied batch to the same epoch), and tells
    ``accepted(n)`` how many deltas each applied batch accepted: every replicated delta,
    pulled or pushed to us, is counted where it is applied."""

    def __init__(
        self,
        replica: Replica,
        run: Callable[..., Any],
        accepted: Callable[[int], None] | None = None,
    ) -> None:
        self._replica = replica
        self._run = run
        self._accepted = accepted

    def apply_blocks(self, *args: Any, **kw: Any) -> Any:
        result = self._run(lambda: self._replica.apply_blocks(*args, **kw))
        if self._accepted is not None and result.accepted:
            self._accepted(result.accepted)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._replica, name)
