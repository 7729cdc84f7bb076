"""Errors the node package raises on purpose; all derive from ``merklog.Error``.

The HTTP error middleware (:mod:`merklog.node.middleware`) and the CLI turn these
into one clear line or a JSON body; anything else reaching them is a bug.
"""

from __future__ import annotations

from merklog.store.errors import Error

__all__ = [
    "Error",
    "Forbidden",
    "NodeError",
    "NodeInputError",
    "NodeStopped",
    "NotSettled",
    "RefusedFact",
    "Unauthorized",
]


#: The one line of a command that ran out of memory (after ``out of memory`` and the
#: allocator's detail, if any): the machine's limit, not a bug to report.
OUT_OF_MEMORY = (
    ": the command needed more memory than this process can get (for eval: a result too"
    " large for this machine, a recursion that derives new values every round such as a"
    " counter over a cycle, or a limit such as ulimit -v)"
)


class NodeError(Error):
    """Base class of the node's own errors."""


class NodeInputError(NodeError, ValueError):
    """Bad input from a user (syntax, values): reported with position, nothing changed."""


class NodeStopped(NodeError):
    """The node was closed while the call ran (a sync cut short by ``Node.stop``): what
    it did until then is kept; run it again once the node is open. Over HTTP a 503
    (the CLI's exit 4: try again when the node runs), not bad input."""


class RefusedFact(NodeInputError):
    """A fact of a write that does not fit the loaded program's ``.decl`` declarations.
    ``fact`` is that fact, so that a caller that knows where its facts came from (``put
    -f`` a file) can name its line; over HTTP the error body carries it too."""

    def __init__(self, message: str, fact: object = None) -> None:
        super().__init__(message)
        self.fact = fact


class Unauthorized(NodeError):
    """A request lacks the token its route needs (HTTP 401)."""


class Forbidden(NodeError):
    """A request's token is valid but does not grant what its route needs: the read
    token on a write route (HTTP 403)."""


class NotSettled(NodeError):
    """Writes are stored, but no epoch evaluated them: the program failed on them (a
    recursion without fixpoint) or no epoch came in time. Queries show the last good
    epoch. ``result`` is the write's :class:`~merklog.node.writes.WriteResult` when one
    call both wrote and evaluated (a plain ``with`` node's ``assert_``), else None."""

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result
