"""The columnar input path (ADR 0090) against a fresh batch run, over mixed-type values.

An int64 matrix inserted into an empty relation becomes that relation's
:class:`~merklog.engine.arraybase.ArrayBase` and travels as a
:class:`~merklog.engine.dataflow.columns.ColumnBatch`: ``count``/``sum`` group it
straight from its columns; every other operator reads it as tuples. Later epochs
insert and delete tuples of mixed types (``1``, ``1.0``, ``true``, ``"1"``,
``x"01"``) against the matrix, where ``1.0`` and ``true`` must never match an int
``1``. Every relation is compared with a fresh batch evaluation after each epoch,
and the tests check that the columnar, vectorised and per-tuple paths all ran.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine import arraybase
from merklog.engine.arraybase import ArrayBase, distinct_rows, tuple_hashes
from merklog.engine.batch import BatchEvaluator
from merklog.engine.dataflow import CountSumJoin, GroupAggregate
from merklog.engine.dataflow.columns import ColumnBatch
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.program import Program
from merklog.engine.values import TRUE, Float, row_to_engine

TEXT = """
stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
total(N, S) :- N := count : p(_, _), S := sum V : p(_, V).
by2(G, H, C) :- q(G, H), C := count : r(G, H, _).
big(G, V) :- p(G, V), V > 500.
lonely(G) :- grp(G), !p(G, 1).
wide(G, H, C, S) :- q(G, H), C := count : p(G, _), S := sum V : p(G, V).
"""

RELS = ("stats", "total", "by2", "big", "lonely", "wide", "p", "r")
KEYS = [0, 1, 1.0, True, False, "1", b"\x01", 2, 0.5, -3]
MIXED = [1, 1.0, True, "1", b"\x01", 0.5, -0.0, 2**62, 7, 501, 501.0]


def _check(engine: IncrementalEngine, base: dict[str, set[tuple]], checked) -> None:
    strata = [list(s.rules) for s in checked.strata if not s.temporal]
    reference = BatchEvaluator(checked.program.rules, strata=strata).evaluate(base)
    for rel in RELS:
        want = reference.engine(rel) if rel in reference else set()
        assert engine.relation(rel).engine == want, rel
        assert engine.count(rel) == len(want), rel


def _matrix(rng: random.Random, n: int, arity: int, dup: bool) -> np.ndarray:
    """``n`` int rows (small values, so mixed-type twins such as ``1.0`` collide with
    them by Python equality); with ``dup``, some rows repeated."""
    m = np.array(
        [[rng.randrange(-3, 4) for _ in range(arity - 1)] + [rng.randrange(0, 1000)]
         for _ in range(n)],
        dtype=np.int64,
    ).reshape(n, arity)  # fmt: skip
    if dup and n:
        m = np.concatenate([m, m[: max(1, n // 5)]])
    return m


def _mixed(rng: random.Random, n: int, arity: int) -> set[tuple]:
    out: set[tuple] = set()
    while len(out) < n:
        head = tuple(rng.choice(KEYS) for _ in range(arity - 1))
        out.add(row_to_engine((*head, rng.choice(MIXED + [rng.randrange(0, 1000)]))))
    return out


def _rows(m: np.ndarray) -> set[tuple]:
    return set(map(tuple, m.tolist()))


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 600),
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from([1, 5, 40, 300]), st.floats(0, 1), st.booleans()),
        min_size=1,
        max_size=5,
    ),
)
def test_columnar_load_then_mixed_epochs_equal_a_fresh_batch_run(
    seed: int, n: int, dup: bool, epochs: list
) -> None:
    rng = random.Random(seed)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    p0, r0 = _matrix(rng, n, 2, dup), _matrix(rng, n, 3, dup)
    base: dict[str, set[tuple]] = {
        "grp": {row_to_engine((k,)) for k in KEYS + [-2, -1, 3]},
        "q": {row_to_engine((a, b)) for a in (-1, 0, 1, 1.0, True) for b in (0, 2, "1")},
        "p": _rows(p0),
        "r": _rows(r0),
    }
    engine.step(inserts={"grp": list(base["grp"]), "q": list(base["q"]), "p": p0, "r": r0})
    _check(engine, base, checked)
    if n:
        assert isinstance(engine._edb["p"], ArrayBase)
    for size, drop, as_array in epochs:
        gone_p = {r for r in base["p"] if rng.random() < drop / 4}
        # Mixed-type twins of stored int rows: p(1.0, V) never deletes p(1, V).
        ints = [(g, v) for g, v in base["p"] if type(g) is int][:3]
        gone_p |= {(Float(float(g)), v) for g, v in ints}
        new_p = _mixed(rng, size, 2)
        base["p"] = (base["p"] - gone_p) | new_p
        if as_array:  # an int matrix into a non-empty relation: read as tuples
            new_r = _matrix(rng, size, 3, False)
            base["r"] |= _rows(new_r)
            engine.step(deletes={"p": list(gone_p)}, inserts={"p": list(new_p), "r": new_r})
        else:
            gone_r = {r for r in base["r"] if rng.random() < drop / 4}
            base["r"] -= gone_r
            engine.step(deletes={"p": list(gone_p), "r": list(gone_r)})
            engine.step(inserts={"p": list(new_p)})
        _check(engine, base, checked)
    ops = [getattr(node, "op", None) for node in engine.circuit.nodes]
    aggs = [op for op in ops if isinstance(op, GroupAggregate)]
    joins = [op for op in ops if isinstance(op, CountSumJoin)]
    if n:
        assert sum(op.columnar for op in aggs) > 0
        assert sum(op.columnar for op in joins) > 0
    assert sum(op.per_tuple for op in aggs) > 0
    assert sum(op.per_group for op in joins) > 0


def test_matrix_rows_never_match_other_types() -> None:
    base = ArrayBase(np.array([[1, 5], [2**62, -1], [0, 0]], dtype=np.int64))
    rows = [(1, 5), (Float(1.0), 5), (TRUE, 5), ("1", 5), (b"\x01", 5), (1, Float(5.0)),
            (2**62, -1), (2**63, -1), (0, 0), (0, 0, 0), (0,)]  # fmt: skip
    assert base.present(rows) == {(1, 5), (2**62, -1), (0, 0)}
    base.remove_present({(1, 5)})
    base.add_new({(Float(1.0), 5), (TRUE, 5)})
    assert (1, 5) not in base and (Float(1.0), 5) in base and (TRUE, 5) in base
    assert len(base) == 4
    assert base.to_set() == set(base) == {(2**62, -1), (0, 0), (Float(1.0), 5), (TRUE, 5)}
    base.add_new({(1, 5)})  # back from the removed rows
    assert base.present([(1, 5)]) == {(1, 5)} and len(base) == 5
    assert {(0, 0), (9, 9)} - base == {(9, 9)}


def test_distinct_rows_removes_repeats_without_a_sorted_column() -> None:
    rng = np.random.default_rng(1)
    m = rng.integers(-5, 5, size=(2000, 2))
    out = distinct_rows(m)
    assert _rows(out) == _rows(m) and len(out) == len(_rows(m))
    ordered = np.stack([np.arange(10), np.zeros(10, dtype=np.int64)], axis=1)
    assert distinct_rows(ordered) is ordered  # a strictly increasing column proves it


def test_a_base_built_from_unsorted_distinct_rows_answers_lookups_exactly() -> None:
    """A node's stored facts come distinct but in CID order: the duplicate check's index
    is kept for the base's lookups, which must stay exact (and apart from 1.0/true)."""
    rng = np.random.default_rng(2)
    rows = {tuple(r) for r in rng.integers(-(2**62), 2**62, size=(3000, 2)).tolist()}
    m = np.array(sorted(rows, key=lambda r: (r[1], r[0]))[::-1], dtype=np.int64)
    m[:, [0, 1]] = m[:, [1, 0]]  # no column strictly increasing
    base = ArrayBase.of_distinct_rows(m)
    assert base.matrix is m and len(base) == len(m)
    stored = [tuple(r) for r in m[:50].tolist()]
    twins = [(Float(float(a)), b) for a, b in stored[:10]] + [(TRUE, b) for _a, b in stored[:10]]
    absent = [(a + 1, b) for a, b in stored if (a + 1, b) not in set(map(tuple, m.tolist()))]
    assert base.present(stored + twins + absent) == set(stored)
    repeated = ArrayBase.of_distinct_rows(np.concatenate([m, m[:7]]))
    assert len(repeated) == len(m) and repeated.present(stored) == set(stored)


