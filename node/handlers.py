"""Handlers of the node's local HTTP API (``/v1/...``, health, metrics, OpenAPI).

Handlers raise; the middlewares in :mod:`merklog.node.middleware` check tokens and
turn every failure into a JSON error with its status. Peer sync routes are
replication's (mounted as a sub-app by :mod:`merklog.node.server`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from itertools import islice
from typing import Any, TypeVar

from aiohttp import web

from merklog.engine.errors import EvaluationInterrupted
from merklog.engine.lexer import may_underflow
from merklog.replication.errors import NotFound, NotTheOwner, ReplicationError, TooLarge
from merklog.replication.server import aborted_on_failure
from merklog.store import InvalidValue, Link, StoreError, decode, decode_fact, encode_facts
from merklog.store.gcpause import gc_paused

from . import helperproc, queries, querybound, writeaccess
from .bulkput import ReadyChunk
from .config import static_dir
from .errors import NodeInputError, NotSettled
from .factpages import FACTS_PAGE_MAX, fact_refs, typed_fact_refs
from .failures import PEER_FAILED_STATUS, UnknownPeer, UnknownRelation, peer_failure
from .helperproc import HelperError, Worker
from .jsonvalues import facts_from_json, float_or_out_of_range, int_or_oversized, value_to_json
from .metrics import CONTENT_TYPE_LATEST
from .middleware import ApiError, map_failure
from .node import Node
from .openapi import openapi_document
from .peersync import check_sync_timeout
from .writes import PreparedAsserts, coerce_facts

log = logging.getLogger(__name__)

T = TypeVar("T")

NODE_KEY = web.AppKey("node", Node)
READY_KEY = web.AppKey("ready", dict)
#: Set when the server shuts down: live-query streams end at once instead of lingering.
CLOSING_KEY = web.AppKey("closing", asyncio.Event)


#: Threads that evaluate and render reads' answers (queries, a live query's first answer
#: and its large events): one per core, at least 2.
READ_THREADS = max(2, os.cpu_count() or 2)


class ReadPool:
    """The threads queries run on, apart from the event loop's default pool, which runs
    the node's writes, epochs, status and peer syncs. A query has no time limit while its
    client waits, so on the default pool (6 threads on 2 cores) six slow queries by a
    reader held every thread: a write took 60 s, ``/v1/status`` 60 s, and a peer's sync
    timed out (QA). Reads past :data:`READ_THREADS` now wait their turn here, and the
    node's own work always finds a thread."""

    def __init__(self, threads: int = READ_THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on a read thread, as ``run_in_executor`` would."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="merklog-read")
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Stop taking reads; those queued are dropped (their clients are gone)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


#: The app's read threads (:class:`ReadPool`).
READ_POOL_KEY = web.AppKey("read_pool", ReadPool)


#: ``Retry-After`` of a live query refused as busy (seconds).
RETRY_BUSY_SECONDS = 5


class LiveQueries:
    """How many live queries (``/v1/subscribe``) the node serves, at most ``node.
    max_live_queries``. Each one is evaluated inside every epoch that changes what it
    reads, and holds its state: QA opened 1,000 that were never read, the node grew from
    275 MB to 632 MB and one write took 32 s. One over the limit is answered 503 ``busy``
    at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """One live query for the block, or ApiError 503 when the limit is reached."""
        if self.open >= self.limit:
            busy = ApiError(
                503,
                "busy",
                f"the node already serves {self.open} live queries (node.max_live_queries);"
                " retry later, or close one",
            )
            busy.retry_after = RETRY_BUSY_SECONDS  # QA: CORS exposes it, the answer had none
            raise busy
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1


#: The app's count of live queries (:class:`LiveQueries`).
LIVE_QUERIES_KEY = web.AppKey("live_queries", LiveQueries)

#: Default page of ``GET /v1/facts`` (the largest is ``factpages.FACTS_PAGE_MAX``).
FACTS_PAGE = 1000


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object (NodeInputError otherwise)."""
    return json_object(await request.read())


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object (NodeInputError otherwise)."""
    try:
        # A float a double cannot hold as written (1e999, 1e-400) would be read as an
        # infinity or 0.0: where the body may hold one, floats are read one by one.
        careful = {"parse_float": float_or_out_of_range} if _may_be_out_of_range(raw) else {}
        # A key given twice in any object kept its last value only ({"assert": …,
        # "assert": …} wrote the second; {"rel": "a", "rel": "b", …} wrote b): every
        # object's keys are checked as it is read (~1 µs a fact object).
        careful["object_pairs_hook"] = _without_repeats
        body = _loads(raw, **careful)
    except NodeInputError:
        raise
    except ValueError:  # an integer of more digits than int() reads (4,300): read it as
        # one that does not fit, which the field it is in reports (assert[0] argument 1: …)
        body = _loads(raw, parse_int=int_or_oversized, **careful)
    if not isinstance(body, dict):
        raise NodeInputError("request body must be a JSON object")
    return body


def _may_be_out_of_range(raw: bytes) -> bool:
    """Whether a JSON body may hold a number no double holds as written: one read as 0.0
    although it is not zero (``1e-400``), or a positive exponent of three digits
    (``1e+400``: read as an infinity, refused either way, but then named as written)."""
    return may_underflow(raw) or (
        (b"e+" in raw or b"E+" in raw) and _BIG_EXPONENT.search(raw) is not None
    )


_BIG_EXPONENT = re.compile(rb"[eE]\+0*[1-9][0-9]{2}")


def query_param(request: web.Request, name: str) -> str | None:
    """The URL parameter ``name`` (None when absent or empty: ``?limit=`` is no limit
    given, as ``?rel=`` and ``?after=`` always were; ``?answer=`` and ``?limit=`` were
    refused, QA); NodeInputError when it is given twice (``?rel=a&rel=b``): one of them
    was used and the other silently dropped, as a JSON body's repeated key was."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise NodeInputError(f"{name}= is given {len(values)} times: give it once")
    return values[0] or None if values else None


def only_fields(body: dict[str, Any], fields: tuple[str, ...], what: str) -> None:
    """NodeInputError naming every key of ``body`` not in ``fields``: a misspelt optional
    field (``"timout"``, ``"sourc"``) would otherwise be ignored, and the request done
    without it."""
    unknown = sorted(set(body) - set(fields))
    if unknown:
        known = " and ".join(f'"{f}"' for f in fields)
        raise NodeInputError(
            f"unknown field {', '.join(map(repr, unknown))}: {what} has only {known}"
        )


def _loads(raw: bytes, **options: Any) -> Any:
    """``json.loads(raw, **options)``; NodeInputError for what is not JSON."""
    try:
        return json.loads(raw, parse_constant=_not_a_json_number, **options)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NodeInputError(f"request body is not JSON: {exc}") from exc
    except RecursionError:  # arrays or objects nested ~1,000 deep overflow the decoder
        raise NodeInputError("request body nests its JSON arrays or objects too deeply") from None


def _not_a_json_number(token: str) -> Any:
    """Refuse ``NaN``, ``Infinity`` and ``-Infinity``, which Python's decoder takes
    but JSON does not have (and no merklog value is)."""
    raise NodeInputError(f"request body is not JSON: {token} is not a JSON number")


def _without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; NodeInputError if a key repeats."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise NodeInputError(f"request body gives the key {key!r} twice")
            seen.add(key)
    return out


# ------------------------------------------------------------------------- public


async def index(request: web.Request) -> web.StreamResponse:
    static = static_dir(request.app[NODE_KEY].config)
    if static is None or not (static / "index.html").is_file():
        return web.json_response(
            {"service": "merklog", "docs": "/openapi.json", "health": "/healthz"}
        )
    return web.FileResponse(static / "index.html")


async def static_file(request: web.Request) -> web.StreamResponse:
    """A file of ``node.static_dir`` (the app's scripts, styles, images), public like the
    app page. Not served (404): a hidden name (a part starting with ``.``, which also
    rules out ``..``), a folder, or a file a symbolic link puts outside the folder."""
    static = static_dir(request.app[NODE_KEY].config)
    name = request.match_info["path"]
    if static is None:
        raise ApiError(404, "not found", "no node.static_dir is set: there are no static files")
    parts = name.split("/")
    missing = ApiError(404, "not found", f"no file static/{name} in node.static_dir")
    if "\x00" in name or any(not part or part.startswith(".") for part in parts):
        raise missing  # a NUL byte names no file (QA: it was a raw Python message, 400)
    path = static.joinpath(*parts).resolve()
    if static not in path.parents or not path.is_file():
        raise missing
    return web.FileResponse(path)


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    ready = request.app[READY_KEY].get("ready", False)
    return web.json_response(
        {"status": "ok" if ready else "starting", "epoch": node.epoch}, status=200 if ready else 503
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# ------------------------------------------------------------------------- reads


async def metrics(request: web.Request) -> web.Response:
    body = request.app[NODE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    info = await asyncio.get_running_loop().run_in_executor(None, node.status)
    return web.json_response(info)


#: ``GET /v1/facts?form=``: ``text`` (default) gives ``{"cid", "fact"}`` per fact, the
#: fact in Datalog syntax; ``json`` gives ``{"cid", "rel", "args"}``, the typed JSON fact
#: form ``POST /v1/facts`` takes.
FACT_FORMS = ("text", "json")


async def list_facts(request: web.Request) -> web.Response:
    """One page of visible facts; ``next`` is the cursor for ``?after=`` (null at the end)."""
    node = request.app[NODE_KEY]
    form = query_param(request, "form") or "text"
    if form not in FACT_FORMS:
        raise NodeInputError(f"form={form!r}: expected one of {', '.join(FACT_FORMS)}")
    rel = query_param(request, "rel") or None
    after = None
    if after_text := query_param(request, "after"):
        try:
            after = Link.parse(after_text)
        except (ValueError, StoreError) as exc:
            raise NodeInputError(f"after= must be a fact CID from a previous page: {exc}") from None
    raw = query_param(request, "limit")
    if raw is None:
        raw = str(FACTS_PAGE)
    if not (raw.isascii() and raw.isdigit()):  # int() also reads "1_0" and "٣"
        negative = raw.startswith("-") and raw[1:].isascii() and raw[1:].isdigit()
        if negative:  # "must be a decimal integer" of -1, which is one (QA)
            raise NodeInputError(f"limit= must be between 1 and {FACTS_PAGE_MAX}, got {raw}")
        raise NodeInputError(f"limit= must be a decimal integer, got {raw!r}")
    limit = int(raw)
    if not 1 <= limit <= FACTS_PAGE_MAX:
        raise NodeInputError(f"limit= must be between 1 and {FACTS_PAGE_MAX}")
    try:
        page, cursor = await asyncio.get_running_loop().run_in_executor(
            None, node.page_facts, rel, after, limit
        )
    except NotFound as exc:  # a relation's cursor this node never stored (ADR 0132)
        raise NodeInputError(f"after= must be a fact CID from a previous page: {exc}") from None
    entries = fact_refs(page) if form == "text" else typed_fact_refs(page)
    return web.json_response({"facts": entries, "next": str(cursor) if cursor else None})


def describe_block(node: Node, cid: Link) -> dict[str, Any]:
    data = node.store.get_held(cid)  # an unknown CID is not worth an IPFS timeout
    out: dict[str, Any] = {"cid": str(cid), "size": len(data)}
    try:
        out["fact"] = str(decode_fact(data))
        out["kind"] = "fact"
    except Exception:
        obj = decode(data)
        out["kind"] = obj.get("kind", "block") if isinstance(obj, dict) else "block"
    return out


async def get_block(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    try:
        cid = Link.parse(request.match_info["cid"])
    except (ValueError, StoreError) as exc:
        raise ApiError(400, "bad CID", str(exc)) from None
    # Off the event loop, as every store read: the store's lock may be held by a write,
    # and a block an IPFS home's cache lacks is asked of its daemon (ADR 0180).
    loop = asyncio.get_running_loop()
    return web.json_response(await loop.run_in_executor(None, describe_block, node, cid))


#: The fields of a ``POST /v1/query`` or ``/v1/subscribe`` body.
_QUERY_FIELDS = frozenset({"q"})


async def _query_text(request: web.Request) -> str:
    if request.method == "POST":
        body = await json_body(request)
        unknown = sorted(set(body) - _QUERY_FIELDS)
        if unknown:  # e.g. a "limit" that would be silently ignored: the whole answer came
            raise ApiError(
                400,
                "bad query",
                f"unknown field {', '.join(map(repr, unknown))}: a query body has only"
                ' "q", e.g. {"q": "path(1, X)"}',
            )
        q = body.get("q")
    else:
        try:
            q = query_param(request, "q")
        except NodeInputError as exc:
            raise ApiError(400, "bad query", str(exc)) from None
    if q is not None and not isinstance(q, str):
        raise ApiError(400, "bad query", f'"q" must be a string, got {_json_type(q)}')
    if q is None or not q.strip():
        raise ApiError(400, "bad query", 'missing query "q", e.g. q=path(1, X)')
    return q


async def query(request: web.Request) -> web.Response:
    """``GET``/``POST /v1/query``: the answer as JSON, evaluated and rendered off the
    event loop under the node's bounds (ADR 0210): stopped within
    :data:`QUERY_CHECK_SECONDS` of its client going away, and 422 ``query too large``
    past the memory budget (``node.eval_memory_mb``)."""
    node = request.app[NODE_KEY]
    text = await _query_text(request)
    try:
        q = node.parse_query(text)
    except NodeInputError as exc:  # syntax, unsafe or unschedulable query
        raise ApiError(400, "bad query", str(exc)) from None
    stop = threading.Event()
    work = request.app[READ_POOL_KEY].run(_answer_query, node, q, stop)
    try:
        body = await _unless_client_gone(request, work, stop)
    except UnknownRelation as exc:  # a relation or arity nothing has: not found, as the CLI's 3
        raise ApiError(404, "unknown relation", str(exc)) from None
    except querybound.QueryTooLarge as exc:
        raise ApiError(422, "query too large", str(exc)) from None
    except EvaluationInterrupted as exc:
        if stop.is_set():  # its client went away: nobody to answer
            raise ConnectionResetError("the query's client went away") from None
        raise ApiError(503, "node stopping", str(exc)) from None
    except (NodeInputError, ValueError) as exc:  # syntax, unsafe or unschedulable query
        raise ApiError(400, "bad query", str(exc)) from None
    return web.Response(text=body, content_type="application/json")


#: Seconds between checks that a query's client is still connected.
QUERY_CHECK_SECONDS = 0.25


async def _unless_client_gone(
    request: web.Request, work: asyncio.Future[str], stop: threading.Event
) -> str:
    """The result of ``work`` (a query on a worker thread), or ``stop`` set once the
    client went away (checked every :data:`QUERY_CHECK_SECONDS`, as a live query's is)
    or the handler is cancelled, and the stopped query's error once it has stopped:
    aiohttp does not cancel a handler whose client left, and a thread cannot be
    cancelled, so a query whose client had given up ran on for a minute, holding
    gigabytes."""
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=QUERY_CHECK_SECONDS)
            if done:
                return work.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                stop.set()
                await asyncio.wait({work})
                return work.result()
    except asyncio.CancelledError:
        stop.set()
        raise


def _answer_query(node: Node, q: Any, stop: threading.Event) -> str:
    """The JSON answer to the parsed query ``q``, off the event loop (a large answer
    takes seconds, and other requests go on meanwhile) and with the cyclic GC paused:
    the rows are objects without cycles, and with a node's EDB in memory collections
    over them doubled the time. Evaluated and rendered under the query's bounds
    (:func:`.querybound.bounded_call`); ``stop`` stops it."""
    return querybound.bounded_call(node, _render_answer, node, q, stop=stop)


def _render_answer(node: Node, q: Any) -> str:
    with gc_paused():
        result = node.answer_query(q)
        return querybound.render_json(result.columns, result.rows, result.epoch, value_to_json)


async def subscribe(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: ``result`` (whole answer), then ``delta`` per changing epoch.
    The stream ends when the client goes away or the server shuts down. At most
    ``node.max_live_queries`` at once (:class:`LiveQueries`)."""
    with request.app[LIVE_QUERIES_KEY].held():
        return await _subscribe(request)


async def _subscribe(request: web.Request) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    closing = request.app[CLOSING_KEY]
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, list, list, int]] = asyncio.Queue()

    def callback(event: str, added: list, removed: list) -> None:
        # Called inside the epoch that produced the change: node.epoch is that epoch.
        loop.call_soon_threadsafe(queue.put_nowait, (event, added, removed, node.epoch))

    text = await _query_text(request)
    try:  # the first answer is a whole query (seconds over a large relation): off the loop,
        # which goes on serving, and stopping, meanwhile
        sub = await request.app[READ_POOL_KEY].run(node.subscribe, text, callback)
    except UnknownRelation as exc:  # as /v1/query answers it (and the CLI's exit 3)
        raise ApiError(404, "unknown relation", str(exc)) from None
    except (NodeInputError, ValueError) as exc:
        raise ApiError(400, "bad query", str(exc)) from None
    try:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        if request.method == "HEAD":  # GET's status and headers, no stream
            await resp.write_eof()
            return resp
        columns = queries.query_columns_of(sub.query)
        closed = asyncio.ensure_future(closing.wait())
        quiet_since = loop.time()
        gone = False
        try:
            while not closing.is_set():
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, closed}, timeout=SSE_CHECK_SECONDS, return_when="FIRST_COMPLETED"
                )
                if getter not in done:
                    getter.cancel()
                    # A client that went away is noticed here, not when a write to it
                    # fails: its live query stopped being evaluated up to 15 s later.
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        gone = True
                        break
                    if not closing.is_set() and loop.time() - quiet_since >= SSE_KEEPALIVE:
                        await resp.write(b": keep-alive\n\n")
                        quiet_since = loop.time()
                    continue
                quiet_since = loop.time()
                event, added, removed, epoch = getter.result()
                args = (event, columns, epoch, added, removed)
                if len(added) + len(removed) > SSE_INLINE_ROWS:  # rendered off the loop
                    data = await request.app[READ_POOL_KEY].run(_sse_event, *args)
                else:
                    data = _sse_event(*args)
                if closing.is_set():
                    break
                if not await _written(resp.write(data), closed, request):
                    gone = True  # stalled or shutting down: the connection is aborted
                    break
            if not gone:
                await resp.write_eof()
        finally:
            closed.cancel()
    finally:
        node.unsubscribe(sub)
    return resp


async def _written(write: Any, closed: asyncio.Future, request: web.Request) -> bool:
    """Await ``write`` (a stream write, which waits while the client's buffers are full)
    unless the server starts closing or it takes :data:`SSE_STALL_SECONDS`; then the
    connection is aborted and False returned."""
    task = asyncio.ensure_future(write)
    done, _ = await asyncio.wait(
        {task, closed}, timeout=SSE_STALL_SECONDS, return_when="FIRST_COMPLETED"
    )
    if task in done:
        task.result()
        return True
    task.cancel()
    transport = request.transport
    if transport is not None:
        transport.abort()
    with suppress(asyncio.CancelledError, ConnectionError):
        await task
    return False


#: Live-query events with more rows than this are rendered on a worker thread.
SSE_INLINE_ROWS = 1000
#: Seconds a live-query event may wait to be taken by its client (the connection's
#: buffers full) before the stream is ended: a client that stays connected without
#: reading (a frozen tab, a phone that lost its network) held every later event in the
#: node's memory and kept the node from stopping for aiohttp's timeouts. A client that
#: reconnects gets a fresh ``result``.
SSE_STALL_SECONDS = 60.0
#: Seconds between checks that a live query's client is still connected.
SSE_CHECK_SECONDS = 0.5
#: Seconds of silence after which a live-query stream gets a keep-alive comment.
SSE_KEEPALIVE = 15.0


def _sse_event(event: str, columns: list, epoch: int, added: list, removed: list) -> bytes:
    """One Server-Sent Event: ``event`` with the rows as JSON values."""
    payload = {
        "columns": columns,
        "epoch": epoch,
        "added": [[value_to_json(v) for v in r] for r in added],
        "removed": [[value_to_json(v) for v in r] for r in removed],
    }
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()


async def genesis(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    data = await asyncio.get_running_loop().run_in_executor(None, node.store.get, node.dataset)
    return web.Response(
        body=data,
        content_type="application/vnd.ipld.dag-cbor",
        headers={"X-Dataset": str(node.dataset)},
    )


async def export_car(request: web.Request) -> web.StreamResponse:
    from merklog.store.car import car_header, car_section

    node = request.app[NODE_KEY]
    resp = web.StreamResponse(headers={"Content-Type": "application/vnd.ipld.car"})
    if request.method == "HEAD":  # GET's status and headers, nothing read
        await resp.prepare(request)
        await resp.write_eof()
        return resp
    loop = asyncio.get_running_loop()
    # The blocks are read on worker threads, a batch at a time (see get_block).
    roots, blocks = await loop.run_in_executor(None, node.export_blocks)
    await resp.prepare(request)
    with aborted_on_failure(request):  # a damaged block part way: cut off now, and logged
        await resp.write(car_header(roots))
        it = iter(blocks)
        while batch := await loop.run_in_executor(None, _next_blocks, it):
            for cid, data in batch:
                await resp.write(car_section(cid, data))
        await resp.write_eof()
    return resp


def _next_blocks(it: Iterator[tuple[Link, bytes]], most: int = 256) -> list[tuple[Link, bytes]]:
    """Up to ``most`` more blocks of ``it`` (an export's), read on the calling thread."""
    return list(islice(it, most))


# ------------------------------------------------------------------------- writes


def _facts_field(body: dict[str, Any], name: str) -> list:
    """``"assert"``/``"retract"``: Datalog text, or a list of JSON facts
    ``{"rel": "edge", "args": [1, 2]}`` with typed values."""
    if name not in body:
        return []
    value = body[name]
    if isinstance(value, str):
        if not value.strip():
            return []
        if name == "assert":
            return coerce_facts([value])
        try:  # LINE:COL alone would read as a position in "assert"
            return coerce_facts([value])
        except (NodeInputError, InvalidValue) as exc:
            raise NodeInputError(f"{name}: {exc}") from None
    if isinstance(value, list):
        return facts_from_json(value, name)
    # null too: a body whose only field is null must not answer 200 having written nothing
    raise NodeInputError(
        f'"{name}" must be Datalog text or a list of {{"rel": ..., "args": [...]}} facts,'
        f" got {_json_type(value)}"
    )


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value (``null``, ``number``, ``object``, …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


#: The fields of a ``POST /v1/facts`` body.
_WRITE_FIELDS = frozenset(("assert", "retract"))


def decode_write_body(raw: bytes) -> tuple[list, list, list]:
    """The checked facts of a ``POST /v1/facts`` body and the asserts' blocks:
    ``(asserts, retracts, encode_facts(asserts))``, computed from the body alone (the
    program's declarations are checked by the write). Encoded here, off the write, which
    runs one at a time (ADR 0145). No cyclic GC passes over the body's objects meanwhile
    (none of them form cycles)."""
    with gc_paused():
        body = json_object(raw)
        unknown = sorted(set(body) - _WRITE_FIELDS)
        if unknown:  # a misspelt "assert" must not answer 200 having written nothing
            raise NodeInputError(
                f"unknown field {', '.join(map(repr, unknown))}: a write body has"
                ' "assert" and/or "retract"'
            )
        add = _facts_field(body, "assert")
        return add, _facts_field(body, "retract"), encode_facts(add)


#: Bodies from this size on are decoded by the node's body worker, when it has one
#: (ADR 0148); smaller ones on the request's thread, where the round trip costs less.
WORKER_MIN_BYTES = 64 << 10


def _packed_write_body(raw: bytes) -> tuple[tuple, list]:
    """:func:`decode_write_body` as the body worker sends it back: the asserts and their
    blocks as plain columns (:meth:`ReadyChunk.pack`), the retracts as facts."""
    add, rem, encoded = decode_write_body(raw)
    return ReadyChunk(PreparedAsserts(add, encoded)).pack(), rem


def body_worker() -> Worker | None:
    """A forked process that decodes, checks and encodes large write bodies with its own
    interpreter lock (ADR 0148), when one may be forked now (``helperproc.available``:
    Linux, one thread, ``MERKLOG_NODE_HELPER`` not ``0``); else None. Fork it before the
    node opens its home: the child then holds no lock file or database handle."""
    if not helperproc.available("MERKLOG_NODE_HELPER"):
        return None
    return Worker(_packed_write_body, "node's body worker process")


class BodyDecoder:
    """Where ``POST /v1/facts`` bodies are decoded (ADR 0148). While a request is the
    only write in progress, on its own thread: the node has nothing else to do, and
    the round trip to a worker would only add to its answer's time. Once another write
    is in progress (a bulk client keeps several in flight), a large body goes to the worker
    process, so its decoding runs beside that write instead of taking turns with it on
    the interpreter lock. Used from the event loop only."""

    def __init__(self, worker: Worker | None = None) -> None:
        self.worker = worker
        #: Write requests between their arrival and their answer.
        self.in_flight = 0

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Count a write request for its whole life (decode, write, answer)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def decode(self, raw: bytes) -> tuple[list, list, list]:
        """:func:`decode_write_body` of ``raw``, off the event loop; by the worker when
        another write is in progress and the body is large."""
        busy = self.in_flight > 1 and len(raw) >= WORKER_MIN_BYTES
        worker = self.worker if busy and self.worker is not None and self.worker.alive else None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _write_body, worker, raw)


#: Where the app's write bodies are decoded (:class:`BodyDecoder`).
BODY_DECODER_KEY = web.AppKey("body_decoder", BodyDecoder)


def _write_body(worker: Worker | None, raw: bytes) -> tuple[list, list, list]:
    """:func:`decode_write_body`, by ``worker`` if given (:meth:`BodyDecoder.decode`
    decides). The facts and CIDs it sends back are rebuilt without checks (it checked
    and computed them); an error it raises is raised as is. If it is gone, or its error
    did not survive the pipe, the body is decoded here (and raises the real error)."""
    if worker is not None:
        # Loading the answer makes a tuple per fact: no cyclic GC pass over the node's
        # heap meanwhile (none of them form cycles).
        with gc_paused():
            try:
                packed, rem = worker.call(raw)
            except HelperError:
                if not worker.alive:
                    log.warning("the body worker process is gone: bodies are decoded in the node")
            else:
                prepared = ReadyChunk.unpack(packed).prepared
                assert prepared is not None  # a worker's chunk always carries its facts
                return prepared.facts, rem, prepared.encoded
    return decode_write_body(raw)


#: ``POST /v1/facts?answer=``: ``full`` (default) answers ``{"cid", "fact"}`` per fact,
#: ``cids`` the CIDs alone in input order (ADR 0082).
WRITE_ANSWERS = ("full", "cids")


async def write_facts(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    answer = query_param(request, "answer")
    if answer is None:
        answer = "full"
    if answer not in WRITE_ANSWERS:
        raise NodeInputError(f"answer={answer!r}: expected one of {', '.join(WRITE_ANSWERS)}")
    decoder = request.app[BODY_DECODER_KEY]
    with decoder.writing():
        return await _write(request, node, decoder, answer)


async def _write(
    request: web.Request, node: Node, decoder: BodyDecoder, answer: str
) -> web.Response:
    raw = await request.read()
    # Decoding and checking a 200k-fact body takes a second or more: never on the event
    # loop, which keeps serving other requests meanwhile (ADR 0082, ADR 0148).
    add, rem, encoded = await decoder.decode(raw)
    if add or rem:  # a freshly joined home syncs once with its origin first
        await writeaccess.sync_before_first_write_async(node)
    try:
        result = await node._write_checked_async(add, rem, encoded)
    except TooLarge as exc:  # a fact over the limit every peer takes: bad input (exit 2),
        # not a refusal, nor a body over node.max_body (413)
        raise ApiError(400, "bad input", exc.detail, exc.fact) from None
    except ReplicationError as exc:  # e.g. this key is not (yet) a writer
        raise ApiError(403, "refused", str(exc)) from None
    unsettled = await _evaluated(node)
    # Rendered and serialised with the GC paused: the per-fact dicts die before it
    # resumes, so no collection walks them (and none is triggered by them) per request.
    with gc_paused():
        body = result.to_json(answer)
        if unsettled:
            body["not_evaluated"] = unsettled
        return web.json_response(body)


async def _evaluated(node: Node) -> str | None:
    """Wait for the epoch that evaluates what was just written (read your writes: a write
    or an import is answered after it); None when it did, else why not. The write is
    durable even when that epoch failed (the epoch loop logs why): it is answered as
    written, saying why it was not evaluated (``not_evaluated``). While the program
    fails no epoch would show it: no wait (QA: each write took the failing recursion's
    6-10 s)."""
    failing = node.epochs.start_failure or node.epochs.last_error
    if failing:
        return f"the writes are stored, but {failing}"
    try:
        await node.settled()
    except NotSettled as exc:
        return str(exc)
    return None


async def load_program(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    body = await json_body(request)
    only_fields(body, ("program", "source"), "a program body")
    text = body.get("program")
    if not isinstance(text, str):
        raise NodeInputError('"program" must be a string')
    source = body.get("source")
    if source is not None and not isinstance(source, str):  # "5:1:5:" read as a position
        raise NodeInputError(
            f'"source" must be a string (the name errors give), got {_json_type(source)}'
        )
    source = source or "<program>"
    try:  # its first epoch runs in the call: off the event loop
        await asyncio.get_running_loop().run_in_executor(None, node.load_program, text, source)
    except NodeInputError as exc:
        raise ApiError(400, "bad program", str(exc)) from None
    # The state the new program derives, read off the event loop (see get_block).
    return web.json_response(await asyncio.get_running_loop().run_in_executor(None, node.status))


async def sync_now(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    body = await json_body(request)
    only_fields(body, ("url", "timeout"), "a sync body")
    url = body.get("url")
    if not isinstance(url, str) or not url.strip():
        raise NodeInputError('"url" must be a peer name or an http(s) URL')
    timeout = sync_timeout(body.get("timeout"))
    try:
        url = node.peer_url(url)
    except UnknownPeer as exc:  # not found, as the CLI's `sync NAME` (exit 3)
        raise ApiError(404, "unknown peer", str(exc)) from None
    if NDJSON in request.headers.get("Accept", ""):
        return await _sync_streamed(request, node, url, timeout)
    task = asyncio.create_task(node.sync(url, timeout=timeout))
    try:
        while not (await asyncio.wait({task}, timeout=SYNC_CHECK_SECONDS))[0]:
            await _stop_if_caller_gone(request, task)
        return web.json_response(task.result())
    except ReplicationError as exc:  # unreachable, refused: the peer's problem
        raise _sync_error(exc) from None
    finally:
        if not task.done():  # this handler was cancelled: stop syncing for it
            task.cancel()
            await asyncio.wait({task})


def sync_timeout(value: Any) -> float | None:
    """The optional ``"timeout"`` of ``POST /v1/sync``: seconds per peer request for this
    sync instead of the node's ``sync.timeout`` (what ``merklog --set sync.timeout=N
    sync`` asks a running node for). None when absent; a value that is not a number
    above 0 and at most :data:`~.config.MAX_SYNC_TIMEOUT` is bad input naming the
    field (:func:`.peersync.check_sync_timeout`)."""
    return check_sync_timeout(value, '"timeout"', json.dumps)


async def forget_sync_history(request: web.Request) -> web.Response:
    """``DELETE /v1/sync/history?url=URL``: forget the sync history of ``URL`` (what
    ``merklog peers remove`` asks a running node): ``{"url", "forgotten"}``, forgotten
    false when there was none. Whether ``URL`` is still a peer is the caller's to say:
    a peer's entry comes back at its next sync."""
    node = request.app[NODE_KEY]
    url = (query_param(request, "url") or "").strip()
    if not url:
        raise NodeInputError('"url" (a query parameter) must name the URL to forget')
    url = url.rstrip("/")
    return web.json_response({"url": url, "forgotten": node.forget_peer_history(url)})


def _sync_error(exc: ReplicationError) -> ApiError:
    """A failed sync's answer: 502 ``peer unreachable`` (retry later) or 424 ``peer
    refused``/``peer error`` (the peer answered: fix the configuration), as
    :func:`.failures.peer_failure` classifies it for the CLI too."""
    _code, status, name = peer_failure(exc) or (None, PEER_FAILED_STATUS, "peer error")
    return ApiError(status, name, exc.detail)


#: ``POST /v1/sync`` with ``Accept: application/x-ndjson`` streams its progress.
NDJSON = "application/x-ndjson"
#: Seconds between checks that a streamed sync's caller is still connected.
SYNC_CHECK_SECONDS = 0.5
#: Seconds without a line after which a streamed sync writes ``{"working": …}``.
SYNC_KEEPALIVE = 10.0


async def _stop_if_caller_gone(request: web.Request, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (a sync run for ``request``) and raise ``ConnectionResetError`` if
    the caller went away (Ctrl-C of ``merklog sync``, a script's timeout).

    Checked every :data:`SYNC_CHECK_SECONDS` while a sync runs, streamed or not: aiohttp
    does not cancel a handler whose client left, and a sync waiting on a silent peer
    writes nothing that could fail, so without this check it ran on for its whole
    timeout. The sync is stopped and recorded as interrupted before the handler ends."""
    transport = request.transport
    if transport is None or transport.is_closing():
        task.cancel()
        await asyncio.wait({task})
        raise ConnectionResetError("the caller of the sync went away") from None


async def _sync_streamed(
    request: web.Request, node: Node, url: str, timeout: float | None = None
) -> web.StreamResponse:
    """The sync as JSON lines: ``{"progress": {"direction", "bytes", "deltas"}}`` after
    each request body, ``{"working": {"seconds"}}`` after :data:`SYNC_KEEPALIVE` seconds
    without a line, then ``{"result": stats}``, so ``merklog sync`` through a running
    node shows real bytes and deltas and never waits a read timeout out. A failure before the first line is the usual JSON
    error status (502 unreachable, 424 refused); after it, a last line ``{"error", "detail", "status"}``."""
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def progress(direction: str, size: int, deltas: int) -> None:
        events.put_nowait({"progress": {"direction": direction, "bytes": size, "deltas": deltas}})

    async def run() -> dict[str, Any]:
        try:
            return await node.sync(url, progress, timeout=timeout)
        finally:
            events.put_nowait({})  # wakes the writer below: the sync is over

    task = asyncio.create_task(run())
    resp: web.StreamResponse | None = None
    loop = asyncio.get_running_loop()
    started = written = loop.time()
    try:
        while not task.done() or not events.empty():
            try:
                event = await asyncio.wait_for(events.get(), SYNC_CHECK_SECONDS)
            except TimeoutError:
                await _stop_if_caller_gone(request, task)
                if resp is not None and loop.time() - written >= SYNC_KEEPALIVE:
                    # Applying what was pulled sends nothing for a while (66 s for 67 MB
                    # on a loaded machine): the CLI gave up after 60 s without a line, and
                    # its leaving cancelled the sync, every retry alike.
                    working = {"working": {"seconds": round(loop.time() - started)}}
                    await resp.write(json.dumps(working).encode() + b"\n")
                    written = loop.time()
                continue
            if not event:
                continue
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": NDJSON})
                await resp.prepare(request)
            await resp.write(json.dumps(event).encode() + b"\n")
            written = loop.time()
        try:
            last: dict[str, Any] = {"result": task.result()}
        except ReplicationError as exc:
            error = _sync_error(exc)
            if resp is None:
                raise error from None
            last = {"error": error.error, "detail": error.detail, "status": error.status}
        except Exception as exc:
            if resp is None:
                raise  # the error middleware answers with its status
            # The status the middleware would have answered (a full disk: 507).
            mapped = map_failure(exc, node.home)
            if mapped is None:
                log.error("sync with %s failed", url, exc_info=exc)
                mapped = (500, "internal error", f"{type(exc).__name__}: {exc}")
            status, name, detail = mapped
            last = {"error": name, "detail": detail, "status": status}
    finally:
        if not task.done():
            task.cancel()  # the client went away: stop syncing for it
            await asyncio.wait({task})  # its history records it before the answer ends
    if resp is None:
        resp = web.StreamResponse(headers={"Content-Type": NDJSON})
        await resp.prepare(request)
    await resp.write(json.dumps(last).encode() + b"\n")
    await resp.write_eof()
    return resp


async def grant(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    body = await json_body(request)
    only_fields(body, ("key",), "a grant body")
    key = body.get("key")
    if not isinstance(key, str):
        raise NodeInputError('"key" must be a 64-digit hex Ed25519 public key')
    try:
        delta = node.grant(key)
    except NotTheOwner as exc:  # a writer may be refused this: exit 1, not 7
        raise ApiError(403, "not owner", str(exc)) from None
    except ReplicationError as exc:
        raise ApiError(403, "refused", str(exc)) from None
    return web.json_response({"delta": delta})


async def list_writers(request: web.Request) -> web.Response:
    """``GET /v1/writers``: ``{"writers": [{"key", "writer", "owner", "delta"}]}``."""
    node = request.app[NODE_KEY]
    return web.json_response({"writers": node.writers()})


async def revoke(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    try:
        delta = node.revoke(request.match_info["key"])
    except NotTheOwner as exc:  # a writer may be refused this: exit 1, not 7
        raise ApiError(403, "not owner", str(exc)) from None
    except ReplicationError as exc:
        raise ApiError(403, "refused", str(exc)) from None
    return web.json_response({"delta": delta})


async def import_car(request: web.Request) -> web.Response:
    """Apply a CAR (all or nothing). The body is streamed to a temporary file first, not
    read whole into memory, so a backup larger than ``node.max_body`` imports too (the
    write token is required); the blocks are then verified and applied on a worker
    thread in one transaction."""
    import tempfile

    from .carfiles import CAR_SUBJECT, import_fault

    node = request.app[NODE_KEY]
    spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)
    try:
        async for chunk in request.content.iter_chunked(1 << 16):
            spool.write(chunk)
        spool.seek(0)

        try:
            result = await asyncio.to_thread(node.import_stream, spool)
        except (StoreError, ReplicationError) as exc:
            # The CAR's fault, said as a stopped home's import says it (the CLI puts the
            # file's name for "the CAR "); anything else is this home's (its IPFS daemon
            # down: 503 store unavailable, which was 400 rejected, QA), mapped as any
            # other request's failure is.
            reason = import_fault(exc)
            if reason is None:
                raise
            raise ApiError(400, "rejected", CAR_SUBJECT + reason) from None
    finally:
        spool.close()
    # answered after the epoch that shows the imported facts (the CLI's "facts M
    # visible" asks status next: it showed the count before the import, QA)
    unsettled = await _evaluated(node)
    if unsettled:
        result["not_evaluated"] = unsettled
    return web.json_response(result)
