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
