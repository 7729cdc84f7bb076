"""Every size limit of replication, writer side and receiver side, in one place.

The rule (docs/adr/0020-writer-enforces-receiver-limits.md): **anything a replica
accepts locally is accepted by every peer.** So each limit a receiver checks has a
writer-side counterpart that is no larger, and the writer (``Replica.write``, the
sync client's push, the sync server's response) shapes what it produces to fit:

==========================  ==========================  ==============================
what                        writer produces at most     receiver accepts at most
==========================  ==========================  ==============================
fact block (encoded)        ``MAX_FACT_BYTES`` (refused  ``RECEIVE_MAX_SECTION`` (CAR
                            at ``put`` with TooLarge)    section, CID included)
relation name of a fact     ``MAX_RELATION_CHARS``       the fact block's limit (read
                            (refused with TooLarge)      without padding, node/factscan)
delta block (encoded)       ``WRITE_MAX_DELTA_BYTES``    ``MAX_DELTA_BYTES``
ops per delta               ``MAX_OPS``                  ``MAX_OPS``
observed CIDs per retract   ``WRITE_MAX_OBSERVED``       ``RECEIVE_MAX_OBSERVED``
                            (split across retract ops)
fact bytes per delta        ``WRITE_MAX_DELTA_FACT_      ``RECEIVE_MAX_PENDING_BYTES``
                            BYTES``
fact blocks per delta       ``MAX_OPS``                  ``RECEIVE_MAX_PENDING_BLOCKS``
CAR body (push / response)  ``WRITE_MAX_BATCH_BYTES``    ``RECEIVE_MAX_BODY``
                            (split into several)         (one delta always fits)
CIDs per block request      ``WRITE_MAX_BLOCK_REQUEST``  ``RECEIVE_MAX_BLOCK_REQUEST``
==========================  ==========================  ==============================

Receiver limits are deliberately larger than writer limits: older writers (before
this rule) produced fact blocks up to the 16 MiB HTTP body limit, retracts listing
more than 1024 observed asserts and deltas carrying many MiB of facts. Receivers
still accept those shapes (bounded by the HTTP body limit), so a dataset that holds
them syncs again; writers no longer produce them. ``tests/replication/test_limits.py``
checks the invariant and writes near every limit through the real write path.
"""

from __future__ import annotations

from merklog.store.car import DEFAULT_MAX_SECTION as CAR_MAX_SECTION

#: Operations in one delta (writer and receiver).
MAX_OPS = 4096
#: Parents of one delta (writer and receiver); a writer with more heads merges the
#: first ``MAX_PARENTS`` and leaves the rest for its next delta.
MAX_PARENTS = 4096
#: Encoded size of one delta block a receiver accepts (older writers kept to it too).
MAX_DELTA_BYTES = 1 << 20
#: Encoded size of one delta block a writer produces (headroom below MAX_DELTA_BYTES).
WRITE_MAX_DELTA_BYTES = MAX_DELTA_BYTES - (16 << 10)

#: Encoded size of one fact block a writer accepts; larger facts are refused at ``put``.
MAX_FACT_BYTES = 1 << 20
#: Largest CAR section (varint + CID + block) a receiver reads: old writers' facts up
#: to the 16 MiB HTTP body limit, plus room for the CID and the length prefix.
RECEIVE_MAX_SECTION = (16 << 20) + 4096

#: Observed delta CIDs one retract op lists when written here.
WRITE_MAX_OBSERVED = 1024
#: Observed CIDs a receiver accepts in one retract op; a 1 MiB delta holds fewer
#: than 27,000 CIDs, so this bound is really the delta size.
RECEIVE_MAX_OBSERVED = 1 << 15

#: Fact bytes one written delta may carry (they travel ahead of it in a CAR).
WRITE_MAX_DELTA_FACT_BYTES = 8 << 20
#: Fact blocks / bytes a receiver buffers while waiting for the delta asserting them.
RECEIVE_MAX_PENDING_BLOCKS = 2 * MAX_OPS + 64
RECEIVE_MAX_PENDING_BYTES = 256 << 20

