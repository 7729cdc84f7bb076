"""Every error the engine raises about its input derives from ``EngineError`` (issue #10:
one error root under ``merklog.Error``), including bad values given through the Python
API, unknown dialects and TSV fields, which raised bare ``TypeError``/``ValueError``."""

from __future__ import annotations

import pytest

import merklog
import merklog.engine
from merklog.engine.errors import EngineError, FieldError, NotAValueError, UnknownDialectError
from merklog.engine.program import Program
from merklog.engine.tsv import parse_field
from merklog.engine.values import to_engine

from ..exception_classes import exception_classes

#: Exception classes of the engine that are control flow, never raised to a caller.
INTERNAL = {"NoBinding": "arithmetic without a value; every evaluator catches it"}


def test_every_public_exception_class_of_the_engine_is_an_engine_error() -> None:
    found = []
    for qualified, cls in exception_classes("merklog.engine").items():
        name = qualified.rsplit(".", 1)[1]
        if not name.startswith("_") and name not in INTERNAL:
            found.append(cls)
            assert issubclass(cls, EngineError), qualified
            assert issubclass(cls, merklog.Error)
    assert len(found) > 10  # the scan sees the engine's error classes


def test_a_value_that_is_not_a_merklog_value_is_an_engine_error() -> None:
    with pytest.raises(NotAValueError) as err:
        to_engine([1])
    assert isinstance(err.value, TypeError) and "list is not a merklog value" in str(err.value)
    prog = Program.parse("q(X) :- p(X).")
    with pytest.raises(NotAValueError) as err:
        prog.evaluate({"p": [(1,), (None,)]})
    assert isinstance(err.value, ValueError) and "facts for p" in str(err.value)


def test_an_unknown_dialect_is_an_engine_error() -> None:
    with pytest.raises(UnknownDialectError) as err:
        Program.parse("p(1).", dialect="prolog")
    assert isinstance(err.value, ValueError) and "'prolog'" in str(err.value)


def test_a_field_outside_its_column_type_is_an_engine_error() -> None:
    with pytest.raises(FieldError) as err:
        parse_field("1.5", "number")
    assert isinstance(err.value, EngineError) and "as a number" in err.value.message


RUNAWAY = "n(0).\nn(X + 1) :- n(X).\nm(X) :- n(X), X < 5.\n"


@pytest.fixture
def low_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """MAX_FIXPOINT_ITERATIONS at 1,000 in every evaluator (the real 1,000,000 rounds
    take seconds)."""
    from merklog.engine import batch, columnar, errors, incremental

    for module in (batch, columnar, errors, incremental):
        monkeypatch.setattr(module, "MAX_FIXPOINT_ITERATIONS", 1_000)
    return 1_000


@pytest.mark.parametrize("backend", ["tuple", "auto"])
def test_a_recursion_without_fixpoint_stops_with_an_error(backend: str, low_limit: int) -> None:
    """``n(X + 1) :- n(X)`` passes every static check and never reaches a fixpoint: the
    evaluators ran (and grew) until the process was killed, and a node with it loaded
    could not be stopped by SIGTERM. A recursion that computes values stops at
    MAX_FIXPOINT_ITERATIONS rounds; a plain one is never limited."""
    from merklog.engine.errors import IterationLimitError

    with pytest.raises(IterationLimitError, match="deriving n did not reach a fixpoint") as err:
        Program.parse(RUNAWAY, backend=backend).evaluate()
    assert isinstance(err.value, merklog.Error) and err.value.code == "iteration_limit"
    assert "1,000 rounds" in str(err.value)
    # at the rule that makes new values (it had no position: eval printed no PROGRAM:L:C)
    assert (err.value.line, err.value.col) == (2, 1)
    assert str(err.value).startswith("2:1: the recursion deriving n did not reach")
    mutual = "p(0).\np(X) :- q(X).\n  q(X + 1) :- p(X).\n"  # the second rule computes
    with pytest.raises(IterationLimitError, match="deriving p, q did not reach") as err:
        Program.parse(mutual, backend=backend).evaluate()
    assert (err.value.line, err.value.col) == (3, 3)
    walk = Program.parse("reach(Y) :- reach(X), next(X, Y).", backend=backend)
    links = low_limit + 10  # more rounds than the limit: plain rules, never stopped
    got = walk.evaluate({"reach": [(0,)], "next": [(i, i + 1) for i in range(links)]})
    assert len(got["reach"]) == links + 1


def test_the_incremental_engine_stops_a_recursion_without_fixpoint(low_limit: int) -> None:
    from merklog.engine.errors import IterationLimitError
    from merklog.engine.incremental import IncrementalEngine

    engine = IncrementalEngine(Program.parse("n(X + 1) :- n(X), go(1).").checked)
    engine.step(inserts={"n": [(0,)]})
    with pytest.raises(IterationLimitError, match="deriving n did not reach a fixpoint") as err:
        engine.step(inserts={"go": [(1,)]})
    assert str(err.value).startswith("1:1: the recursion deriving n")
    walk = IncrementalEngine(Program.parse("reach(Y) :- reach(X), next(X, Y).").checked)
    walk.step(inserts={"next": [(i, i + 1) for i in range(low_limit + 10)]})
    out = walk.step(inserts={"reach": [(0,)]})
    assert len(out["reach"]) == low_limit + 11
