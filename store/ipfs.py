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
import ipaddress
import re
import urllib.parse
import warnings
from collections.abc import Iterable, Iterator, Sequence

from .blockstore import BlockStore, verify
from .car import car_header, car_section
from .codec import encode
from .errors import BlockNotFound, CIDMismatch, StoreError, StoreUnavailable
from .link import DAG_CBOR, RAW, Link

with warnings.catch_warnings():  # ipfshttpclient imports with deprecation noise
    warnings.simplefilter("ignore")
    import ipfshttpclient
    from ipfshttpclient import exceptions as ipfs_errors

_FORMATS = {DAG_CBOR: "dag-cbor", RAW: "raw"}

#: DAG-CBOR tag 42 (a link) as it appears in encoded bytes; a block without it links nowhere.
_LINK_TAG = b"\xd8\x2a"
#: Links per pin-set block: 4096 links of ~40 bytes stay far below IPFS's 1 MiB block limit.
PINSET_LINKS = 4096
#: Blocks per ``dag/import`` request (each answered only once all are stored).
IMPORT_CHUNK = 1024
#: Extra seconds a ``dag/import`` may take per block (js-ipfs stores ~500 per CPU-second).
IMPORT_SECONDS_PER_BLOCK = 0.02
#: CIDs per ``pin/add`` request: they travel in the URL, which Node's HTTP parser caps at 16 KiB.
_PIN_ARGS = 128


class BadAPIAddress(StoreError, ValueError):
    """An IPFS API address that is neither a multiaddr nor an http(s) URL (bad input)."""


def api_multiaddr(addr: str) -> str:
    """The API multiaddr for ``addr``, given as a multiaddr or as an ``http://host:port`` URL.

    ``http://127.0.0.1:5001`` and ``http://127.0.0.1:5001/api/v0`` both become
    ``/ip4/127.0.0.1/tcp/5001/http``; a multiaddr (starting with ``/``) is kept as is
    once it checks out as ``/ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT[/http|/https]``.
    Raises :class:`BadAPIAddress` for anything else, so a typo fails before any request.
    """
    text = addr.strip()
    if text.startswith("/"):
        _check_multiaddr(text)
        return text
    url = urllib.parse.urlsplit(text)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BadAPIAddress(
            f"not an IPFS API address: {addr!r} (use http://HOST:PORT or a multiaddr)"
        )
    if url.username is not None or url.password is not None:
        # kept in config.toml in plain text and never sent (QA): refused, as peer URLs are
        raise BadAPIAddress(
            "an IPFS API address takes no user:password@ (merklog sends no credentials to"
            " the daemon): use http://HOST:PORT, and a proxy on loopback for a daemon that"
            " needs them"
        )
    try:
        port = url.port or (443 if url.scheme == "https" else 5001)
    except ValueError:
        raise BadAPIAddress(f"not an IPFS API address: {addr!r} (bad port)") from None
    try:
        ip = ipaddress.ip_address(url.hostname)
        proto = "ip4" if ip.version == 4 else "ip6"
    except ValueError:
        proto = "dns"
    return f"/{proto}/{url.hostname}/tcp/{port}/{url.scheme}"


def _check_multiaddr(text: str) -> None:
    """Raise :class:`BadAPIAddress` unless ``text`` is an API multiaddr merklog can use:
    ``/ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT`` with an optional ``/http`` or ``/https``.
    The HTTP client found out only when asked to connect ("cannot reach the IPFS API at
    /garbage: Unsupported Multiaddr pattern", exit 1 as if the daemon were down)."""
    parts = text.strip("/").split("/")
    usage = "(use http://HOST:PORT or a multiaddr /ip4/HOST/tcp/PORT/http)"
    if len(parts) not in (4, 5) or parts[0] not in _HOST_PROTOCOLS or parts[2] != "tcp":
        raise BadAPIAddress(f"not an IPFS API address: {text!r} {usage}")
    proto, host, _tcp, port, *scheme = parts
    if scheme and scheme[0] not in ("http", "https"):
        raise BadAPIAddress(
            f"not an IPFS API address: {text!r} (/{scheme[0]}: only /http or /https)"
        )
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise BadAPIAddress(f"not an IPFS API address: {text!r} (bad port {port!r})")
    if proto in ("ip4", "ip6"):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is None or ip.version != int(proto[-1]):
            raise BadAPIAddress(f"not an IPFS API address: {text!r} (bad {proto} address {host!r})")
    elif not host:
        raise BadAPIAddress(f"not an IPFS API address: {text!r} (no host name)")


