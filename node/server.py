"""The node's HTTP server: one route table, the middlewares, the peer sync sub-app.

Every ``/v1`` route needs a bearer token — the read token (``api.read_token``)
or the write token (``api.token``) for reads, the write token for writes — unless
``api.anonymous_reads`` is true (reads only). Health, ``/openapi.json`` and the
app page are public. Peer sync routes (``/v1/datasets/...``, ``/v1/inbox``) are
replication's: each request is signed by the calling node's Ed25519 key and
checked against ``[peers]``: the dataset sync routes are mounted as a sub-app and
the token check leaves every peer route alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web

from . import cors, middleware
from . import handlers as h
from .config import static_dir
from .helperproc import Worker
from .node import Node
from .openapi import query_parameters
from .peersync import config_allow_list, record_incoming
from .runtime import remove_runfile, write_runfile

log = logging.getLogger(__name__)

NODE_KEY = h.NODE_KEY
READY_KEY = h.READY_KEY


@dataclass(frozen=True)
class Route:
    """One route of the local API: who may call it is part of its definition."""

    method: str
    path: str
    handler: Callable[[web.Request], Any]
    access: str  # public | read | write
    #: The handler reads the body as a stream (any size); else whole, up to node.max_body.
    streams_body: bool = False


ROUTES: tuple[Route, ...] = (
    Route("GET", "/", h.index, "public"),
    Route("GET", "/healthz", h.healthz, "public"),
    Route("GET", "/openapi.json", h.openapi, "public"),
    Route("GET", "/static/{path:.+}", h.static_file, "public"),
    Route("GET", "/metrics", h.metrics, "read"),
    Route("GET", "/v1/status", h.status, "read"),
    Route("GET", "/v1/genesis", h.genesis, "read"),
    Route("GET", "/v1/facts", h.list_facts, "read"),
    Route("POST", "/v1/facts", h.write_facts, "write"),
    Route("GET", "/v1/blocks/{cid}", h.get_block, "read"),
    Route("GET", "/v1/query", h.query, "read"),
    Route("POST", "/v1/query", h.query, "read"),
    Route("GET", "/v1/subscribe", h.subscribe, "read"),
    Route("POST", "/v1/subscribe", h.subscribe, "read"),
    Route("GET", "/v1/export", h.export_car, "read"),
    Route("POST", "/v1/program", h.load_program, "write"),
    Route("POST", "/v1/sync", h.sync_now, "write"),
    Route("DELETE", "/v1/sync/history", h.forget_sync_history, "write"),
    Route("GET", "/v1/writers", h.list_writers, "read"),
    Route("POST", "/v1/writers", h.grant, "write"),
    Route("DELETE", "/v1/writers/{key}", h.revoke, "write"),
    Route("POST", "/v1/import", h.import_car, "write", streams_body=True),
)

#: Prefix of the peer sync sub-app (replication's /v1/datasets/{id}/... routes).
SYNC_PREFIX = "/v1/datasets"
#: Seconds a stopping node waits for write requests in flight to be answered (a write
#: of the largest body takes seconds; it commits whether it is waited for or not).
WRITE_DRAIN_TIMEOUT = 300.0


def peer_routes(node: Node) -> tuple[web.Application, list[web.RouteDef]]:
    """replication's signed peer routes for this node's replica: the dataset sync routes
    as a sub-app mounted at ``SYNC_PREFIX``, and the rest (``/v1/inbox``) as plain routes.
    """
    from merklog.replication.server import sync_routes

    from .metrics import ServedSyncCounts

    routes, _service = sync_routes(
        {node.replica.dataset: node.served_replica},
        config_allow_list(node.config),
        inbox=node.inbox,
        metrics=ServedSyncCounts(node.metrics),
        on_served=partial(record_incoming, node),
    )
    sync = web.Application()
    others: list[web.RouteDef] = []
    for route in routes:
        assert isinstance(route, web.RouteDef)
        if route.path.startswith(SYNC_PREFIX + "/"):
            _add(sync, route.method, route.path[len(SYNC_PREFIX) :], route.handler)
        else:
            others.append(route)
    return sync, others


def _add(app: web.Application, method: str, path: str, handler: Any) -> None:
    """Route ``method path`` to ``handler``; a GET route answers HEAD too (RFC 9110
    §9.3.2: uptime checkers send HEAD), with GET's headers and no body."""
    expect = middleware.expect_continue
    if method == "GET":
        app.router.add_get(path, handler, expect_handler=expect)  # and HEAD (allow_head)
    else:
        app.router.add_route(method, path, handler, expect_handler=expect)


