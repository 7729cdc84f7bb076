"""``Link``: a CIDv1 value held as its raw binary form.

``multiformats.CID`` is correct but slow to build and compare; facts and deltas
hold millions of links, so merklog keeps the 36 raw bytes (version, codec,
multihash) in a small hashable object and converts only at the edges.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING, Any

import libipld

from .errors import InvalidValue

if TYPE_CHECKING:  # multiformats costs ~0.2 s to import: only the slow paths need it
    from multiformats import CID

DAG_CBOR = 0x71
RAW = 0x55
SHA2_256 = 0x12

_DAG_CBOR_PREFIX = bytes([0x01, DAG_CBOR, SHA2_256, 0x20])
_SHA256_HEADER = bytes([SHA2_256, 0x20])


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise InvalidValue("truncated varint in CID")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:  # QA: read as the shorter CID by peers' decoders
                raise InvalidValue("non-minimal varint in CID")
            return value, pos
        shift += 7
        if shift > 63:
            raise InvalidValue("varint too long in CID")


#: Whether multiformats knows a multicodec / multihash code (cached: a lookup is ~20 µs).
_KNOWN_CODECS: dict[int, bool] = {}
_KNOWN_HASHES: dict[int, bool] = {}


def _check_readable(codec: int, code: int) -> None:
    """InvalidValue unless every merklog peer's decoder can read a CID of ``codec`` and
    multihash ``code``: a fact holding one that some decoder refuses is refused by every
    peer, which stopped the dataset's sync for good (QA: ``cid"bagm3gaqaaf5a"``, codec
    0x9999, was written, then refused by every receiver and by the writer's own reads).
    The reference DAG-CBOR decoder reads CIDs through multiformats' tables."""
    from multiformats import multicodec, multihash

    known = _KNOWN_CODECS.get(codec)
    if known is None:
        known = _KNOWN_CODECS[codec] = _known(multicodec.get, codec)
    if not known:
        raise InvalidValue(f"CID codec 0x{codec:x} is no codec merklog peers can read")
    known = _KNOWN_HASHES.get(code)
    if known is None:
        known = _KNOWN_HASHES[code] = _known(multihash.get, code)
    if not known:
        raise InvalidValue(f"CID multihash 0x{code:x} is no hash merklog peers can read")


def _known(get: Any, code: int) -> bool:
    try:
        get(code=code)
    except Exception:  # multiformats' KeyError subclasses
        return False
    return True