#: The first protocol of an API multiaddr: where the daemon is.
_HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")


def _reason(exc: Exception) -> str:
    """The short cause of a client error ("Connection refused", the daemon's message)."""
    text = str(exc)
    match = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if match:
        return match.group(1).strip()
    return text if len(text) <= 200 else text[:200] + "…"


def _field(answer: object, key: str) -> object:
    """``answer[key]`` of a JSON object answer, None if the answer is not one (garbage)."""
    try:
        return answer[key]  # type: ignore[index]
    except (KeyError, TypeError, IndexError):
        return None


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
        except ipfs_errors.ConnectionError as exc:
            # what to do first: "IPFS version failed at ADDR: daemon not reachable" read as
            # an IPFS fault, not as a daemon to start
            raise StoreUnavailable(
                f"the IPFS daemon at {self.addr} is not reachable ({_reason(exc)}; asked for"
                f" {what}): start it, or set store.ipfs_api to where it listens"
            ) from exc
        except ipfs_errors.ErrorResponse as exc:  # the daemon answered, refusing
            raise StoreError(f"IPFS {what} failed at {self.addr}: {_reason(exc)}") from exc
        except ipfs_errors.StatusError as exc:
            status = getattr(getattr(exc.original, "response", None), "status_code", None)
            if status in (404, 405, 501):  # an HTTP server, but no /api/v0 here (QA: exit 4)
                raise BadAPIAddress(
                    f"{self.addr} answers HTTP but is no IPFS RPC API (HTTP {status} for"
                    f" /api/v0/{what}; is it the daemon's gateway port?): set store.ipfs_api"
                    " to the daemon's API address (its config's Addresses.API)"
                ) from exc
            raise StoreUnavailable(f"IPFS {what} failed at {self.addr}: {_reason(exc)}") from exc
        except ipfs_errors.Error as exc:  # garbage, a broken stream: not an IPFS API answer
            raise StoreUnavailable(f"IPFS {what} failed at {self.addr}: {_reason(exc)}") from exc

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

    def ping(self) -> str:
        """The daemon's version; StoreError (within ``timeout``) if it does not answer sanely."""
        try:
            answer = self._call("version", self.client.version)
        except ipfs_errors.TimeoutError:
            raise StoreUnavailable(
                f"IPFS daemon at {self.addr} did not answer in {self.timeout}s"
            ) from None
        version = _field(answer, "Version")
        if not isinstance(version, str):
            raise StoreUnavailable(
                f"IPFS API at {self.addr} answered garbage to /version: {answer!r:.80}"
            )
        return version

    def import_blocks(self, blocks: Sequence[tuple[Link, bytes]]) -> None:
        """Write and pin many blocks: ``dag/import`` of CARs of ``IMPORT_CHUNK`` blocks,
        plus ``pin/add`` for the blocks that link elsewhere.

        Each CAR carries its blocks plus a pin-set block listing the link-free ones; the
        CAR's root is that pin-set block, which the daemon pins recursively (cheap: one
        level deep). Blocks that link elsewhere (deltas link their parents, a fact may
        hold a link value) are pinned directly instead, so the daemon never walks (or,
        offline, waits for) anything beyond this batch. The daemon answers a
        ``dag/import`` only once it stored the whole CAR, so each request may take
        ``timeout`` plus ``IMPORT_SECONDS_PER_BLOCK`` per block. Raises StoreError
        (StoreUnavailable for a daemon that is down, slow or answers garbage) if any
        step fails or the daemon does not confirm every root; blocks it did store are
        harmless (content-addressed, re-imported by a retry).
        """
        for start in range(0, len(blocks), IMPORT_CHUNK):
            chunk = blocks[start : start + IMPORT_CHUNK]
            leaves = [cid for cid, data in chunk if _LINK_TAG not in data]
            pinsets = []
            for i in range(0, len(leaves), PINSET_LINKS):
                data = encode({"merklog": "pinset", "blocks": leaves[i : i + PINSET_LINKS]})
                pinsets.append((Link.for_dag_cbor(data), data))
            roots = [cid for cid, _ in pinsets]

            def car(chunk=chunk, roots=roots, pinsets=pinsets) -> Iterator[bytes]:
                yield car_header(roots)
                for cid, data in chunk:
                    yield car_section(cid, data)
                for cid, data in pinsets:
                    yield car_section(cid, data)

            self._dag_import(car(), roots, self.timeout + IMPORT_SECONDS_PER_BLOCK * len(chunk))
        if self.pin:
            self.pin_direct([cid for cid, data in blocks if _LINK_TAG in data])

    def _dag_import(self, chunks: Iterator[bytes], roots: list[Link], timeout: float) -> None:
        from ipfshttpclient import multipart

        body, headers = multipart.stream_bytes(chunks)
        try:
            answer = self._call(
                "dag/import",
                self.client._client.request,
                "/dag/import",
                decoder="json",
                data=body,
                headers=headers,
                opts={"pin-roots": "true" if self.pin else "false"},
                timeout=timeout,
            )
        except ipfs_errors.TimeoutError:
            raise StoreUnavailable(
                f"IPFS daemon at {self.addr} did not answer dag/import in {timeout:.0f}s"
            ) from None
        if not self.pin or not roots:
            return
        pinned: set[Link] = set()
        try:
            for item in answer:
                root = item["Root"]
                if root.get("PinErrorMsg"):
                    # The daemon failed on its side (one shutting down says "Database is
                    # not open"): nothing is kept here, and a retry may succeed.
                    raise StoreUnavailable(
                        f"IPFS daemon at {self.addr} could not pin {root['Cid']['/']}: "
                        f"{root['PinErrorMsg']}"
                    )
                pinned.add(Link.parse(root["Cid"]["/"]))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StoreUnavailable(
                f"IPFS API at {self.addr} answered dag/import with garbage: {answer!r:.120}"
            ) from exc
        if not set(roots) <= pinned:
            raise StoreUnavailable(
                f"IPFS daemon at {self.addr} confirmed {len(pinned & set(roots))} of "
                f"{len(roots)} pinned roots after dag/import"
            )

    def pin_direct(self, cids: Sequence[Link]) -> None:
        """Pin blocks directly (already on the daemon), ``_PIN_ARGS`` per request."""
        for i in range(0, len(cids), _PIN_ARGS):
            chunk = [str(c) for c in cids[i : i + _PIN_ARGS]]
            try:
                answer = self._call("pin/add", self.client.pin.add, *chunk, recursive=False)
            except ipfs_errors.TimeoutError:
                raise StoreUnavailable(
                    f"IPFS daemon at {self.addr} did not answer pin/add in {self.timeout}s"
                ) from None
            got = _field(answer, "Pins")
            if not isinstance(got, list) or len(got) != len(chunk):
                raise StoreUnavailable(
                    f"IPFS API at {self.addr} answered pin/add with garbage: {answer!r:.120}"
                )

    def unpin(self, cids: Iterable[Link]) -> None:
        """Remove direct pins (absent pins are fine); the daemon's GC may then drop the blocks."""
        for cid in cids:
            if self._pinned(cid):
                self._call("pin/rm", self.client.pin.rm, str(cid), recursive=False)

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

    def get_held(self, cid: Link) -> bytes:
        """``get`` within the existence probe's bound (see :meth:`BlockStore.get_held`)."""
        return self.get(cid, self.probe_timeout)

    def get(self, cid: Link, wait: float | None = None) -> bytes:
        """The verified block; BlockNotFound once the daemon has looked for ``wait``
        seconds (default ``timeout``) without finding it."""
        data = self._read_block(cid, self.timeout if wait is None else wait)
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
