"""Refuse queries of relations that do not exist, instead of answering "(0 rows)".

A relation exists for a query when the program mentions it with that arity (rule
head, rule body or program fact), or the visible data holds a fact of it with that
arity, or it is the ``tick`` clock of a ticking node. A relation the program
defines but that holds no tuples right now is fine: its answer is empty. An atom
written with ``...`` (any further arguments) matches every arity from its own up.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from merklog.engine import ast

from .errors import NodeInputError
from .failures import ExitCode, Failure, UnknownRelation

T = TypeVar("T")


def program_arities(program: Any) -> dict[str, set[int]]:
    """``rel -> {arity}`` for every atom a checked program mentions."""
    out: dict[str, set[int]] = {}
    for rule in program.rules:
        out.setdefault(rule.head.rel, set()).add(len(rule.head.args))
        for lit in rule.body:
            for atom, _polarity in ast.body_atoms(lit):
                out.setdefault(atom.rel, set()).add(len(atom.args))
    for rel, row in program.facts:
        out.setdefault(rel, set()).add(len(row))
    return out


def require_known(
    query: Iterable[ast.BodyLiteral],
    program: Mapping[str, set[int]],
    data: Callable[[str], set[int]],
    extra: Mapping[str, set[int]] | None = None,
    *,
    new_relations: bool = False,
    names: Callable[[], Iterable[str]] | None = None,
    emptied: Collection[str] = (),
) -> None:
    """Raise :class:`UnknownRelation` for the first atom of ``query`` whose relation and
    arity neither ``program``, ``data`` (the arities of the visible facts of a relation)
    nor ``extra`` has. ``new_relations``: a relation nothing has yet passes (a live query
    may wait for its first fact); one known with other arities does not. ``names()``: the
    relations the visible facts have, asked only for an unknown relation, to name the
    closest known one (``did you mean gt?``) as the engine's own check does.
    ``emptied``: relations with no visible fact that the data had once (every fact
    retracted): known, at any arity, with no rows. The error for a relation nothing
    has names it as :attr:`UnknownRelation.unseen`, for the caller to ask the store."""
    for lit in query:
        for atom, _polarity in ast.body_atoms(lit):
            rel, n, rest = atom.rel, len(atom.args), atom.rest
            known = set(program.get(rel, ())) | set((extra or {}).get(rel, ()))
            if n in known or (rest and any(k >= n for k in known)):
                continue
            stored = data(rel)
            if n in stored or (rest and any(k > n for k in stored)):
                continue
            arities = known | stored
            where = f"{atom.pos.line}:{atom.pos.col}: " if atom.pos.line else ""
            if arities:
                have = ", ".join(f"{rel}/{k}" for k in sorted(arities))
                raise UnknownRelation(
                    f"{where}unknown relation {rel}/{n}: {rel} exists here as {have} only;"
                    " check the query"
                )
            if new_relations or rel in emptied:
                continue
            known_names = {*program, *(extra or {}), *(names() if names is not None else ())}
            close = difflib.get_close_matches(rel, sorted(known_names), n=1)
            error = UnknownRelation(
                f"{where}unknown relation {rel}/{n}: no fact has it and the program"
                " does not mention it" + (f" (did you mean {close[0]}?)" if close else "")
            )
            error.unseen = rel
            raise error


class UnanswerableQuery(Failure, NodeInputError):
    """A query the evaluator cannot schedule (a variable only a comparison or a negation
    mentions): bad input, reported instead of an internal error."""

    exit_code = ExitCode.BAD_INPUT


def evaluate(run: Callable[[Any], T], query: Any) -> T:
    """``run(query)``, with the planner's "unschedulable" turned into bad input (queries
    are checked when parsed, :func:`merklog.node.queries.parse_query`; this is the net)."""
    from merklog.engine.errors import UnschedulableError

    try:
        return run(query)
    except UnschedulableError as exc:
        raise UnanswerableQuery(
            f"cannot answer this query: {exc}; bind every variable in a positive atom"
        ) from None
