"""Content-addressed storage: values, facts, DAG-CBOR codec, CIDs and block stores.

``IPFSBlockStore`` lives in ``merklog.store.ipfs`` (imported on demand: it pulls in
ipfshttpclient).

Knows nothing of the engine, replication or the network.
"""

from .blockstore import BlockStore, MemoryBlockStore, SharedSQLite, verify
from .codec import (
    Fact,
    check_facts,
    decode,
    decode_fact,
    encode,
    encode_fact,
    encode_facts,
    encode_reference,
    fact_block,
    fact_block_reference,
    fact_cid,
    make_fact,
)
from .errors import (
    BlockNotFound,
    CIDMismatch,
    Error,
    InvalidBlock,
    InvalidValue,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from .link import Link
from .sqlite import SQLiteBlockStore
from .values import (
    MAX_RELATION_CHARS,
    Value,
    check_relation,
    check_value,
    check_writable_relation,
    format_value,
    type_name,
)

__all__ = [
    "MAX_RELATION_CHARS",
    "BlockNotFound",
    "BlockStore",
    "CIDMismatch",
    "Error",
    "Fact",
    "InvalidBlock",
    "InvalidValue",
    "Link",
    "MemoryBlockStore",
    "SQLiteBlockStore",
    "SharedSQLite",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "type_name",
    "Value",
    "check_facts",
    "check_relation",
    "check_value",
    "check_writable_relation",
    "decode",
    "decode_fact",
    "encode",
    "encode_fact",
    "encode_facts",
    "encode_reference",
    "fact_block",
    "fact_block_reference",
    "fact_cid",
    "format_value",
    "make_fact",
    "verify",
]
