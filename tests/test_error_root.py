"""One error root: every exception class merklog defines is a ``merklog.Error``.

An app catches ``merklog.Error`` and nothing the package raises escapes it. The only
exceptions are internal signals that never leave the function that raises them:
private classes (a leading underscore) and the ones named in ``INTERNAL_SIGNALS`` with
the place that catches them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import merklog

#: Raised and caught inside the engine, never seen by a caller.
INTERNAL_SIGNALS = {
    # an arithmetic term has no value for this binding; the evaluator catches it and
    # drops the binding (engine/batch.py, engine/dataflow/operators.py, count_sum_join.py)
    "merklog.engine.arith.NoBinding",
}

PACKAGES = ("merklog.store", "merklog.engine", "merklog.replication", "merklog.node")


def _exception_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            module = importlib.import_module(info.name)
            for attr, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                ):
                    found[f"{module.__name__}.{attr}"] = obj
    return found


def test_every_exception_merklog_defines_is_a_merklog_error() -> None:
    classes = _exception_classes()
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
    assert INTERNAL_SIGNALS <= set(_exception_classes())
