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
from .target import Target, open_target

T = TypeVar("T")


@contextmanager
def target(state: State) -> Iterator[Target]:
    """The running node (over HTTP) or the home opened in this process."""
    with open_target(state.home, state.overrides) as t:
        yield t


def facts_text(args: tuple[str, ...], file: Any) -> str:
    """Facts from the arguments, else from ``--file`` (``-`` = stdin).

    An argument may leave out its final ``.`` (``merklog put 'edge(1, 2)'``); a file or
    standard input is read as it is, so that one ending in a comment is not given a
    ``.`` of its own and its errors name lines that exist."""
    parts = [_with_period(a) for a in args if a.strip()]
    if file is not None:
        parts.append(file.read())
    elif not parts and not sys.stdin.isatty():
        parts.append(sys.stdin.read())
    text = "\n".join(p for p in parts if p.strip())
    if not text.strip():
        raise click.UsageError("no facts given (e.g. merklog put 'edge(1, 2).')")
    return text


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
