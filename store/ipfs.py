"""A block store backed by an IPFS daemon's HTTP API (``ipfshttpclient``).

Blocks are written with ``block.put`` (format dag-cbor, so the daemon names them
with the same CIDv1 merklog computes — checked on every put) and pinned, so the
daemon's garbage collector keeps them. Every read is bounded by a timeout: an
IPFS node asked for a block it lacks searches the network (or, offline, waits)
instead of answering "not found", so a timeout means :class:`BlockNotFound`.
Every block read is re-hashed; a mismatch raises :class:`CIDMismatch`.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable, Iterator

from .blockstore import BlockStore, verify
from .errors import BlockNotFound, CIDMismatch, StoreError
from .link import DAG_CBOR, RAW, Link

with warnings.catch_warnings():  # ipfshttpclient imports with deprecation noise
    warnings.simplefilter("ignore")
    import ipfshttpclient
    from ipfshttpclient import exceptions as ipfs_errors

_FORMATS = {DAG_CBOR: "dag-cbor", RAW: "raw"}


class IPFSBlockStore(BlockStore):
    """Blocks in an IPFS node, pinned on put, verified on get.

    ``timeout`` bounds every request (seconds); ``probe_timeout`` bounds the
    existence checks of ``has``/``get``, which on a missing block only end by
    timing out (the daemon is asked to give up after that long).
    """

    def __init__(
        self,
        addr: str = "/ip4/127.0.0.1/tcp/5001/http",
        timeout: float = 10,
        *,
        probe_timeout: float = 1.0,
        pin: bool = True,
    ) -> None:
        self.addr = addr
        self.timeout = timeout
        self.probe_timeout = probe_timeout
        self.pin = pin
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.client = ipfshttpclient.Client(addr=addr, timeout=timeout)
        except ipfs_errors.Error as exc:
            raise StoreError(f"cannot reach the IPFS API at {addr}: {exc}") from exc

    # ------------------------------------------------------------ helpers

    def _call(self, what: str, func, *args, **kwargs):
        """Call the client, turning transport errors into StoreError (timeouts handled by callers)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return func(*args, **kwargs)
        except ipfs_errors.TimeoutError:
            raise
        except ipfs_errors.Error as exc:
            raise StoreError(f"IPFS {what} failed at {self.addr}: {exc}") from exc

    @staticmethod
    def _timed_out(exc: Exception) -> bool:
        return isinstance(exc, ipfs_errors.TimeoutError) or (
            isinstance(exc, StoreError) and "timed out" in str(exc)
        )

    def _read_block(self, cid: Link, wait: float) -> bytes:
        """Ask the daemon for a block, giving up (BlockNotFound) after ``wait`` seconds."""
        try:
            return self._call(
                "block/get",
                self.client.block.get,
                str(cid),
                opts={"timeout": f"{int(wait * 1000)}ms"},
                timeout=wait + self.timeout,
            )
        except (ipfs_errors.TimeoutError, StoreError) as exc:
            if self._timed_out(exc) or "not found" in str(exc).lower():
                raise BlockNotFound(cid) from None
            raise

    # ------------------------------------------------------------ BlockStore

    def put_many(self, blocks: Iterable[tuple[Link, bytes]]) -> int:
        new = 0
        for cid, data in blocks:
            data = verify(cid, bytes(data), "put")
            fmt = _FORMATS.get(cid.codec)
            if fmt is None:
                raise StoreError(f"IPFS store cannot put codec 0x{cid.codec:x} blocks ({cid})")
            # "New" = not yet pinned by us (a pin lookup answers at once; a has() on an
            # absent block only ends by timing out).
            existed = bool(self._pinned(cid)) if self.pin else self.has(cid)
            result = self._call(
                "block/put", self.client.block.put, io.BytesIO(data), opts={"format": fmt}
            )
            returned = Link.parse(result["Key"])
            if returned != cid:
                raise CIDMismatch(cid, returned, f"IPFS daemon at {self.addr} named the block")
            if self.pin and not existed:
                # Direct pin: a recursive one would fetch (and hang on) linked blocks not put yet.
                self._call("pin/add", self.client.pin.add, str(cid), recursive=False)
            new += not existed
        return new

    def get(self, cid: Link) -> bytes:
        data = self._read_block(cid, self.timeout)
        return verify(cid, data, f"IPFS {self.addr}")

    def has(self, cid: Link) -> bool:
        try:
            self._call(
                "block/stat",
                self.client.block.stat,
                str(cid),
                opts={"timeout": f"{int(self.probe_timeout * 1000)}ms"},
                timeout=self.probe_timeout + self.timeout,
            )
        except (ipfs_errors.TimeoutError, StoreError) as exc:
            if self._timed_out(exc) or "not found" in str(exc).lower():
                return False
            raise
        return True

    def iter_cids(self) -> Iterator[Link]:
        """The CIDs pinned directly or recursively (what this store put and keeps)."""
        seen: set[Link] = set()
        for kind in ("direct", "recursive"):
            pins = self._call("pin/ls", self.client.pin.ls, type=kind)
            for text in pins.get("Keys", {}) or {}:
                link = Link.parse(text)
                if link not in seen:
                    seen.add(link)
                    yield link

    def delete_many(self, cids: Iterable[Link]) -> int:
        """Unpin and remove blocks; ``block/rm`` answers at once, also for absent blocks."""
        removed = 0
        for cid in cids:
            if self._pinned(cid):
                self._call("pin/rm", self.client.pin.rm, str(cid), recursive=False)
            # ipfshttpclient 0.7 has no block.rm wrapper: call the HTTP API endpoint directly.
            answers = self._call(
                "block/rm", self.client._client.request, "/block/rm", (str(cid),), decoder="json"
            )
            errors = [a["Error"] for a in answers if isinstance(a, dict) and a.get("Error")]
            if not errors:
                removed += 1
            elif not all("not found" in e for e in errors):
                raise StoreError(f"IPFS block/rm {cid} failed at {self.addr}: {errors}")
        return removed

    def _pinned(self, cid: Link) -> list[Link]:
        try:
            pins = self._call("pin/ls", self.client.pin.ls, str(cid), type="direct")
        except StoreError as exc:
            if "not pinned" in str(exc).lower():
                return []
            raise
        return [Link.parse(text) for text in (pins.get("Keys", {}) or {})]

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"IPFSBlockStore({self.addr!r})"
