"""A replica as a CAR file and back: ``merklog export`` / ``import``, ``GET /v1/export``,
``POST /v1/import`` and ``restore`` (docs/operations.md, "Backup and restore").

An export holds the dataset's genesis block first, then every delta with its fact
blocks in clock order, rooted at the heads; an import verifies and applies blocks all
or nothing. The functions take what they work on (store and replica, or the node as a
:class:`Owner`) instead of importing :mod:`.node`, so :class:`~.node.Node` delegates
here and :mod:`.backup` can restore without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from merklog.store import CIDMismatch, InvalidBlock, Link

from .files import output_file

#: A block as a CAR holds it.
Block = tuple[Link, bytes]


class Owner(Protocol):
    """What an import needs of the node: its dataset and replica, the epoch step that
    applies blocks, its metrics, and a way to have the new facts evaluated."""

    dataset: Link
    replica: Any
    metrics: Any
    tasks: Any

    def atomically(self, fn: Callable[..., Any], *args: Any) -> Any: ...
    def wake(self) -> None: ...
    def run_epoch(self) -> int: ...


def export_blocks(
    store: Any, replica: Any, genesis: Link
) -> tuple[list[Link], Iterable[tuple[Link, bytes]]]:
    """(roots = heads, blocks = genesis then every delta with its facts, in clock order).

    Each block once: a fact that several deltas assert (asserted again) comes with the
    first of them only; an import finds it stored when the later delta arrives. (A CAR
    with a block twice said `exported 20 blocks` where fsck of the restore counted 19.)

    Refused (:class:`~.failures.Failure`, exit 1 / HTTP 409) before any block is read
    when the home keeps some deltas only as a snapshot's metadata (pruned, or
    bootstrapped from a snapshot): a CAR without them could not be restored; and
    (:class:`~.failures.StoreDamaged`, exit 5) when the replica's tables lost rows
    other rows name (:func:`~merklog.replication.consistency.table_damage`)."""
    from merklog.replication.consistency import table_damage

    damage = table_damage(replica)
    if damage:  # the CAR would be refused by restore, or lack facts: found only then (QA)
        from .failures import StoreDamaged

        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        raise StoreDamaged(
            f"the store is damaged, so a backup of it could not be restored: {damage[0]}"
            f"{more}; nothing was exported. Run `merklog fsck`, and restore a backup or"
            " join a peer (`merklog init --join URL` in a new home)"
        )
    covered = replica.covered_count()
    if covered:
        from .failures import Failure

        raise Failure(
            f"this home keeps {covered} of its deltas only as a snapshot's metadata (pruned,"
            " or bootstrapped from a snapshot), so a CAR backup would lack them and could"
            " not be restored: keep that snapshot folder as the backup of the history it"
            " covers (docs/spark.md)"
        )

    def blocks() -> Iterable[tuple[Link, bytes]]:
        yield genesis, store.get(genesis)
        again = replica.reasserted_facts()
        written: set[bytes] = set()
        for cid, data in replica.missing_for([replica.dataset]):
            if cid.raw in again:
                if cid.raw in written:
                    continue
                written.add(cid.raw)
            yield cid, data

    return replica.heads(), blocks()


def export_car(
    store: Any,
    replica: Any,
    genesis: Link,
    path: str | Path,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write the replica to a CAR file (atomically); returns the number of blocks."""
    from merklog.store.car import write_car

    roots, blocks = export_blocks(store, replica, genesis)
    count = 0

    def counted() -> Iterable[tuple[Link, bytes]]:
        nonlocal count
        for item in blocks:
            count += 1
            if progress is not None and count % 1000 == 0:
                progress(count)
            yield item

    with output_file(path) as out:  # a full disk leaves no half-written backup
        write_car(out, roots, counted())
    return count


def import_blocks(node: Owner, blocks: Iterable[tuple[Link, bytes]]) -> dict[str, int]:
    """Verify and apply blocks (all or nothing); the next epoch sees the new facts."""
    return _apply_blocks(node, _block_pairs(blocks))


def _apply_blocks(node: Owner, blocks: Iterable[tuple[Link, bytes]]) -> dict[str, int]:
    genesis = node.dataset
    applied = node.atomically(
        node.replica.apply_blocks, ((c, d) for c, d in blocks if c != genesis)
    )
    result = applied.to_json()
    node.metrics.deltas.inc(result.get("accepted", 0))
    node.wake()
    if not node.tasks.running:
        node.run_epoch()
    return result


def import_stream(
    node: Owner, src: BinaryIO, progress: Callable[[int], None] | None = None
) -> dict[str, int]:
    """Verify and apply the CAR read from ``src``, all or nothing, up to the heads its
    roots name (:func:`reaching`): what ``merklog import`` on a stopped home and ``POST
    /v1/import`` both do. ``progress(blocks)`` every 1,000 blocks. The CAR's faults
    raise :class:`CarFault`."""

    def counted(blocks: Iterable[Block]) -> Iterable[Block]:
        for i, block in enumerate(blocks, 1):
            if progress is not None and i % 1000 == 0:
                progress(i)
            yield block

    roots, blocks = read_import_car(src)
    return _apply_blocks(node, reaching(roots, node.replica, counted(blocks)))


