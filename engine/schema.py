"""Relation declarations: column types, and checking facts against them.

A declaration fixes a relation's arity and the type of each column. In the
merklog dialect it is optional and written

.. code-block:: datalog

    .decl edge(src: int, dst: int).
    .decl label(node: any, text: str).

with the merklog types ``int float str bytes bool cid`` and ``any``; the
Soufflé frontend produces the same :class:`~merklog.engine.ast.Declaration`
from ``.decl`` with Soufflé's types (``number unsigned float symbol``).

Types follow value identity (docs/language.md, "Value identity"): ``1`` is an
``int`` and never a ``float``, ``true`` is a ``bool`` and never an ``int``.

:func:`check_declarations` is one of the static checks (a relation declared
twice, inline facts that do not fit); :class:`Schema` is what a node keeps to
refuse, at ``put``, a fact that does not fit (:meth:`Schema.check_fact`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from merklog.store import Link, format_value

from .arith import INT32_MAX, INT32_MIN
from .ast import NOPOS, Declaration, Pos, Program
from .errors import DeclarationError
from .parser import MERKLOG_TYPES
from .values import from_engine, value_type

#: The column types of the merklog dialect (parsed by the parser), and of the Soufflé frontend.
SOUFFLE_TYPES = ("number", "unsigned", "float", "symbol", "any")

#: The largest ``unsigned`` (Soufflé's 32-bit unsigned type).
UINT32_MAX = 2**32 - 1

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int,),
    "unsigned": (int,),
    "float": (float,),
    "str": (str,),
    "symbol": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
    "cid": (Link,),
}


def value_fits(value: Any, column_type: str) -> bool:
    """Does a plain merklog value (or its engine form) have ``column_type``?"""
    if column_type == "any":
        return True
    value = from_engine(value)
    want = _PYTHON_TYPES.get(column_type)
    if want is None:
        return True  # a Soufflé user type: the frontend checked it
    if type(value) not in want:
        return False
    if column_type == "number":  # Soufflé's integer types are 32 bits wide here
        return INT32_MIN <= value <= INT32_MAX
    if column_type == "unsigned":
        return 0 <= value <= UINT32_MAX
    return True


def _show(decl: Declaration) -> str:
    cols = ", ".join(f"{name}: {kind}" for name, kind in decl.columns)
    where = f" at {decl.pos}" if decl.pos != NOPOS else ""
    return f".decl {decl.rel}({cols}){where}"


class Schema:
    """The declarations of a program, by relation name."""

    def __init__(self, declarations: Sequence[Declaration] = ()) -> None:
        self.declarations: dict[str, Declaration] = {}
        for decl in declarations:
            known = self.declarations.get(decl.rel)
            if known is not None and known.columns != decl.columns:
                raise DeclarationError.at(
                    decl.pos,
                    f"{decl.rel} is declared twice: {_show(known)} and {_show(decl)}",
                    "keep one declaration per relation",
                )
            self.declarations.setdefault(decl.rel, decl)

    @classmethod
    def of(cls, program: Program | Any) -> Schema:
        """The schema of an ast.Program or a CheckedProgram."""
        program = getattr(program, "program", program)
        return cls(program.declarations)

    def __contains__(self, rel: object) -> bool:
        return rel in self.declarations

    def __bool__(self) -> bool:
        return bool(self.declarations)

    def problem(self, rel: str, args: Sequence[Any]) -> str | None:
        """Why ``rel(args)`` does not fit its declaration (None when it fits or is undeclared)."""
        decl = self.declarations.get(rel)
        if decl is None:
            return None
        if len(args) != decl.arity:
            return (
                f"{rel} has arity {decl.arity} ({_show(decl)}) but the fact has {len(args)} "
                "arguments"
            )
        for (name, kind), value in zip(decl.columns, args, strict=True):
            if not value_fits(value, kind):
                plain = from_engine(value)
                if kind in ("number", "unsigned") and type(plain) is int:
                    return (
                        f"column {name} of {rel} is {kind} ({_show(decl)}), and {plain} is"
                        f" outside its 32-bit range"
                    )
                return (
                    f"column {name} of {rel} is {kind} ({_show(decl)}), "
                    f"got {value_type(value)} {format_value(plain)}"
                )
        return None

    def check_fact(self, rel: str, args: Sequence[Any], pos: Pos | None = None) -> None:
        """Raise :class:`DeclarationError` when ``rel(args)`` does not fit its declaration."""
        why = self.problem(rel, args)
        if why is not None:
            raise DeclarationError.at(
                pos,
                f"{rel}({', '.join(format_value(from_engine(v)) for v in args)}) does not fit: {why}",
                "change the fact or the declaration",
                relation=rel,
            )

    def check_facts(self, facts: Mapping[str, Any]) -> None:
        """Check ``relation -> rows`` (the first misfit raises). An int64 matrix is checked
        by its first row, which stands for all: every value in it is an int (it passed a
        float or str column unchecked, QA)."""
        for rel, rows in facts.items():
            if rel not in self.declarations:
                continue
            if hasattr(rows, "ndim"):
                rows = [tuple(rows[0].tolist())] if len(rows) else []
            for row in rows:
                self.check_fact(rel, tuple(row))


def check_declarations(program: Program) -> Schema:
    """Static check: one declaration per relation, and inline facts that fit their
    declaration (``p(1.5).`` under ``.decl p(x: number)`` is refused at its line:col, as
    a node refuses it at ``put`` and ``eval`` in a fact file)."""
    schema = Schema.of(program)
    if schema:
        positions = program.fact_positions
        for i, (rel, args) in enumerate(program.facts):
            schema.check_fact(rel, args, positions[i] if i < len(positions) else NOPOS)
    return schema


__all__ = ["MERKLOG_TYPES", "SOUFFLE_TYPES", "Schema", "check_declarations", "value_fits"]
