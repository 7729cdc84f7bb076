"""The OpenAPI 3.1 document of the node's HTTP API, served at ``/openapi.json``.

It lists every route the server answers — the local API, health and metrics, and
the peer routes (``/v1/datasets/...``, ``/v1/inbox``), whose bodies are CAR
streams signed by the calling peer — and a test compares it with the router.
Every error answer is a JSON ``Error`` body.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from merklog.replication.client import SyncStats
from merklog.replication.limits import RECEIVE_MAX_BLOCK_REQUEST

_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": _ERROR_REF}


BAD_INPUT = _err("Bad input; nothing was changed")
UNAUTHORIZED = _err("Missing or wrong bearer token (or, on peer routes, peer signature)")
FORBIDDEN = _err("Refused: this node's key may not do that (e.g. not a writer, not the owner)")
NOT_FOUND = _err("No such block, dataset or route")
UNKNOWN_RELATION = _err(
    "The query names a relation (or arity) neither the data (visible facts, or facts the"
    " dataset once had) nor the program has"
)
PROGRAM_FAILING = _err(
    "failed: the loaded program fails on the stored facts (a home restarted in that"
    " state); load a fixed program or retract what makes it fail"
)
TOO_LARGE = _err("Request body larger than node.max_body")
QUERY_TOO_LARGE = _err(
    "query too large: answering the query would take the node past its memory budget"
    " (node.eval_memory_mb); narrow the query or raise the budget"
)
NODE_STOPPING = _err("node stopping: the node closed while the query was evaluated")
READ_TOKEN_ON_WRITE = _err("Refused: the read token (api.read_token) grants reads only")
REFUSED_DELTA = _err(
    "A delta was refused (invalid_signature, unauthorized_author, missing_parents, cycle,"
    " wrong_dataset, invalid_delta; see docs/sync-protocol.md): the whole CAR is rolled"
    " back"
)
PEER_DOWN = _err(
    "peer unreachable: the peer could not be reached (connection refused, timeout, DNS);"
    " nothing was changed here, try again later (CLI exit 4)"
)
PEER_REFUSED = _err(
    "peer refused (the peer answered with a refusal: not allowed to sync, another dataset,"
    " this node itself), peer untrusted (its TLS certificate is not trusted here) or peer"
    " error (any other answer); nothing was changed here, fix the configuration (CLI exit 1)"
)

READ: list[dict[str, list[str]]] = [{"readToken": []}, {"writeToken": []}]
WRITE: list[dict[str, list[str]]] = [{"writeToken": []}]
PEER: list[dict[str, list[str]]] = [{"peerSignature": []}]


def _json(schema_ref: str, description: str = "OK") -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}},
    }


def _raw(media: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": {"type": "string"}}}}


def _body(schema_ref: str | None = None, media: str = "application/json") -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{schema_ref}"} if schema_ref else {"type": "string"}
    return {"required": True, "content": {media: {"schema": schema}}}


#: What ``facts`` counts in an import's or a push's answer.
ASSERT_OPS = "The assert ops of the accepted deltas (retracted ones too), not the visible facts"


def _q(
    name: str, description: str, required: bool = True, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _counts(*names: str, **described: str) -> dict[str, Any]:
    """An object of integer counts (all present in every answer)."""
    props: dict[str, Any] = {n: {"type": "integer", "minimum": 0} for n in names}
    for n, text in described.items():
        props[n] = {"type": "integer", "minimum": 0, "description": text}
    return {"type": "object", "required": list(props), "properties": props}


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _op(
    summary: str,
    security: list | None,
    responses: dict[str, Any],
    *,
    streamed: bool = False,
    **extra: Any,
) -> dict:
    """One operation; a token-taking one lists 401 (and 403 for the read token on a
    write), and one whose body is read whole (not ``streamed``) lists 413."""
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if security is not None:
        op["security"] = security
        responses.setdefault("401", UNAUTHORIZED)
        if security is WRITE:  # the read token is valid but grants reads only
            responses.setdefault("403", READ_TOKEN_ON_WRITE)
        if "requestBody" in extra and not streamed:  # a body over node.max_body
            responses.setdefault("413", TOO_LARGE)
    else:
        op["security"] = []
    op.update(extra)
    return op


def _paths() -> dict[str, Any]:
    ds = _path("id", "Dataset id (CID of its genesis block)")
    return {
        "/": {
            "get": _op(
                "The app page (node.static_dir) or a pointer to this document",
                None,
                {"200": {"description": "HTML page or JSON"}},
            )
        },
        "/static/{path}": {
            "get": _op(
                "A file of node.static_dir (the app's scripts, styles, images), public",
                None,
                {
                    "200": {"description": "The file; its type from its name"},
                    "404": _err(
                        "No node.static_dir, no such file, a hidden name (a part starting"
                        " with '.'), a folder, or a symbolic link leading out of the folder"
                    ),
                },
                parameters=[_path("path", "Path of the file inside node.static_dir")],
            )
        },
        "/healthz": {
            "get": _op(
                "Readiness: 200 once the store is open and the first epoch ran",
                None,
                {"200": _json("Health"), "503": _json("Health", "Starting or stopping")},
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text exposition format)",
                READ,
                {"200": _raw("text/plain")},
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document",
                None,
                {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            )
        },
        "/v1/status": {
            "get": _op(
                "Dataset, heads, epoch, counts and per-peer sync state",
                READ,
                {"200": _json("Status")},
            )
        },
        "/v1/genesis": {
            "get": _op(
                "The dataset's genesis block (header X-Dataset: its CID); used by init --join",
                READ,
                {"200": _raw("application/vnd.ipld.dag-cbor")},
            )
        },
        "/v1/facts": {
            "get": _op(
                "One page of visible facts in CID order (with rel: in the order the node stored them)",
                READ,
                {"200": _json("FactPage"), "400": BAD_INPUT},
                parameters=[
                    _q("rel", "Relation name", required=False),
                    _q("after", "Cursor: the `next` of the previous page", required=False),
                    _q(
                        "limit",
                        "Page size, 1..10000 (default 1000)",
                        required=False,
                        schema={"type": "integer", "minimum": 1, "maximum": 10000},
                    ),
                    _q(
                        "form",
                        "`text` (default): `{cid, fact}` per fact, the fact in Datalog syntax;"
                        " `json`: `{cid, rel, args}`, the typed JSON fact form POST takes",
                        required=False,
                    ),
                ],
            ),
            "post": _op(
                "Assert or retract facts: Datalog text or typed JSON facts",
                WRITE,
                {
                    "200": _json("WriteResult", "Durably written (survives a crash)"),
                    "400": BAD_INPUT,
                    "403": FORBIDDEN,
                    "413": TOO_LARGE,
                    "503": _json(
                        "Error",
                        "A freshly joined node could not reach the peer it joined from"
                        " for its sync before the first write",
                    ),
                },
                requestBody=_body("Write"),
                parameters=[
                    _q(
                        "answer",
                        "`full` (default): `{cid, fact}` per fact; `cids`: the CIDs alone, in"
                        " input order (a bulk writer has the facts; ADR 0082)",
                        required=False,
                    )
                ],
            ),
        },
        "/v1/blocks/{cid}": {
            "get": _op(
                "A block by CID, decoded (facts shown in Datalog syntax)",
                READ,
                {"200": _json("Block"), "400": BAD_INPUT, "404": NOT_FOUND},
                parameters=[_path("cid", "Block CID")],
            )
        },
        "/v1/query": {
            "get": _op(
                "Evaluate a query such as path(1, X) against the current epoch",
                READ,
                {
                    "200": _json("QueryResult"),
                    "400": BAD_INPUT,
                    "404": UNKNOWN_RELATION,
                    "409": PROGRAM_FAILING,
                    "422": QUERY_TOO_LARGE,
                    "503": NODE_STOPPING,
                },
                parameters=[_q("q", "Query: an atom or a comma-separated body")],
            ),
            "post": _op(
                "Same as GET, query in a JSON body",
                READ,
                {
                    "200": _json("QueryResult"),
                    "400": BAD_INPUT,
                    "404": UNKNOWN_RELATION,
                    "409": PROGRAM_FAILING,
                    "422": QUERY_TOO_LARGE,
                    "503": NODE_STOPPING,
                },
                requestBody=_body("Query"),
            ),
        },
        "/v1/subscribe": {
            "get": _op(
                "Live query as Server-Sent Events",
                READ,
                {
                    "200": _raw("text/event-stream", "Event stream"),
                    "400": BAD_INPUT,
                    "404": UNKNOWN_RELATION,
                    "409": PROGRAM_FAILING,
                    "503": _err("busy: node.max_live_queries live queries already served"),
                },
                description=(
                    "First event `result` holds the whole current answer; then one `delta` "
                    "event per epoch that changed it. Each event's data is a JSON object "
                    "`{columns, epoch, added, removed}` (rows of values as in QueryResult; "
                    "apply `removed`, then `added`). A `: keep-alive` comment follows 15 s "
                    "of silence. Events carry no `id`: a reconnecting client gets a fresh "
                    "`result`. A relation nothing has yet is taken (404 only for a known "
                    "relation at another arity). The token may be passed as "
                    "`?access_token=` (EventSource sends no headers). The server ends the "
                    "stream when it shuts down."
                ),
                parameters=[
                    _q("q", "Query: an atom or a comma-separated body"),
                    _q("access_token", "Read or write token (instead of the header)", False),
                ],
            ),
            "post": _op(
                "Same as GET, query in a JSON body (for a query too long for a URL: a"
                " request line over 8190 bytes answers 414)",
                READ,
                {
                    "200": _raw("text/event-stream", "Event stream"),
                    "400": BAD_INPUT,
                    "404": UNKNOWN_RELATION,
                    "409": PROGRAM_FAILING,
                    "503": _err("busy: node.max_live_queries live queries already served"),
                },
                requestBody=_body("Query"),
            ),
        },
        "/v1/export": {
            "get": _op(
                "The whole replica as a CAR (genesis, deltas, facts; roots = heads)",
                READ,
                {"200": _raw("application/vnd.ipld.car")},
            )
        },
        "/v1/import": {
            "post": _op(
                "Verify and apply the deltas of a CAR (all or nothing); the body is streamed"
                " to a temporary file, so node.max_body does not bound it",
                WRITE,
                {"200": _json("ImportResult"), "400": BAD_INPUT},
                streamed=True,
                requestBody=_body(media="application/vnd.ipld.car"),
            )
        },
        "/v1/program": {
            "post": _op(
                "Load (replace) the Datalog program evaluated every epoch",
                WRITE,
                {"200": _json("Status"), "400": BAD_INPUT},
                requestBody=_body("ProgramText"),
            )
        },
        "/v1/sync": {
            "post": _op(
                "Pull from and push to a peer now (Accept: application/x-ndjson streams"
                ' {"progress": {direction, bytes, deltas}} lines, direction "pull", "push" or'
                ' "waiting" (another sync with that peer runs first), then {"result": …})',
                WRITE,
                {
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/SyncResult"}
                            },
                            "application/x-ndjson": {"schema": {"type": "string"}},
                        },
                    },
                    "400": BAD_INPUT,
                    "404": _err("No peer of that name in [peers] (and no http(s) URL)"),
                    "424": PEER_REFUSED,
                    "502": PEER_DOWN,
                    "503": _err(
                        "node stopping: the node stopped before the sync ended (what it"
                        " applied is kept; sync again when it runs)"
                    ),
                },
                requestBody=_body("SyncRequest"),
            )
        },
        "/v1/sync/history": {
            "delete": _op(
                "Forget the sync history of a URL (status stops listing it; what"
                " `merklog peers remove` asks): {url, forgotten}",
                WRITE,
                {"200": _json("ForgetResult"), "400": BAD_INPUT},
                parameters=[_q("url", "The peer URL whose history to forget")],
            )
        },
        "/v1/writers": {
            "get": _op(
                "Who may write on top of the current heads, and who was revoked: the owner"
                " first, each with the grant or revoke that decides",
                READ,
                {"200": _json("WriterList")},
            ),
            "post": _op(
                "Grant a key write access to the dataset (owner only)",
                WRITE,
                {"200": _json("AuthResult"), "400": BAD_INPUT, "403": FORBIDDEN},
                requestBody=_body("WriterKey"),
            ),
        },
        "/v1/writers/{key}": {
            "delete": _op(
                "Revoke a key's write access (owner only); its earlier deltas stay",
                WRITE,
                {"200": _json("AuthResult"), "400": BAD_INPUT, "403": FORBIDDEN},
                parameters=[_path("key", "64-digit hex Ed25519 public key")],
            )
        },
        "/v1/inbox": {
            "post": _op(
                "Peer route: deliver signed @async message blocks (CAR)",
                PEER,
                {
                    "200": _json("InboxResult"),
                    "400": BAD_INPUT,
                    "403": FORBIDDEN,
                    "413": TOO_LARGE,
                },
                requestBody=_body(media="application/vnd.ipld.car"),
            )
        },
        "/v1/datasets/{id}/heads": {
            "get": _op(
                "Peer route: the dataset's heads and delta count",
                PEER,
                {"200": _json("Heads"), "404": NOT_FOUND},
                parameters=[ds],
            )
        },
        "/v1/datasets/{id}/genesis": {
            "get": _op(
                "Peer route: the dataset's genesis block",
                PEER,
                {"200": _raw("application/vnd.ipld.dag-cbor"), "404": NOT_FOUND},
                parameters=[ds],
            )
        },
        "/v1/datasets/{id}/sync": {
            "post": _op(
                "Peer route: send heads and a summary, receive a CAR of what the caller lacks",
                PEER,
                {
                    "200": _raw("application/vnd.ipld.car"),
                    "400": BAD_INPUT,
                    "404": NOT_FOUND,
                    "409": _err("need_summary (resend with a larger window) or pruned"),
                },
                parameters=[ds],
                requestBody=_body("SyncBody"),
            )
        },
        "/v1/datasets/{id}/blocks": {
            "post": _op(
                "Peer route: blocks of the dataset by CID (repairs fetch only what they lack)",
                PEER,
                {
                    "200": {
                        **_raw(
                            "application/vnd.ipld.car",
                            "CAR (root: the genesis) of the asked blocks this node holds"
                            " intact, in the order asked, bounded in size",
                        ),
                        "headers": {
                            "X-Merklog-Processed": {
                                "description": (
                                    "How many of the asked CIDs were looked at; ask again"
                                    " for the rest. One looked at but absent from the CAR"
                                    " is not served here."
                                ),
                                "schema": {"type": "integer", "minimum": 1},
                            }
                        },
                    },
                    "400": BAD_INPUT,
                    "404": NOT_FOUND,
                    "413": _err("More CIDs than one block request may name"),
                },
                parameters=[ds],
                requestBody=_body("BlockRequest"),
            )
        },
        "/v1/datasets/{id}/push": {
            "post": _op(
                "Peer route: push a CAR of deltas the server lacks",
                PEER,
                {
                    "200": _json("PushResult"),
                    "400": BAD_INPUT,
                    "403": FORBIDDEN,
                    "404": NOT_FOUND,
                    "413": TOO_LARGE,
                    "422": REFUSED_DELTA,
                },
                parameters=[ds],
                requestBody=_body(media="application/vnd.ipld.car"),
            )
        },
    }


_VALUE = {
    "description": (
        "A typed value: JSON integer (int64), number with a fraction or exponent (float), "
        'boolean, string, {"/": {"bytes": base64}} (bytes) or {"/": "<CID>"} (link)'
    ),
}


def _schemas() -> dict[str, Any]:
    obj = {"type": "object"}
    fact_ref = {"$ref": "#/components/schemas/FactRef"}
    # ``POST /v1/facts?answer=cids`` lists the CIDs alone (ADR 0082).
    fact_or_cid = {"oneOf": [fact_ref, {"type": "string", "description": "A fact CID"}]}
    facts = {
        "oneOf": [
            {"type": "string", "description": "Datalog facts, e.g. edge(1, 2)."},
            {"type": "array", "items": {"$ref": "#/components/schemas/JsonFact"}},
        ]
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {"type": "string"},
                "detail": {"type": "string"},
                "fact": {
                    "$ref": "#/components/schemas/JsonFact",
                    "description": "The fact of a write that was refused (it does not fit"
                    " the program's .decl declarations, or it is over the 1 MiB limit)",
                },
            },
        },
        "Health": {
            "type": "object",
            "properties": {"status": {"type": "string"}, "epoch": {"type": "integer"}},
        },
        "Value": _VALUE,
        "JsonFact": {
            "type": "object",
            "required": ["rel", "args"],
            "properties": {
                "rel": {"type": "string"},
                "args": {"type": "array", "items": {"$ref": "#/components/schemas/Value"}},
            },
            "additionalProperties": False,
        },
        "Write": {
            "type": "object",
            "properties": {"assert": facts, "retract": facts},
            "additionalProperties": False,
        },
        "WriteResult": {
            "type": "object",
            "properties": {
                "asserted": {"type": "array", "items": fact_or_cid},
                "retracted": {"type": "array", "items": fact_or_cid},
                "delta": {"type": ["string", "null"]},
                "not_visible": {"type": "array", "items": fact_ref},
                "not_evaluated": {
                    "type": "string",
                    "description": "Only when no epoch evaluated the write: why (the loaded"
                    " program is failing, or no epoch came within 10 s). The write is"
                    " stored all the same; queries answer the last good epoch.",
                },
            },
        },
        "FactRef": {
            "type": "object",
            "required": ["cid", "fact"],
            "properties": {"cid": {"type": "string"}, "fact": {"type": "string"}},
        },
        "TypedFactRef": {
            "type": "object",
            "required": ["cid", "rel", "args"],
            "properties": {
                "cid": {"type": "string"},
                "rel": {"type": "string"},
                "args": {"type": "array", "items": {"$ref": "#/components/schemas/Value"}},
            },
        },
        "FactPage": {
            "type": "object",
            "properties": {
                "facts": {
                    "type": "array",
                    "items": {"oneOf": [fact_ref, {"$ref": "#/components/schemas/TypedFactRef"}]},
                },
                "next": {"type": ["string", "null"], "description": "Cursor for ?after="},
            },
        },
        "Block": {
            "type": "object",
            "properties": {
                "cid": {"type": "string"},
                "kind": {"type": "string"},
                "fact": {"type": "string"},
                "size": {"type": "integer"},
            },
        },
        "Query": {
            "type": "object",
            "required": ["q"],
            "properties": {"q": {"type": "string"}},
            "additionalProperties": False,
        },
        "QueryResult": {
            "type": "object",
            "properties": {
                "columns": {"type": "array", "items": {"type": "string"}},
                "rows": {
                    "type": "array",
                    "items": {"type": "array", "items": {"$ref": "#/components/schemas/Value"}},
                },
                "epoch": {"type": "integer"},
            },
        },
        "ProgramText": {
            "type": "object",
            "required": ["program"],
            "properties": {
                "program": {"type": "string", "description": "Datalog program text"},
                "source": {
                    "type": "string",
                    "description": "Name used in errors (SOURCE:LINE:COL: message)",
                },
            },
            "additionalProperties": False,
        },
        "SyncRequest": {
            "type": "object",
            "required": ["url"],
            "properties": {
                "url": {"type": "string", "description": "Peer name or URL"},
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 86400,
                    "description": "Seconds per peer request for this sync instead of the"
                    " node's sync.timeout (merklog --set sync.timeout=N sync sends it)",
                },
            },
            "additionalProperties": False,
        },
        "SyncResult": _counts(*(f.name for f in dataclasses.fields(SyncStats))),
        "ForgetResult": {
            "type": "object",
            "properties": {"url": {"type": "string"}, "forgotten": {"type": "boolean"}},
        },
        "WriterKey": {
            "type": "object",
            "required": ["key"],
            "properties": {"key": {"type": "string", "description": "64-digit hex public key"}},
            "additionalProperties": False,
        },
        "AuthResult": {"type": "object", "properties": {"delta": {"type": ["string", "null"]}}},
        "WriterList": {
            "type": "object",
            "properties": {
                "writers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "key": {"type": "string", "description": "hex Ed25519 public key"},
                            "writer": {"type": "boolean", "description": "may write now"},
                            "owner": {"type": "boolean"},
                            "delta": {
                                "type": "string",
                                "description": "the grant or revoke that decides (the"
                                " genesis for the owner and the genesis writers)",
                            },
                        },
                    },
                }
            },
        },
        "ImportResult": {
            **_counts("accepted", "duplicates", facts=ASSERT_OPS),
            "properties": {
                **_counts("accepted", "duplicates", facts=ASSERT_OPS)["properties"],
                "not_evaluated": {
                    "type": "string",
                    "description": "Why no epoch evaluated the import yet (absent when one did)",
                },
            },
        },
        "InboxResult": _counts("accepted", "duplicates"),
        "Heads": {
            "type": "object",
            "required": ["dataset", "heads", "deltas"],
            "properties": {
                "dataset": {"type": "string"},
                "heads": {"type": "array", "items": {"type": "string"}},
                "deltas": {"type": "integer", "minimum": 0},
            },
        },
        "SyncBody": obj,
        "PushResult": {
            **_counts("accepted", "duplicates", facts=ASSERT_OPS),
            "required": ["accepted", "duplicates", "facts", "heads"],
            "properties": {
                **_counts("accepted", "duplicates", facts=ASSERT_OPS)["properties"],
                "heads": {"type": "array", "items": {"type": "string"}},
            },
        },
        "BlockRequest": {
            "type": "object",
            "required": ["cids"],
            "properties": {
                "cids": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": RECEIVE_MAX_BLOCK_REQUEST,
                }
            },
        },
        "PeerState": {
            "type": "object",
            "properties": {
                "name": {"type": ["string", "null"]},
                "url": {"type": "string"},
                "last_attempt": {"type": ["number", "null"]},
                "last_success": {"type": ["number", "null"]},
                "last_incoming": {"type": ["number", "null"]},
                "last_error": {"type": ["string", "null"]},
                "failures": {"type": "integer"},
                "deltas_behind": {"type": ["integer", "null"]},
            },
        },
        "Status": {
            "type": "object",
            "properties": {
                "dataset": {"type": "string"},
                "key": {"type": "string"},
                "heads": {"type": "array", "items": {"type": "string"}},
                "epoch": {"type": "integer"},
                "facts": {"type": "integer"},
                "derived": {"type": "integer"},
                "program": {"type": "boolean"},
                "program_error": {
                    "type": ["string", "null"],
                    "description": "why the last epoch failed (the loaded program on the"
                    " stored facts); null when it ran",
                },
                "engine": {"type": "string", "enum": ["incremental", "batch"]},
                "outbox_pending": {"type": "integer"},
                "outbox_dropped": {"type": "integer"},
                "peers": {"type": "array", "items": {"$ref": "#/components/schemas/PeerState"}},
                "last_sync": {"type": ["object", "null"]},
            },
        },
    }


def _with_query_tokens(paths: dict[str, Any]) -> dict[str, Any]:
    """Every GET that takes a token takes it as ``?access_token=`` too (the middleware
    reads it on any GET, not only ``/v1/subscribe``, which alone listed it). Peer GET
    routes take a request signature only: no token, in a header or the query."""
    tokens = ({"readToken": []}, {"writeToken": []})
    for ops in paths.values():
        op = ops.get("get")
        takes_token = op and any(scheme in tokens for scheme in op.get("security", ()))
        if takes_token and {"queryToken": []} not in op["security"]:
            op["security"] = [*op["security"], {"queryToken": []}]
    return paths


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The whole document (a fresh dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "merklog node API",
            "version": version,
            "description": (
                "HTTP API of a merklog peer: write facts (Datalog text or typed JSON), "
                "query, live queries (Server-Sent Events), export/import, writers, health "
                "and metrics, plus the signed peer routes. Reads need the read token or the "
                "write token (unless api.anonymous_reads), writes the write token: "
                "`Authorization: Bearer <token>`. Every error is a JSON `Error` body. A "
                "`/v1` route refuses (400) a URL query parameter it does not list here "
                "(`access_token` where `queryToken` is listed)."
            ),
        },
        "paths": _with_query_tokens(_paths()),
        "components": {
            "securitySchemes": {
                "readToken": {"type": "http", "scheme": "bearer", "description": "api.read_token"},
                "writeToken": {"type": "http", "scheme": "bearer", "description": "api.token"},
                "queryToken": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "access_token",
                    "description": "the read or write token as ?access_token= (GET only: for "
                    "EventSource and links, which send no headers; RFC 6750 §2.3)",
                },
                "peerSignature": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Merklog-Signature",
                    "description": "Ed25519 request signature of a peer listed in [peers]",
                },
            },
            "schemas": _schemas(),
        },
    }


def query_parameters(doc: dict[str, Any] | None = None) -> dict[tuple[str, str], frozenset[str]]:
    """``(METHOD, path template) -> names of the URL query parameters it takes``, for
    every operation of ``doc`` (this document): its ``in: query`` parameters, and
    ``access_token`` where it takes ``queryToken``. The node refuses any other name
    (:func:`merklog.node.middleware.query_params`): what a route takes is said once."""
    doc = doc or openapi_document()
    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            names = {p["name"] for p in op.get("parameters", ()) if p["in"] == "query"}
            if {"queryToken": []} in op.get("security", ()):
                names.add("access_token")
            out[(method.upper(), path)] = frozenset(names)
    return out
