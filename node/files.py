"""Files the CLI and the node write and read: owner-only files and directories (what a
home holds is secret, tokens and keys, or data), the files a user names for output
(:func:`output_file`) and program files read as text (:func:`read_text_file`).

Every file the node creates in a home — config.toml (API tokens), identity.pem,
store.sqlite and its ``-wal``/``-shm`` companions, node.json, CAR exports — is
mode 0600 and the home directory 0700, whatever the umask. SQLite creates its
``-wal`` and ``-shm`` files with the permissions of the database file, so creating
that file 0600 before SQLite opens it covers all three. Opening an existing home
tightens what an older version left readable: it takes the group's and others' bits
away and never adds one (a home an operator made read-only, 0500, stays so), and it
leaves alone a file this user does not own (it cannot change it; reading it may still
work).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700
#: The node's Ed25519 key in its home (PKCS#8 PEM, 0600).
IDENTITY_FILE = "identity.pem"
#: What a restore keeps in the home until its import has committed (:mod:`.backup`).
RESTORE_MARKER = "restore.unfinished"
#: The secrets at the top of a home: API tokens and the node's private key.
SECRET_FILES = ("config.toml", IDENTITY_FILE)
#: The default store in a home and SQLite's companions of it: every fact of the dataset.
STORE_FILES = ("store.sqlite", "store.sqlite-wal", "store.sqlite-shm")


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing, 0700; an existing one loses its group's
    and others' bits (see the module docstring)."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _owner_only(path)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty if missing, owner-only; tighten it if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(fd)
    tighten(path)
    return path


def tighten(path: Path) -> None:
    """Take the group's and others' bits off an existing file (no-op for a missing one)."""
    try:
        _owner_only(path)
    except FileNotFoundError:
        pass


def _owner_only(path: Path) -> None:
    """``path``'s mode without the group's and others' bits; the owner's stay as they are
    (never adds write to a read-only file). A file of another user is left alone."""
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 and info.st_uid == os.geteuid():
        os.chmod(path, mode & ~0o077)


def tighten_home(home: Path) -> None:
    """Make the home directory and what it holds at the top owner-only: its secret files
    (:data:`SECRET_FILES`) and the default store (:data:`STORE_FILES`), those that exist.

    Called whenever a command reads a home's config or takes its lock, so a home an older
    version (or a ``cp``, an unpack) left readable by others stops being so as soon as it
    is used, whichever command uses it (``merklog token`` and ``peers list`` read nothing
    but the config, QA). A file this user does not own is left as it is (:func:`tighten`
    does not try): reading it is still possible, and refusing would be no safer."""
    tighten(home)
    for name in (*SECRET_FILES, *STORE_FILES):
        tighten(home / name)


@contextmanager
def owner_only_files() -> Iterator[None]:
    """Run the block with the umask 077: what it creates (and the processes it starts
    create) is owner-only whatever the user's umask, as an export of every fact must be.
    For a command's own process only: the umask is the whole process's."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically (temp file + rename) with owner-only ``data``. A write
    or rename that fails (a full disk) leaves ``path`` as it was and no temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def named(exc: OSError, path: str | Path) -> OSError:
    """``exc`` with ``path`` as its file name when it has none: a failed ``write`` names
    no file, and "no space left on the device" then left the user to guess which disk
    (the home's, or the one a backup went to, QA)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


def open_private(path: Path, mode: str = "wb"):  # noqa: ANN201 - a file object
    """``open(path, mode)`` creating the file owner-only (for exports and temp files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.chmod(path, FILE_MODE)
    return os.fdopen(fd, mode)


@contextmanager
def output_file(path: str | Path) -> Iterator[BinaryIO]:
    """Where a command writes a file the user named (``export FILE``), as a binary file.

    ``-`` is standard output. A path that is, or links to, something other than a
    regular file (a FIFO, a terminal, ``/dev/null``) is written as it goes: replacing it
    would turn a pipe into a file nobody reads. Otherwise the data goes to an owner-only
    temporary file beside the final one (the link's target, not the link), is synced to
    disk and renamed over it only once whole, so a failure (a full disk, Ctrl-C) leaves
    the old file as it was and no half-written one."""
    if str(path) == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    real = Path(os.path.realpath(path))
    try:
        mode = real.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path} is a directory")
    if mode is None and not real.parent.is_dir():  # said of the user's path, not the temp file
        raise FileNotFoundError(f"cannot write {path}: there is no directory {real.parent}")
    if mode is not None and not stat.S_ISREG(mode):
        try:
            with open(real, "wb") as out:
                yield out
        except OSError as exc:
            raise named(exc, path) from None
        return
    tmp = real.with_name(real.name + ".tmp")
    try:
        with open_private(tmp) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, real)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_text_file(path: str | Path) -> str:
    """A program file the user named, as text. One that is not UTF-8 is bad input named
    by ``FILE:LINE:COL`` of its first bad byte (Python's message gave neither)."""
    # A byte order mark is no character of the program (QA: it made every error on the
    # first line one column off).
    return decode_utf8(Path(path).read_bytes(), path).removeprefix("\ufeff")


def first_non_utf8(text: str) -> tuple[int, str] | None:
    """Where ``text`` (an argument: Python keeps bytes that are not UTF-8 as lone
    surrogates) first holds what UTF-8 cannot encode, and its name for a message:
    ``(index, "byte 0xff")``, or ``U+D800`` for a surrogate that no byte gave. None when
    all of it is UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        return exc.start, byte
    return None


def decode_utf8(data: bytes, name: str | Path) -> str:
    """``data`` (the contents of the file ``name``) as text; bytes that are not UTF-8 are
    bad input named by ``NAME:LINE:COL`` of the first of them (Python's message gave
    neither)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from merklog.engine.pos import pos_at

        from .errors import NodeInputError  # bad input: exit 2, HTTP 400

        raise NodeInputError(
            f"{name}:{pos_at(data, exc.start)}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the"
            " file as UTF-8"
        ) from None