def test_array_inputs_keep_value_identity_and_stay_columnar() -> None:
    engine = IncrementalEngine(Program.parse("c(N) :- N := count : p(_, _).").checked)
    engine.step(inserts={"p": np.array([[1, 2], [1, 2], [3, 4]], dtype=np.uint8)})
    assert engine.relation("c") == {(2,)}
    assert engine.last is not None
    delta = engine.last._deltas["p"]
    assert isinstance(delta, ColumnBatch) and not delta.materialised
    # A float matrix holds floats, a bool matrix bools: never the int rows.
    engine.step(inserts={"p": np.array([[1.0, 2.0]])})
    engine.step(inserts={"p": np.array([[True, False]])})
    assert engine.relation("c") == {(4,)}
    engine.step(deletes={"p": np.array([[1, 2]])})
    assert engine.relation("p") == {(3, 4), (1.0, 2.0), (True, False)}
    assert (1, 2) not in engine.relation("p") and (1.0, 2.0) in engine.relation("p")
    # Events may be arrays too (one epoch only; read as tuples).
    engine.step(events={"p": np.array([[1, 2], [5, 6]])})
    assert engine.relation("c") == {(5,)}
    engine.step()
    assert engine.relation("c") == {(3,)}
    # Rows of another arity than the program reads are kept but never counted.
    other = IncrementalEngine(Program.parse("c(N) :- N := count : p(_, _).").checked)
    other.step(inserts={"p": np.zeros((4, 3), dtype=np.int64)})
    assert other.relation("c") == {(0,)} and len(other.relation("p")) == 1


