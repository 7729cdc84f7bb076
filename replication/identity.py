"""Ed25519 identities: node keys and dataset writer keys.

Keys are raw 32-byte public keys on the wire and in blocks; private keys are
saved as unencrypted PKCS#8 PEM files with mode 0600.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .errors import BadKey

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64


class Identity:
    """An Ed25519 key pair: ``public_key`` (32 raw bytes) and ``sign(data)``."""

    __slots__ = ("_private", "public_key")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_key: bytes = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte seed (tests, benchmarks)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def seed(self) -> bytes:
        """The raw 32-byte private seed."""
        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the private key as PKCS#8 PEM, readable by the owner only (0600)."""
        path = Path(path)
        pem = self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, pem)
        finally:
            os.close(fd)
        os.chmod(path, 0o600)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Load a key saved by :meth:`save` (PEM) or a raw 32-byte seed file."""
        try:
            data = Path(path).read_bytes()
        except IsADirectoryError:  # Python's "[Errno 21] Is a directory", exit 1
            error = BadKey(f"{path} is not a valid node key (it is a directory)")
            error.why = "it is a directory"
            raise error from None
        if len(data) == 32:
            return cls.from_seed(data)
        what = "it is empty" if not data.strip() else "it is not a PEM private key"
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):  # the library's own words
            key = None  # name no file and point to its FAQ: said below instead
        else:
            what = "it holds another kind of key"
        if not isinstance(key, Ed25519PrivateKey):
            error = BadKey(
                f"{path} is not a valid node key ({what}; a node key is an Ed25519 private"
                " key in PEM, as `merklog init` writes it)"
            )
            error.why = what
            raise error
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        path = Path(path)
        if path.exists():
            return cls.load(path)
        ident = cls.generate()
        ident.save(path)
        return ident

    def __repr__(self) -> str:
        return f"Identity({self.public_key.hex()[:16]}…)"


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by ``public_key``,
    a key somebody must hold the private key of (:func:`public_key_problem`): OpenSSL
    verifies signatures against a point of small order that anyone can forge (for the
    identity point, ``R`` = identity and ``S`` = 0 verify for every message), so every
    replica refuses them alike, whatever a grant once let through."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    if _weak(public_key):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (_CryptoInvalidSignature, ValueError):
        return False
    return True


#: Curve25519's prime and the twisted Edwards curve's constant d (RFC 8032 §5.1).
_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


#: Why a 32-byte key is no writer's or peer's key (:func:`public_key_problem`).
NO_POINT = (
    "it decodes to no point of the curve, so no signature could ever be made with it"
)
SMALL_ORDER = (
    "it is a point of small order, for which anyone can make signatures without a"
    " private key"
)


def public_key_problem(key: bytes) -> str | None:
    """Why ``key`` cannot be a node's Ed25519 public key, or None when it can: 32 bytes
    that decode to a point of the curve (RFC 8032 §5.1.3) whose order is not small.

    ``cryptography`` loads any 32 bytes as a public key, so ``ff`` * 32 (no point) was
    granted as a writer, a grant nobody could use. Worse, the 8 points of small order
    (the identity ``01 00…00``, ``00…00`` of order 4, …) are keys no one holds the
    private key of, yet OpenSSL verifies forged signatures against them: a grant of one
    let anyone write to the dataset (QA: a delta signed with ``R`` = identity, ``S`` = 0
    was accepted by every replica)."""
    if len(key) != PUBLIC_KEY_SIZE:
        return f"it is {len(key)} bytes, not {PUBLIC_KEY_SIZE}"
    point = _decode_point(key)
    if point is None:
        return NO_POINT
    if _small_order(point):
        return SMALL_ORDER
    return None


def _decode_point(key: bytes) -> tuple[int, int] | None:
    """The affine point ``(x, y)`` the 32-byte ``key`` encodes (RFC 8032 §5.1.3), or None."""
    number = int.from_bytes(key, "little")
    y, sign = number & ((1 << 255) - 1), number >> 255
    if y >= _P:
        return None
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        x = x * _SQRT_M1 % _P
        if (v * x * x - u) % _P:
            return None
    if x == 0 and sign:
        return None
    if x & 1 != sign:
        x = _P - x
    return x, y


def _small_order(point: tuple[int, int]) -> bool:
    """Whether ``[8] point`` is the identity ``(0, 1)``: the point lies in the curve's
    8-torsion. Three doublings with the complete twisted Edwards addition law (a = -1)."""
    x, y = point
    for _ in range(3):
        xx, yy, t = x * x % _P, y * y % _P, _D * x * x % _P * y % _P * y % _P
        x = 2 * x * y * pow(1 + t, _P - 2, _P) % _P
        y = (yy + xx) * pow(1 - t, _P - 2, _P) % _P
    return x == 0 and y == 1


@functools.lru_cache(maxsize=4096)
def _weak(key: bytes) -> bool:
    """Whether signatures by ``key`` are refused (:func:`public_key_problem`: a point of
    small order); a key that decodes to no point is refused by the verifier itself.
    Cached: a replica verifies many deltas of few authors."""
    point = _decode_point(key)
    return point is not None and _small_order(point)
