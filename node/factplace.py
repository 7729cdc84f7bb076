"""Where a fact sits in an input text: the ``LINE:COL`` that names a fact refused after
it parsed (it does not fit the program's declarations, it is over the 1 MiB limit).

The write that refuses it sees facts, not text, so the error names the fact; ``put -f``
then looks it up in the text it read. That lookup runs only on such an error: it reads
the text again (``read_fact_lines``, or the parser for other shapes).
"""

from __future__ import annotations

from typing import Any

from merklog.engine.factreader import read_fact_lines
from merklog.engine.parser import parse_facts_placed
from merklog.store import Fact


def _identity(fact: Fact) -> tuple:
    """A key equal for two facts exactly when they are the same fact: values compared
    with their types (``p(1)``, ``p(1.0)`` and ``p(true)`` differ, as their CIDs do), a
    float's ``-0.0`` as the ``0.0`` a write stores."""
    return (
        fact.rel,
        tuple((type(v), v + 0.0 if type(v) is float else v) for v in fact.args),
    )


def place_of(text: str, fact: Fact) -> tuple[int, int] | None:
    """The ``(line, column)`` in ``text`` of the first fact that is ``fact`` (by value
    identity, :func:`_identity`), or None when no fact of ``text`` is."""
    key, arity = _identity(fact), len(fact.args)

    def same(other: Fact) -> bool:
        return other.rel == fact.rel and len(other.args) == arity and _identity(other) == key

    bulk = read_fact_lines(text)
    if bulk is not None:  # one fact per line, empty lines between
        holding = [n for n, line in enumerate(text.split("\n"), 1) if line != ""]
        for line, other in zip(holding, bulk[0], strict=False):
            if same(other):
                return line, 1
        return None
    try:
        placed = parse_facts_placed(text)
    except Exception:  # noqa: BLE001 - it parsed before, or no place can be named
        return None
    for other, pos in placed:
        if same(other):
            return pos.line, pos.col
    return None


def name_place(exc: Any, text: str) -> None:
    """Start the message of ``exc``, an error about the fact ``exc.fact``, with that
    fact's ``LINE:COL`` in ``text`` (which ``cliutil.in_file`` then turns into
    ``FILE:LINE:COL``), when the fact is found there. Changes ``exc`` in place."""
    fact = getattr(exc, "fact", None)
    if not isinstance(fact, Fact):
        return
    place = place_of(text, fact)
    if place is None:
        return
    at = f"{place[0]}:{place[1]}: "
    exc.args = (at + str(exc),)
    if isinstance(getattr(exc, "detail", None), str):  # a replication error's message
        exc.detail = at + exc.detail