def build_app(
    node: Node, body_worker: Worker | None = None, manage_node: bool = True
) -> web.Application:
    """The whole HTTP surface of ``node``: local API, then the peer sync sub-app.
    ``body_worker``: a process that decodes large write bodies (ADR 0148), or None to
    decode every body in this process. ``manage_node``: the app starts the node's
    background tasks when it starts and stops them when it stops (``merklog node run``);
    False for a node an app already runs (:func:`merklog.serve`)."""
    app = web.Application(
        client_max_size=int(node.config.get("node.max_body")),
        middlewares=[
            middleware.count,
            cors.preflight,
            middleware.in_flight,
            middleware.errors,
            middleware.auth,
            middleware.query_params,
            middleware.body_limit,
        ],
    )
    app[NODE_KEY] = node
    app[READY_KEY] = {"ready": False}
    app[h.CLOSING_KEY] = asyncio.Event()
    app[middleware.CONFIG_KEY] = node.config
    cors.install(app, node.config)
    app[middleware.METRICS_KEY] = node.metrics
    app[middleware.IN_FLIGHT_KEY] = middleware.InFlight()
    app[h.BODY_DECODER_KEY] = h.BodyDecoder(body_worker)
    app[h.READ_POOL_KEY] = h.ReadPool()
    app[h.LIVE_QUERIES_KEY] = h.LiveQueries(int(node.config.get("node.max_live_queries")))
    access: dict[tuple[str, str], str] = {}
    for route in ROUTES:
        _add(app, route.method, route.path, route.handler)
        access[(route.method, route.path)] = route.access
    static_dir(node.config, must_exist=True)  # refuses a folder that would publish the home
    sync, others = peer_routes(node)
    for route in others:
        _add(app, route.method, route.path, route.handler)
        access[(route.method, route.path)] = "peer"
    app.add_subapp(SYNC_PREFIX, sync)
    app[middleware.ACCESS_KEY] = access
    app[middleware.PARAMS_KEY] = query_parameters()
    app[middleware.BUFFERED_KEY] = frozenset(
        (r.method, r.path) for r in ROUTES if r.method == "POST" and not r.streams_body
    )

    async def on_startup(app: web.Application) -> None:
        if manage_node:
            node.start()
        app[READY_KEY]["ready"] = True

    async def on_shutdown(app: web.Application) -> None:
        app[READY_KEY]["ready"] = False
        app[h.CLOSING_KEY].set()  # live-query streams end now, not at the shutdown timeout
        if manage_node:
            await node.stop()

    async def on_cleanup(app: web.Application) -> None:
        app[h.READ_POOL_KEY].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.on_shutdown.append(on_shutdown)
    return app


def router_routes(app: web.Application) -> set[tuple[str, str]]:
    """``(METHOD, path template)`` of every route ``app`` answers (sub-apps included,
    HEAD left out): what ``/openapi.json`` must list."""
    out: set[tuple[str, str]] = set()
    for resource in app.router.resources():
        if isinstance(resource, web.PrefixedSubAppResource):
            out |= router_routes(resource._app)  # its resources carry the prefix already
            continue
        for route in resource:
            if route.method != "HEAD":
                out.add((route.method, resource.canonical))
    return out


#: Longest request line (method, URL, version) the node reads: longer answers 414.
MAX_REQUEST_LINE = 8190
#: Longest header (name and value) the node reads: longer, or more than aiohttp's 128
#: headers, answers 431. Unlike the request line's, so the two can be told apart.
MAX_HEADER = 16384


