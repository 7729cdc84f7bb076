"""Errors raised by the content-addressed store layer, and the root of every merklog error.

:class:`Error` lives here because ``store`` is the lowest layer: ``engine``,
``replication`` and ``node`` all import ``store`` already, so each package's own
error base can derive from it without an import running the wrong way. The
package root re-exports it as ``merklog.Error``: an app catches that one class
to handle anything merklog raises on purpose.
"""


class Error(Exception):
    """Root of every error merklog raises on purpose (``merklog.Error``)."""


def one_line(text: object, limit: int = 200, markup: bool = False) -> str:
    """``text`` (a message, an exception, a peer's answer) as one line of at most
    ``limit`` characters: what merklog puts in its own error messages when it quotes a
    decoder's report (dag_cbor's spans several lines) or a body a peer sent. Runs of
    whitespace, line breaks included, become one space; with ``markup`` (a body that is
    no merklog answer), HTML or XML loses its tags, and a piece of text the page repeats
    (its title as its heading) is kept once."""
    import re

    flat = str(text)
    if markup and flat.lstrip().startswith("<"):
        # the text between tags, each piece once: a page's <title> and <h1> often repeat
        pieces = [" ".join(p.split()) for p in re.split(r"<[^>]*>", flat)]
        flat = " ".join(dict.fromkeys(p for p in pieces if p))
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def what_was_sent(body: bytes | str, limit: int = 100) -> str:
    """``it sent: EXCERPT`` of a body a peer answered that is no answer merklog can read
    (an HTML error page of a proxy, text, bytes that are not UTF-8), for the one line
    that reports it: :func:`one_line` with its markup dropped; ``it sent nothing`` for an
    empty body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if not text.strip():
        return "it sent nothing"
    return f"it sent: {one_line(text, limit, markup=True)}"


class StoreError(Error):
    """Base class of every store error."""


class StoreUnavailable(StoreError):
    """The store's backend (an IPFS daemon) is down, too slow or answers garbage.

    Nothing was changed; the same call can succeed once the backend is back.
    """


class StoreCorrupt(StoreError):
    """The store's tables contradict each other (damage below the blocks: a table that
    lost rows), so the operation cannot go on; ``merklog fsck`` lists it, and a backup
    must be restored."""


class InvalidValue(StoreError, ValueError):
    """A value outside the value types of docs/storage.md (int64, finite float, str, bytes, bool, link)."""


class InvalidBlock(StoreError, ValueError):
    """Bytes that do not decode as the expected DAG-CBOR block shape."""


class CIDMismatch(StoreError):
    """A block's bytes do not hash to the CID it was stored or sent under."""

    def __init__(self, expected: object, actual: object, where: str = "") -> None:
        self.expected = expected
        self.actual = actual
        self.where = where
        suffix = f" ({where})" if where else ""
        super().__init__(f"CID mismatch{suffix}: expected {expected}, block hashes to {actual}")

    def __reduce__(self) -> tuple:  # pickles (a worker process raises it to its parent)
        return type(self), (self.expected, self.actual, self.where)


class BlockNotFound(StoreError, KeyError):
    """The store holds no block under this CID."""

    def __init__(self, cid: object) -> None:
        self.cid = cid
        super().__init__(f"block not found: {cid}")

    def __reduce__(self) -> tuple:  # pickles (a worker process raises it to its parent)
        return type(self), (self.cid,)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]
