"""The OpenAPI 3.1 document of the node's local HTTP API, served at ``/openapi.json``.

Peer-to-peer sync routes (``/v1/datasets/...``, ``/v1/inbox``) are listed too so
one document describes everything the server answers; their bodies are CAR
streams signed by the calling peer.
"""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "Bad input; nothing was changed",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_UNAUTH = {
    "description": "Missing or wrong bearer token",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_TOKEN: list[dict[str, list[str]]] = [{"token": []}]


def _json(schema_ref: str, description: str = "OK") -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}},
    }


def _q(name: str, description: str, required: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": {"type": "string"},
    }


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The whole document (a fresh dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "merklog node API",
            "version": version,
            "description": (
                "Local API of a merklog peer: write facts in Datalog syntax, query, "
                "subscribe to live queries (Server-Sent Events), health and metrics. "
                "Write endpoints need `Authorization: Bearer <api.token>`."
            ),
        },
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "Readiness: 200 once the store is open and the first epoch ran",
                    "responses": {
                        "200": _json("Health"),
                        "503": _json("Health", "Starting or stopping"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text exposition format)",
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/v1/status": {
                "get": {
                    "summary": "Dataset, heads, peers, epoch, last sync",
                    "responses": {"200": _json("Status")},
                }
            },
            "/v1/facts": {
                "get": {
                    "summary": "Visible facts, optionally of one relation",
                    "parameters": [_q("rel", "Relation name", required=False)],
                    "responses": {"200": _json("FactList"), "400": _ERROR},
                },
                "post": {
                    "summary": "Assert or retract facts written in Datalog syntax",
                    "security": _TOKEN,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Write"}}
                        },
                    },
                    "responses": {
                        "200": _json("WriteResult", "Durably written (survives a crash)"),
                        "400": _ERROR,
                        "401": _UNAUTH,
                        "413": _ERROR,
                    },
                },
            },
            "/v1/blocks/{cid}": {
                "get": {
                    "summary": "A block by CID, decoded (facts shown in Datalog syntax)",
                    "parameters": [
                        {
                            "name": "cid",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {"200": _json("Block"), "400": _ERROR, "404": _ERROR},
                }
            },
            "/v1/query": {
                "get": {
                    "summary": "Evaluate a query such as path(1, X) against the current epoch",
                    "parameters": [_q("q", "Query: an atom or a comma-separated body")],
                    "responses": {"200": _json("QueryResult"), "400": _ERROR},
                },
                "post": {
                    "summary": "Same as GET, query in a JSON body",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Query"}}
                        },
                    },
                    "responses": {"200": _json("QueryResult"), "400": _ERROR},
                },
            },
            "/v1/subscribe": {
                "get": {
                    "summary": "Live query as Server-Sent Events",
                    "description": (
                        "First event `result` holds the whole current answer; then one "
                        "`delta` event per epoch that changed it, with `added` and "
                        "`removed` rows."
                    ),
                    "parameters": [_q("q", "Query: an atom or a comma-separated body")],
                    "responses": {
                        "200": {
                            "description": "Event stream",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "400": _ERROR,
                    },
                }
            },
            "/v1/program": {
                "post": {
                    "summary": "Load (replace) the Datalog program evaluated every epoch",
                    "security": _TOKEN,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ProgramText"}
                            }
                        },
                    },
                    "responses": {"200": _json("Status"), "400": _ERROR, "401": _UNAUTH},
                }
            },
            "/v1/sync": {
                "post": {
                    "summary": "Pull from and push to a peer now",
                    "security": _TOKEN,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/SyncRequest"}
                            }
                        },
                    },
                    "responses": {
                        "200": _json("SyncResult"),
                        "400": _ERROR,
                        "401": _UNAUTH,
                        "502": _ERROR,
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {"type": "string"},
                        "detail": {"type": "string"},
                    },
                },
                "Health": {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string"},
                        "epoch": {"type": "integer"},
                    },
                },
                "Write": {
                    "type": "object",
                    "properties": {
                        "assert": {"type": "string", "description": "Facts, e.g. edge(1, 2)."},
                        "retract": {"type": "string"},
                    },
                },
                "WriteResult": {
                    "type": "object",
                    "properties": {
                        "asserted": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/FactRef"},
                        },
                        "retracted": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/FactRef"},
                        },
                        "delta": {"type": ["string", "null"]},
                    },
                },
                "FactRef": {
                    "type": "object",
                    "required": ["cid", "fact"],
                    "properties": {"cid": {"type": "string"}, "fact": {"type": "string"}},
                },
                "FactList": {
                    "type": "object",
                    "properties": {
                        "facts": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/FactRef"},
                        }
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
                },
                "QueryResult": {
                    "type": "object",
                    "properties": {
                        "columns": {"type": "array", "items": {"type": "string"}},
                        "rows": {"type": "array", "items": {"type": "array"}},
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
                },
                "SyncRequest": {
                    "type": "object",
                    "required": ["url"],
                    "properties": {"url": {"type": "string"}},
                },
                "SyncResult": {"type": "object"},
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
                        "engine": {"type": "string", "enum": ["incremental", "batch"]},
                        "outbox_pending": {"type": "integer"},
                        "peers": {"type": "object"},
                        "last_sync": {"type": ["object", "null"]},
                    },
                },
            },
        },
    }