def reaching(roots: list[Link], replica: Any, blocks: Iterable[Block]) -> Iterator[Block]:
    """``blocks``, then, once the last has been applied (inside the import's
    transaction, so that what it raises rolls the whole import back), a check that
    every root of the CAR is a delta this replica has: a :class:`CarFault` ``is
    incomplete`` otherwise (ADR 0211).

    A CAR cut exactly between two sections (a copy or a download stopped early) is a
    valid, shorter CAR: every block verifies and every delta has its parents before it,
    so it imported the deltas before the cut, dropped the facts after the last of them,
    and said so with exit 0. Its roots, the heads it was exported at, are what it misses.
    A root this home already had before is no gap (a CAR of a peer that is behind)."""
    yield from blocks
    missing = [root for root in roots if not replica.has_delta(root)]
    if missing:
        raise CarFault(
            f"is incomplete: {len(missing)} of the {len(roots)} head(s) it was exported at"
            " are not in it (a copy cut short?), nor in this home: nothing was imported"
        )


def _block_pairs(blocks: Any) -> Iterator[tuple[Link, bytes]]:
    """``blocks`` as ``(Link, bytes)`` pairs, or InvalidBlock for a caller's mistake (not
    a list, an item that is not such a pair): a raw TypeError or ValueError otherwise.
    Raised inside the import's transaction, so nothing of it is applied."""
    if not isinstance(blocks, Iterable) or isinstance(blocks, str | bytes):
        raise InvalidBlock(f"blocks: expected (CID, bytes) pairs, got {type(blocks).__name__}")
    for i, item in enumerate(blocks):
        if not (
            isinstance(item, tuple | list)
            and len(item) == 2
            and isinstance(item[0], Link)
            and isinstance(item[1], bytes | bytearray | memoryview)
        ):
            raise InvalidBlock(f"blocks[{i}]: expected a (Link, bytes) pair, got {item!r:.60}")
        yield item[0], bytes(item[1])


def import_car(
    node: Owner, path: str | Path, progress: Callable[[int], None] | None = None
) -> dict[str, int]:
    """Verify and apply the blocks of the CAR file at ``path`` (see :func:`import_blocks`).

    A CAR that cannot be applied through its own fault (see :func:`import_fault`) raises
    :class:`InvalidBlock` ``"PATH REASON"``: bad input (exit 2), as ``POST /v1/import``
    answers 400 with the same reason, so ``merklog import`` says the same on a stopped
    home and through a running node."""

    with open(path, "rb") as src:
        try:
            return import_stream(node, src, progress)
        except Exception as exc:
            reason = import_fault(exc)
            if reason is None:
                raise
            raise InvalidBlock(f"{path} {reason}") from None


#: How ``POST /v1/import`` names the CAR in a refusal's detail (``the CAR REASON``); the
#: CLI puts the file's name in its place.
CAR_SUBJECT = "the CAR "


class CarFault(InvalidBlock):
    """A CAR being imported is not a valid CAR, or holds a block that does not hash to
    its CID: ``reason`` says which, without naming the file."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def import_fault(exc: BaseException) -> str | None:
    """Why an import is refused when the CAR is at fault (bad input: exit 2, HTTP 400
    ``rejected``), worded without the file's name (the node does not know it): ``is
    damaged: …``, ``is not a valid CAR: …``, ``holds another dataset: …`` or ``is
    refused: …`` (a delta the dataset does not accept: a bad signature, an author who is
    not a writer, a missing parent, …). None when ``exc`` is not the CAR's fault (this
    home's store or disk)."""
    from merklog.replication.errors import ReplicationError, WrongDataset

    if isinstance(exc, CarFault):
        return exc.reason
    if isinstance(exc, WrongDataset):
        return f"holds another dataset: {exc.detail}"
    if isinstance(exc, ReplicationError):
        return f"is refused: {exc.detail}"
    return None


def read_import_car(src: BinaryIO) -> tuple[list[Link], Iterator[Block]]:
    """``read_car(src)`` of a CAR to import: its faults (not a CAR, a block that does not
    hash to its CID) raise :class:`CarFault`, not the store's own ``CIDMismatch`` (which
    means this home's store is damaged: exit 5, not the file's fault)."""
    from merklog.store.car import read_car

    try:
        roots, blocks = read_car(src)
    except (CIDMismatch, InvalidBlock) as exc:
        raise _car_fault(exc) from None
    return roots, _checked(blocks)


def _car_fault(exc: CIDMismatch | InvalidBlock) -> CarFault:
    if isinstance(exc, CIDMismatch):
        return CarFault(f"is damaged: {exc}")
    return CarFault(f"is not a valid CAR: {exc}")


def _checked(blocks: Iterable[Block]) -> Iterator[Block]:
    try:
        yield from blocks
    except (CIDMismatch, InvalidBlock) as exc:
        raise _car_fault(exc) from None


def read_input_car(src: BinaryIO, path: str | Path) -> tuple[list[Link], Iterator[Block]]:
    """``read_car(src)`` of a CAR file the user gave (``path`` names it): a block that
    does not hash to its CID, or bytes that are no CAR, are reported as that file's fault
    (``InvalidBlock`` ``"PATH REASON"``: bad input, exit 2), not as damage to the home's
    store (``CIDMismatch``, exit 5)."""
    try:
        roots, blocks = read_import_car(src)
    except CarFault as exc:
        raise InvalidBlock(f"{path} {exc.reason}") from None
    return roots, _named(blocks, path)


def _named(blocks: Iterable[Block], path: str | Path) -> Iterator[Block]:
    try:
        yield from blocks
    except CarFault as exc:
        raise InvalidBlock(f"{path} {exc.reason}") from None
