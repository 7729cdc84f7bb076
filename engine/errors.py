"""Errors raised for bad programs: one class per kind of mistake, each with a position.

Every error carries the 1-based ``line`` and ``col`` of the offending construct
and a one-line ``hint`` saying how to fix it; ``str(err)`` is
``"{line}:{col}: {message}\\n  hint: {hint}"`` so CLIs can print it unchanged
(without the ``line:col:`` prefix when there is no source position, line 0).
``code`` is a stable snake_case identifier (used by tools and the conformance
adapter); the class itself is what callers should catch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from merklog.store.errors import Error

from .pos import NOPOS, Pos


class _Head(Protocol):
    rel: str


class _Rule(Protocol):
    """What :meth:`IterationLimitError.after` reads of a rule (an ``ast.Rule``; this
    module imports no AST, which itself raises these errors)."""

    head: _Head
    pos: Pos

    @property
    def computes_values(self) -> bool: ...


class EngineError(Error):
    """Base class of every static error in a merklog program (syntax or checks)."""

    code = "engine_error"
    default_hint = "see docs/language.md"

    def __init__(
        self,
        message: str,
        line: int = 0,
        col: int = 0,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.line = line
        self.col = col
        self.hint = hint if hint is not None else self.default_hint
        super().__init__(self._format())

    @classmethod
    def at(cls, pos: Pos | None, message: str, hint: str | None = None, **extra: object):
        """Build the error at an AST position (``NOPOS`` when unknown)."""
        pos = pos or NOPOS
        err = cls(message, pos.line, pos.col, hint)
        for key, value in extra.items():
            setattr(err, key, value)
        return err

    @property
    def pos(self) -> Pos:
        return Pos(self.line, self.col)

    def _format(self) -> str:
        if self.line == 0:  # no source position (e.g. a fact given at run time)
            return f"{self.message}\n  hint: {self.hint}"
        return f"{self.line}:{self.col}: {self.message}\n  hint: {self.hint}"

    def __str__(self) -> str:
        return self._format()


class ParseError(EngineError):
    """The text is not a well-formed program, query, fact list or value."""

    code = "parse_error"
    default_hint = "check the syntax near this position (docs/language.md)"


class RangeRestrictionError(EngineError):
    """A head, comparison or negated variable is not bound by a positive body predicate."""

    code = "unbound_variable"
    default_hint = "bind the variable with a positive atom, a CID selection, an aggregate or `==`"


class UnsafeNegationError(EngineError):
    """A variable of a negated atom is not bound by the rest of the body."""

    code = "unsafe_negation"
    default_hint = "bind the variable in a positive atom first, or replace it by `_`"


class AggregateScopeError(EngineError):
    """An aggregate's parameter is bound outside it, repeated, or its local variables leak."""

    code = "aggregate_scope"
    default_hint = "aggregate over a fresh variable that appears once in the aggregated atom"


class UnschedulableError(EngineError):
    """No evaluation order binds every variable before it is needed (the planner's verdict)."""

    code = "unschedulable"
    default_hint = "bind every variable with a positive atom, an aggregate or `==` before using it"

    literal: str = ""


class ArityError(EngineError):
    """One relation is used with different numbers of arguments."""

    code = "arity_mismatch"
    default_hint = "use the relation with the same number of arguments everywhere"


class DeclarationError(EngineError):
    """A relation is declared twice, or a fact does not fit its relation's declaration."""

    code = "declaration"
    default_hint = "make the fact fit the declaration (docs/language.md, declarations)"


class UnknownRelationError(EngineError):
    """A query names a relation that no fact, rule or declaration defines."""

    code = "unknown_relation"
    default_hint = "check the relation's spelling; relations come from facts, rules or .decl"


class UnstratifiableError(EngineError):
    """Negation or aggregation through recursion; ``cycle`` lists the relations."""

    code = "cyclic_negation"
    default_hint = "break the cycle: negation and aggregation may not depend on themselves"

    cycle: Sequence[str] = ()