#: Bytes of all the fact blocks one delta asserts that a receiver accepts, the blocks it
#: already stores included: a sync answer sends a delta with every fact it asserts, and
#: never splits one, so a delta over this could never be served to a peer (QA: a writer
#: re-asserting 280 stored 1 MB facts in one 16 KB delta stopped every peer's sync for
#: good). Far above what a writer puts in one (``WRITE_MAX_DELTA_FACT_BYTES``), and
#: below ``RECEIVE_MAX_BODY`` with room for the delta and the CAR framing.
RECEIVE_MAX_DELTA_FACT_BYTES = 128 << 20
#: CAR bytes a writer puts in one push body or one sync response (then it continues
#: in another request); a single delta with its facts is never split.
WRITE_MAX_BATCH_BYTES = 64 << 20
#: Body a receiver accepts in one push / sync response.
RECEIVE_MAX_BODY = 256 << 20

#: CIDs in one sync request's summary (heads, window, boundary) a receiver accepts; a
#: client's full-log summary names every delta, so this bounds the log size for which
#: the worst case (divergence beyond the 32k-delta window) still reconciles.
RECEIVE_MAX_SUMMARY = 1_000_000
#: Bytes of a sync request a receiver accepts: room for a full summary of that size
#: (a CID in JSON is ~62 bytes).
RECEIVE_MAX_SYNC_REQUEST = 80 << 20

#: CIDs one block request (``POST /v1/datasets/{id}/blocks``, used by ``fsck`` repairs)
#: names when written here; the caller asks again for the rest.
WRITE_MAX_BLOCK_REQUEST = 1024
#: CIDs in one block request a receiver accepts, and the bytes of that JSON request.
RECEIVE_MAX_BLOCK_REQUEST = 4096
RECEIVE_MAX_BLOCK_REQUEST_BYTES = 1 << 20

#: An ``@async`` message block (writer and receiver); a larger one is never queued.
MAX_MESSAGE_BYTES = 64 << 10
#: Message bytes a writer puts in one ``POST /v1/inbox`` (then it starts another).
WRITE_MAX_INBOX_BATCH_BYTES = 2 << 20
#: Inbox body a receiver accepts.
RECEIVE_MAX_INBOX_BODY = 4 << 20

#: Every (writer limit, receiver limit) pair the rule above promises.
PAIRS: dict[str, tuple[int, int]] = {
    "delta bytes": (WRITE_MAX_DELTA_BYTES, MAX_DELTA_BYTES),
    "fact section": (MAX_FACT_BYTES + 64, RECEIVE_MAX_SECTION),
    "delta section": (MAX_DELTA_BYTES + 64, RECEIVE_MAX_SECTION),
    # every block a peer accepts goes through a CAR file (export, import, restore)
    "CAR file section": (RECEIVE_MAX_SECTION, CAR_MAX_SECTION),
    "observed": (WRITE_MAX_OBSERVED, RECEIVE_MAX_OBSERVED),
    "pending bytes": (WRITE_MAX_DELTA_FACT_BYTES, RECEIVE_MAX_PENDING_BYTES),
    "delta fact bytes": (WRITE_MAX_DELTA_FACT_BYTES, RECEIVE_MAX_DELTA_FACT_BYTES),
    # one delta with all its facts fits one sync answer a receiver takes
    "delta in one answer": (
        RECEIVE_MAX_DELTA_FACT_BYTES + MAX_DELTA_BYTES + (MAX_OPS + 1) * 64,
        RECEIVE_MAX_BODY,
    ),
    "pending blocks": (MAX_OPS, RECEIVE_MAX_PENDING_BLOCKS),
    "sync request": (RECEIVE_MAX_SUMMARY * 64 + 4096, RECEIVE_MAX_SYNC_REQUEST),
    "inbox body": (
        WRITE_MAX_INBOX_BATCH_BYTES + MAX_MESSAGE_BYTES + 256 * 64,
        RECEIVE_MAX_INBOX_BODY,
    ),
    "block request cids": (WRITE_MAX_BLOCK_REQUEST, RECEIVE_MAX_BLOCK_REQUEST),
    # a CID in JSON is ~62 bytes; a response is WRITE_MAX_BATCH_BYTES plus at most one
    # block past that budget (the server always sends at least one).
    "block request bytes": (WRITE_MAX_BLOCK_REQUEST * 64 + 4096, RECEIVE_MAX_BLOCK_REQUEST_BYTES),
    "block response": (WRITE_MAX_BATCH_BYTES + RECEIVE_MAX_SECTION, RECEIVE_MAX_BODY),
    "batch bytes": (
        WRITE_MAX_BATCH_BYTES + MAX_DELTA_BYTES + WRITE_MAX_DELTA_FACT_BYTES + 2 * MAX_OPS * 64,
        RECEIVE_MAX_BODY,
    ),
}