def unparsed_answer(exc: Exception, max_line: int = MAX_REQUEST_LINE) -> tuple[int, str, str]:
    """``(status, error, detail)`` for a request aiohttp could not parse. The detail
    never quotes the request: aiohttp's own message holds the Python repr of the request
    line, ``?access_token=`` and all."""
    from aiohttp.http_exceptions import LineTooLong

    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (max_line,):
            return 414, "uri too long", f"the request line is over {max_line} bytes"
        return 431, "request header fields too large", f"a header is over {MAX_HEADER} bytes"
    if "Too many headers" in str(exc):
        return 431, "request header fields too large", "the request has too many headers"
    twice = _DUPLICATE_HEADER.search(str(exc))
    if twice is not None:  # a header's name only, never a value (QA: named nothing)
        return 400, "bad request", f"the request gives the header {twice[1]} more than once"
    return 400, "bad request", "the request is not valid HTTP/1.1"


#: aiohttp's words for a header that may be given once (Content-Type, Content-Length, …).
_DUPLICATE_HEADER = re.compile(r"Duplicate '([A-Za-z0-9-]{1,64})' header found")


def _node_server(metrics: Any, origins: frozenset[str] = frozenset()) -> type[web.Server]:
    """aiohttp's low-level server, but a request it cannot parse is answered as every
    other error (a JSON ``{"error", "detail"}``, counted in
    ``merklog_http_requests_total`` under ``route="unmatched"``) and logged without its
    text. aiohttp answered plain text echoing the request line and logged that line."""

    class Handler(web.RequestHandler):
        def data_received(self, data: bytes) -> None:
            """aiohttp's, but a body that turns malformed after its request was handed to
            a handler (a bad chunk size mid-body) fails that handler's read: aiohttp queued
            the parse error as a next request and never ended the body, so the handler
            waited forever and, for a write, held the node's stop (QA)."""
            from aiohttp.web_protocol import RequestPayloadError, _ErrInfo

            queued = len(self._messages)
            super().data_received(data)
            current = self._current_request
            if current is None or current._payload.is_eof():
                return
            for i in range(queued, len(self._messages)):
                if isinstance(self._messages[i][0], _ErrInfo):
                    del self._messages[i]
                    self._keepalive = False  # the stream is out of step: close after,
                    self._lingering_time = 0.0  # without reading the rest of the body
                    current._payload.set_exception(
                        RequestPayloadError("the body is not valid HTTP/1.1 chunked encoding")
                    )
                    break

        def handle_error(
            self,
            request: Any,
            status: int = 500,
            exc: BaseException | None = None,
            message: str | None = None,
        ) -> web.StreamResponse:
            from aiohttp.http_exceptions import HttpProcessingError

            if not isinstance(exc, HttpProcessingError):
                return super().handle_error(request, status, exc, message)
            status, error, detail = unparsed_answer(exc, self.max_line_size)
            log.info("bad HTTP request: %s %s (%s)", status, detail, type(exc).__name__)
            metrics.http_requests.labels("unmatched", request.method, str(status)).inc()
            response = middleware.json_error(status, error, detail)
            response.force_close()
            # QA: these answers had no CORS headers, so a listed page saw only a network
            # error. aiohttp keeps none of an unparsed request's headers, so its Origin is
            # unknown: with one origin listed, that one may read the error (it holds no
            # data); with several, none can be chosen.
            if len(origins) == 1:
                (origin,) = origins
                response.headers["Access-Control-Allow-Origin"] = origin
            if origins:
                response.headers["Vary"] = "Origin"
            return response

    class Server(web.Server):
        def __call__(self) -> web.RequestHandler:
            return Handler(self, loop=self._loop, **self._kwargs)

    return Server


