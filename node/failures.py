"""Failures a CLI user can cause or meet, and the exit status each one gives.

The CLI has one error boundary (:class:`merklog.node.cli.Boundary`): whatever a
command raises is classified here into one line of text and one documented exit
status (docs/operations.md, "Exit status"). Nothing else in the CLI catches
exceptions to print them, so the mapping below is the whole story.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from enum import IntEnum
from pathlib import Path

from merklog.replication.errors import NotTheOwner, Unauthorized
from merklog.store.errors import Error

from .errors import OUT_OF_MEMORY, NodeError, NodeInputError

#: What to do about a home whose store is damaged or missing. The home, not the store
#: alone: `init` refuses a home whose config names a store that is not there (QA: "move
#: it away", said of the store, led to a second refusal).
STORE_WAY_OUT = (
    "restore a backup into a fresh home (`merklog --home NEW_HOME restore BACKUP.car`, see"
    " docs/operations.md), or move the whole home away and run `merklog init` (`init"
    " --join URL` fetches the dataset again from a peer)"
)


class ExitCode(IntEnum):
    """Exit statuses of ``merklog`` (documented in docs/operations.md)."""

    OK = 0
    FAILED = 1  #: the operation could not be done (home busy or missing, peer refused …)
    BAD_INPUT = 2  #: usage error or bad input (syntax, values, config, over a limit)
    NOT_FOUND = 3  #: a fact to retract is not visible, a relation/arity or block unknown
    PEER_UNREACHABLE = 4  #: a peer or the running node could not be reached
    STORE_DAMAGED = 5  #: store.sqlite corrupted, truncated, empty or missing blocks
    DISK_FULL = 6  #: no space left to write
    NOT_A_WRITER = 7  #: this node's key may not write to the dataset (yet)
    INTERNAL = 70  #: a bug in merklog: the message says what to report


class Failure(NodeError):
    """A failure with a message meant for the user and its exit status."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class NotVisible(Failure, NodeInputError):
    """``retract`` of facts that are not visible (nothing to retract)."""

    exit_code = ExitCode.NOT_FOUND


class ProgramFailing(Failure):
    """The loaded program fails on the stored facts (a recursion that never reaches a
    fixpoint), and no epoch has evaluated them since the node started: there is no
    earlier epoch to answer reads from. HTTP 409; a change that lets the program run
    (retracting the fact that sets it off, a corrected program) ends it."""


class UnknownRelation(Failure, NodeInputError):
    """A query names a relation (or an arity of it) that neither the data nor the
    program has."""

    exit_code = ExitCode.NOT_FOUND
    #: The relation named when no visible fact and no program has it at any arity
    #: (None when it is known with other arities).
    unseen: str | None = None


class UnknownPeer(Failure, NodeInputError):
    """A peer name that ``[peers]`` does not hold (and that is no URL): not found, as the
    CLI's ``sync NAME`` says it (exit 3, HTTP 404)."""

    exit_code = ExitCode.NOT_FOUND


class StoreDamaged(Failure):
    """The home's store cannot be read as a merklog store."""

    exit_code = ExitCode.STORE_DAMAGED


class KeyMissing(StoreDamaged):
    """An initialised home has lost its node key (``identity.pem``): a new key would not
    be a writer of the dataset, so only ``init`` may make one (exit 5, like a damaged
    store: part of the home is gone)."""


class NotAWriter(Failure, Unauthorized):
    """This node's key is not (yet) a writer of the dataset (HTTP: 403, like the
    replica's own Unauthorized)."""

    exit_code = ExitCode.NOT_A_WRITER


class NotWritableYet(Failure):
    """A freshly joined home must sync once with the peer it joined from before its
    first write, and that sync cannot happen now: the peer cannot be reached (HTTP: 503,
    CLI: exit 4), or a Python API write runs inside an event loop that cannot wait for it
    (the message says ``await node.sync(origin)``)."""

    exit_code = ExitCode.PEER_UNREACHABLE
    http_status = 503


DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

#: The HTTP status of the node's ``POST /v1/sync`` when the peer answered but the sync
#: failed (refused, or a broken answer): the node is fine, a dependency failed.
#: :func:`exit_code_for_status` maps it back to exit 1, like a stopped home's sync.
PEER_FAILED_STATUS = 424


def peer_failure(exc: BaseException) -> tuple[ExitCode, int, str] | None:
    """How a failed sync with a peer is reported, the same by a stopped home and through
    a running node: ``(exit status, HTTP status of POST /v1/sync, error name)``; None
    when ``exc`` is no peer failure.

    A peer that could not be reached (refused connection, timeout, DNS) is worth a
    retry: exit 4, HTTP 502 ``peer unreachable``. A peer that answered and refused (a
    4xx: not allowed to sync, another dataset, the node itself) needs a configuration
    fixed: exit 1, HTTP 424 ``peer refused``; so does a peer whose TLS certificate this
    host does not trust: exit 1, HTTP 424 ``peer untrusted``; any other answer (a 5xx,
    a malformed answer) exit 1, HTTP 424 ``peer error``. The CLI's message is ``NAME: DETAIL``
    on both paths."""
    from merklog.replication.errors import PeerError, PeerRefused, PeerUnreachable, PeerUntrusted

    if isinstance(exc, PeerUnreachable):
        return ExitCode.PEER_UNREACHABLE, 502, "peer unreachable"
    if isinstance(exc, PeerUntrusted):  # its TLS certificate: configuration (ADR 0179)
        return ExitCode.FAILED, PEER_FAILED_STATUS, "peer untrusted"
    if isinstance(exc, PeerRefused):
        return ExitCode.FAILED, PEER_FAILED_STATUS, "peer refused"
    if isinstance(exc, PeerError):
        return ExitCode.FAILED, PEER_FAILED_STATUS, "peer error"
    return None


def local_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of this home's own store or disk (SQLite's errors, a
    full disk), not of a peer it was talking to or of a bug: a sync that meets one
    reports it as what it is (a full disk: exit 6, HTTP 507), not as the peer
    unreachable, and epochs that meet one log it once, not a traceback each."""
    return isinstance(exc, sqlite3.Error) or (
        isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS
    )


#: Below this many free bytes, the file system of a home counts as full: SQLite grows its
#: ``-shm`` file in 32 KiB steps and its ``-wal`` file by pages, so a disk that failed one
#: of them has less than this left.
FULL_BELOW = 1 << 20


#: SQLite's extended codes of a write the file system refused: SQLITE_IOERR_WRITE,
#: _FSYNC, _DIR_FSYNC, _TRUNCATE and _SHMSIZE (https://sqlite.org/rescode.html).
_WRITE_REFUSED = {778, 1034, 1290, 1546, 4874}


def _io_error(exc: sqlite3.DatabaseError) -> bool:
    """SQLite's ``disk I/O error`` (SQLITE_IOERR and its extended codes): what it says
    when a write fails on ENOSPC while growing ``-shm`` or ``-wal`` (SQLite gives no
    errno to Python), and also for other failing writes."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == sqlite3.SQLITE_IOERR
    return "disk I/O error" in str(exc)


def disk_full(path: Path | None) -> bool:
    """Whether the file system holding ``path`` (a home) has (next to) no free space
    left for this user: how an I/O error of SQLite is told apart from a damaged store."""
    if path is None:
        return False
    try:
        fs = os.statvfs(path)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < FULL_BELOW