class NextRuleFinitenessError(EngineError):
    """An ``@next`` rule could change the database forever for a static EDB (Dialog query-engine spec §1.3.1)."""

    code = "next_rule_finiteness"
    default_hint = (
        "repeat the head atom in the body with the same arguments, "
        "or add a positive atom over a non-@next relation"
    )


class AsyncHeadError(EngineError):
    """An ``@async`` head does not name its destination peer correctly."""

    code = "async_head"
    default_hint = "write p(@Peer, ...)@async with Peer bound in the body"


#: Rounds a recursive stratum whose rules compute values (arithmetic, aggregates:
#: :attr:`~merklog.engine.ast.Rule.computes_values`) may take to reach its fixpoint in
#: one evaluation. Such a recursion can keep making new values (``n(X + 1) :- n(X).``)
#: and never reach one; every evaluator stops it here with :class:`IterationLimitError`
#: instead of running (and growing) until the process is killed. A recursion of plain
#: rules derives only tuples of values it was given and is never limited (a walk along
#: a chain of millions of links takes as many rounds as it needs).
MAX_FIXPOINT_ITERATIONS = 1_000_000


class IterationLimitError(EngineError):
    """A recursive stratum did not reach its fixpoint within
    :data:`MAX_FIXPOINT_ITERATIONS` rounds: its rules keep deriving new values."""

    code = "iteration_limit"
    default_hint = (
        "a recursive rule keeps deriving new values (e.g. n(X + 1) :- n(X)); bound it"
        " with a condition such as X < 1000"
    )

    @classmethod
    def after(cls, rules: Sequence[_Rule]) -> IterationLimitError:
        """The error of a recursive stratum of ``rules`` that ran out of rounds, at the
        first of its rules (in the program's text) that computes values: only such a
        rule can make new values forever, so that is where the program needs a bound.
        Rules parsed from no text (position 0:0) give an error without a position."""
        names = ", ".join(sorted({rule.head.rel for rule in rules}))
        computing = [rule for rule in rules if rule.computes_values and rule.pos.line]
        first = min(computing, key=lambda rule: (rule.pos.line, rule.pos.col), default=None)
        return cls.at(
            first.pos if first is not None else None,
            f"the recursion{' deriving ' + names if names else ''} did not reach a fixpoint"
            f" in {MAX_FIXPOINT_ITERATIONS:,} rounds (MAX_FIXPOINT_ITERATIONS)",
        )


class EvaluationInterrupted(EngineError):
    """An evaluation stopped between two rounds because its caller asked it to
    (:func:`merklog.engine.interrupt.interruptible`): a node closing while an epoch
    runs. Nothing it derived counts; the caller evaluates again from its inputs."""

    code = "interrupted"
    default_hint = "the evaluation runs again when the node next evaluates"


#: What a join that grew too large is told to do.
_JOIN_HINT = (
    "a join of large relations on no common variable derives the product of their sizes:"
    " join them on a common variable or bind one to a constant; if the data is just that"
    " large, raise the memory budget"
)


