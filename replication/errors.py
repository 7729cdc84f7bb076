"""Replication errors: each names a stable error code and the HTTP status it maps to.

Every rejection of remote input raises one of these; the server turns it into
``{"error": code, "detail": message}`` with ``status`` and counts it in metrics.
"""

from __future__ import annotations

from merklog.store.errors import Error, one_line


class ReplicationError(Error):
    """Base class: ``code`` is the machine-readable error name, ``status`` its HTTP status."""

    code = "replication_error"
    status = 400

    def __init__(self, detail: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def to_json(self) -> dict[str, str]:
        return {"error": self.code, "detail": self.detail}


class MalformedBlock(ReplicationError):
    """Bytes that are not canonical DAG-CBOR of the expected shape (also malformed CAR)."""

    code = "malformed_block"
    status = 400


class CIDMismatchError(ReplicationError):
    """A block whose bytes do not hash to the CID it was sent under."""

    code = "cid_mismatch"
    status = 400


class TooLarge(ReplicationError):
    """A body, block or delta over the configured limit. ``fact``: the fact a writer
    refused for its size (a block over ``MAX_FACT_BYTES``, a relation name too long),
    else None."""

    code = "too_large"
    status = 413
    fact: object = None


class InvalidSignature(ReplicationError):
    """A delta whose Ed25519 signature does not verify against its author."""

    code = "invalid_signature"
    status = 422


class Unauthorized(ReplicationError):
    """A delta whose author is not a writer in its causal past (or a non-owner grant)."""

    code = "unauthorized_author"
    status = 422


class NotTheOwner(Unauthorized):
    """A grant or revoke written by a key that is not the dataset owner's: the owner alone
    decides who writes. Not "not a writer" (the key may well write facts)."""

    code = "not_owner"


class MissingParents(ReplicationError):
    """A delta whose parents (or asserted fact blocks) are not known."""

    code = "missing_parents"
    status = 422


class CycleError(ReplicationError):
    """A delta that names itself as a parent or observed delta."""

    code = "cycle"
    status = 422


class WrongDataset(ReplicationError):
    """A delta belonging to another dataset, or an unknown dataset."""

    code = "wrong_dataset"
    status = 422


class InvalidDelta(ReplicationError):
    """A delta that decodes but breaks a rule (clock, op shape, limits)."""

    code = "invalid_delta"
    status = 422


class NeedSummary(ReplicationError):
    """The caller's heads are unknown and its summary does not cover the divergence."""

    code = "need_summary"
    status = 409


class AuthError(ReplicationError):
    """A peer request that is unsigned, badly signed, stale or replayed."""

    code = "unauthenticated"
    status = 401


class Forbidden(ReplicationError):
    """A peer the allow-list does not permit for this dataset or action."""

    code = "forbidden"
    status = 403


class NotFound(ReplicationError):
    code = "not_found"
    status = 404


class RequestTimeout(ReplicationError):
    code = "timeout"
    status = 408


class BadKey(ReplicationError):
    """A key file that holds no Ed25519 private key (empty, truncated, junk); ``why``
    says what it holds instead ("it is empty")."""

    code = "bad_key"
    status = 400
    why = ""


class PeerError(ReplicationError):
    """A sync with a remote peer failed (client side): the parent of
    :class:`PeerUnreachable` (no answer) and :class:`PeerRefused` (a refusal); raised as
    itself when the peer answered with something else (a 5xx, a malformed answer)."""

    code = "peer_error"
    status = 502


class PeerUnreachable(PeerError):
    """A peer could not be reached (refused, reset, DNS, timeout): nothing was exchanged
    beyond what earlier completed requests applied. ``reason`` is why in a few words
    (``connection refused``) when no connection could be made, else empty."""

    code = "peer_unreachable"
    status = 502
    reason = ""

    @classmethod
    def for_url(cls, base_url: str, exc: BaseException) -> PeerUnreachable:
        """The error for the peer at ``base_url`` that could not be connected to (``exc``
        is what the HTTP client raised): ``cannot reach peer URL: REASON``."""
        error = cls(cannot_reach(base_url, exc))
        error.reason = unreachable_reason(exc)
        return error


#: How every message about a peer that could not be connected to begins (the CLI's
#: ``sync``, ``peers add``, ``init --join``): it says "peer unreachable" by itself.
CANNOT_REACH = "cannot reach peer"
#: How :func:`unreachable_reason` words a TLS handshake that failed.
TLS_FAILED = "TLS handshake failed"
#: What to do about it: the usual cause is an https:// URL of a peer serving plain HTTP.
PLAIN_HTTP_HINT = "a peer that serves plain HTTP needs an http:// URL"


def handshake_failed(reason: str) -> bool:
    """Whether ``reason`` (from :func:`unreachable_reason`) is a TLS handshake that
    failed: an https:// URL of a peer that serves plain HTTP, a configuration to fix
    (exit 1, a peer error) rather than a peer to retry (exit 4), for ``sync``, ``peers
    add`` and ``init --join`` alike."""
    return reason.startswith(TLS_FAILED)


def cannot_reach(url: str, why: BaseException | str, purpose: str = "") -> str:
    """The one wording of a peer that could not be connected to: ``cannot reach peer
    URL[ PURPOSE]: REASON`` (``purpose`` as ``to join it``); ``why`` is what the HTTP
    client raised (its reason from :func:`unreachable_reason`) or that reason."""
    doing = f" {purpose}" if purpose else ""
    reason = why if isinstance(why, str) else unreachable_reason(why)
    return f"{CANNOT_REACH} {url}{doing}: {reason}"


def unreachable_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few plain words: ``connection refused``, ``no such
    host``, ``timed out``, else what the OS says (its strerror, ``no route to host``).
    ``exc`` is what an HTTP client raised: an :class:`OSError`, aiohttp's
    ``ClientConnectorError`` (and its DNS and TLS kinds), urllib's ``URLError`` or a
    timeout; their own texts are Python reprs (``<urlopen error [Errno 111] …>``,
    ``Connect call failed ('127.0.0.1', 1)``) that a user should not have to read."""
    import errno  # here: every CLI command imports this module, few meet a peer
    import os
    import socket
    import ssl
    import urllib.error

    while True:  # to the OS's error inside the client's
        inner = getattr(exc, "os_error", None)  # aiohttp's ClientConnectorError
        if isinstance(exc, urllib.error.URLError):
            inner = exc.reason
        if not isinstance(inner, BaseException):
            break
        exc = inner
    code = getattr(exc, "errno", None)
    if isinstance(exc, TimeoutError) or code == errno.ETIMEDOUT:
        return "timed out"
    if isinstance(exc, ssl.SSLError):  # a handshake that failed (not an untrusted cert)
        why = getattr(exc, "verify_message", None) or exc.reason or one_line(str(exc))
        return f"{TLS_FAILED} ({str(why).lower().replace('_', ' ')})"
    if isinstance(exc, socket.gaierror):
        # getaddrinfo's "this name has no address": the host does not exist
        missing = {getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA")}
        return "no such host" if code in missing else _plain(exc.strerror or str(exc))
    if code == errno.ECONNREFUSED:
        return "connection refused"
    if isinstance(exc, OSError) and isinstance(code, int) and code > 0:
        return _plain(os.strerror(code))  # not exc.strerror: aiohttp puts a repr there
    if isinstance(exc, urllib.error.URLError):
        return _plain(str(exc.reason))
    return _plain(one_line(str(exc))) or type(exc).__name__


def _plain(text: str) -> str:
    """``text`` with a capital first letter lowered (``Connection reset by peer``), as a
    reason continues a line; ``TLS …`` stays."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


class PeerUntrusted(PeerError):
    """The peer's TLS certificate is not trusted here (self-signed, signed by a private CA
    this host does not know, for another name, expired): no request was sent, and
    retrying cannot help until a configuration changes (docs/adr/0179)."""

    code = "peer_untrusted"
    status = 502

    @classmethod
    def for_url(cls, base_url: str, reason: object) -> PeerUntrusted:
        """The error for the peer at ``base_url`` (``https://HOST:PORT``); ``reason`` is
        what the TLS layer said (an ``ssl.SSLCertVerificationError`` or its text)."""
        why = getattr(reason, "verify_message", None) or str(reason)
        return cls(
            f"the TLS certificate of {base_url} is not trusted ({why}); if a private CA"
            " signed it, set SSL_CERT_FILE to a CA bundle that holds that CA"
            " (docs/operations.md)"
        )


class PeerRefused(PeerError):
    """A peer answered and refused the sync (an HTTP 4xx: not allowed to sync, another
    dataset, a bad signature): retrying will not help until a configuration changes.
    ``status`` is the peer's HTTP status, ``code`` its error name."""

    code = "peer_refused"
    status = 502
