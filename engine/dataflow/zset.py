"""Z-sets and indexed Z-sets: rows (tuples of merklog values) with integer weights.

A Z-set is a plain ``dict[row, weight]`` holding only non-zero weights; an indexed
Z-set is ``dict[key, dict[row, weight]]`` (Dialog dataflow spec §2.1–2.2). Plain dicts keep the
hot loops of the operators free of method-call overhead; the helpers below are
the only code that builds them, so the "no zero weight" invariant holds everywhere.
Timestamps are not stored in these values: a stream carries one value per timestamp
and the circuit knows the current one (Dialog dataflow spec §2.7 "cell" model).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping

Row = tuple
ZSet = dict  # dict[Row, int], weights never zero
IndexedZSet = dict  # dict[Hashable, dict[Row, int]]


def zset(items: Iterable[tuple[Row, int]] | Mapping[Row, int] = ()) -> ZSet:
    """Consolidate ``(row, weight)`` pairs (or a mapping) into a Z-set, dropping zeros."""
    out: ZSet = {}
    pairs = items.items() if isinstance(items, Mapping) else items
    for row, w in pairs:
        n = out.get(row, 0) + w
        if n:
            out[row] = n
        else:
            out.pop(row, None)
    return out


def from_rows(rows: Iterable[Row], weight: int = 1) -> ZSet:
    """A Z-set giving each row ``weight`` per occurrence."""
    return zset((row, weight) for row in rows)


def add_into(target: ZSet, delta: Mapping[Row, int], scale: int = 1) -> ZSet:
    """``target += scale * delta`` in place (zero weights removed); returns ``target``."""
    for row, w in delta.items():
        n = target.get(row, 0) + w * scale
        if n:
            target[row] = n
        else:
            del target[row]
    return target


def add_weight(target: ZSet, row: Row, w: int) -> None:
    """``target[row] += w`` keeping the no-zero invariant."""
    n = target.get(row, 0) + w
    if n:
        target[row] = n
    else:
        target.pop(row, None)


def plus(a: Mapping[Row, int], b: Mapping[Row, int]) -> ZSet:
    """``a + b`` (Dialog dataflow spec §2.9.15)."""
    return add_into(dict(a), b)


def minus(a: Mapping[Row, int], b: Mapping[Row, int]) -> ZSet:
    """``a - b`` (Dialog dataflow spec §2.9.14)."""
    return add_into(dict(a), b, -1)


def negate(a: Mapping[Row, int]) -> ZSet:
    """Every weight negated (Dialog dataflow spec §2.9.8)."""
    return {row: -w for row, w in a.items()}


def distinct(a: Mapping[Row, int]) -> ZSet:
    """Rows with positive weight, weight set to 1 (Dialog dataflow spec §2.9.3)."""
    return {row: 1 for row, w in a.items() if w > 0}


def filter_zset(pred: Callable[[Row], bool], a: Mapping[Row, int]) -> ZSet:
    """Rows satisfying ``pred`` (Dialog dataflow spec §2.9.4)."""
    return {row: w for row, w in a.items() if pred(row)}


def map_zset(fn: Callable[[Row], Row], a: Mapping[Row, int]) -> ZSet:
    """Rows transformed by ``fn``; rows that collide have their weights added (§2.9.7)."""
    out: ZSet = {}
    get = out.get
    for row, w in a.items():  # add_weight inlined: this loop runs for every Map
        new = fn(row)
        n = get(new, 0) + w
        if n:
            out[new] = n
        else:
            del out[new]  # n == 0 with w != 0: ``new`` was present
    return out


def index_with(key_fn: Callable[[Row], Hashable], a: Mapping[Row, int]) -> IndexedZSet:
    """Group rows by ``key_fn(row)`` into an indexed Z-set (Dialog dataflow spec §2.9.5)."""
    groups: defaultdict[Hashable, dict[Row, int]] = defaultdict(dict)
    for row, w in a.items():
        # ``a`` is a Z-set: its rows are distinct, so each lands in its group once.
        groups[key_fn(row)][row] = w
    return dict(groups)


def flatten(indexed: Mapping[Hashable, Mapping[Row, int]]) -> ZSet:
    """Forget the index: the Z-set of all rows of an indexed Z-set."""
    out: ZSet = {}
    for group in indexed.values():
        add_into(out, group)
    return out


def join_indexed(
    a: Mapping[Hashable, Mapping[Row, int]],
    b: Mapping[Hashable, Mapping[Row, int]],
    combine: Callable[[Hashable, Row, Row], Row],
    out: ZSet | None = None,
) -> ZSet:
    """Equi-join two indexed Z-sets on their keys; weights multiply (Dialog dataflow spec §2.9.12)."""
    if out is None:
        out = {}
    if len(b) < len(a):
        for k, brows in b.items():
            arows = a.get(k)
            if arows:
                for arow, wa in arows.items():
                    for brow, wb in brows.items():
                        add_weight(out, combine(k, arow, brow), wa * wb)
    else:
        for k, arows in a.items():
            brows = b.get(k)
            if brows:
                for arow, wa in arows.items():
                    for brow, wb in brows.items():
                        add_weight(out, combine(k, arow, brow), wa * wb)
    return out
