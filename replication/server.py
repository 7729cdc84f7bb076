"""aiohttp side of sync: routes the node mounts (``sync_routes``) or a standalone app.

Endpoints (all requests signed, see :mod:`.auth`; errors are 4xx JSON
``{"error", "detail"}`` and counted in ``metrics``):

- ``GET  /v1/datasets/{id}/heads``    → ``{"dataset", "heads": [cid…], "deltas": n}``
- ``GET  /v1/datasets/{id}/genesis``  → the genesis block (dag-cbor bytes)
- ``POST /v1/datasets/{id}/sync``     JSON ``{"heads": [cid…], "summary": {…}|null}``
  → streamed CAR (roots = our heads) of every block the caller lacks, or 409 ``need_summary``
- ``POST /v1/datasets/{id}/blocks``   JSON ``{"cids": [cid…]}`` (repairs: the blocks by CID)
  → streamed CAR (root = the genesis) of the named blocks this replica holds intact,
  in the order asked, at most ~``max_response`` bytes; header ``X-Merklog-Processed``
  = how many of the CIDs were looked at (the caller asks again for the rest)
- ``POST /v1/datasets/{id}/push``     CAR → ``{"accepted", "duplicates", "facts", "heads"}``
- ``POST /v1/inbox``                  CAR of ``@async`` message blocks → ``{"accepted", "duplicates"}``

``on_served(peer_key, kind, heads)``, if given, is called (on the event loop) after a
sync response was sent in full (``kind`` "pull") or a push was applied ("push"): how the
owner learns that a peer synced with it. ``heads`` are the peer's heads as far as this
server can tell: after a pull that took everything it lacked, our heads (it holds
them once it applied the response); after a pull of a part, the heads it asked with;
after a push, the roots of its CAR (its own heads). A hook that raises is logged, never
the caller's failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from merklog.store import Link
from merklog.store.car import car_header, car_section

from .auth import AllowList, ReplayGuard, SignedRequest, check_digest, verify_request
from .blockserve import plan_blocks, read_sections, runs
from .errors import (
    Forbidden,
    MalformedBlock,
    NotFound,
    ReplicationError,
    RequestTimeout,
    TooLarge,
)
from .limits import (
    MAX_PARENTS,
    RECEIVE_MAX_BLOCK_REQUEST,
    RECEIVE_MAX_BLOCK_REQUEST_BYTES,
    RECEIVE_MAX_BODY,
    RECEIVE_MAX_INBOX_BODY,
    RECEIVE_MAX_SECTION,
    RECEIVE_MAX_SUMMARY,
    RECEIVE_MAX_SYNC_REQUEST,
    WRITE_MAX_BATCH_BYTES,
)
from .messages import Inbox
from .metrics import Metrics
from .replica import Replica, Summary
from .wire import SPOOL_MEMORY, CarReader

log = logging.getLogger(__name__)

CAR_TYPE = "application/vnd.ipld.car"
DAG_CBOR_TYPE = "application/vnd.ipld.dag-cbor"


@dataclass
class Limits:
    """Server-side limits (bytes, seconds)."""

    max_push_body: int = RECEIVE_MAX_BODY
    max_json_body: int = 4 << 20
    max_inbox_body: int = RECEIVE_MAX_INBOX_BODY
    max_block: int = RECEIVE_MAX_SECTION
    #: CAR bytes of whole deltas per sync response (the caller asks again for the rest).
    max_response: int = WRITE_MAX_BATCH_BYTES
    read_timeout: float = 60.0
    clock_skew: float = 300.0
    max_summary: int = RECEIVE_MAX_SUMMARY
    #: A sync request: heads plus a summary of up to ``max_summary`` CIDs.
    max_sync_request: int = RECEIVE_MAX_SYNC_REQUEST
    #: Deflate sync responses when the caller accepts it: the CIDs in a CAR are
    #: incompressible but fact and delta structure is not.
    compress: bool = True
    #: CIDs in one block request, and its JSON body in bytes.
    max_block_request: int = RECEIVE_MAX_BLOCK_REQUEST
    max_block_request_bytes: int = RECEIVE_MAX_BLOCK_REQUEST_BYTES


ReplicaLookup = Mapping[Link, Replica] | Callable[[Link], Replica | None]


@contextmanager
def aborted_on_failure(request: web.Request) -> Iterator[None]:
    """Around the body of an answer whose status and headers are sent: a failure part way
    (a damaged block read, a full disk) closes the connection at once, so the caller sees
    the answer cut off now, instead of waiting out its timeout for a body that will never
    end (an error answer can no longer be sent); the error goes on to be logged and mapped
    as any other."""
    try:
        yield
    except BaseException:
        transport = request.transport
        if transport is not None:
            transport.close()
        raise


#: ``on_served(peer_key, kind, heads)``: a peer's sync request was served ("pull" or
#: "push"); ``heads``: the peer's heads as far as this server can tell (module docstring).
ServedHook = Callable[[bytes, str, list[Link]], None]


@dataclass
class SyncService:
    """State behind the routes: replicas served, who may call, limits, metrics."""

    replicas: ReplicaLookup
    allow: AllowList
    inbox: Inbox | None = None
    limits: Limits = field(default_factory=Limits)
    metrics: Metrics = field(default_factory=Metrics)
    guard: ReplayGuard | None = None
    on_served: ServedHook | None = None

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = ReplayGuard(self.limits.clock_skew)

    def replica(self, dataset_id: str) -> Replica:
        try:
            dataset = Link.parse(dataset_id)
        except ValueError:
            raise NotFound(f"{dataset_id!r} is not a dataset id") from None
        found = (
            self.replicas.get(dataset)
            if isinstance(self.replicas, Mapping)
            else self.replicas(dataset)
        )
        if found is None:
            raise NotFound(f"dataset {dataset} is not served here")
        return found

    # ------------------------------------------------------------ plumbing

    def _authenticate(
        self, request: web.Request, dataset: Link | None, replica: Replica | None = None
    ) -> SignedRequest:
        assert self.guard is not None

        def admit(key: bytes) -> None:
            if replica is not None and key == replica.identity.public_key:
                # A sync with one's own URL: "not allowed to sync" sent its user to [peers].
                raise Forbidden(
                    "the request is signed with this node's own key: that URL is this node"
                    " itself, which has nothing to sync with itself"
                )
            self.allow.require(key, dataset)

        return verify_request(
            request.method, request.path_qs, request.headers, self.guard, admit=admit
        )

    async def _read_small(self, request: web.Request, limit: int, signed: SignedRequest) -> bytes:
        body = await self._spool(request, limit, signed)
        try:
            return body.read()
        finally:
            body.close()

    async def _spool(self, request: web.Request, limit: int, signed: SignedRequest) -> Any:
        if request.content_length is not None and request.content_length > limit:
            raise TooLarge(f"body of {request.content_length} bytes exceeds {limit}")
        out = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)
        digest = hashlib.sha256()
        size = 0
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                async for chunk in request.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"body exceeds {limit} bytes")
                    digest.update(chunk)
                    out.write(chunk)
        except TimeoutError:
            out.close()
            raise RequestTimeout(f"body not received within {self.limits.read_timeout} s") from None
        except BaseException:
            out.close()
            raise
        self.metrics["bytes_in"] += size
        try:
            check_digest(signed, digest.hexdigest())
        except ReplicationError:
            out.close()
            raise
        out.seek(0)
        return out

    def _served(self, peer: bytes, kind: str, heads: list[Link]) -> None:
        if self.on_served is None:
            return
        try:
            self.on_served(peer, kind, heads)
        except Exception:  # a record of who synced must never fail the sync
            log.exception("recording a %s by peer %s… failed", kind, peer.hex()[:16])

    @staticmethod
    def _heads_json(replica: Replica) -> list[str]:
        return [str(h) for h in replica.heads()]

    # ------------------------------------------------------------ handlers

    async def heads(self, request: web.Request) -> web.StreamResponse:
        replica = self.replica(request.match_info["id"])
        self._authenticate(request, replica.dataset, replica)
        heads = await asyncio.to_thread(self._heads_json, replica)
        count = await asyncio.to_thread(replica.delta_count)
        return web.json_response({"dataset": str(replica.dataset), "heads": heads, "deltas": count})

    async def genesis(self, request: web.Request) -> web.StreamResponse:
        replica = self.replica(request.match_info["id"])
        self._authenticate(request, replica.dataset, replica)
        return web.Response(body=replica.genesis.data, content_type=DAG_CBOR_TYPE)

    async def sync(self, request: web.Request) -> web.StreamResponse:
        replica = self.replica(request.match_info["id"])
        signed = self._authenticate(request, replica.dataset, replica)
        raw = await self._read_small(request, self.limits.max_sync_request, signed)
        # Decoded off the event loop: 80 MB of JSON naming 1,250,000 CIDs took 20 s,
        # during which the node answered nothing, /healthz included (QA).
        heads, summary = await asyncio.to_thread(_sync_request, raw, self.limits.max_summary)
        if (
            summary is not None
            and len(summary.window) + len(summary.boundary) > self.limits.max_summary
        ):
            raise TooLarge("summary too large")
        deltas = await asyncio.to_thread(replica.missing_deltas, heads, summary)
        present = await asyncio.to_thread(replica.blockstore.has_many, deltas)
        if len(present) != len(deltas):
            raise ReplicationError(
                f"{len(deltas) - len(present)} of the {len(deltas)} deltas the caller lacks were"
                " pruned here (covered by a snapshot); bootstrap from that snapshot first",
                code="pruned",
                status=409,
            )
        roots = await asyncio.to_thread(replica.heads)
        # deflate at level 1: CIDs do not compress, fact/delta structure does; level 1
        # gets almost all of it for a third of the CPU of zlib's default level.
        deflate = (
            self.limits.compress
            and bool(deltas)
            and "deflate" in request.headers.get("Accept-Encoding", "")
        )
        headers = {"Content-Type": CAR_TYPE, "X-Merklog-Deltas": str(len(deltas))}
        if deflate:
            headers["Content-Encoding"] = "deflate"
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        with aborted_on_failure(request):
            return await self._send_deltas(
                request, resp, replica, signed, deltas, heads, roots, deflate
            )

    async def _send_deltas(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        replica: Replica,
        signed: Any,
        deltas: list[Link],
        heads: list[Link],
        roots: list[Link],
        deflate: bool,
    ) -> web.StreamResponse:
        """The body of :meth:`sync`'s answer, whose status and headers are sent."""
        z = zlib.compressobj(1) if deflate else None

        def encode_batch(batch: list[Link], first: bool, budget: int) -> tuple[int, int, bytes]:
            """CAR sections of whole deltas from ``batch`` until ``budget`` bytes are
            reached (at least one delta): (deltas consumed, raw bytes, bytes to send)."""
            parts = [car_header(roots)] if first else []
            size = len(parts[0]) if first else 0
            consumed = 0
            for cid in batch:
                if consumed and size >= budget:
                    break
                for c, b in replica.blocks_for([cid]):
                    section = car_section(c, b)
                    parts.append(section)
                    size += len(section)
                consumed += 1
            buf = b"".join(parts)
            return consumed, size, (z.compress(buf) if z is not None else buf)

        # One response carries at most ~max_response bytes of whole deltas (a prefix in
        # clock order, so parents come first); the caller sees from the CAR roots (our
        # heads) that it is not done yet and asks again.
        lacked = len(deltas)
        sent = 0
        i = 0
        first = True
        while first or (i < len(deltas) and sent < self.limits.max_response):
            step = deltas[i : i + 64]
            used, size, out = await asyncio.to_thread(
                encode_batch, step, first, self.limits.max_response - sent
            )
            first = False
            i += used
            sent += size
            if out:
                await resp.write(out)
        deltas = deltas[:i]
        if z is not None:
            await resp.write(z.flush())
        await resp.write_eof()
        self.metrics["bytes_out"] += sent
        self.metrics["deltas_out"] += len(deltas)
        self.metrics["sync_requests"] += 1
        # All it lacked sent: it holds our heads once applied; else it still lacks the
        # rest, and its own heads are what we know of it.
        self._served(signed.peer, "pull", roots if i >= lacked else heads)
        return resp

    async def blocks(self, request: web.Request) -> web.StreamResponse:
        """Blocks by CID (see :mod:`.blockserve`): what a repair lacks, not the whole log."""
        replica = self.replica(request.match_info["id"])
        signed = self._authenticate(request, replica.dataset, replica)
        raw = await self._read_small(request, self.limits.max_block_request_bytes, signed)
        try:
            obj = json.loads(raw)
            if not isinstance(obj["cids"], list):
                raise TypeError("cids is not a list")
            cids = [Link.parse(c) for c in obj["cids"]]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise MalformedBlock(f"block request must be JSON {{cids: [cid…]}}: {exc}") from exc
        if len(cids) > self.limits.max_block_request:
            raise TooLarge(
                f"{len(cids)} CIDs in one block request; at most {self.limits.max_block_request}"
            )
        looked, plan = await asyncio.to_thread(plan_blocks, replica, cids, self.limits.max_response)
        # Streamed (ADR 0097): the plan fixed what this response covers, so the header
        # goes first and blocks follow one run (~1 MiB) at a time, re-hashed as read.
        resp = web.StreamResponse(
            headers={"Content-Type": CAR_TYPE, "X-Merklog-Processed": str(looked)}
        )
        await resp.prepare(request)
        with aborted_on_failure(request):
            header = car_header([replica.dataset])
            await resp.write(header)
            sent = len(header)
            served = 0
            for run in runs(plan):
                body, count = await asyncio.to_thread(read_sections, replica, run)
                if body:
                    await resp.write(body)
                    sent += len(body)
                served += count
            await resp.write_eof()
        self.metrics["bytes_out"] += sent
        self.metrics["blocks_out"] += served
        self.metrics["block_requests"] += 1
        return resp

    async def push(self, request: web.Request) -> web.StreamResponse:
        replica = self.replica(request.match_info["id"])
        signed = self._authenticate(request, replica.dataset, replica)
        body = await self._spool(request, self.limits.max_push_body, signed)
        try:
            reader = CarReader(body, self.limits.max_block)
            result = await asyncio.to_thread(replica.apply_blocks, reader.blocks(), True)
        finally:
            body.close()
        self.metrics["deltas_in"] += result.accepted
        self.metrics["push_requests"] += 1
        pushed = await asyncio.to_thread(_known_roots, replica, reader.roots)
        self._served(signed.peer, "push", pushed)
        heads = await asyncio.to_thread(self._heads_json, replica)
        return web.json_response({**result.to_json(), "heads": heads})

    async def inbox_post(self, request: web.Request) -> web.StreamResponse:
        if self.inbox is None:
            raise NotFound("this node has no @async inbox")
        signed = self._authenticate(request, None)
        body = await self._spool(request, self.limits.max_inbox_body, signed)
        try:
            reader = CarReader(body, self.limits.max_block)
            new, dup = await asyncio.to_thread(self.inbox.receive, signed.peer, reader.blocks())
        finally:
            body.close()
        self.metrics["inbox_messages"] += new
        self.metrics["inbox_duplicates"] += dup
        return web.json_response({"accepted": new, "duplicates": dup})

    # ------------------------------------------------------------ wiring

    def wrap(self, handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            self.metrics["requests"] += 1
            try:
                return await handler(request)
            except ReplicationError as exc:
                self.metrics.reject(exc.code)
                return web.json_response(exc.to_json(), status=exc.status)

        return guarded

    def routes(self) -> list[web.RouteDef]:
        w = self.wrap
        return [
            web.get("/v1/datasets/{id}/heads", w(self.heads)),
            web.get("/v1/datasets/{id}/genesis", w(self.genesis)),
            web.post("/v1/datasets/{id}/sync", w(self.sync)),
            web.post("/v1/datasets/{id}/blocks", w(self.blocks)),
            web.post("/v1/datasets/{id}/push", w(self.push)),
            web.post("/v1/inbox", w(self.inbox_post)),
        ]


SYNC_SERVICE: web.AppKey[SyncService] = web.AppKey("merklog_sync", SyncService)


def sync_routes(
    replicas: ReplicaLookup,
    allow: AllowList,
    *,
    inbox: Inbox | None = None,
    limits: Limits | None = None,
    metrics: Metrics | None = None,
    on_served: ServedHook | None = None,
) -> tuple[list[web.RouteDef], SyncService]:
    """Route definitions for ``app.add_routes(...)`` plus the service (metrics, limits);
    ``on_served`` see the module docstring."""
    service = SyncService(
        replicas,
        allow,
        inbox,
        limits or Limits(),
        metrics if metrics is not None else Metrics(),  # an empty Counter is falsy
        on_served=on_served,
    )
    return service.routes(), service


def make_sync_app(
    replicas: ReplicaLookup,
    allow: AllowList,
    *,
    inbox: Inbox | None = None,
    limits: Limits | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """A standalone aiohttp application serving sync; ``app[SYNC_SERVICE]`` is the service."""
    routes, service = sync_routes(replicas, allow, inbox=inbox, limits=limits, metrics=metrics)
    app = web.Application(client_max_size=service.limits.max_json_body)
    app.add_routes(routes)
    app[SYNC_SERVICE] = service
    return app


def _known_roots(replica: Replica, roots: list[Link]) -> list[Link]:
    """The roots of a pushed CAR recorded as the pushing peer's heads: each once, at most
    ``MAX_PARENTS``, and only deltas the replica has (QA: a push naming 100,000 roots,
    none of them deltas, had them all recorded for the peer's ``deltas_behind``)."""
    firsts = list(dict.fromkeys(roots))[:MAX_PARENTS]
    return [root for root in firsts if replica.has_delta(root)]


def _sync_request(raw: bytes, max_heads: int) -> tuple[list[Link], Summary | None]:
    """The heads (each once) and summary of a sync request body, or MalformedBlock
    saying what is wrong in the protocol's words: ``[]`` was answered "list indices must
    be integers or slices, not str", ``{}`` "'heads'", ``{"heads": 5}`` "'int' object
    is not iterable". More than ``max_heads`` distinct heads is TooLarge, as a summary
    over its limit is."""
    shape = "sync request must be a JSON object {heads: [CID, …], summary: {…} | null}"
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise MalformedBlock(f"{shape}: it is not JSON") from None
    if not isinstance(obj, dict):
        raise MalformedBlock(f"{shape}, got a JSON {type(obj).__name__}")
    heads = obj.get("heads")
    if not isinstance(heads, list) or not all(isinstance(h, str) for h in heads):
        raise MalformedBlock(f'{shape}: "heads" must be a list of CID strings')
    heads = list(dict.fromkeys(heads))  # a head named twice is one head
    if len(heads) > max_heads:
        raise TooLarge(f"sync request names {len(heads)} heads, over the limit of {max_heads}")
    try:
        links = [Link.parse(h) for h in heads]
    except ValueError as exc:
        raise MalformedBlock(f'{shape}: "heads" holds a bad CID ({exc})') from None
    summary = obj.get("summary")
    return links, None if summary is None else Summary.from_json(summary)


__all__ = ["SYNC_SERVICE", "Limits", "SyncService", "make_sync_app", "sync_routes"]