class _Runner(web.AppRunner):
    """``web.AppRunner`` whose server answers unparsable requests as JSON errors."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        origins = self.app.get(cors.ORIGINS_KEY) or frozenset()
        server.__class__ = _node_server(self.app[middleware.METRICS_KEY], origins)
        return server


def _bad_request_line(record: logging.LogRecord) -> bool:
    """A request aiohttp could not parse is the client's mistake, answered 4xx: should
    aiohttp.server log one (the node's handler above logs them itself), one INFO line
    without the request's text (aiohttp's message quotes the request line, tokens and
    all), not an ERROR with a traceback."""
    from aiohttp.http_exceptions import HttpProcessingError

    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError):
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "bad HTTP request: %s (%s)", (exc.code, type(exc).__name__)
        record.exc_info = record.exc_text = None
        return logging.getLogger("aiohttp.server").isEnabledFor(logging.INFO)
    return True


@dataclass
class Serving:
    """A node's HTTP API listening on ``url`` (:func:`start_serving`); :meth:`close`
    stops it."""

    node: Node
    url: str
    runner: web.AppRunner
    app: web.Application

    async def close(self) -> None:
        """Remove the run file (CLI commands on the home open it themselves again), stop
        listening, answer the writes in flight and close every connection."""
        remove_runfile(self.node.home)
        if self.node.url == self.url:
            self.node.url = None
        await _finish_writes(self.runner, self.app)
        await self.runner.cleanup()


async def start_serving(
    node: Node,
    host: str,
    port: int,
    body_worker: Worker | None = None,
    manage_node: bool = True,
) -> Serving:
    """Listen on ``host:port`` (0: any free port) with ``node``'s whole HTTP surface and
    write the home's run file, so ``merklog`` commands on the home go through it."""
    app = build_app(node, body_worker, manage_node)
    server_log = logging.getLogger("aiohttp.server")
    if _bad_request_line not in server_log.filters:
        server_log.addFilter(_bad_request_line)
    # No aiohttp access log: it would print ?access_token= query strings.
    runner = _Runner(
        app,
        handle_signals=False,
        shutdown_timeout=2,
        access_log=None,
        max_line_size=MAX_REQUEST_LINE,
        max_field_size=MAX_HEADER,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
    bound = sockets[0].getsockname()[1] if sockets else port
    url = f"http://{host}:{bound}"
    node.url = url
    write_runfile(node.home, url)
    return Serving(node, url, runner, app)


async def serve(
    node: Node,
    host: str,
    port: int,
    announce: Callable[[str], None],
    body_worker: Worker | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM; ``announce(url)`` once listening and ready."""
    serving = await start_serving(node, host, port, body_worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptFailures(loop.get_exception_handler()))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    announce(serving.url)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await serving.close()


class AcceptFailures:
    """The event loop's exception handler of a serving node: asyncio's own for everything
    but the listener's ``socket.accept() out of system resource`` (out of file
    descriptors, ``ulimit -n``), which asyncio logs with a traceback at every attempt
    (QA: 31,844 times in 30 s, 13 MB of log). That is one WARNING a minute, without the
    traceback, saying what to do; the connections wait in the listen queue meanwhile."""

    #: Seconds between two warnings of the same failure.
    EVERY = 60.0

    def __init__(self, previous: Callable[..., Any] | None) -> None:
        self.previous = previous
        self.last = float("-inf")
        self.missed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system"):
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = loop.time()
        if now - self.last < self.EVERY:
            self.missed += 1
            return
        exc = context.get("exception")
        more = f" ({self.missed} more since the last warning)" if self.missed else ""
        log.warning(
            "cannot accept connections: %s%s; they wait until descriptors free up"
            " (raise the open-files limit, ulimit -n, of the node)",
            getattr(exc, "strerror", None) or exc,
            more,
        )
        self.last, self.missed = now, 0


async def _finish_writes(runner: web.AppRunner, app: web.Application) -> None:
    """Stop listening, then wait for the write requests in flight to be read, stored and
    answered, before the runner's cleanup: that closes every connection, after which
    aiohttp reads no more of a body, and cancels a handler still running two seconds
    later, while its write commits in a worker thread all the same. The epoch loop still
    runs meanwhile, so each such write's epoch answers it at once."""
    app[READY_KEY]["ready"] = False
    app[h.CLOSING_KEY].set()  # live-query streams end now, not after the writes
    for site in list(runner.sites):
        await site.stop()
    if not await app[middleware.IN_FLIGHT_KEY].drained(WRITE_DRAIN_TIMEOUT):
        log.warning("stopping with write requests still unanswered")


def static_path(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()
