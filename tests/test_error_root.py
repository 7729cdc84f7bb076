"""One error root: every exception class merklog defines is a ``merklog.Error``.

An app catches ``merklog.Error`` and nothing the package raises escapes it. The only
exceptions are internal signals that never leave the function that raises them:
private classes (a leading underscore) and the ones named in ``INTERNAL_SIGNALS`` with
the place that catches them.
"""

from __future__ import annotations

import merklog

from .exception_classes import exception_classes

#: Raised and caught inside the engine, never seen by a caller.
INTERNAL_SIGNALS = {
    # an arithmetic term has no value for this binding; the evaluator catches it and
    # drops the binding (engine/batch.py, engine/dataflow/operators.py, count_sum_join.py)
    "merklog.engine.arith.NoBinding",
}

PACKAGES = ("merklog.store", "merklog.engine", "merklog.replication", "merklog.node")


def test_every_exception_merklog_defines_is_a_merklog_error() -> None:
    classes = exception_classes(*PACKAGES)
    assert "merklog.node.spark.compact.CompactError" in classes  # the scan reaches node.spark
    stray = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, merklog.Error)
        and name not in INTERNAL_SIGNALS
        and not name.rsplit(".", 1)[1].startswith("_")
    )
    assert not stray, "exceptions outside merklog.Error: " + ", ".join(stray)


def test_the_internal_signals_still_exist() -> None:
    assert INTERNAL_SIGNALS <= set(exception_classes(*PACKAGES))