def test_tuple_hashes_are_the_builtin_hash_of_the_rows() -> None:
    rng = np.random.default_rng(7)
    edges = np.array([0, 1, -1, -2, 2**61 - 1, 2**61, -(2**61), 2**63 - 1, -(2**63)])
    for arity in (1, 2, 3, 4):
        m = np.concatenate([
            rng.integers(-(2**63), 2**63 - 1, size=(3000, arity), dtype=np.int64),
            rng.choice(edges, size=(500, arity)).astype(np.int64),
        ])  # fmt: skip
        want = np.array([hash(r) for r in map(tuple, m.tolist())], dtype=np.int64)
        assert (tuple_hashes(m) == want.view(np.uint64)).all()


def _lookups_agree_with_a_set(base: ArrayBase, m: np.ndarray) -> None:
    rows = list(map(tuple, m.tolist()))
    twins = [(Float(float(r[0])), *r[1:]) for r in rows[:40]] + [(TRUE, *r[1:]) for r in rows[:9]]
    absent = [(r[0], r[1] + 1000) for r in rows[:300]] + [(2**63, 0), ("1", 1)]
    probe = rows[:300] + twins + absent
    assert base.present(probe) == set(rows[:300])
    for r in rows[:10] + twins[:10] + absent[:10]:  # the one-by-one path
        assert (r in base) == (r in set(rows))


def test_lookups_are_exact_with_the_builtin_and_the_fallback_hash(monkeypatch) -> None:
    m = np.stack([np.arange(5000) % 97 - 48, np.arange(5000) // 97], axis=1)
    base = ArrayBase(m)
    _lookups_agree_with_a_set(base, m)
    assert base._index is not None and base._index.hash_one is hash
    # An interpreter whose hash() differs from tuple_hashes (a fault this one cannot
    # produce): the index checks, then hashes rows its own way; answers stay exact.
    monkeypatch.setattr(arraybase, "_builtin_hash_matches", lambda matrix: False)
    other = ArrayBase(m)
    _lookups_agree_with_a_set(other, m)
    assert other._index is not None and other._index.hash_one is not hash


_MATCH_VALUES = st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 1.0, True, "1", b"\x01"])


