"""The merklog Datalog engine: language, static checks, batch and incremental evaluation.

``from merklog.engine import Program`` is the entry point (see
:mod:`merklog.engine.program`). Exports are resolved lazily so that submodules
(the parser, arith, the dataflow runtime, …) import independently of each other.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Program": "program",
    "EpochResult": "program",
    "Relations": "batch",
    "BatchEvaluator": "batch",
    "Source": "io",
    "Sink": "io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