class EvaluationTooLarge(EngineError):
    """An evaluation stopped between two rounds because it grew the process past its
    memory budget (:func:`merklog.engine.interrupt.memory_budget`, ADR 0207): most often
    a recursion that derives new values every round, which no round limit stops before
    memory runs out when each round derives many tuples. Nothing it derived counts."""

    code = "evaluation_too_large"
    default_hint = (
        "a recursion that derives new values every round never ends, such as a counter"
        " over a cycle (d(Y, D + 1) :- d(X, D), edge(X, Y)): bound it (D < 100); if the"
        " data is just that large, raise the memory budget"
    )

    @classmethod
    def over(
        cls,
        limit: int,
        size: int,
        rounds: int,
        deriving: str,
        setting: str,
        what: str = "memory budget",
    ) -> EvaluationTooLarge:
        """The error of an evaluation that grew the process to ``size`` bytes, past
        ``limit`` (its ``what``, raised by ``setting``), after ``rounds`` rounds of the
        recursion deriving the relations ``deriving``."""
        grown = (
            f"it grew this process to {math.ceil(size / (1024 * 1024)):,} MB, past its {what}"
            f" of {limit // (1024 * 1024):,} MB ({setting})"
        )
        if not rounds and not deriving:  # checked inside a rule's join, not between rounds
            where, hint = "in a join", _JOIN_HINT
        else:
            recursion = f"the recursion deriving {deriving}" if deriving else "a recursion"
            where = f"after {rounds:,} round{'' if rounds == 1 else 's'} of {recursion}"
            hint = cls.default_hint
        err = cls(f"the evaluation stopped {where}: {grown}", hint=f"{hint} ({setting})")
        err.limit, err.size, err.rounds, err.setting = limit, size, rounds, setting
        return err

    @classmethod
    def reading(cls, limit: int, size: int, setting: str, name: str) -> EvaluationTooLarge:
        """The error of reading the fact file ``name`` (a device or a pipe: a regular
        file's size is known) that grew the process to ``size`` bytes, past ``limit``."""
        mib = 1024 * 1024
        err = cls(
            f"reading {name} grew this process to {math.ceil(size / mib):,} MB, past its"
            f" memory budget of {limit // mib:,} MB ({setting})",
            hint=f"{name} is no regular file: does it ever end (/dev/zero, a pipe nobody"
            f" closes)? Give a file, or raise the memory budget ({setting})",
        )
        err.limit, err.size, err.setting = limit, size, setting
        return err

    @classmethod
    def before_join(
        cls, limit: int, size: int, setting: str, what: str = "memory budget"
    ) -> EvaluationTooLarge:
        """The error of a join whose output would grow the process to ``size`` bytes,
        past ``limit``: refused before it is allocated (ADR 0210)."""
        mib = 1024 * 1024
        err = cls(
            f"the evaluation stopped before a join: its output would grow this process to"
            f" {math.ceil(size / mib):,} MB, past its {what} of {limit // mib:,} MB ({setting})",
            hint=f"{_JOIN_HINT} ({setting})",
        )
        err.limit, err.size, err.setting = limit, size, setting
        return err

    limit: int = 0
    size: int = 0
    rounds: int = 0
    setting: str = ""


class UnsupportedError(EngineError):
    """A construct of another dialect merklog does not implement; ``construct`` names it."""

    code = "unsupported"
    default_hint = "rewrite the program without this construct (docs/language.md lists them)"

    construct: str = ""


class FactFileError(EngineError, ValueError):
    """A line of a fact file (``merklog eval --facts``) that does not fit its relation.

    ``line``/``col`` point into the file named by ``path``; ``str(err)`` has the
    usual ``"{line}:{col}: {message}"`` form, so CLIs print ``f"{err.path}:{err}"``.
    """

    code = "bad_fact_file"
    default_hint = "see docs/language.md, fact files"

    path: str = ""


class NotAValueError(EngineError, TypeError, ValueError):
    """A Python object given to the engine as a value that is not a merklog value
    (a list, ``None``, …): facts passed to :meth:`Program.evaluate` or converted to
    engine form. Also a ``TypeError``/``ValueError``, as it was before it had a code."""

    code = "not_a_value"
    default_hint = "values are int, float, str, bytes, bool or a CID"


class UnknownDialectError(EngineError, ValueError):
    """A dialect name other than ``auto``, ``merklog`` or ``souffle``."""

    code = "unknown_dialect"
    default_hint = "use auto, merklog or souffle"


class FieldError(EngineError, ValueError):
    """A TSV field that does not fit its declared column type (the reader adds the
    file, line and column: :class:`FactFileError`)."""

    code = "bad_field"
    default_hint = "see docs/evaluation.md, field grammar"


__all__ = [
    "AggregateScopeError",
    "ArityError",
    "AsyncHeadError",
    "DeclarationError",
    "EngineError",
    "EvaluationInterrupted",
    "EvaluationTooLarge",
    "FactFileError",
    "FieldError",
    "NextRuleFinitenessError",
    "NotAValueError",
    "ParseError",
    "RangeRestrictionError",
    "UnknownDialectError",
    "UnknownRelationError",
    "UnstratifiableError",
    "UnsafeNegationError",
    "UnschedulableError",
    "UnsupportedError",
]
