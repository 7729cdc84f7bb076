"""The HTTP app's middlewares: request metrics, bearer-token auth and error mapping.

Order (outermost first): ``count`` (every answer by route template and status),
``in_flight`` (requests that change the home, which a shutdown lets finish and
answer), ``errors`` (every failure becomes a JSON body ``{"error", "detail"}`` with
the right status; a client that went away is not an error), ``auth`` (the token a
route needs, from the route table in :mod:`merklog.node.server`), ``query_params`` (a
``/v1`` URL parameter the route does not take is refused), ``body_limit`` (a body
declared over ``node.max_body`` is refused from the headers).

:func:`expect_continue` answers ``Expect: 100-continue`` for the same routes: a
request its headers already refuse gets no "100 Continue", so its client hears the
refusal without uploading the body.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import ClientConnectionError, ClientPayloadError, web
from aiohttp.web_protocol import RequestPayloadError

from merklog.replication.errors import ReplicationError
from merklog.store import (
    BlockNotFound,
    Error,
    Fact,
    InvalidValue,
    StoreError,
    StoreUnavailable,
)

from .config import Config
from .errors import Forbidden, NodeError, NodeInputError, NodeStopped, Unauthorized
from .failures import ExitCode, Failure, classify
from .jsonvalues import fact_to_json
from .metrics import NodeMetrics

log = logging.getLogger(__name__)

#: HTTP status and error name for each exit status of :mod:`merklog.node.failures`.
_FAILURE_STATUS: dict[int, tuple[int, str]] = {
    ExitCode.BAD_INPUT: (400, "bad input"),
    ExitCode.NOT_FOUND: (404, "not found"),
    ExitCode.PEER_UNREACHABLE: (502, "peer unreachable"),
    ExitCode.STORE_DAMAGED: (500, "store damaged"),
    ExitCode.DISK_FULL: (507, "disk full"),
    ExitCode.NOT_A_WRITER: (403, "refused"),
    ExitCode.FAILED: (409, "failed"),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: ``(method, route template) -> access`` where access is public | read | write | peer.
ACCESS_KEY = web.AppKey("merklog_access", dict)
CONFIG_KEY = web.AppKey("merklog_config", Config)
#: ``(method, route template)`` of the routes that read their whole body into memory,
#: so that ``node.max_body`` bounds it (not ``/v1/import``, which streams).
BUFFERED_KEY = web.AppKey("merklog_buffered_bodies", frozenset)
METRICS_KEY = web.AppKey("merklog_metrics", NodeMetrics)


class ApiError(NodeError):
    """An answer other than 200 decided by a handler: status, error name, detail, and
    the fact it refused, if one (see :func:`json_error`)."""

    def __init__(self, status: int, error: str, detail: str = "", fact: Any = None) -> None:
        super().__init__(detail or error)
        self.status = status
        self.error = error
        self.detail = detail
        self.fact = fact
        #: Seconds for a ``Retry-After`` header (a 503 ``busy``), if the caller may retry.
        self.retry_after: int | None = None


def json_error(status: int, error: str, detail: str = "", fact: Any = None) -> web.Response:
    """``{"error", "detail"}``, and ``"fact"`` in the typed JSON fact form when the
    error is about one fact of a write (a misfit, a fact over 1 MiB): a client that sent
    many facts can tell which, and where it came from."""
    body: dict[str, Any] = {"error": error}
    if detail:
        body["detail"] = detail
    if isinstance(fact, Fact):
        body["fact"] = fact_to_json(fact)
    return web.json_response(body, status=status)


def route_template(request: web.Request) -> str:
    """The matched route's template (``/v1/blocks/{cid}``), or ``unmatched``."""
    route = request.match_info.route
    resource = getattr(route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


def route_access(request: web.Request) -> str:
    """Which credential the matched route needs (public for unknown paths: they 404)."""
    if getattr(request.match_info, "http_exception", None) is not None:
        return "public"
    method = "GET" if request.method == "HEAD" else request.method
    table: dict = request.config_dict[ACCESS_KEY]
    return table.get((method, route_template(request)), "public")


# ------------------------------------------------------------------------- auth


def _presented_token(request: web.Request) -> str:
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer":  # the scheme name is case-insensitive (RFC 7235 §2.1)
        return credentials.strip()
    # EventSource (SSE) cannot send headers: reads may carry ?access_token= (RFC 6750 §2.3).
    if request.method in ("GET", "HEAD"):
        return request.query.get("access_token", "")
    return ""


def _matches(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``, in constant time. A header's bytes that are not
    UTF-8 reach here as lone surrogates (aiohttp decodes with ``surrogateescape``): they
    match no token, so they are a wrong token (401), not a codec error."""
    if not expected:
        return False
    try:
        presented = given.encode()
    except UnicodeEncodeError:
        presented = b""
    return hmac.compare_digest(presented, expected.encode())


def check_token(config: Config, access: str, token: str) -> None:
    """Raise Unauthorized (401) unless ``token`` grants ``access`` (read or write), or
    Forbidden (403) for the read token on a write route: it is valid, and no other
    credential for the same token would help (RFC 9110 §15.5.4).

    The write token (``api.token``) grants reads too; ``api.read_token`` grants reads
    only; ``api.anonymous_reads = true`` lets reads through without a token. A token
    that is presented and wrong is refused even then: a client with a stale or mistyped
    token learns it from its first read, not from its first write (RFC 6750 §3.1).
    """
    write = config.get("api.token")
    if access == "write":
        if _matches(token, write):
            return
        if _matches(token, config.get("api.read_token")):
            raise Forbidden(
                "the read token (api.read_token) grants reads only: send Authorization:"
                " Bearer <api.token> (the write token)"
            )
        raise Unauthorized("send Authorization: Bearer <api.token> (the write token)")
    if access == "read":
        if _matches(token, write) or _matches(token, config.get("api.read_token")):
            return
        if config.get("api.anonymous_reads"):
            if not token:
                return
            raise Unauthorized(
                "the token is neither api.read_token nor api.token (reads are open without"
                " one: api.anonymous_reads)"
            )
        raise Unauthorized("send Authorization: Bearer <api.read_token or api.token>")


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routes marked read/write need a bearer token; peer routes check signatures
    themselves (replication), public ones (health, OpenAPI, the app page) need none."""
    access = route_access(request)
    if access in ("read", "write"):
        _token_given_once(request)
        check_token(request.app[CONFIG_KEY], access, _presented_token(request))
    return await handler(request)


def _token_given_once(request: web.Request) -> None:
    """Bad input (400) for a token given more than once: ``?access_token=`` or the
    ``Authorization`` header twice (the
    first was taken, so a right one after a wrong one was refused and the other way
    round let through) or beside an ``Authorization`` header (whose token was taken and
    the URL's ignored, right or wrong). As any other URL parameter given twice."""
    given = len(request.query.getall("access_token", []))
    if given > 1:
        raise NodeInputError(f"access_token= is given {given} times: give it once")
    headers = len(request.headers.getall("Authorization", []))
    if headers > 1:  # the first was taken, as with access_token= twice
        raise NodeInputError(f"the Authorization header is given {headers} times: give it once")
    if given and request.headers.get("Authorization"):
        raise NodeInputError(
            "the token is given twice, in the Authorization header and as access_token=:"
            " give it once"
        )


# ------------------------------------------------------------ query parameters

#: ``(method, route template) -> the URL query parameters the route takes``
#: (:func:`merklog.node.openapi.query_parameters`).
PARAMS_KEY = web.AppKey("merklog_query_params", dict)


def unknown_query_params(request: web.Request) -> NodeInputError | None:
    """The refusal of a ``/v1`` request whose URL names a parameter its route does not
    take (``?limt=5``), or None. A misspelt parameter was ignored, and the request
    answered without it (a first page of 1,000 rows), where a JSON body's unknown field
    is refused."""
    template = route_template(request)
    if not request.query or not template.startswith("/v1/"):
        return None
    method = "GET" if request.method == "HEAD" else request.method
    takes = request.config_dict[PARAMS_KEY].get((method, template))
    if takes is None:  # a 404 or 405: its own answer says why
        return None
    unknown = sorted(set(request.query) - takes)
    if not unknown:
        return None
    names = ", ".join(f"{name}=" for name in unknown)
    known = ", ".join(f"{name}=" for name in sorted(takes)) or "no URL parameter"
    return NodeInputError(f"unknown URL parameter {names}: {method} {template} takes {known}")


def non_utf8_query(request: web.Request) -> NodeInputError | None:
    """The refusal of a ``/v1`` request whose URL parameters are not UTF-8 once their
    %-escapes are decoded (``q=u(%22%ff%22)``), or None. They were read with every bad
    byte replaced by U+FFFD, so such a query matched the string "\ufffd" and answered
    true, and a refusal quoted a character the client never sent."""
    raw = request.rel_url.raw_query_string
    if not raw or "%" not in raw or not request.path.startswith("/v1/"):
        return None
    for pair in raw.split("&"):
        name, _, value = pair.partition("=")
        for part, what in ((name, "name"), (value, "value")):
            data = unquote_to_bytes(part.replace("+", " "))
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                label = unquote_to_bytes(name).decode("utf-8", "backslashreplace")
                return NodeInputError(
                    f"URL parameter {label}=: its {what} is not UTF-8 (byte"
                    f" 0x{data[exc.start]:02x} at byte {exc.start + 1} once %-decoded)"
                )
    return None


@web.middleware
async def query_params(request: web.Request, handler: Handler) -> web.StreamResponse:
    """400 for a ``/v1`` request with a URL parameter its route does not take, or one
    that is not UTF-8."""
    refusal = non_utf8_query(request) or unknown_query_params(request)
    if refusal is not None:
        raise refusal
    return await handler(request)


# ------------------------------------------------------------------ body limit


def declared_too_large(request: web.Request) -> bool:
    """Whether ``request`` declares (``Content-Length``) a body over ``node.max_body``
    for a route that reads its body whole."""
    length = request.content_length
    if length is None or length <= request.client_max_size:
        return False
    method = "GET" if request.method == "HEAD" else request.method
    return (method, route_template(request)) in request.config_dict.get(BUFFERED_KEY, ())


@web.middleware
async def body_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
    """413 for a body declared over ``node.max_body``, from the headers: at once,
    instead of after the upload (or never, for a client that waits for an answer
    before sending the rest). A body without ``Content-Length`` (chunked) is refused
    once it passes the limit while it is read (aiohttp's ``client_max_size``)."""
    if declared_too_large(request):
        raise web.HTTPRequestEntityTooLarge(
            max_size=request.client_max_size, actual_size=request.content_length or 0
        )
    return await handler(request)


def refused_from_headers(request: web.Request) -> bool:
    """Whether ``auth``, ``query_params`` or ``body_limit`` will refuse ``request``
    before its body."""
    access = route_access(request)
    if access in ("read", "write"):
        try:
            check_token(request.config_dict[CONFIG_KEY], access, _presented_token(request))
        except (Unauthorized, Forbidden):
            return True
    return (
        non_utf8_query(request) is not None
        or unknown_query_params(request) is not None
        or declared_too_large(request)
    )


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """The answer to ``Expect: 100-continue`` (RFC 9110 §10.1.1): "100 Continue" unless
    the headers already decide a refusal (a missing or wrong token, an unknown URL
    parameter, a body declared over ``node.max_body``); then nothing, and the
    middlewares answer the refusal while the client still holds its body. Any other expectation: 417."""
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return json_error(417, "expectation failed", f"Expect: {expect} is not supported")
    if request.version >= (1, 1) and not refused_from_headers(request):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer proper has not started
    return None


# ------------------------------------------------------------------------- errors


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def map_failure(exc: BaseException, home: Path | None = None) -> tuple[int, str, str] | None:
    """(status, error, detail) for a failure a user can cause or meet; None for a bug.

    Past the answers only HTTP has (an :class:`ApiError`, 401, a replication error's
    own status, a down IPFS daemon), a failure is classified as the CLI classifies it
    (:func:`merklog.node.failures.classify`: a full disk is 507 as it is exit 6)."""
    if isinstance(exc, ApiError):
        return exc.status, exc.error, exc.detail
    if isinstance(exc, Unauthorized):
        return 401, "unauthorized", str(exc)
    if isinstance(exc, Forbidden):
        return 403, "forbidden", str(exc)
    if isinstance(exc, BlockNotFound):
        return 404, "not found", str(exc)
    if isinstance(exc, ReplicationError):
        return exc.status, exc.code, exc.detail
    if isinstance(exc, Failure):  # the CLI's classification, as an HTTP status
        status, error = _FAILURE_STATUS.get(exc.exit_code, (500, "failed"))
        return getattr(exc, "http_status", status), error, str(exc)
    if isinstance(exc, NodeStopped):  # a sync cut short by the node's stop: try again
        return 503, "node stopping", str(exc)
    if isinstance(exc, NodeInputError | InvalidValue) or (
        isinstance(exc, Error) and isinstance(exc, ValueError)
    ):
        return 400, "bad input", str(exc)
    if isinstance(exc, StoreUnavailable):  # an IPFS home's daemon is down: nothing changed
        return 503, "store unavailable", str(exc)
    code, message = classify(exc, home)
    if code == ExitCode.FAILED and isinstance(exc, StoreError):
        return 500, "store error", str(exc)
    if code in _FAILURE_STATUS:
        status, error = _FAILURE_STATUS[code]
        return status, error, message
    return None


#: The ``Content-Encoding`` values of request bodies the node decodes (aiohttp's).
BODY_CODINGS = frozenset({"", "identity", "gzip", "deflate"})


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure a JSON body with the right status; never a traceback page.

    aiohttp's own answers (404 unknown path, 405, 413 body too large, …) are
    re-rendered as JSON. A client that disconnects mid-request (e.g. mid-sync) is
    logged at DEBUG and no answer is attempted on the closed connection. A body in a
    content coding the node does not decode is 415, one that does not decode is 400.
    """
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in BODY_CODINGS and request.body_exists:
        # QA: "xyz" was ignored and the body read as plain; refused before any handler
        return json_error(
            415,
            "unsupported media type",
            f"Content-Encoding {coding!r} is not one this node decodes: send the body as"
            " identity, gzip or deflate",
        )
    try:
        response = await handler(request)
    except RequestPayloadError as exc:  # QA: a gzip body that is not gzip answered 500
        why = " ".join(str(exc).split()).removeprefix("400, message: ")
        named = f" (Content-Encoding: {coding})" if coding not in ("", "identity") else ""
        return json_error(400, "bad input", f"the request body could not be read{named}: {why}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else ""
        if exc.status == 405:
            allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
            detail = f"{request.method} is not allowed here; use {allowed}"
        elif exc.status == 404 and not detail:
            detail = f"no route {request.path} (see /openapi.json)"
        elif exc.status == 413:
            declared = request.content_length
            limit = f"{request.client_max_size} bytes (node.max_body)"
            if request.headers.get("Content-Encoding", "identity").lower() != "identity":
                # the declared size is the compressed one, which may well be under the
                # limit: "of 2087280 bytes exceeds 16777216 bytes" contradicted itself (QA)
                sent = f" ({declared} bytes as sent)" if declared is not None else ""
                detail = f"request body decompresses to more than {limit}{sent}"
            else:
                size = f"of {declared} bytes " if declared is not None else ""
                detail = f"request body {size}exceeds {limit}"
        response = json_error(exc.status, exc.reason.lower(), detail)
        for name in ("Allow",):
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except (ConnectionResetError, ClientConnectionError, ClientPayloadError) as exc:
        if not _client_gone(request):
            raise  # e.g. an outgoing call failed: a real error, mapped by the caller
        log.debug("%s %s: client went away (%s)", request.method, request.path, exc)
        return web.Response(status=499)  # never sent: aiohttp drops it on a closed transport
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        mapped = map_failure(exc, request.app[CONFIG_KEY].home)
        if mapped is None:
            log.exception("%s %s failed", request.method, request.path)
            return json_error(500, "internal error", f"{type(exc).__name__}: {exc}")
        status, error, detail = mapped
        if status >= 500 and status not in (502, 504):  # a peer down: the sync logged it
            log.warning("%s %s: %s", request.method, request.path, detail)
        if status in (400, 401, 403):
            request.app[METRICS_KEY].rejected.inc()
        response = json_error(status, error, detail, getattr(exc, "fact", None))
        if status == 401:  # the scheme to authenticate with (RFC 9110 §11.6.1, RFC 6750 §3)
            response.headers["WWW-Authenticate"] = 'Bearer realm="merklog"'
        retry = getattr(exc, "retry_after", None)
        if retry is not None:
            response.headers["Retry-After"] = str(retry)
        return response
    return response


# ------------------------------------------------------------------------- metrics


async def _template_of_path(app: web.Application, request: web.Request) -> str:
    """The template of the route whose path ``request`` matches, whatever its method
    (a 405 resolves to no route), or ``unmatched``."""
    for resource in app.router.resources():
        if isinstance(resource, web.PrefixedSubAppResource):
            found = await _template_of_path(resource._app, request)  # prefixed already
            if found != "unmatched":
                return found
            continue
        _match, allowed = await resource.resolve(request)
        if allowed:
            return resource.canonical
    return "unmatched"


@web.middleware
async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every answer in ``merklog_http_requests_total{route, method, status}``; a
    405 under the route of its path."""
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        route = route_template(request)
        if status == 405 and route == "unmatched":
            route = await _template_of_path(request.app, request)
        request.app[METRICS_KEY].http_requests.labels(route, request.method, str(status)).inc()


class InFlight:
    """The requests that change the home (writes, imports, grants, loads, a peer's
    push), from arrival to answer. A stopping node waits for them (``server``): aiohttp
    cancels a handler still running two seconds into its shutdown, and a large write
    committed in its worker thread all the same, stored but never answered (the client
    told "no answer … may have been applied")."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until none is in flight (True), or ``timeout`` seconds (False)."""
        if self.count:
            log.info("stopping: waiting for %d write request(s) to be answered", self.count)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


IN_FLIGHT_KEY = web.AppKey("merklog_in_flight", InFlight)
#: Requests that change nothing here (or nothing a client waits to hear is stored): a
#: query or a live query sent as POST, and an outgoing sync, which a shutdown may cut
#: short (it applies each peer's deltas in one transaction; a retry resumes it). QA: a
#: live query's client sending its body slowly held the node's stop for minutes.
_NOT_WRITES = frozenset({"/v1/query", "/v1/subscribe", "/v1/sync"})


@web.middleware
async def in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Hold :class:`InFlight` while a request that may change the home is handled."""
    if request.method in ("GET", "HEAD", "OPTIONS") or request.path in _NOT_WRITES:
        return await handler(request)
    with request.config_dict[IN_FLIGHT_KEY].hold():
        return await handler(request)
