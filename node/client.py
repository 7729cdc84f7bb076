"""A small synchronous client of a running node's local HTTP API (used by the CLI)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from merklog.store import Fact
from merklog.store.errors import Error

from .errors import NodeError
from .factpages import FACTS_PAGE_MAX
from .files import output_file


class NodeAPIError(NodeError, RuntimeError):
    """The node answered with an error (message taken from its JSON body), or (``status``
    0) gave no answer."""

    def __init__(
        self, status: int, message: str, error: str = "", detail: str = "", reason: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        #: The JSON body's ``error`` and ``detail`` ("" if the answer had none).
        self.error = error
        self.detail = detail
        #: Why no connection could be made (``connection refused``), else "".
        self.reason = reason
        #: The fact of the write the node refused (the body's ``fact``), else None.
        self.fact: Fact | None = None


#: Error names of the node's answers whose detail is the whole message, worded as a
#: stopped home's CLI words it (``failures.classify``): the name before it only said the
#: same thing twice (``unknown relation: unknown relation nosuch/1: …``).
_SELF_CONTAINED = frozenset(
    {
        "bad input",
        "bad program",
        "bad query",
        "bad CID",
        "refused",
        "rejected",
        "failed",
        "store damaged",
        "store error",
        "store unavailable",
        "disk full",
        "not owner",  # "only the dataset owner grants or revokes writers", as stopped (QA)
    }
)


#: How every refusal of a home that cannot write yet begins (node/writeaccess.py): it
#: says why itself, so the CLI prints it as a stopped home does, not "peer unreachable: …".
NOT_WRITABLE_YET = "this node cannot write yet"


def api_message(error: str, detail: str) -> str:
    """The one-line message for an error answer ``{"error": error, "detail": detail}``:
    the detail alone when it says everything (it names the error, the error is one of
    :data:`_SELF_CONTAINED`, or it is a peer that could not be connected to: ``cannot
    reach peer URL: connection refused``), else ``error: detail`` (``unauthorized: send
    …``, ``peer unreachable: peer URL did not answer within 60 s``)."""
    from merklog.replication.errors import CANNOT_REACH

    if not detail:
        return error
    if error in _SELF_CONTAINED or error.lower() in detail.lower():
        return detail
    if error in ("peer unreachable", "peer error") and detail.startswith(CANNOT_REACH):
        return detail  # a TLS handshake that failed is a peer error, worded the same way
    if detail.startswith(NOT_WRITABLE_YET):  # said whole, as a stopped home says it
        return detail
    return f"{error}: {detail}"


#: Seconds a ``sync`` call waits for the node beyond the sync timeout it asked for: the
#: node's own answer (a timeout error) must come before this client gives up.
SYNC_WAIT_MARGIN = 30.0


def _refused_fact(payload: Any) -> Fact | None:
    """The fact an error body names (``"fact"``, typed JSON), if it names a valid one."""
    if not isinstance(payload, dict) or "fact" not in payload:
        return None
    from .jsonvalues import fact_from_json

    try:
        return fact_from_json(payload["fact"])
    except Error:  # a body this client cannot read: the message is still the error
        return None


class _OutputError(Exception):
    """Writing a streamed answer where the caller wants it failed (``error``)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class NodeClient:
    """Calls ``url`` with the local bearer ``token``."""

    def __init__(self, url: str, token: str = "", timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: Any = None,
        sink: Any = None,
        length: int | None = None,
        lines: Callable[[str, int, int], None] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One request; ``raw`` is a CAR body (bytes, or a file-like object sent as a
        stream of ``length`` bytes), ``sink`` receives a streamed answer; ``timeout``
        (seconds of silence before giving up) replaces the client's own for this call."""
        # UTF-8, not \\u escapes: a put sizes its requests at 4 bytes per character
        # at most (an astral character escaped by ensure_ascii takes 12).
        data = (
            raw
            if raw is not None
            else (None if body is None else json.dumps(body, ensure_ascii=False).encode())
        )
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header(
            "Content-Type", "application/vnd.ipld.car" if raw is not None else "application/json"
        )
        if length is not None:
            req.add_header("Content-Length", str(length))
        if lines is not None:
            req.add_header("Accept", "application/x-ndjson")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            wait = self.timeout if timeout is None else timeout
            with urllib.request.urlopen(req, timeout=wait) as resp:
                if lines is not None and "ndjson" in resp.headers.get("Content-Type", ""):
                    return _follow_lines(resp, lines, self.url)
                if sink is not None:
                    while chunk := resp.read(1 << 16):
                        try:
                            sink.write(chunk)
                        except OSError as exc:  # the local output, not the node
                            raise _OutputError(exc) from exc
                    return int(resp.headers.get("X-Block-Count", "0"))
                return json.loads(resp.read() or b"null")
        except _OutputError as exc:
            # A full local disk, a closed stdout (`export - | head`): what it is (exit 6,
            # a quiet 141), not "cannot reach node".
            raise exc.error from None
        except urllib.error.HTTPError as exc:
            error = detail = ""
            body = b""
            try:
                body = exc.read()
                payload = json.loads(body)
                error, detail = str(payload.get("error", "error")), str(payload.get("detail") or "")
                message = api_message(error, detail)
            except (ValueError, AttributeError, OSError):
                # no merklog answer (a proxy's error page): what it sent, as sync says it
                from merklog.store.errors import what_was_sent

                payload, message = None, f"{exc} ({what_was_sent(body)})"
            failure = NodeAPIError(exc.code, message, error, detail)
            failure.fact = _refused_fact(payload)
            raise failure from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            from merklog.replication.errors import PeerUntrusted, unreachable_reason

            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):  # nothing was sent
                raise PeerUntrusted.for_url(self.url, reason) from None
            if isinstance(exc, http.client.IncompleteRead):  # the node stopped mid-answer
                reason = f"its answer was cut off after {len(exc.partial):,} bytes"
            elif isinstance(exc, http.client.HTTPException):  # a malformed answer
                reason = f"no valid HTTP answer: {exc!r}"
            if method != "GET" and not isinstance(reason, ConnectionRefusedError | socket.gaierror):
                # Sent, then no answer (a timeout, a reset): the node may have applied it.
                why = reason if isinstance(reason, str) else unreachable_reason(exc)
                raise NodeAPIError(
                    0,
                    f"no answer from node at {self.url} ({why}): the request was sent and"
                    " may have been applied; check (`merklog status`, `query`) before repeating",
                ) from None
            if isinstance(exc, http.client.IncompleteRead):
                raise NodeAPIError(
                    0,
                    f"node at {self.url}: {reason}: the node stopped it, and its log says why"
                    " (a damaged store is named there, with its repair); or the connection"
                    " broke, and it is worth trying again",
                ) from None
            if isinstance(exc, http.client.HTTPException):
                raise NodeAPIError(0, f"node at {self.url}: {reason}; try again") from None
            why = unreachable_reason(exc)
            raise NodeAPIError(0, f"cannot reach node at {self.url}: {why}", reason=why) from None

    def write(self, asserts: str = "", retracts: str = "", answer: str = "full") -> dict[str, Any]:
        """``POST /v1/facts``; ``answer="cids"`` asks for the CIDs alone (in input order)
        instead of ``{"cid", "fact"}`` per fact (ADR 0082)."""
        path = "/v1/facts" if answer == "full" else "/v1/facts?answer=" + answer
        return self._call("POST", path, {"assert": asserts, "retract": retracts})

    def query(self, q: str) -> dict[str, Any]:
        return self._call("POST", "/v1/query", {"q": q})

    def facts(self, rel: str | None = None) -> dict[str, Any]:
        """Every visible fact (of ``rel``), following ``GET /v1/facts`` pages."""
        out: list[dict[str, str]] = []
        after = None
        while True:
            params = {k: v for k, v in (("rel", rel), ("after", after)) if v}
            params["limit"] = str(FACTS_PAGE_MAX)  # the largest page: fewer requests
            suffix = "?" + urllib.parse.urlencode(params) if params else ""
            page = self._call("GET", "/v1/facts" + suffix)
            out.extend(page["facts"])
            after = page.get("next")
            if not after:
                return {"facts": out}

    def block(self, cid: str) -> dict[str, Any]:
        return self._call("GET", "/v1/blocks/" + urllib.parse.quote(cid))

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def load_program(self, text: str, source: str = "") -> dict[str, Any]:
        return self._call("POST", "/v1/program", {"program": text, "source": source})

    def sync(
        self,
        url: str,
        progress: Callable[[str, int, int], None] | None = None,
        timeout: float | None = None,
        node_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Sync the node with the peer ``url``; with ``progress``, the node streams its
        progress (JSON lines) and ``progress(direction, bytes, deltas)`` follows it.
        ``timeout``: the seconds per peer request the node uses for this sync instead of
        its own ``sync.timeout`` (``merklog --set sync.timeout=N sync``); without it,
        ``node_timeout`` is the node's own as far as the caller knows (its home's
        config). This call waits at least that long (plus a margin) for the node before
        giving up itself: a peer the node waits 100 s for is not cut at 60 s here."""
        body: dict[str, Any] = {"url": url}
        if timeout is not None:
            body["timeout"] = timeout
        per_request = timeout if timeout is not None else node_timeout
        wait = None if per_request is None else max(self.timeout, per_request + SYNC_WAIT_MARGIN)
        return self._call("POST", "/v1/sync", body, lines=progress, timeout=wait)

    def forget_sync_history(self, url: str) -> bool:
        """``DELETE /v1/sync/history``: the node forgets ``url``'s sync history; whether
        it had one."""
        query = urllib.parse.urlencode({"url": url})
        return bool(self._call("DELETE", "/v1/sync/history?" + query)["forgotten"])

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def grant(self, key: str) -> dict[str, Any]:
        return self._call("POST", "/v1/writers", {"key": key})

    def writers(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/writers")["writers"])

    def revoke(self, key: str) -> dict[str, Any]:
        return self._call("DELETE", "/v1/writers/" + urllib.parse.quote(key))

    def export_car(self, path: Any, progress: Callable[[int], None] | None = None) -> int:
        """Stream the node's CAR export into ``path`` (:func:`.files.output_file`: ``-``
        is standard output); returns the block count, counted as the CAR arrives
        (``progress(blocks)``)."""
        counter = _BlockCounter(progress)
        with output_file(path) as out:
            self._call("GET", "/v1/export", sink=counter.tee(out))
            counter.close()
        return counter.blocks

    def import_car(
        self, path: Any, progress: Callable[[int], None] | None = None
    ) -> dict[str, Any]:
        """Send the CAR at ``path`` to ``POST /v1/import`` as a stream (not read whole into
        memory; larger than ``node.max_body`` is fine), ``progress(blocks)`` as it goes."""
        import os

        counter = _BlockCounter(progress)
        with open(path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            return self._call("POST", "/v1/import", raw=counter.reader(src), length=size)


def _follow_lines(resp: Any, progress: Callable[[str, int, int], None], url: str) -> Any:
    """Read a streamed sync (``{"progress": …}`` lines, then ``{"result": …}`` or a last
    ``{"error", "detail", "status"}``), calling ``progress`` for each progress line.
    ``url``: the node's, named when its stream ends without a result (it stopped)."""
    for raw in resp:
        event = json.loads(raw)
        if "progress" in event:
            p = event["progress"]
            progress(p["direction"], int(p["bytes"]), int(p["deltas"]))
        elif "result" in event:
            return event["result"]
        elif "error" in event:
            message = api_message(str(event["error"]), str(event.get("detail") or ""))
            raise NodeAPIError(int(event.get("status", 502)), message)
    # The node stopped mid-sync (killed, crashed): what its sync applied is durable, the
    # rest comes with the next sync. QA: "the node ended the sync stream without a
    # result" did not say which node, nor what to do.
    raise NodeAPIError(
        502,
        f"the node at {url} stopped before its sync ended (it was stopped or crashed:"
        " `merklog status` says whether it runs); what it applied is kept, run the sync"
        " again when it runs",
    )


class _BlockCounter:
    """Counts the blocks of a CAR stream passing through (CAR framing only: the node
    verifies the blocks), calling ``progress(blocks)`` as they complete."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        from merklog.store.car import CarDecoder

        self.decoder = CarDecoder(verify_blocks=False)
        self.progress = progress
        self.blocks = 0

    def feed(self, chunk: bytes) -> None:
        n = len(self.decoder.feed(chunk))
        if n:
            # the header is not a block; CarDecoder counts sections after it
            self.blocks += n
            if self.progress is not None:
                self.progress(self.blocks)

    def close(self) -> None:
        self.decoder.close()

    def tee(self, out: Any) -> Any:
        """A writable that counts what it passes on to ``out``."""
        counter = self

        class _Tee:
            def write(self, chunk: bytes) -> int:
                counter.feed(chunk)
                return out.write(chunk)

        return _Tee()

    def reader(self, src: Any) -> Any:
        """A readable (for urllib's streamed body) that counts what is read from ``src``."""
        counter = self

        class _Reader:
            def read(self, size: int = -1) -> bytes:
                chunk = src.read(size if size and size > 0 else 1 << 16)
                if chunk:
                    counter.feed(chunk)
                return chunk

        return _Reader()
