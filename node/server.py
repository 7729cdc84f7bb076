"""The node's HTTP server: local API, live queries (SSE), health, metrics, OpenAPI, and
the peer sync routes, all on one aiohttp application.

Local write endpoints need ``Authorization: Bearer <api.token>``; reads are open
(bind to 127.0.0.1, the default, to keep them local). Peer routes authenticate
each request by the calling node's Ed25519 signature (see replication).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from merklog.store import (
    BlockNotFound,
    Link,
    StoreError,
    StoreUnavailable,
    decode,
    decode_fact,
)

from . import wiring
from .metrics import CONTENT_TYPE_LATEST
from .node import Node
from .openapi import openapi_document
from .runtime import remove_runfile, write_runfile

log = logging.getLogger(__name__)

NODE_KEY = web.AppKey("node", Node)
READY_KEY = web.AppKey("ready", dict)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, message: str, detail: str = "") -> web.Response:
    body: dict[str, Any] = {"error": message}
    if detail:
        body["detail"] = detail
    return web.json_response(body, status=status)


def _input_errors() -> tuple[type[BaseException], ...]:
    from merklog.store import InvalidValue

    return (wiring.NodeInputError, InvalidValue, ValueError)


def _require_token(request: web.Request) -> web.Response | None:
    node = request.app[NODE_KEY]
    token = node.config.get("api.token")
    got = request.headers.get("Authorization", "")
    if not token or not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
        node.metrics.rejected.inc()
        return error(401, "unauthorized", "send Authorization: Bearer <api.token from config>")
    return None


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise wiring.NodeInputError(f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise wiring.NodeInputError("request body must be a JSON object")
    return body


# ------------------------------------------------------------------------- handlers


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    ready = request.app[READY_KEY].get("ready", False)
    return web.json_response(
        {"status": "ok" if ready else "starting", "epoch": node.epoch}, status=200 if ready else 503
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[NODE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE_KEY].status())


async def list_facts(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    rel = request.query.get("rel")
    facts = await asyncio.get_running_loop().run_in_executor(None, node.list_facts, rel)
    return web.json_response({"facts": [{"cid": str(c), "fact": str(f)} for c, f in facts]})


async def write_facts(request: web.Request) -> web.Response:
    if (denied := _require_token(request)) is not None:
        return denied
    node = request.app[NODE_KEY]
    try:
        body = await _json_body(request)
        asserts = body.get("assert") or ""
        retracts = body.get("retract") or ""
        if not isinstance(asserts, str) or not isinstance(retracts, str):
            raise wiring.NodeInputError('"assert" and "retract" must be strings of Datalog facts')
        add = node.coerce_facts([asserts]) if asserts.strip() else []
        rem = node.coerce_facts([retracts]) if retracts.strip() else []
    except _input_errors() as exc:
        node.metrics.rejected.inc()
        return error(400, "bad input", str(exc))
    try:
        result = await node.write_async(add, rem)
    except wiring.replication_errors() as exc:  # e.g. this key is not (yet) a writer
        node.metrics.rejected.inc()
        return error(403, "refused", str(exc))
    await node.settled()  # read-your-writes: the answer comes after the epoch that saw it
    return web.json_response(result.to_json())


async def get_block(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    try:
        cid = Link.parse(request.match_info["cid"])
    except (ValueError, StoreError) as exc:
        return error(400, "bad CID", str(exc))
    try:
        return web.json_response(describe_block(node, cid))
    except BlockNotFound:
        return error(404, "not found", f"no block {cid}")


def describe_block(node: Node, cid: Link) -> dict[str, Any]:
    data = node.store.get(cid)
    out: dict[str, Any] = {"cid": str(cid), "size": len(data)}
    try:
        out["fact"] = str(decode_fact(data))
        out["kind"] = "fact"
    except Exception:
        obj = decode(data)
        out["kind"] = obj.get("kind", "block") if isinstance(obj, dict) else "block"
    return out


async def _query_text(request: web.Request) -> str:
    if request.method == "POST":
        body = await _json_body(request)
        q = body.get("q")
    else:
        q = request.query.get("q")
    if not isinstance(q, str) or not q.strip():
        raise wiring.NodeInputError('missing query "q", e.g. q=path(1, X)')
    return q


async def query(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    try:
        text = await _query_text(request)
        result = node.query(text)
    except _input_errors() as exc:
        return error(400, "bad query", str(exc))
    return web.json_response(result.to_json())


async def subscribe(request: web.Request) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, list, list, int]] = asyncio.Queue()

    def callback(event: str, added: list, removed: list) -> None:
        # Called inside the epoch that produced the change: node.epoch is that epoch.
        loop.call_soon_threadsafe(queue.put_nowait, (event, added, removed, node.epoch))

    try:
        text = await _query_text(request)
        sub = node.subscribe(text, callback)
    except _input_errors() as exc:
        return error(400, "bad query", str(exc))
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    columns = wiring.query_columns_of(sub.query)
    try:
        while True:
            try:
                event, added, removed, epoch = await asyncio.wait_for(queue.get(), timeout=15)
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            payload = {
                "columns": columns,
                "epoch": epoch,
                "added": [[wiring.json_value(v) for v in r] for r in added],
                "removed": [[wiring.json_value(v) for v in r] for r in removed],
            }
            await resp.write(f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        node.unsubscribe(sub)
    return resp


async def load_program(request: web.Request) -> web.Response:
    if (denied := _require_token(request)) is not None:
        return denied
    node = request.app[NODE_KEY]
    try:
        body = await _json_body(request)
        text = body.get("program")
        if not isinstance(text, str):
            raise wiring.NodeInputError('"program" must be a string')
        node.load_program(text, source=str(body.get("source") or "<program>"))
    except _input_errors() as exc:
        node.metrics.rejected.inc()
        return error(400, "bad program", str(exc))
    # Answer with the state the new program derives (its first epoch ran).
    await asyncio.get_running_loop().run_in_executor(None, node.run_epoch)
    return web.json_response(node.status())


async def sync_now(request: web.Request) -> web.Response:
    if (denied := _require_token(request)) is not None:
        return denied
    node = request.app[NODE_KEY]
    try:
        body = await _json_body(request)
        url = body.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise wiring.NodeInputError('"url" must be an http(s) URL')
    except _input_errors() as exc:
        return error(400, "bad input", str(exc))
    try:
        stats = await node.sync(node.resolve_peer(url))
    except Exception as exc:  # peer unreachable or refusing: report, change nothing
        return error(502, "sync failed", f"{type(exc).__name__}: {exc}")
    return web.json_response(stats)


async def grant(request: web.Request) -> web.Response:
    if (denied := _require_token(request)) is not None:
        return denied
    node = request.app[NODE_KEY]
    try:
        body = await _json_body(request)
        key = body.get("key")
        if not isinstance(key, str) or len(bytes.fromhex(key)) != 32:
            raise wiring.NodeInputError('"key" must be a 64-digit hex Ed25519 public key')
        delta = node.grant(key)
    except _input_errors() as exc:
        return error(400, "bad input", str(exc))
    except wiring.replication_errors() as exc:
        return error(403, "refused", str(exc))
    return web.json_response({"delta": delta})


async def export_car(request: web.Request) -> web.StreamResponse:
    from merklog.store.car import car_header, car_section

    node = request.app[NODE_KEY]
    roots, blocks = node.export_blocks()
    resp = web.StreamResponse(headers={"Content-Type": "application/vnd.ipld.car"})
    await resp.prepare(request)
    await resp.write(car_header(roots))
    for cid, data in blocks:
        await resp.write(car_section(cid, data))
    await resp.write_eof()
    return resp


async def import_car(request: web.Request) -> web.Response:
    if (denied := _require_token(request)) is not None:
        return denied
    from merklog.store.car import CarDecoder

    node = request.app[NODE_KEY]
    decoder = CarDecoder()
    try:
        blocks = list(decoder.feed(await request.read()))
        decoder.close()
        result = node.import_blocks(blocks)
    except (StoreError, *wiring.replication_errors()) as exc:
        node.metrics.rejected.inc()
        return error(400, "rejected", str(exc))
    return web.json_response(result)


async def genesis(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    return web.Response(
        body=node.store.get(node.dataset),
        content_type="application/vnd.ipld.dag-cbor",
        headers={"X-Dataset": str(node.dataset)},
    )


async def index(request: web.Request) -> web.StreamResponse:
    static = request.app[NODE_KEY].config.path("node.static_dir")
    if static is None or not (static / "index.html").exists():
        return web.json_response(
            {"service": "merklog", "docs": "/openapi.json", "health": "/healthz"}
        )
    return web.FileResponse(static / "index.html")


# ------------------------------------------------------------------------- app


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except StoreUnavailable as exc:  # an IPFS home whose daemon is down: nothing changed
        return error(503, "store unavailable", str(exc))
    except Exception as exc:  # never a bare 500 page: a JSON body naming the problem
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal error", f"{type(exc).__name__}: {exc}")


def build_app(node: Node) -> web.Application:
    """The whole HTTP surface of ``node`` (peer sync routes included when available)."""
    app = web.Application(
        client_max_size=int(node.config.get("node.max_body")), middlewares=[_errors]
    )
    app[NODE_KEY] = node
    app[READY_KEY] = {"ready": False}
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/genesis", genesis)
    app.router.add_get("/v1/facts", list_facts)
    app.router.add_post("/v1/facts", write_facts)
    app.router.add_get("/v1/blocks/{cid}", get_block)
    app.router.add_get("/v1/query", query)
    app.router.add_post("/v1/query", query)
    app.router.add_get("/v1/subscribe", subscribe)
    app.router.add_post("/v1/program", load_program)
    app.router.add_post("/v1/sync", sync_now)
    app.router.add_post("/v1/writers", grant)
    app.router.add_get("/v1/export", export_car)
    app.router.add_post("/v1/import", import_car)
    static = node.config.path("node.static_dir")
    if static is not None and static.is_dir():
        app.router.add_static("/static/", static)
    wiring.add_peer_routes(app, node)

    async def on_startup(app: web.Application) -> None:
        node.start()
        app[READY_KEY]["ready"] = True

    async def on_shutdown(app: web.Application) -> None:
        app[READY_KEY]["ready"] = False
        await node.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


async def serve(node: Node, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM; ``announce(url)`` once listening and ready."""
    app = build_app(node)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
    bound = sockets[0].getsockname()[1] if sockets else port
    url = f"http://{host}:{bound}"
    node.url = url
    write_runfile(node.home, url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    announce(url)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        remove_runfile(node.home)
        await runner.cleanup()


def static_path(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()
