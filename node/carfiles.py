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
    """(roots = heads, blocks = genesis then every delta with its facts, in clock order)."""

    def blocks() -> Iterable[tuple[Link, bytes]]:
        yield genesis, store.get(genesis)
        yield from replica.missing_for([replica.dataset])

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


def import_car(
    node: Owner, path: str | Path, progress: Callable[[int], None] | None = None
) -> dict[str, int]:
    """Verify and apply the blocks of the CAR file at ``path`` (see :func:`import_blocks`)."""
    def counted(blocks: Iterable[tuple[Link, bytes]]) -> Iterable[tuple[Link, bytes]]:
        for i, block in enumerate(blocks, 1):
            if progress is not None and i % 1000 == 0:
                progress(i)
            yield block

    from merklog.replication.errors import WrongDataset

    with open(path, "rb") as src:
        _roots, blocks = read_input_car(src, path)
        try:
            return import_blocks(node, counted(blocks))
        except WrongDataset as exc:  # the file's fault: bad input, as through a node (400)
            raise InvalidBlock(f"{path} holds another dataset: {exc}") from None


def read_input_car(src: BinaryIO, path: str | Path) -> tuple[list[Link], Iterator[Block]]:
    """``read_car(src)`` of a CAR file the user gave (``path`` names it): a block that
    does not hash to its CID is reported as that file's fault (``InvalidBlock``: bad
    input, exit 2), not as damage to the home's store (``CIDMismatch``, exit 5)."""
    from merklog.store.car import read_car

    try:
        roots, blocks = read_car(src)
    except CIDMismatch as exc:
        raise InvalidBlock(f"{path} is damaged: {exc}") from None
    return roots, _verified(blocks, path)


def _verified(blocks: Iterable[Block], path: str | Path) -> Iterator[Block]:
    try:
        yield from blocks
    except CIDMismatch as exc:
        raise InvalidBlock(f"{path} is damaged: {exc}") from None
