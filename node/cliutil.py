"""Helpers shared by the CLI commands: opening the target and reading facts from arguments.

Errors are not caught here: the CLI's one error boundary (``cli.Boundary``) turns
every exception into one line and a documented exit status.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click

from .cli import State
from .failures import ExitCode, Failure
from .target import LocalTarget, Target, open_target

T = TypeVar("T")


#: A home holding at least this many facts shows a bar while a command reads them.
LOAD_BAR_FACTS = 100_000


@contextmanager
def target(state: State) -> Iterator[Target]:
    """The running node (over HTTP) or the home opened in this process; then a read of
    the home's stored facts (a query's first epoch) shows its progress."""
    with open_target(state.home, state.overrides) as t:
        if not isinstance(t, LocalTarget):
            yield t
            return
        with load_bar(t.node):
            yield t


class LoadBar:
    """``Node.load_progress`` drawn as a transient bar on stderr: ``reading stored facts
    N/M facts``, from the first batch of a read of :data:`LOAD_BAR_FACTS` facts or more,
    on a terminal only, and gone once the read is done (before a node says it listens)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, read: int, visible: int) -> None:
        if self._bar is None:
            if visible < LOAD_BAR_FACTS or read >= visible or not self.console.is_terminal:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("reading stored facts"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("facts"),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("read", total=visible)
        self._bar.update(self._task, completed=read)
        if read >= visible:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def load_bar(node: Any, console: Any = None) -> Iterator[LoadBar]:
    """Show ``node``'s read of its stored facts (:class:`LoadBar`) while the block runs."""
    bar = LoadBar(console)
    node.load_progress = bar
    try:
        yield bar
    finally:
        bar.close()
        node.load_progress = None


def facts_text(args: tuple[str, ...], file: Any) -> str:
    """Facts from the arguments, else from ``--file`` (``-`` = stdin). No arguments and no
    file is a usage error; a file (or standard input) with no facts is nothing to do.

    An argument may leave out its final ``.`` (``merklog put 'edge(1, 2)'``); a file or
    standard input is read as it is, so that one ending in a comment is not given a
    ``.`` of its own and its errors name lines that exist."""
    parts = [_with_period(a) for a in args if a.strip()]
    _check_utf8("\n".join(parts))
    if file is not None:
        parts.append(_read_utf8(file))
    elif not parts and not sys.stdin.isatty():
        parts.append(_read_utf8(sys.stdin))
    text = "\n".join(p for p in parts if p.strip())
    if not text.strip() and file is None:
        # An empty -f FILE holds no facts, as one of comments only does: nothing to do,
        # exit 0 (it was a usage error, which broke scripts over generated files).
        ctx = click.get_current_context(silent=True)
        command = ctx.command_path if ctx is not None else "merklog put"
        raise click.UsageError(f"no facts given (e.g. {command} 'edge(1, 2).')")
    return text


def in_file(exc: BaseException, args: tuple[str, ...], file: Any) -> None:
    """Make ``exc`` name the ``--file`` it points into: a message that starts with a
    position ``LINE:COL`` in the text :func:`facts_text` joined says ``FILE:LINE:COL`` of
    that file instead (as ``load`` and ``eval`` say it) when the position falls in the
    file's part. A stopped home's parse errors and a running node's answers both start
    so, and both paths then say the same. Changes ``exc`` in place."""
    import re

    from merklog.engine.errors import EngineError

    if file is None:
        return
    before = sum(_with_period(a).count("\n") + 1 for a in args if a.strip())
    found = re.match(r"(\d+):(\d+): ", str(exc))
    if found is None or int(found[1]) <= before:
        return
    name = getattr(file, "name", None) or "<stdin>"
    at = f"{name}:{int(found[1]) - before}:{found[2]}"
    if isinstance(exc, EngineError):  # renders its position itself: carry it in the text
        exc.message, exc.line = f"{at}: {exc.message}", 0
        exc.args = (str(exc),)
    else:
        old = str(exc)
        exc.args = (f"{at}: {old[found.end() :]}",)
        if getattr(exc, "detail", None) == old:  # a replication error says its detail
            exc.detail = exc.args[0]


def _read_utf8(stream: Any) -> str:
    """A text stream's contents, read as its bytes so that bytes that are not UTF-8 are
    bad input at ``FILE:LINE:COL`` (the codec's own message named neither), the same
    whether the home's node runs or not. A CRLF line end is read as one; a lone CR is
    kept, as in an argument or a write body: text mode made it a line end, so a string
    holding one (``"mid\rdle"``) was refused from a file as "unterminated"."""
    raw = getattr(stream, "buffer", None)
    if raw is None:
        return stream.read()
    from .files import decode_utf8

    name = getattr(stream, "name", "-")
    name = "<stdin>" if name in ("-", "<stdin>", 0) else name
    text = decode_utf8(raw.read(), name)
    return text.replace("\r\n", "\n") if "\r" in text else text


def _check_utf8(args: str) -> None:
    """Arguments holding bytes that are not UTF-8 (Python keeps them as lone surrogates):
    bad input at ``LINE:COL`` of the joined arguments, not a codec's message (a
    different one through a running node)."""
    from .files import first_non_utf8

    found = first_non_utf8(args)
    if found is not None:
        from merklog.engine.pos import pos_at

        from .errors import NodeInputError

        at, byte = found
        raise NodeInputError(f"{pos_at(args, at)}: not UTF-8 text ({byte}); give facts as UTF-8")


def _with_period(arg: str) -> str:
    """``arg`` with the ``.`` it may leave out, when it ends like a complete fact (``)`` or
    a name, outside a string, every parenthesis closed); otherwise as it is, so that
    ``bad(1`` is an error at the end of what the user typed ("found end of input"), not
    at a ``.`` they never wrote."""
    end = arg.rstrip()[-1:]
    if end == "." or not (end == ")" or end.isalnum() or end == "_"):
        return arg
    depth, quoted, escaped = 0, False, False
    for ch in arg:
        if quoted:
            escaped, quoted = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            quoted = True
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
    return arg + "." if depth == 0 and not quoted else arg


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Stop the command with ``message`` and exit status ``code`` (docs/operations.md)."""
    raise Failure(message, code)


def guard(fn: Callable[[], T]) -> T:
    """Run ``fn`` (kept for the commands' call sites; the boundary reports failures)."""
    return fn()


def stdout_console(**options: Any) -> Any:
    """A rich console on standard output whose closed pipe (``| head``) ends the command
    like any other write to it (exit :data:`merklog.node.cli.STDOUT_CLOSED`); rich's own
    handling exited 1."""
    from rich.console import Console as RichConsole

    class _Console(RichConsole):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "standard output closed")

    return _Console(**options)
