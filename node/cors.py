"""Cross-origin calls from the pages of the origins ``api.cors_origins`` names (CORS).

A page served from another origin than the node (a dev server on another port, an app
on its own domain) may call the API only if the node answers the browser's checks: a
preflight ``OPTIONS`` before any call that sends a token or a JSON body, and an
``Access-Control-Allow-Origin`` header on every answer (errors and live-query streams
included) before the page may read it. With no origin configured (the default) the node
sends no such header and refuses every preflight, as before.

- :func:`preflight`, a middleware (outside error mapping and auth: a preflight carries
  no token), answers ``OPTIONS`` preflights: 204 with the methods and headers allowed
  for a listed origin, a JSON 403 naming the option for any other.
- :func:`allow_origin`, an ``on_response_prepare`` hook, adds the origin's headers to
  every answer to a listed origin just before its headers are sent, so streams
  (``text/event-stream``) get them too.

No ``Access-Control-Allow-Credentials``: the API takes tokens in the ``Authorization``
header (or ``?access_token=`` on reads), never cookies.
"""

from __future__ import annotations

from aiohttp import web

from .config import Config, cors_origins
from .middleware import Handler, json_error

#: What a listed origin's pages may send: the API's methods, a token and a JSON body.
ALLOW_METHODS = "GET, HEAD, POST, DELETE"
ALLOW_HEADERS = "Authorization, Content-Type"
#: How long a browser may keep a preflight's answer, in seconds.
MAX_AGE = "600"
ORIGINS_KEY = web.AppKey("merklog_cors_origins", frozenset)


def origins(config: Config) -> frozenset[str]:
    """The origins ``config`` lets call the API (checked when the config was read)."""
    return cors_origins(str(config.get("api.cors_origins")))


def _listed(request: web.Request) -> str | None:
    origin = request.headers.get("Origin")
    if origin and origin.lower() in request.config_dict[ORIGINS_KEY]:
        return origin
    return None


@web.middleware
async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return await handler(request)
    origin = _listed(request)
    asked = request.headers["Access-Control-Request-Method"].strip().upper()
    if origin is not None and asked not in ALLOW_METHODS.split(", "):
        return json_error(  # QA: a preflight for PUT got 204, for a method no route takes
            405,
            "method not allowed",
            f"no route takes {asked}; a page may call this node with {ALLOW_METHODS}",
        )
    if origin is None:
        return json_error(
            403,
            "origin not allowed",
            f"pages of {request.headers.get('Origin', 'no origin')} may not call this node:"
            " list their origin in api.cors_origins",
        )
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": MAX_AGE,
        },
    )


async def allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    """Let a listed origin's page read this answer (the errors' too)."""
    origin = _listed(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        # a page may read why a call was refused and where a stream was cut
        response.headers["Access-Control-Expose-Headers"] = "WWW-Authenticate, Retry-After"
    if request.config_dict[ORIGINS_KEY]:  # the answer depends on the Origin header
        response.headers.add("Vary", "Origin")


def install(app: web.Application, config: Config) -> None:
    """Set ``app`` up for the origins of ``config`` (``preflight`` is in its middlewares)."""
    app[ORIGINS_KEY] = origins(config)
    app.on_response_prepare.append(allow_origin)


__all__ = ["ALLOW_HEADERS", "ALLOW_METHODS", "allow_origin", "install", "origins", "preflight"]
