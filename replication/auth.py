"""Peer request authentication: Ed25519-signed requests, replay guard and allow-list.

A request carries ``X-Merklog-Key`` (hex public key), ``X-Merklog-Time`` (unix
seconds), ``X-Merklog-Nonce`` (random hex), ``X-Merklog-Digest`` (sha256 hex of
the body) and ``X-Merklog-Signature`` (hex Ed25519 over :func:`signing_string`).
The server rejects requests outside the clock-skew window, nonces it has seen
within that window, bad signatures, and bodies whose digest differs.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from merklog.store import Link

from .errors import AuthError, Forbidden
from .identity import Identity, verify_signature

H_KEY = "X-Merklog-Key"
H_TIME = "X-Merklog-Time"
H_NONCE = "X-Merklog-Nonce"
H_DIGEST = "X-Merklog-Digest"
H_SIG = "X-Merklog-Signature"

EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
#: Digits of an ``X-Merklog-Time`` at most (Unix seconds have 10 until the year 2286).
MAX_TIME_DIGITS = 12
#: An Ed25519 public key's and signature's sizes.
KEY_BYTES, SIGNATURE_BYTES = 32, 64


def signing_string(method: str, path: str, ts: str, nonce: str, digest: str) -> bytes:
    """The exact bytes a request signature covers."""
    return "\n".join(["merklog-request-v1", method.upper(), path, ts, nonce, digest]).encode()


def sign_headers(
    identity: Identity, method: str, path: str, digest: str = EMPTY_DIGEST, now: float | None = None
) -> dict[str, str]:
    """Headers that authenticate a request for ``method path`` with body digest ``digest``."""
    ts = str(int(time.time() if now is None else now))
    nonce = os.urandom(16).hex()
    sig = identity.sign(signing_string(method, path, ts, nonce, digest))
    return {
        H_KEY: identity.public_key.hex(),
        H_TIME: ts,
        H_NONCE: nonce,
        H_DIGEST: digest,
        H_SIG: sig.hex(),
    }


@dataclass(frozen=True)
class SignedRequest:
    """The verified identity of a request; ``digest`` must still be checked against the body."""

    peer: bytes
    digest: str


class ReplayGuard:
    """Remembers (key, nonce) pairs for the skew window; a second use is a replay."""

    def __init__(self, window: float = 300.0, max_entries: int = 200_000) -> None:
        self.window = window
        self.max_entries = max_entries
        self._seen: dict[tuple[bytes, str], float] = {}
        self._lock = threading.Lock()

    def check_and_remember(self, key: bytes, nonce: str, now: float) -> None:
        with self._lock:
            if len(self._seen) >= self.max_entries:
                self._seen = {k: t for k, t in self._seen.items() if t > now}
                if len(self._seen) >= self.max_entries:
                    raise AuthError("replay cache full; retry later", code="busy", status=429)
            expiry = self._seen.get((key, nonce))
            if expiry is not None and expiry > now:
                raise AuthError("request nonce already used", code="replayed_request")
            self._seen[(key, nonce)] = now + 2 * self.window


def verify_request(
    method: str,
    path: str,
    headers: Mapping[str, str],
    guard: ReplayGuard,
    now: float | None = None,
    admit: Callable[[bytes], None] | None = None,
) -> SignedRequest:
    """Check a request's signature headers (not yet its body digest). ``admit(key)``
    raises for a key this server does not serve; it runs once the signature verifies and
    before the nonce is remembered, so that keys nobody listed cannot fill the replay
    cache (QA: a stranger's requests, each refused 403, filled it in ~4 minutes and every
    listed peer was then answered 429)."""
    now = time.time() if now is None else now
    try:
        key = bytes.fromhex(headers[H_KEY])
        ts = headers[H_TIME]
        nonce = headers[H_NONCE]
        digest = headers[H_DIGEST]
        sig = bytes.fromhex(headers[H_SIG])
    except KeyError as exc:
        raise AuthError(f"missing request signature header {exc.args[0]}") from None
    except ValueError:
        raise AuthError("malformed request signature headers") from None
    # Unix seconds in ASCII digits, as sign_headers writes them: int() also took other
    # scripts' digits ("٣٣") and any length, and a 309-digit stamp overflowed the
    # comparison below into a 500 with a traceback, for a request nobody had signed.
    if not (0 < len(ts) <= MAX_TIME_DIGITS and ts.isascii() and ts.isdigit()):
        raise AuthError(f"malformed request signature headers: {H_TIME} must be Unix seconds")
    if len(key) != KEY_BYTES or len(sig) != SIGNATURE_BYTES:
        raise AuthError(
            f"malformed request signature headers: {H_KEY} must be {KEY_BYTES} bytes and"
            f" {H_SIG} {SIGNATURE_BYTES} bytes, in hex"
        )
    stamp = int(ts)
    if len(nonce) < 16 or len(nonce) > 64 or len(digest) != 64:
        raise AuthError("request nonce must be 16-64 chars and digest a sha256 hex")
    if abs(now - stamp) > guard.window:
        # Said as the clocks it is about: "outside the window" told the device whose
        # clock was right that its own request was stale, and never said clocks (QA).
        gap = int(abs(now - stamp))
        side = "behind" if stamp < now else "ahead of"
        raise AuthError(
            f"request timestamp {stamp} is {gap:,} s {side} the clock of the node answering"
            f" ({int(now)}): the two nodes' clocks differ by more than the"
            f" {int(guard.window)} s allowed; set the clock that is wrong (NTP)",
            code="stale_request",
        )
    if not verify_signature(key, sig, signing_string(method, path, ts, nonce, digest)):
        raise AuthError("request signature does not verify", code="bad_request_signature")
    if admit is not None:
        admit(key)
    guard.check_and_remember(key, nonce, now)
    return SignedRequest(key, digest)


def check_digest(signed: SignedRequest, actual: str) -> None:
    if actual != signed.digest:
        raise AuthError("request body does not match its signed digest", code="digest_mismatch")


class AllowList:
    """Which peer keys may sync which datasets (``None`` = every dataset served).

    ``allows(peer, dataset)`` with ``dataset=None`` asks about dataset-less calls
    (the ``@async`` inbox): any listed peer may deliver messages.
    """

    def __init__(self, peers: Mapping[bytes | str, Iterable[Link | str] | None] = ()) -> None:
        self._peers: dict[bytes, set[Link] | None] = {}
        for key, datasets in dict(peers).items():
            self.allow(key, datasets)

    def allow(self, key: bytes | str, datasets: Iterable[Link | str] | None = None) -> None:
        raw = bytes.fromhex(key) if isinstance(key, str) else bytes(key)
        if datasets is None:
            self._peers[raw] = None
            return
        links = {d if isinstance(d, Link) else Link.parse(d) for d in datasets}
        current = self._peers.get(raw, set())
        if current is None:
            return
        self._peers[raw] = current | links

    def deny(self, key: bytes | str) -> None:
        raw = bytes.fromhex(key) if isinstance(key, str) else bytes(key)
        self._peers.pop(raw, None)

    def allows(self, peer: bytes, dataset: Link | None) -> bool:
        if peer not in self._peers:
            return False
        scope = self._peers[peer]
        return dataset is None or scope is None or dataset in scope

    def require(self, peer: bytes, dataset: Link | None) -> None:
        if not self.allows(peer, dataset):
            what = f"dataset {dataset}" if dataset is not None else "this node"
            # the whole key and the command that allows it: a prefix could not be pasted
            raise Forbidden(
                f"peer {peer.hex()} is not allowed to sync {what}; to allow it, run `merklog"
                f" peers add NAME URL --key {peer.hex()}` on the node that refused it"
            )
