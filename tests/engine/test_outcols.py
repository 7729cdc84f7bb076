"""Result columns (engine/outcols.py): ``np.lexsort`` over the column keys gives exactly
``sort_rows``' cross-type order, and the column text is ``format_field``'s, with floats
that read back as the same float."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.batch import sort_rows
from merklog.engine.outcols import Column, column_text, dictionary_text, float_text, row_order
from merklog.engine.tsv import format_field, parse_field, write_relation
from merklog.engine.values import from_engine, to_engine
from merklog.store import Link, format_value

CID = Link.for_dag_cbor(b"\xa0")
_EDGES = [
    1, 1.0, True, False, "1", x := b"\x01", 0, 0.5, -1, -1.5, 2**63 - 1, -(2**63), 2**63 - 2,
    float(2**63), float(-(2**63)), 2**53, 2**53 + 1, float(2**53), 9007199254740993,
    1e300, -1e300, 1e-7, 123.0, 5e-324, "", "é", "Z", "a\tb", b"", x + b"\x00", CID,
]  # fmt: skip
_value = st.one_of(
    st.sampled_from(_EDGES),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=4),
    st.binary(max_size=3),
)


def rows_of(draw_rows: list[tuple]) -> list[tuple]:
    return list({tuple(to_engine(v) for v in row) for row in draw_rows})


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3).flatmap(lambda n: st.lists(st.tuples(*[_value] * n), min_size=1)))
def test_row_order_is_sort_rows_order(raw: list[tuple]) -> None:
    rows = rows_of(raw)
    cols = [Column.of_values(c) for c in zip(*rows, strict=True)]
    got = [rows[i] for i in row_order(cols)]
    assert [tuple(map(repr, r)) for r in got] == [tuple(map(repr, r)) for r in sort_rows(rows)]


@settings(max_examples=200, deadline=None)
@given(st.lists(_value, min_size=1))
def test_column_text_reads_back_as_the_same_value(values: list) -> None:
    engine = [to_engine(v) for v in values]
    col = Column.of_values(engine)
    text = column_text(col, dictionary_text(col, format_field)).to_pylist()
    for value, field in zip(engine, text, strict=True):
        assert field == format_field(value)  # one definition of a field's text
        plain = from_engine(value)
        if type(plain) is float:  # floats read back as the same float (1.0 stays 1.0)
            back = parse_field(field)
            assert type(back) is float and back == plain, (field, plain)


def test_encoded_columns_sort_like_tuples(tmp_path) -> None:
    """The columnar executor's encoded columns (ids below the ints) and the tuple
    executor's rows give the same sorted file, in the documented order between types
    (bool < number < str < bytes; ``1`` just before ``1.0``)."""
    from merklog.engine.program import Program

    values = ["1", "1.0", "true", '"1"', 'x"01"', "-2", "0.5", '"a"', "false"]
    text = "".join(f"p({v}).\n" for v in values) + "q(X) :- p(X).\n"
    out = {}
    for backend in ("tuple", "columnar"):
        rels = Program.parse(text, backend=backend).evaluate()
        if backend == "columnar":
            assert rels.encoded_columns("q") is not None  # the encoded path was taken
        path = tmp_path / f"{backend}.csv"
        assert write_relation(path, rels, "q", sort=True) == len(values)
        out[backend] = path.read_text()
    assert out["tuple"] == out["columnar"] == "false\ntrue\n-2\n0.5\n1\n1.0\n1\na\n01\n"


def test_one_kind_columns_with_repeated_values_break_ties_on_the_next_column() -> None:
    """A column of strings only (or floats only) is its own dictionary, repeats
    included: equal values must get equal keys so the next column decides."""
    rows = rows_of(
        [("b", 1.0, 3), ("a", 2.5, 1), ("a", 0.5, 2), ("é", 0.5, 0), ("a", 0.5, 1), ("Z", -0.0, 9)]
    )
    cols = [Column.of_values(c) for c in zip(*rows, strict=True)]
    assert cols[0].mask is not None and cols[0].mask.all() and len(cols[0].values) == len(rows)
    got = [rows[i] for i in row_order(cols)]
    assert [tuple(map(repr, r)) for r in got] == [tuple(map(repr, r)) for r in sort_rows(rows)]


_LAYOUT_EDGES = [
    1e-7, -1e-05, 1e-4, 0.00012, 123456789012345.0, 1e15, 9007199254740991.0, 1e16, 1e21,
    5e-324, 1.7976931348623157e308, 0.1, 100.0, -0.0, 0.0, 123456789.0,
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(_LAYOUT_EDGES), st.floats(allow_nan=False, allow_infinity=False)),
        min_size=1,
    )
)
def test_a_float_column_is_written_as_format_value_renders_it(floats: list[float]) -> None:
    """One value, one rendering: eval wrote pyarrow's layout (``1e-7``, ``-0.00001``,
    ``1e+15``) where put, query and the HTTP API write ``1e-07``, ``-1e-05``,
    ``1000000000000000.0``."""
    import numpy as np

    text = float_text(np.array(floats, dtype=np.float64)).to_pylist()
    assert text == [format_value(f) for f in floats]


def test_a_column_of_ints_beside_long_strings_takes_each_text_once() -> None:
    """QA: ``eval`` of a column holding 1,500 ints beside a 3 MB and a 5 MB string
    failed with pyarrow's "Take operation overflowed binary array capacity" after 2.2 GB:
    the dictionary's text was taken for every row (an int row's id is 0, the 3 MB
    string) before ``if_else`` dropped it. Each row's text is now taken once."""
    long_x, long_7 = "x" * 3_000_000, "7" * 5_000_000
    values = [*range(1500), long_x, long_7, "z"]
    col = Column.of_values([to_engine(v) for v in values])
    text = column_text(col, dictionary_text(col, format_field))
    assert text.to_pylist() == [format_field(to_engine(v)) for v in values]
    assert text.nbytes < 9_000_000 + 20 * len(values)
