"""aiohttp side of sync for the calling peer: pull, push, sync (both ways), clone.

``sync`` is two round trips in the common case: one ``POST …/sync`` carrying our
heads and a small summary (the server answers with a CAR of what we lack, its
heads as roots), then, if the server lacks some of ours, one ``POST …/push``.
When the summary does not cover how far we diverged the server answers 409
``need_summary`` and we resend with an 8× larger window (then the full log), so
the fallback costs O(log n) round trips, never one per DAG level.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from merklog.store import BlockStore, Link
from merklog.store.errors import one_line

from .auth import EMPTY_DIGEST, sign_headers
from .errors import (
    PLAIN_HTTP_HINT,
    PeerError,
    PeerRefused,
    PeerUnreachable,
    PeerUntrusted,
    ReplicationError,
    TooLarge,
    cannot_reach,
    unreachable_reason,
)
from .identity import Identity
from .limits import (
    RECEIVE_MAX_BODY,
    RECEIVE_MAX_SECTION,
    WRITE_MAX_BATCH_BYTES,
    WRITE_MAX_BLOCK_REQUEST,
)
from .metrics import Metrics
from .replica import ApplyResult, Replica, Summary
from .wire import SPOOL_MEMORY, CarReader, spool_deltas

#: ``progress("pull" | "push", body bytes so far, deltas so far)``.
Progress = Callable[[str, int, int], None]
#: ``progress(blocks so far, block bytes so far)`` of a block fetch.
BlockProgress = Callable[[int, int], None]

#: Body bytes between two progress calls while a sync response arrives.
PROGRESS_STEP = 1 << 20
#: Deltas accepted between two progress calls while a pulled response is applied.
PROGRESS_DELTAS = 1000

INITIAL_WINDOW = 8
FULL_WINDOW_AFTER = 1 << 16


@dataclass
class SyncStats:
    """What one pull/push/sync cost and achieved (all byte counts are HTTP bodies)."""

    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    block_bytes_received: int = 0
    block_bytes_sent: int = 0
    deltas_received: int = 0
    deltas_pushed: int = 0
    accepted: int = 0
    #: Deltas the peer lacks that this replica cannot send: kept here only as a snapshot's
    #: metadata (pruned, or bootstrapped from a snapshot), and those built on them.
    held_back: int = 0

    def __iadd__(self, other: SyncStats) -> SyncStats:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


class SyncClient:
    """Signed requests to peers' sync endpoints on behalf of ``identity``."""

    def __init__(
        self,
        identity: Identity,
        session: aiohttp.ClientSession | None = None,
        *,
        timeout: float = 60.0,
        max_body: int = RECEIVE_MAX_BODY,
        max_block: int = RECEIVE_MAX_SECTION,
        max_batch: int = WRITE_MAX_BATCH_BYTES,
        metrics: Metrics | None = None,
        compress: bool = True,
        progress: Progress | None = None,
        progress_deltas: int = PROGRESS_DELTAS,
    ) -> None:
        self.identity = identity
        self.compress = compress
        self._session = session
        self._own_session = session is None
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.max_body = max_body
        self.max_block = max_block
        self.max_batch = max_batch
        #: ``progress(direction, bytes so far, deltas so far)`` after each request body,
        #: every ``PROGRESS_STEP`` bytes of a response arriving, and every
        #: ``progress_deltas`` deltas accepted while a pulled response is applied (it
        #: commits as a whole at its end: a large one takes seconds).
        self.progress = progress
        self.progress_deltas = max(1, progress_deltas)
        self.metrics = metrics if metrics is not None else Metrics()

    async def __aenter__(self) -> SyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ requests

    @asynccontextmanager
    async def _request(
        self, method: str, url: str, **kw: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One HTTP exchange; network failures become :class:`PeerUnreachable`."""
        try:
            async with self.session.request(method, url, timeout=self.timeout, **kw) as resp:
                yield resp
        except aiohttp.ClientConnectorCertificateError as exc:  # before its parent class
            raise PeerUntrusted.for_url(_base(url), exc.certificate_error) from None
        except aiohttp.ClientConnectorSSLError as exc:  # also before ClientConnectorError
            # The TLS handshake itself failed (a peer serving plain HTTP answers an
            # https:// URL with WRONG_VERSION_NUMBER): a configuration to fix, not a peer
            # to retry.
            raise PeerError(f"{cannot_reach(_base(url), exc)}; {PLAIN_HTTP_HINT}") from None
        except aiohttp.ClientConnectorError as exc:
            raise PeerUnreachable.for_url(_base(url), exc) from None
        except TimeoutError:
            raise PeerUnreachable(
                f"peer {_base(url)} did not answer within {self.timeout.total} s", status=504
            ) from None
        except aiohttp.ClientPayloadError:
            raise PeerUnreachable(
                f"peer {_base(url)} cut its answer off part way: the peer stopped it (its log"
                " says why, e.g. a damaged store), or the connection broke"
            ) from None
        except aiohttp.ClientError as exc:
            # in plain words ("connection reset by peer"), not "[Errno 104] Connection …"
            raise PeerUnreachable(
                f"peer {_base(url)} failed mid-request: {unreachable_reason(exc)}"
            ) from None

    @asynccontextmanager
    async def _post_json(
        self, url: str, path: str, body: bytes
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A signed ``POST`` of a JSON ``body`` to ``path`` on the peer at ``url``; any
        status but 200 raises the peer's error (:meth:`_error`)."""
        headers = self._headers("POST", path, _sha256(body))
        headers["Content-Type"] = "application/json"
        async with self._request("POST", url.rstrip("/") + path, data=body, headers=headers) as r:
            if r.status != 200:
                raise await self._error(r)
            yield r

    def _headers(self, method: str, path: str, digest: str = EMPTY_DIGEST) -> dict[str, str]:
        return sign_headers(self.identity, method, path, digest)

    @staticmethod
    async def _error(resp: aiohttp.ClientResponse) -> PeerError:
        """The peer's error answer as an exception: a 4xx (but 408/429: try again) is a
        refusal (:class:`PeerRefused`); a 502, 503 or 504 says the peer (or what it
        depends on, an IPFS daemon) cannot serve now, as good as unreachable
        (:class:`PeerUnreachable`: worth retrying); anything else a :class:`PeerError`."""
        text = await resp.text()
        try:
            obj = json.loads(text)
            code, detail = str(obj["error"]), one_line(obj.get("detail", ""), 1000)
        except (ValueError, KeyError, TypeError):
            # Not a merklog peer (an HTML error page): a short excerpt on one line.
            code, detail = "http_error", one_line(text, markup=True)
        refused = 400 <= resp.status < 500 and resp.status not in (408, 429)
        unavailable = resp.status in (502, 503, 504)
        kind = PeerRefused if refused else PeerUnreachable if unavailable else PeerError
        return kind(
            f"{resp.url}: HTTP {resp.status} {code}: {detail}", code=code, status=resp.status
        )

    async def heads(self, url: str, dataset: Link) -> list[Link]:
        path = f"/v1/datasets/{dataset}/heads"
        async with self._request(
            "GET", url.rstrip("/") + path, headers=self._headers("GET", path)
        ) as resp:
            if resp.status != 200:
                raise await self._error(resp)
            obj = await resp.json()
        return [Link.parse(h) for h in obj["heads"]]

    async def genesis(self, url: str, dataset: Link) -> bytes:
        path = f"/v1/datasets/{dataset}/genesis"
        async with self._request(
            "GET", url.rstrip("/") + path, headers=self._headers("GET", path)
        ) as resp:
            if resp.status != 200:
                raise await self._error(resp)
            data = await resp.read()
        if not dataset.verifies(data):
            raise PeerError(f"{url} sent a genesis block that does not hash to {dataset}")
        return data

    async def clone(
        self, url: str, dataset: Link, conn_or_path: Any, blockstore: BlockStore
    ) -> tuple[Replica, SyncStats]:
        """Start following ``dataset`` from a peer: fetch its genesis, open a replica, pull."""
        data = await self.genesis(url, dataset)
        replica = await asyncio.to_thread(
            Replica.open, conn_or_path, blockstore, self.identity, dataset, data
        )
        stats = await self.pull(url, replica)
        stats.round_trips += 1
        return replica, stats

    async def pull(self, url: str, replica: Replica) -> SyncStats:
        """Fetch and apply every block the peer has and we lack; ``stats`` + peer heads."""
        stats, _ = await self._pull(url, replica)
        return stats

    async def pull_heads(self, url: str, replica: Replica) -> tuple[SyncStats, list[Link]]:
        """``pull`` that also returns the peer's heads as of the response (for a ``push``)."""
        return await self._pull(url, replica)

    async def _pull(self, url: str, replica: Replica) -> tuple[SyncStats, list[Link]]:
        stats = SyncStats()
        path = f"/v1/datasets/{replica.dataset}/sync"
        peer = url.rstrip("/")
        # Size the summary so it covers what the peer lacked when we last saw it.
        unsynced = await asyncio.to_thread(replica.unsynced_count, peer)
        window: int | None = INITIAL_WINDOW + (unsynced or 0)
        if window >= FULL_WINDOW_AFTER:
            window = None
        while True:
            heads = await asyncio.to_thread(replica.heads)
            summary = await asyncio.to_thread(replica.summary, window)
            body = json.dumps(
                {"heads": [str(h) for h in heads], "summary": summary.to_json()},
                separators=(",", ":"),
            ).encode()
            digest = _sha256(body)
            headers = self._headers("POST", path, digest)
            headers["Content-Type"] = "application/json"
            stats.round_trips += 1
            stats.bytes_sent += len(body)
            async with self._request(
                "POST", url.rstrip("/") + path, data=body, headers=headers
            ) as resp:
                if resp.status != 200:
                    error = await self._error(resp)
                    if error.code == "need_summary" and window is not None:
                        window = window * 8 if window * 8 < FULL_WINDOW_AFTER else None
                        continue
                    raise error
                shown = 0

                def arrived(size: int) -> None:  # bytes as they arrive; deltas once applied
                    nonlocal shown
                    if self.progress is not None and size - shown >= PROGRESS_STEP:
                        shown = size
                        self.progress("pull", stats.bytes_received + size, stats.accepted)

                spool, size = await self._spool(resp, "sync response", arrived)
            stats.bytes_received += size
            try:
                reader = CarReader(spool, self.max_block)
                roots = await _reading(reader.read_header)
                counted = _Counting(reader.blocks())
                result: ApplyResult = await _reading(
                    replica.apply_blocks,
                    counted,
                    True,
                    self._applying(stats.bytes_received, stats.accepted),
                    stop=counted.stop,
                )
            finally:
                spool.close()
            await asyncio.to_thread(replica.remember_peer_heads, peer, roots)
            stats.block_bytes_received += counted.bytes
            stats.deltas_received += result.accepted + result.duplicates
            stats.accepted += result.accepted
            self.metrics["bytes_in"] += size
            self.metrics["deltas_in"] += result.accepted
            if self.progress is not None:
                self.progress("pull", stats.bytes_received, stats.accepted)
            # A response holds a bounded prefix of what we lack: its roots (the peer's
            # heads) all known here means we are done, else ask for the rest.
            unknown = [r for r in roots if not await asyncio.to_thread(replica.has_delta, r)]
            if not unknown or result.accepted == 0:
                return stats, roots
            window = INITIAL_WINDOW

    def _applying(self, size: int, before: int) -> Callable[[int], None] | None:
        """``apply_blocks``' progress hook for a pulled response (None without
        ``progress``): every ``progress_deltas`` deltas accepted, ``progress("pull",
        size, before + accepted)`` on the event loop (the hook runs in the apply's worker
        thread; the loop runs the calls in order, before the apply's own result)."""
        if self.progress is None:
            return None
        loop = asyncio.get_running_loop()
        report, step = self.progress, self.progress_deltas

        def applied(accepted: int) -> None:
            if accepted % step == 0:
                loop.call_soon_threadsafe(report, "pull", size, before + accepted)

        return applied

    async def push(
        self, url: str, replica: Replica, their_heads: list[Link] | None = None
    ) -> SyncStats:
        """Send the peer every block it lacks (asks for its heads first if not given)."""
        stats = SyncStats()
        if their_heads is None:
            their_heads = await self.heads(url, replica.dataset)
            stats.round_trips += 1
        known = [h for h in their_heads if await asyncio.to_thread(replica.has_delta, h)]
        missing = await asyncio.to_thread(replica.missing_deltas, known)
        deltas, stats.held_back = await asyncio.to_thread(replica.sendable, missing)
        path = f"/v1/datasets/{replica.dataset}/push"
        done = 0
        while done < len(deltas):
            # At most max_batch bytes of whole deltas per request, parents first.
            spooled, used = await asyncio.to_thread(
                spool_deltas, replica.heads(), replica.blocks_for, deltas[done:], self.max_batch
            )
            headers = self._headers("POST", path, spooled.digest)
            headers["Content-Type"] = "application/vnd.ipld.car"
            stats.round_trips += 1
            stats.bytes_sent += spooled.size
            stats.block_bytes_sent += spooled.block_bytes
            stats.deltas_pushed += used
            try:
                async with self._request(
                    "POST",
                    url.rstrip("/") + path,
                    data=spooled.file,
                    headers=headers,
                    compress="deflate" if self.compress and spooled.size > 1024 else None,
                ) as resp:
                    if resp.status != 200:
                        raise await self._error(resp)
                    raw = await resp.read()
            finally:
                spooled.file.close()
            done += used
            try:
                after = [Link.parse(h) for h in json.loads(raw)["heads"]]
            except (ValueError, KeyError, TypeError):
                after = []
            if after:
                await asyncio.to_thread(replica.remember_peer_heads, url.rstrip("/"), after)
            stats.bytes_received += len(raw)
            self.metrics["bytes_out"] += spooled.size
            self.metrics["deltas_out"] += used
            if self.progress is not None:
                self.progress("push", stats.bytes_sent, stats.deltas_pushed)
        return stats

    async def get_blocks(
        self,
        url: str,
        dataset: Link,
        wanted: Iterable[Link],
        progress: BlockProgress | None = None,
    ) -> BlockFetch:
        """The ``wanted`` blocks of ``dataset`` the peer holds (``POST …/blocks``, at most
        ``WRITE_MAX_BLOCK_REQUEST`` CIDs a request, each response bounded by the peer):
        every block re-hashed against its CID on receipt, nothing applied. CIDs the peer
        does not serve are left out of ``found``. ``progress(blocks, bytes)`` after each
        response. A peer without the route raises :class:`PeerError` with status 404."""
        todo = list(dict.fromkeys(wanted))
        fetch = BlockFetch()
        path = f"/v1/datasets/{dataset}/blocks"
        while todo:
            ask = todo[:WRITE_MAX_BLOCK_REQUEST]
            body = json.dumps({"cids": [str(c) for c in ask]}, separators=(",", ":")).encode()
            async with self._post_json(url, path, body) as resp:
                looked = _processed(resp, len(ask))
                spool, size = await self._spool(resp, "block response")
            try:
                reader = CarReader(spool, self.max_block)
                await _reading(reader.read_header)
                got = await _reading(list, reader.blocks())  # re-hashed by CarReader
            finally:
                spool.close()
            asked = set(ask[:looked])
            for cid, data in got:
                if cid not in asked:
                    raise PeerError(f"{url} sent block {cid}, which was not asked for")
                fetch.found[cid] = data
                fetch.block_bytes += len(data)
            fetch.requests += 1
            fetch.bytes_received += size
            fetch.bytes_sent += len(body)
            self.metrics["bytes_in"] += size
            todo = todo[looked:]
            if progress is not None:
                progress(len(fetch.found), fetch.block_bytes)
        return fetch

    async def fetch_blocks(
        self,
        url: str,
        replica: Replica,
        wanted: Iterable[Link],
        progress: BlockProgress | None = None,
    ) -> BlockFetch:
        """The ``wanted`` blocks (verified) from the peer's copy of the dataset, for repairs
        (:meth:`get_blocks`); a peer older than the blocks route is read the old way
        (:meth:`fetch_blocks_from_log`, ``from_log`` set). Nothing is applied."""
        wanted = set(wanted)
        try:
            return await self.get_blocks(url, replica.dataset, wanted, progress)
        except PeerError as exc:
            if exc.status not in (404, 405) or exc.code == "not_found":
                raise  # a 404 not_found is the peer's "dataset not served here"
        found = await self.fetch_blocks_from_log(url, replica, wanted)
        fetch = BlockFetch(found, block_bytes=sum(len(b) for b in found.values()), from_log=True)
        if progress is not None:
            progress(len(found), fetch.block_bytes)
        return fetch

    async def fetch_blocks_from_log(
        self, url: str, replica: Replica, wanted: set[Link]
    ) -> dict[Link, bytes]:
        """Repairs from a peer without ``POST …/blocks``: asks for its whole log in
        bounded sync responses and keeps only the ``wanted`` blocks (verified)."""
        found: dict[Link, bytes] = {}
        if replica.dataset in wanted:
            found[replica.dataset] = await self.genesis(url, replica.dataset)
        path = f"/v1/datasets/{replica.dataset}/sync"
        received: list[Link] = []
        while len(found) < len(wanted):
            summary = Summary(received, [], True).to_json() if received else None
            body = json.dumps({"heads": [str(replica.dataset)], "summary": summary}).encode()
            async with self._post_json(url, path, body) as resp:
                spool, _size = await self._spool(resp, "sync response")
            try:
                reader = CarReader(spool, self.max_block)
                roots = await _reading(reader.read_header)
                got = await _reading(list, reader.blocks())
            finally:
                spool.close()
            before = len(received)
            for cid, data in got:  # CarReader re-hashed every block
                received.append(cid)
                if cid in wanted:
                    found[cid] = data
            if len(received) == before or set(roots) <= set(received):
                break
        return found

    async def _spool(
        self, resp: Any, what: str, arrived: Callable[[int], None] | None = None
    ) -> tuple[Any, int]:
        """A response body copied to a spooled temporary file (in memory while small),
        rewound, with its size; more than ``max_body`` bytes raise :class:`TooLarge`
        (nothing kept). ``arrived(size)`` after each chunk, for progress."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)
        size = 0
        try:
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > self.max_body:
                    raise TooLarge(f"{what} exceeds {self.max_body} bytes")
                spool.write(chunk)
                if arrived is not None:
                    arrived(size)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool, size

    async def sync(self, url: str, replica: Replica) -> SyncStats:
        """Both directions: pull what we lack, then push what the peer lacks."""
        stats, their_heads = await self._pull(url, replica)
        if set(their_heads) != set(await asyncio.to_thread(replica.heads)):
            stats += await self.push(url, replica, their_heads)
        return stats


@dataclass
class BlockFetch:
    """What :meth:`SyncClient.get_blocks` got: the blocks (verified) and what it cost."""

    found: dict[Link, bytes] = field(default_factory=dict)
    requests: int = 0
    bytes_sent: int = 0
    #: HTTP body bytes received (CAR framing included).
    bytes_received: int = 0
    #: Payload bytes of the blocks received.
    block_bytes: int = 0
    #: The peer had no blocks route: its whole log was read (costs not counted here).
    from_log: bool = False


T = TypeVar("T")


async def _reading(fn: Callable[..., T], *args: Any, stop: Callable[[], None] | None = None) -> T:
    """``await asyncio.to_thread(fn, *args)`` for work that reads a spooled response: if
    the caller is cancelled (the node stops, a sync task is cancelled, Ctrl-C), the
    thread still runs, so the cancellation waits for it before the caller's ``finally``
    closes the spool under it (the thread's "I/O operation on closed file" then surfaced
    as "Future exception was never retrieved" in the node's log).

    ``stop()``, if given, is called first, to make that thread end early: the apply of
    a large response otherwise ran to its commit (8-14 s) after a Ctrl-C, which was
    then reported as "interrupted" although everything had been applied."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if stop is not None:
            stop()
        await asyncio.wait({work})
        if not work.cancelled():
            work.exception()  # retrieved: its outcome no longer matters to anyone
        raise


def _processed(resp: aiohttp.ClientResponse, asked: int) -> int:
    """How many of the ``asked`` CIDs the peer looked at (``X-Merklog-Processed``)."""
    try:
        looked = int(resp.headers.get("X-Merklog-Processed", ""))
    except ValueError:
        raise PeerError(f"{resp.url}: block response without X-Merklog-Processed") from None
    if not 1 <= looked <= asked:
        raise PeerError(f"{resp.url}: X-Merklog-Processed {looked} outside 1..{asked}")
    return looked


class SyncStopped(ReplicationError):
    """A cancelled sync's apply ended before its commit: nothing of that response is
    kept (the apply is all or nothing). Raised in the worker thread, never past
    :func:`_reading`, which raises the cancellation instead."""


class _Counting:
    """Iterator wrapper counting block payload bytes."""

    def __init__(self, it: Any) -> None:
        self.it = iter(it)
        self.bytes = 0
        self.stopped = False

    def __iter__(self) -> _Counting:
        return self

    def stop(self) -> None:
        """Make the next ``next()`` raise :class:`SyncStopped` (called from the event
        loop's thread while a worker thread iterates: one attribute write)."""
        self.stopped = True

    def __next__(self) -> tuple[Link, bytes]:
        if self.stopped:
            raise SyncStopped("the sync was cancelled before this response was applied")
        cid, data = next(self.it)
        self.bytes += len(data)
        return cid, data


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
