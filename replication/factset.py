"""A set of facts keyed by CID, so values keep their identity (ADR 0096).

``Fact`` is a NamedTuple of Python values, and Python's ``==``/``hash`` merge ``1``,
``1.0`` and ``True``: a plain ``set`` of ``p(1)``, ``p(1.0)`` and ``p(true)`` holds one
element where the replica holds three facts with three CIDs. :class:`FactSet` keeps
each fact under its CID; membership, equality and subset tests go through CIDs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from typing import Any

from merklog.store import Error, Fact, Link, fact_cid


def _cid_of(item: Any) -> Link | None:
    if isinstance(item, Link):
        return item
    if isinstance(item, Fact):
        try:
            return fact_cid(item)
        except Error:  # not a valid fact: in no fact set
            return None
    return None


class FactSet(Set[Fact]):
    """Facts by CID: iterates the facts in CID order; ``in`` takes a Fact or its CID.

    Compared with another FactSet by CIDs; with any other set of facts by the CIDs of
    its elements (so a plain ``set`` that already merged ``p(1)`` and ``p(1.0)`` does
    not equal a FactSet holding both)."""

    __slots__ = ("_by_cid",)

    def __init__(self, items: Iterable[tuple[Link, Fact]] = ()) -> None:
        self._by_cid: dict[Link, Fact] = dict(sorted(items, key=lambda cf: cf[0].raw))

    def __contains__(self, item: object) -> bool:
        cid = _cid_of(item)
        return cid is not None and cid in self._by_cid

    def __iter__(self) -> Iterator[Fact]:
        return iter(self._by_cid.values())

    def __len__(self) -> int:
        return len(self._by_cid)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FactSet):
            return self._by_cid.keys() == other._by_cid.keys()
        if isinstance(other, Set):
            return len(self) == len(other) and all(x in self for x in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-style container, like set

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> FactSet:
        """Set operators (``&``, ``|``, ``-``) build FactSets from facts."""
        out = cls()
        for fact in it:
            cid = _cid_of(fact)
            if cid is not None:
                out._by_cid[cid] = fact
        return out

    def cids(self) -> list[Link]:
        """The facts' CIDs, sorted."""
        return list(self._by_cid)

    def items(self) -> list[tuple[Link, Fact]]:
        """``(CID, fact)`` pairs in CID order."""
        return list(self._by_cid.items())

    def __repr__(self) -> str:
        return "FactSet({" + ", ".join(str(f) for f in self) + "})"
