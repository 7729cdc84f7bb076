"""Helpers shared by the CLI commands: error reporting and reading facts from arguments."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from .cli import State
from .config import ConfigError
from .runtime import HomeBusy
from .target import Target, TargetError, input_errors, open_target

T = TypeVar("T")


@contextmanager
def target(state: State) -> Iterator[Target]:
    """``open_target`` with every user-facing failure turned into a clean CLI error."""
    try:
        with open_target(state.home, state.overrides) as t:
            yield t
    except click.ClickException:
        raise
    except (ConfigError, HomeBusy) as exc:
        raise click.ClickException(str(exc)) from None
    except input_errors() as exc:
        raise click.ClickException(str(exc)) from None


def facts_text(args: tuple[str, ...], file: Any) -> str:
    """Facts from the arguments, else from ``--file`` (``-`` = stdin)."""
    parts = list(args)
    if file is not None:
        parts.append(file.read())
    elif not parts and not sys.stdin.isatty():
        parts.append(sys.stdin.read())
    text = "\n".join(p if p.rstrip().endswith(".") else p + "." for p in parts if p.strip())
    if not text.strip():
        raise click.UsageError("no facts given (e.g. merklog put 'edge(1, 2).')")
    return text


def fail(message: str) -> None:
    raise click.ClickException(message)


def guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (TargetError, *input_errors()) as exc:
        raise click.ClickException(str(exc)) from None
