"""CAR streams on the wire: spooling with a digest, and decoding with replication errors.

Both sides of sync hold at most one CAR section in memory: bodies are spooled
to a temporary file (memory up to 1 MiB, then disk) while their sha256 is
computed, then decoded block by block.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from merklog.store import CIDMismatch, InvalidBlock, Link, StoreError
from merklog.store.car import CarDecoder, car_header, car_section
from merklog.store.errors import one_line

from .blocks import fast_verifies
from .errors import CIDMismatchError, MalformedBlock, ReplicationError, TooLarge

SPOOL_MEMORY = 1 << 20
CHUNK = 1 << 16


@dataclass
class Spooled:
    """A spooled body: the file (rewound), its sha256 hex, size, and block payload bytes."""

    file: IO[bytes]
    digest: str
    size: int
    blocks: int = 0
    block_bytes: int = 0


def spool_car(roots: Iterable[Link], blocks: Iterable[tuple[Link, bytes]]) -> Spooled:
    """Write a CAR into a spooled temp file, hashing as it goes."""
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)
    digest = hashlib.sha256()
    size = count = payload = 0
    buf = bytearray(car_header(roots))
    for cid, data in blocks:
        buf += car_section(cid, data)
        count += 1
        payload += len(data)
        if len(buf) >= CHUNK:
            digest.update(buf)
            out.write(buf)
            size += len(buf)
            buf.clear()
    digest.update(buf)
    out.write(buf)
    size += len(buf)
    out.seek(0)
    return Spooled(out, digest.hexdigest(), size, count, payload)


def spool_deltas(
    roots: Iterable[Link],
    blocks_for: Callable[[list[Link]], Iterable[tuple[Link, bytes]]],
    deltas: list[Link],
    limit: int,
) -> tuple[Spooled, int]:
    """A CAR of whole deltas (each with its fact blocks) from the front of ``deltas``
    until ``limit`` bytes are reached, at least one: (spooled CAR, deltas taken)."""
    taken = 0
    size = 0

    def blocks() -> Iterator[tuple[Link, bytes]]:
        nonlocal taken, size
        for delta in deltas:
            if taken and size >= limit:
                return
            for cid, data in blocks_for([delta]):
                size += len(data) + len(cid.raw) + 8
                yield cid, data
            taken += 1

    return spool_car(roots, blocks()), taken


def _translate(exc: Exception) -> ReplicationError:
    if isinstance(exc, ReplicationError):
        return exc
    if isinstance(exc, CIDMismatch):
        return CIDMismatchError(str(exc))
    if isinstance(exc, InvalidBlock) and "exceeds" in str(exc):
        return TooLarge(str(exc))
    return MalformedBlock(f"malformed CAR: {one_line(exc)}")


class CarReader:
    """Decode a CAR from a file object, raising ReplicationErrors; ``roots`` after ``open``."""

    def __init__(self, source: IO[bytes], max_section: int) -> None:
        self.source = source
        # Blocks are re-hashed here with the fast dag-cbor path instead of in the decoder.
        self.decoder = CarDecoder(max_section=max_section, verify_blocks=False)
        self._pending: list[tuple[Link, bytes]] = []
        self.roots: list[Link] = []

    def read_header(self) -> list[Link]:
        try:
            while self.decoder.roots is None:
                chunk = self.source.read(CHUNK)
                if not chunk:
                    self.decoder.close()
                self._pending.extend(self.decoder.feed(chunk))
        except (StoreError, ValueError) as exc:
            raise _translate(exc) from exc
        self.roots = list(self.decoder.roots)
        return self.roots

    def blocks(self) -> Iterator[tuple[Link, bytes]]:
        if self.decoder.roots is None:
            self.read_header()
        for cid, data in self._pending:
            if not fast_verifies(cid, data):
                raise CIDMismatchError(f"CAR block does not hash to {cid}")
            yield cid, data
        self._pending = []
        while True:
            try:
                chunk = self.source.read(CHUNK)
                if not chunk:
                    self.decoder.close()
                    return
                got = self.decoder.feed(chunk)
            except (StoreError, ValueError) as exc:
                raise _translate(exc) from exc
            for cid, data in got:
                if not fast_verifies(cid, data):
                    raise CIDMismatchError(f"CAR block does not hash to {cid}")
                yield cid, data