@settings(max_examples=80, deadline=None)
@given(
    rows=st.sets(st.tuples(st.integers(-3, 3), st.integers(-3, 3)), min_size=1, max_size=40),
    added=st.sets(st.tuples(_MATCH_VALUES, _MATCH_VALUES), max_size=6),
    drop=st.integers(0, 5),
    consts=st.dictionaries(st.integers(0, 2), _MATCH_VALUES, min_size=1, max_size=2),
)
def test_array_base_matching_equals_a_filter_by_identity(
    rows: set, added: set, drop: int, consts: dict
) -> None:
    """``ArrayBase.matching`` (numpy over the matrix, the overlay in Python) gives the
    rows a scan keeps, comparing by identity: ``1``, ``1.0``, ``true``, ``"1"`` and
    ``x"01"`` never match each other; removed rows never come back; a column past the
    arity matches nothing."""
    from merklog.engine.values import row_holds

    base = ArrayBase(np.array(sorted(rows), dtype=np.int64))
    gone = set(sorted(rows)[:drop])
    base.remove_present(gone)
    new = {row_to_engine(r) for r in added} - set(base)
    base.add_new(new)
    engine_consts = {c: row_to_engine((v,))[0] for c, v in consts.items()}
    want = {r for r in base if row_holds(r, engine_consts)}
    assert set(base.matching(engine_consts)) == want


_COL_VALUES = st.sampled_from([0, 1, -1, 2, 2**63 - 1, -(2**63), 1.0, -0.0, 0.0, True, "1", b"\x01"])


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.tuples(_COL_VALUES, _COL_VALUES), min_size=1, max_size=30),
    consts=st.dictionaries(st.integers(0, 2), _COL_VALUES, min_size=1, max_size=2),
)
def test_relations_matching_equals_a_filter_by_identity(rows: list, consts: dict) -> None:
    """``Relations.matching`` (what a query such as ``p(1, Y)`` reads from a reload's
    snapshot) gives the rows a scan of the relation keeps, by identity: whether the
    relation is held as plain int64 columns with repeated rows, as columns whose
    strings, bytes, floats and booleans are codes below the integers, or as tuples.
    ``1``, ``1.0``, ``true``, ``"1"``, ``x"01"``, ``0.0`` and ``-0.0`` never match
    each other; a column past the arity matches nothing."""
    from merklog.engine.batch import Rel, Relations
    from merklog.engine.columnar import Encoder, Ineligible, encode_rows, scan_values
    from merklog.engine.values import row_holds

    engine = [row_to_engine(r) for r in rows]
    engine_consts = {c: row_to_engine((v,))[0] for c, v in consts.items()}
    want = {r for r in engine if row_holds(r, engine_consts)}
    held = {"tuples": Rel(set(engine))}
    ints = [r for r in engine if all(type(v) is int for v in r)]
    if ints:  # repeated rows, as a caller hands columns in
        twice = np.array(ints + ints, dtype=np.int64)
        held["ints"] = Rel(cols=[twice[:, 0].copy(), twice[:, 1].copy()], distinct=False)
    # as the columnar executor encodes a stratum's relation, when there is room for codes
    # below its least int (none below -2**63)
    with contextlib.suppress(Ineligible):
        objects, low = scan_values(set(engine))
        encoder = Encoder(objects, 0 if low is None else low)
        held["encoded"] = Rel(cols=encode_rows(set(engine), encoder.ids), decoder=encoder.decoder())
    relations = Relations(held)
    for name in held:
        expected = want if name != "ints" else {r for r in ints if row_holds(r, engine_consts)}
        assert relations.matching(name, engine_consts) == expected, name
    assert relations.matching("absent", engine_consts) == set()
