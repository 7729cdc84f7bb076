"""Queries on a node: facts and queries in Datalog syntax, their columns, and their
answers over the current relations (single-atom queries by matching, others through
the batch evaluator)."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from typing import Any

from merklog.engine import ast
from merklog.engine.checks import query_columns as _query_columns
from merklog.engine.values import row_to_engine, to_engine
from merklog.store import Fact, make_fact

from .errors import NodeInputError

QUERY_REL = "__query"


def parse_facts(text: str) -> list[Fact]:
    """Ground facts in Datalog syntax (``edge(1, 2). edge(2, 3).``)."""
    from merklog.engine.parser import parse_facts as _parse

    try:
        parsed = _parse(text)
    except Exception as exc:  # parser errors carry line:column
        raise NodeInputError(str(exc)) from exc
    facts = [f if isinstance(f, Fact) else make_fact(f[0], f[1]) for f in parsed]
    # A -0.0 is written "-0…" (a literal too small for a double, -1e-400, is refused)
    return _zeros_as_stored(facts) if _MINUS_ZERO.search(text) else facts


_MINUS_ZERO = re.compile(r"-0")


def _zeros_as_stored(facts: list[Fact]) -> list[Fact]:
    """``facts`` with ``-0.0`` as the ``0.0`` the store keeps (the parser leaves it to
    ``make_fact``, which its facts skip): a write of ``p(-0.0).`` answered a Fact holding
    ``-0.0`` under the CID of ``0.0``. One pass over the floats; facts are rebuilt only
    when one of them is a zero."""
    floats = [v for v in chain.from_iterable(map(itemgetter(1), facts)) if type(v) is float]
    if 0.0 not in floats:
        return facts
    return [
        Fact(f.rel, tuple(v + 0.0 if type(v) is float else v for v in f.args))  # -0.0 + 0.0 is 0.0
        if any(type(v) is float and v == 0.0 for v in f.args)
        else f
        for f in facts
    ]


def parse_query(text: str) -> tuple[ast.BodyLiteral, ...]:
    """An atom (``path(1, X)``) or a conjunction (``edge(X, Y), !edge(Y, X)``), checked:
    a query no evaluation order can answer (``!edge(X, Y)``, ``edge(X, Y), Z > 1``)
    is refused here with the engine's line:col error, like a syntax error."""
    from merklog.engine.checks import check_query_body
    from merklog.engine.errors import EngineError
    from merklog.engine.parser import parse_query_body

    try:
        body = parse_query_body(text)
        check_query_body(body)
    except EngineError as exc:
        raise NodeInputError(str(exc)) from exc
    return body


def query_relations(query: tuple[ast.BodyLiteral, ...]) -> set[str]:
    return {atom.rel for lit in query for atom, _ in ast.body_atoms(lit)}


def evaluate_query(
    query: tuple[ast.BodyLiteral, ...],
    relation: Callable[[str], set[tuple]],
    matching: Callable[[str, dict[int, Any]], set[tuple]] | None = None,
) -> tuple[list[str], list[tuple]]:
    """Columns (the query's named variables) and the distinct rows answering it.

    ``relation(rel)`` gives the relation's rows in engine form
    (:mod:`merklog.engine.values`) and the answer rows are in engine form too, so
    ``1``, ``1.0`` and ``true`` stay three rows; convert with ``row_from_engine``
    where they leave the node. ``matching(rel, {column: value})``, if given, gives the
    rows holding those constants (a superset would do), so that a single-atom query
    with constants (``edge(1, Y)``) reads only what it answers."""
    return answer(query, query_inputs(query, relation, matching))


def query_inputs(
    query: tuple[ast.BodyLiteral, ...],
    relation: Callable[[str], set[tuple]],
    matching: Callable[[str, dict[int, Any]], set[tuple]] | None = None,
) -> dict[str, set[tuple]]:
    """The rows :func:`answer` reads, by relation (see :func:`evaluate_query`): those of
    a single atom's constants, else every relation the query names. Read apart from the
    evaluation so that a node reads them from its published epoch, which an epoch may
    replace once they are read (copies), and evaluates without holding it (ADR 0210)."""
    match = atom_matcher(query)
    if match is not None:
        atom = query[0].atom  # type: ignore[union-attr]
        consts = {
            i: to_engine(a.value) for i, a in enumerate(atom.args) if isinstance(a, ast.Const)
        }
        rows = matching(atom.rel, consts) if matching is not None and consts else None
        return {atom.rel: relation(atom.rel) if rows is None else rows}
    return {rel: relation(rel) for rel in query_relations(query)}


def answer(
    query: tuple[ast.BodyLiteral, ...], inputs: dict[str, set[tuple]]
) -> tuple[list[str], list[tuple]]:
    """Columns and distinct engine-form rows of ``query`` over ``inputs`` (what
    :func:`query_inputs` read): a single atom by matching, else one rule evaluated by
    the batch evaluator."""
    names = [v.name for v in _query_columns(query)]
    match = atom_matcher(query)
    if match is not None:
        (candidates,) = inputs.values()
        return names, list({m for m in map(match, candidates) if m is not None})
    from merklog.engine.batch import BatchEvaluator

    head = ast.Atom(QUERY_REL, tuple(_query_columns(query)))
    rule = ast.Rule(head, query)
    result = BatchEvaluator([rule]).evaluate(inputs)
    return names, list(result.engine(QUERY_REL)) if QUERY_REL in result else []


def atom_matcher(
    query: tuple[ast.BodyLiteral, ...],
) -> Callable[[tuple], tuple | None] | None:
    """For a single-atom query of constants and variables, a function mapping one tuple of
    its relation to the answer row it yields (None if it does not match); None otherwise.

    Tuples may be plain or in engine form; constants and repeated variables match by
    value identity (``p(1)`` does not match ``p(1.0)`` or ``p(true)``), and the answer
    row is in engine form."""
    if len(query) != 1 or not isinstance(query[0], ast.Positive) or query[0].cid is not None:
        return None
    atom = query[0].atom
    if not all(isinstance(a, ast.Var | ast.Const) for a in atom.args):
        return None
    names = [v.name for v in _query_columns(query)]
    n = len(atom.args)
    consts = [to_engine(a.value) if isinstance(a, ast.Const) else None for a in atom.args]

    def match(row: tuple) -> tuple | None:
        if len(row) < n or (len(row) != n and not atom.rest):
            return None
        row = row_to_engine(row)
        env: dict[str, Any] = {}
        for arg, const, value in zip(atom.args, consts, row, strict=False):
            if isinstance(arg, ast.Const):
                if const != value:  # engine values: == is identity
                    return None
            elif arg.anonymous:
                continue
            elif arg.name in env:
                if env[arg.name] != value:
                    return None
            else:
                env[arg.name] = value
        return tuple(env[name] for name in names)

    return match


def query_columns_of(query: tuple[ast.BodyLiteral, ...]) -> list[str]:
    return [v.name for v in _query_columns(query)]