class Link:
    """A CIDv1 (any codec and multihash multiformats knows) compared and hashed by its raw
    bytes."""

    __slots__ = ("raw", "_hash")

    def __init__(self, raw: bytes | str) -> None:
        """A link from a CID's binary form, or from its text (``Link("bafy…")`` is
        :meth:`parse`); :class:`InvalidValue` for anything that is not a CIDv1."""
        if isinstance(raw, str):
            parsed = Link.parse(raw)
            self.raw, self._hash = parsed.raw, parsed._hash
            return
        if not isinstance(raw, bytes | bytearray | memoryview):  # bytes(5) is 5 zero bytes
            raise InvalidValue(
                f"a Link is a CID string (bafy…) or a CID's bytes, got {type(raw).__name__}"
            )
        raw = bytes(raw)
        version, pos = _varint(raw, 0)
        if version != 1:
            raise InvalidValue(f"only CIDv1 links are supported, got version {version}")
        codec, pos = _varint(raw, pos)
        code, pos = _varint(raw, pos)
        size, pos = _varint(raw, pos)
        if len(raw) - pos != size:
            raise InvalidValue("CID multihash length does not match its digest")
        _check_readable(codec, code)
        self.raw = raw
        self._hash = hash(raw)

    @classmethod
    def _trusted(cls, raw: bytes) -> Link:
        link = cls.__new__(cls)
        link.raw = raw
        link._hash = hash(raw)
        return link

    @classmethod
    def for_dag_cbor(cls, data: bytes) -> Link:
        """The CIDv1 (dag-cbor, sha2-256) of an encoded block."""
        return cls._trusted(_DAG_CBOR_PREFIX + hashlib.sha256(data).digest())

    @classmethod
    def dag_cbor_links(cls, digests: bytes) -> list[Link]:
        """The CIDv1 (dag-cbor, sha2-256) links of sha2-256 digests given back to back
        (32 bytes each): any 32 bytes make a valid such CID, so nothing is parsed. For
        CIDs computed elsewhere and sent as one blob (``put -f``'s helper, ADR 0147)."""
        if len(digests) % 32:
            raise InvalidValue("sha2-256 digests are 32 bytes each")
        trusted, prefix = cls._trusted, _DAG_CBOR_PREFIX
        return [trusted(prefix + digests[i : i + 32]) for i in range(0, len(digests), 32)]

    @staticmethod
    def dag_cbor_digests(links: list[Link]) -> bytes:
        """The sha2-256 digests of CIDv1 dag-cbor links, back to back: the inverse of
        :meth:`dag_cbor_links` (raises InvalidValue for a link of another kind)."""
        raws = [link.raw for link in links]
        if {raw[:4] for raw in raws} - {_DAG_CBOR_PREFIX} or {len(raw) for raw in raws} - {36}:
            raise InvalidValue("not every link is a CIDv1 dag-cbor sha2-256 link")
        return b"".join([raw[4:] for raw in raws])

    @classmethod
    def for_block(cls, data: bytes, codec: int) -> Link:
        """The CIDv1 (given codec, sha2-256) of a block's bytes."""
        if codec == DAG_CBOR:
            return cls.for_dag_cbor(data)
        prefix = bytes([0x01]) + uvarint(codec) + bytes([SHA2_256, 0x20])
        return cls._trusted(prefix + hashlib.sha256(data).digest())

    @classmethod
    def parse(cls, text: str) -> Link:
        """Parse a base32 (``b…``) CIDv1 string, or any multibase a CID accepts.

        A base32 string must be the one way to write its CID (lowercase, unused trailing
        bits zero): ``…wwz`` read as the CID written ``…wwy``, so one block answered to
        two names, and a not-found message echoed a CID other than the one typed."""
        if not isinstance(text, str):
            raise InvalidValue(f"expected a CID string, got {type(text).__name__}")
        if text.startswith("b") and text.isalnum():
            body = text[1:].upper()
            try:
                raw = base64.b32decode(body + "=" * (-len(body) % 8))
            except ValueError as exc:
                raise InvalidValue(f"not a base32 CID: {text!r}") from exc
            link = cls(raw)
            if str(link) != text:
                raise InvalidValue(f"not a canonical base32 CID: {text!r} (written {link})")
            return link
        from multiformats import CID

        try:
            return cls.from_cid(CID.decode(text))
        except Exception as exc:  # multiformats raises several error types
            if text.startswith("Qm") and len(text) == 46:  # said only "not a CID" (QA)
                raise InvalidValue(
                    f"not a CID merklog takes: {text!r} is a CIDv0 (base58, Qm…); write it as"
                    " a CIDv1 (`ipfs cid format -v 1 -b base32 CID` gives bafy…)"
                ) from exc
            raise InvalidValue(f"not a CID: {text!r}") from exc

    @classmethod
    def from_cid(cls, cid: CID) -> Link:
        return cls(bytes(cid))

    def to_cid(self) -> CID:
        from multiformats import CID

        return CID.decode(self.raw)

    @property
    def codec(self) -> int:
        _version, pos = _varint(self.raw, 0)
        codec, _ = _varint(self.raw, pos)
        return codec

    @property
    def digest(self) -> bytes:
        """The multihash digest (the hash bytes without code and length)."""
        return self.to_cid().digest

    def verifies(self, data: bytes) -> bool:
        """True iff ``data`` hashes to this CID (sha2-256 links only; others never verify)."""
        raw = self.raw
        if len(raw) == 36 and raw[0] == 0x01 and raw[1] < 0x80 and raw[2:4] == _SHA256_HEADER:
            return raw[4:] == hashlib.sha256(data).digest()  # CIDv1, one-byte codec: the hot path
        _version, pos = _varint(self.raw, 0)
        _codec, pos = _varint(self.raw, pos)
        if self.raw[pos : pos + 2] != bytes([SHA2_256, 0x20]):
            return False
        return self.raw[pos + 2 :] == hashlib.sha256(data).digest()

    def __bytes__(self) -> bytes:
        """The CID's binary form (``raw``): ``Link(bytes(link)) == link``."""
        return self.raw

    def __str__(self) -> str:
        # libipld renders a CIDv1 as multibase base32 in C (~30x faster than base64's
        # pure-Python b32encode: ``put`` prints one CID per fact).
        text = libipld.encode_cid(self.raw)
        if text[:1] == "b":
            return text
        return "b" + base64.b32encode(self.raw).decode("ascii").lower().rstrip("=")

    @staticmethod
    def texts(links: list[Link]) -> list[str]:
        """``str(link)`` of each link: CIDv1s rendered by libipld in one pass over them
        (``put`` prints one CID per fact; ~0.3 against ~0.8 µs a CID)."""
        texts = list(map(libipld.encode_cid, [link.raw for link in links]))
        if "".join([text[:1] for text in texts]) == "b" * len(texts):
            return texts
        return [str(link) for link in links]

    def __repr__(self) -> str:
        return f"Link({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Link) and other.raw == self.raw

    def __lt__(self, other: Link) -> bool:
        return self.raw < other.raw

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (Link, (self.raw,))


def uvarint(value: int) -> bytes:
    """Unsigned LEB128 varint, as multiformats and CAR use it."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
