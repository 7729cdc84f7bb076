"""CAR v1 (Content Addressable aRchive): streaming encode and decode.

A CAR is a varint-prefixed DAG-CBOR header ``{"roots": [CID…], "version": 1}``
followed by sections ``varint(len(cid) + len(data)) ‖ cid ‖ data``. It is the
interchange format of merklog and the wire format of sync, so both sides work
incrementally: the writer yields bytes per block and the decoder accepts chunks
of any size, holding at most one section in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO

from .blockstore import verify
from .codec import decode, encode
from .errors import InvalidBlock
from .link import Link, uvarint

#: A section larger than this is rejected before it is buffered (DoS guard). As large as
#: the largest block a peer accepts (replication's ``RECEIVE_MAX_SECTION``, checked as a
#: pair there): a block a replica holds must go through export, import and restore (QA:
#: a 5 MB fact of an older writer, accepted by sync, made every CAR of the dataset
#: unreadable at 4 MiB).
DEFAULT_MAX_SECTION = (16 << 20) + 4096


def car_header(roots: Iterable[Link]) -> bytes:
    """The varint-prefixed header of a CAR with these roots."""
    header = encode({"roots": list(roots), "version": 1})
    return uvarint(len(header)) + header


def car_section(cid: Link, data: bytes) -> bytes:
    """One varint-prefixed block section."""
    return uvarint(len(cid.raw) + len(data)) + cid.raw + data


def iter_car(roots: Iterable[Link], blocks: Iterable[tuple[Link, bytes]]) -> Iterator[bytes]:
    """Yield a CAR as byte chunks (header, then one chunk per block)."""
    yield car_header(roots)
    for cid, data in blocks:
        yield car_section(cid, data)


def write_car(out: BinaryIO, roots: Iterable[Link], blocks: Iterable[tuple[Link, bytes]]) -> int:
    """Write a CAR to a binary stream; return the number of blocks written."""
    out.write(car_header(roots))
    count = 0
    for cid, data in blocks:
        out.write(car_section(cid, data))
        count += 1
    return count


def _cid_length(buf: bytes | bytearray, start: int) -> int:
    """Length in bytes of the binary CIDv1 beginning at ``start`` (raises InvalidBlock)."""
    pos = start
    for _ in range(3):  # version, codec, multihash code
        while True:
            if pos >= len(buf):
                raise InvalidBlock("CAR section ends inside its CID")
            byte = buf[pos]
            pos += 1
            if not byte & 0x80:
                break
    size = shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidBlock("CAR section ends inside its CID")
        byte = buf[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    if buf[start] != 0x01:
        raise InvalidBlock("CAR section holds a CID that is not CIDv1")
    return pos - start + size


class CarDecoder:
    """Push-based CAR v1 decoder: ``feed`` chunks, get verified ``(cid, data)`` blocks.

    Every block is re-hashed against its CID (CIDMismatch on failure). ``roots``
    is available once the header has been read; ``close`` checks nothing is left over.
    """

    def __init__(self, max_section: int = DEFAULT_MAX_SECTION, verify_blocks: bool = True) -> None:
        self._buf = bytearray()
        self._max_section = max_section
        self._verify = verify_blocks
        self.roots: list[Link] | None = None
        self.blocks_read = 0
        self.bytes_read = 0

    def _read_varint(self) -> tuple[int, int] | None:
        value = shift = 0
        for i, byte in enumerate(self._buf):
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, i + 1
            shift += 7
            if shift > 63:
                raise InvalidBlock("CAR varint too long")
        return None

    def feed(self, chunk: bytes) -> list[tuple[Link, bytes]]:
        """Consume bytes; return the blocks completed by them (possibly none)."""
        self._buf += chunk
        self.bytes_read += len(chunk)
        out: list[tuple[Link, bytes]] = []
        while True:
            head = self._read_varint()
            if head is None:
                return out
            length, offset = head
            if length == 0:
                raise InvalidBlock("CAR section of length zero")
            if length > self._max_section:
                raise InvalidBlock(
                    f"CAR section of {length} bytes exceeds the {self._max_section}-byte limit"
                )
            if len(self._buf) < offset + length:
                return out
            section = bytes(self._buf[offset : offset + length])
            del self._buf[: offset + length]
            if self.roots is None:
                self.roots = self._parse_header(section)
                continue
            cid_len = _cid_length(section, 0)
            if cid_len > len(section):
                raise InvalidBlock("CAR section shorter than its CID")
            try:
                cid = Link(section[:cid_len])
            except ValueError as exc:
                raise InvalidBlock(f"CAR section holds a malformed CID: {exc}") from exc
            data = section[cid_len:]
            if self._verify:
                verify(cid, data, "CAR")
            self.blocks_read += 1
            out.append((cid, data))

    @staticmethod
    def _parse_header(section: bytes) -> list[Link]:
        header = decode(section)
        if not isinstance(header, dict) or header.get("version") != 1:
            raise InvalidBlock("not a CAR v1 header (version must be 1)")
        roots = header.get("roots")
        if not isinstance(roots, list) or not all(isinstance(r, Link) for r in roots):
            raise InvalidBlock("CAR header 'roots' must be a list of CIDs")
        return roots

    def close(self) -> None:
        """Raise InvalidBlock if the stream ended mid-section or before the header."""
        if self.roots is None:
            raise InvalidBlock("CAR stream ended before its header")
        if self._buf:
            raise InvalidBlock(f"CAR stream ended inside a section ({len(self._buf)} stray bytes)")


def read_car(
    source: BinaryIO, chunk_size: int = 1 << 16, max_section: int = DEFAULT_MAX_SECTION
) -> tuple[list[Link], Iterator[tuple[Link, bytes]]]:
    """Read a CAR from a binary stream: ``(roots, blocks)`` where blocks is a lazy iterator."""
    decoder = CarDecoder(max_section=max_section)
    pending: list[tuple[Link, bytes]] = []
    while decoder.roots is None:
        chunk = source.read(chunk_size)
        if not chunk:
            decoder.close()
        pending.extend(decoder.feed(chunk))

    def blocks() -> Iterator[tuple[Link, bytes]]:
        yield from pending
        while True:
            chunk = source.read(chunk_size)
            if not chunk:
                decoder.close()
                return
            yield from decoder.feed(chunk)

    return decoder.roots, blocks()