def permission_denied(path: str | os.PathLike[str], home: Path | None = None) -> str:
    """The line for a file of the home this user may not open: whose it is and what to do.
    The usual cause is one run as another user (``sudo merklog node run``), which left
    the files its own; Python said only ``[Errno 13] Permission denied: '…'``."""
    line = f"cannot open {os.fsdecode(path)}: permission denied"
    try:
        owner = os.stat(path).st_uid
    except OSError:  # a directory on the way is not searchable
        return f"{line}; check the owner and mode of it and of its directories"
    me = os.geteuid()
    if owner == me:
        return f"{line}; it is yours but its mode ({_mode(path)}) does not let you: chmod u+rw it"
    where = home if home is not None else os.path.dirname(os.fsdecode(path))
    return (
        f"{line}; it belongs to {_user(owner)}, not to {_user(me)} (a command run as"
        f" another user?): run merklog as {_user(owner)}, or give the files back with"
        f" chown -R {_user(me)} {where}"
    )


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _mode(path: str | os.PathLike[str]) -> str:
    import stat

    return stat.filemode(os.stat(path).st_mode)


def classify(exc: BaseException, home: Path | None = None) -> tuple[ExitCode, str]:
    """The exit status and one-line message for ``exc`` (raised by a CLI command)."""
    from merklog.engine.errors import EngineError
    from merklog.replication.errors import PeerError, ReplicationError, TooLarge
    from merklog.store.errors import (
        BlockNotFound,
        CIDMismatch,
        InvalidBlock,
        InvalidValue,
        StoreCorrupt,
        StoreUnavailable,
    )

    from .config import ConfigError
    from .runtime import HomeBusy

    store = f"the store of {home}" if home is not None else "the store"
    if isinstance(exc, Failure):
        return exc.exit_code, str(exc)
    if isinstance(exc, PeerError):
        from .client import api_message  # the line a running node's answer gives

        code, _status, name = peer_failure(exc) or (ExitCode.FAILED, 0, "peer error")
        return code, api_message(name, exc.detail)
    if isinstance(exc, StoreUnavailable):  # the IPFS daemon of an IPFS home
        return ExitCode.PEER_UNREACHABLE, str(exc)
    if isinstance(exc, NotTheOwner):  # a writer, maybe: not exit 7 (QA)
        return ExitCode.FAILED, exc.detail
    if isinstance(exc, Unauthorized):
        return ExitCode.NOT_A_WRITER, exc.detail
    if isinstance(exc, TooLarge):
        return ExitCode.BAD_INPUT, exc.detail
    if isinstance(exc, ReplicationError):
        return ExitCode.FAILED, exc.detail
    if isinstance(exc, StoreCorrupt):
        return ExitCode.STORE_DAMAGED, (
            f"{store} is damaged ({exc}); `merklog fsck` lists what is wrong: restore a"
            " backup (docs/operations.md)"
        )
    if isinstance(exc, BlockNotFound | CIDMismatch):
        return ExitCode.STORE_DAMAGED, (
            f"{store} is damaged ({exc}); run `merklog fsck --repair-from URL` or restore"
            " a backup (docs/operations.md)"
        )
    if isinstance(exc, ConfigError | EngineError | InvalidValue | InvalidBlock):
        return ExitCode.BAD_INPUT, str(exc)
    if isinstance(exc, HomeBusy):
        return ExitCode.FAILED, str(exc)
    if isinstance(exc, sqlite3.DatabaseError):
        text = str(exc)
        if "full" in text or (_io_error(exc) and disk_full(home)):
            return ExitCode.DISK_FULL, f"no space left on the device to write {store}: {text}"
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_CANTOPEN:
            # A file SQLite could not open (the store, its -wal or -shm): no damage.
            return ExitCode.FAILED, (
                f"cannot open {store} ({text}): SQLite could not open it or its -wal or"
                " -shm file (out of file descriptors: raise ulimit -n; or the home is not"
                " writable by this user)"
            )
        if getattr(exc, "sqlite_errorcode", None) in _WRITE_REFUSED:
            # A write the file system refused with room left: a file size limit (EFBIG,
            # ``ulimit -f``, FAT32's 4 GiB) or a failing disk. It was "damaged … move it
            # away" (exit 5) for a healthy store: the transaction was rolled back.
            return ExitCode.DISK_FULL, (
                f"cannot write {store} ({text}): the file system refused a write (a file"
                " size limit such as `ulimit -f` or FAT32's 4 GiB, or a failing disk); the"
                " store is not damaged by it: lift the limit or make room and run the"
                " command again (`merklog fsck` checks the home)"
            )
        if "locked" in text or "busy" in text:
            return ExitCode.FAILED, f"{store} is in use by another process: {text}"
        if "readonly" in text or "read-only" in text:
            where = f"{home}/store.sqlite" if home is not None else "store.sqlite"
            return ExitCode.FAILED, (
                f"cannot write {store} ({text}): {where}, its -wal and -shm files and"
                " the home directory must be writable by this user (check their owner"
                " and modes, and that the file system is not mounted read-only)"
            )
        return ExitCode.STORE_DAMAGED, (
            f"{store} is damaged or not a merklog store ({text}); {STORE_WAY_OUT}"
        )
    if isinstance(exc, OSError):
        if exc.errno in DISK_FULL_ERRNOS:
            if exc.filename:  # which disk: the home's, or the one a file was going to
                return ExitCode.DISK_FULL, (
                    f"cannot write {exc.filename}: no space left on the device"
                    f" ({exc.strerror}); make room there and run the command again"
                )
            return ExitCode.DISK_FULL, f"no space left on the device: {exc}"
        if isinstance(exc, PermissionError) and exc.filename:
            return ExitCode.FAILED, permission_denied(exc.filename, home)
        if exc.errno == errno.EROFS and exc.filename:
            return ExitCode.FAILED, (
                f"cannot write {exc.filename}: its file system is mounted read-only; every"
                " merklog command writes in the home (its lock file node.lock, the store's"
                " -wal and -shm files), even to read: copy the home to a writable place"
            )
        if exc.errno in (errno.EMFILE, errno.ENFILE):  # the file named is any it opened
            return ExitCode.FAILED, (
                f"out of file descriptors ({exc.strerror}): raise the open-files limit"
                " (ulimit -n) of this command, or of the system"
            )
        if exc.filename and exc.strerror:  # as a Unix tool says it, not "[Errno 21] …"
            return ExitCode.FAILED, f"{exc.filename}: {exc.strerror}"
        return ExitCode.FAILED, str(exc)
    if isinstance(exc, ValueError):
        return ExitCode.BAD_INPUT, str(exc)
    if isinstance(exc, Error):
        return ExitCode.FAILED, str(exc)
    if isinstance(exc, MemoryError):  # the machine's limit, not a bug to report
        detail = f" ({exc})" if str(exc) else ""
        return ExitCode.FAILED, f"out of memory{detail}{OUT_OF_MEMORY}"
    return ExitCode.INTERNAL, (
        f"internal error ({type(exc).__name__}: {exc}); please report it with the command"
        " you ran (run with -vv to log the traceback)"
    )


def exit_code_for_status(status: int, error: str = "") -> ExitCode:
    """The exit status for an HTTP error from the running node (CLI commands that go
    through its API); ``error`` is the answer's error name (a 403 ``forbidden`` is a
    token that grants reads only, a configuration problem like a 401, not exit 7; a 403
    ``not owner`` a grant or revoke by a key that may write but is not the owner's)."""
    if status == 403 and error in ("forbidden", "not owner"):
        return ExitCode.FAILED
    if status == 0:
        return ExitCode.PEER_UNREACHABLE
    if status == 404:
        return ExitCode.NOT_FOUND
    if status in (400, 413, 415, 422):
        return ExitCode.BAD_INPUT
    if status == 409:  # the node's "failed": the operation could not be done (exit 1)
        return ExitCode.FAILED
    if status == 403:
        return ExitCode.NOT_A_WRITER
    if status in (502, 503, 504):
        return ExitCode.PEER_UNREACHABLE
    if status == PEER_FAILED_STATUS:  # the node reached the peer, which refused
        return ExitCode.FAILED
    if status == 507:
        return ExitCode.DISK_FULL
    return ExitCode.FAILED
