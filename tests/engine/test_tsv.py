"""engine.tsv: the columnar reader and writer agree with the per-field grammar.

The vectorised paths (pyarrow CSV reader, regex classification, pyarrow
writer) must give exactly what :func:`parse_field` / :func:`format_field`
define, field by field, on mixed-type data: ``1``, ``1.0`` and ``"1"`` apart.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merklog.engine.batch import Rel, Relations
from merklog.engine.errors import FactFileError, FieldError
from merklog.engine.tsv import (
    _read_rows,
    format_field,
    parse_field,
    read_relation,
    row_line,
    write_relation,
)

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def typed(rows) -> list[tuple]:
    """Rows with each value tagged by its Python type, so 1 == 1.0 == True cannot hide."""
    if isinstance(rows, np.ndarray):
        rows = [tuple(r) for r in rows.tolist()]
    return [tuple((type(v).__name__, v) for v in row) for row in rows]


# Fields built from the characters that matter to the grammar.
field_text = st.text(alphabet=st.sampled_from(list("0123456789-+.eE _x\r\u0661ab")), max_size=8)
numberish = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
    st.integers(min_value=2**63, max_value=2**64).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    # beyond a double, or read as 0.0 although not zero; and zeros and subnormals that fit
    st.sampled_from(["1e999", "1e-400", "-2.5e-330", "0.0", "0.0e-999", "5e-324", "0e5"]),
    field_text,
)


@SETTINGS
@given(
    width=st.integers(1, 3),
    data=st.data(),
)
def test_columnar_reader_matches_the_field_grammar(tmp_path: Path, width: int, data) -> None:
    # one column of the file is drawn from one kind, so whole-column fast paths run too
    kinds = [data.draw(st.sampled_from(["ints", "floats", "mixed"])) for _ in range(width)]
    n = data.draw(st.integers(1, 12))
    strategy = {
        "ints": st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
        "floats": st.floats(allow_nan=False, allow_infinity=False).map(repr),
        "mixed": numberish,
    }
    rows = [[data.draw(strategy[k]) for k in kinds] for _ in range(n)]
    text = "".join("\t".join(r) + "\n" for r in rows if "\t".join(r).strip("\r"))
    path = tmp_path / "p.facts"
    path.write_bytes(text.encode())
    expected = _read_rows(path, text.encode(), width, None, 64) if text else []
    got = read_relation(path)
    assert typed(got) == typed(expected)


@SETTINGS
@given(st.lists(numberish, min_size=1, max_size=10))
def test_souffle_number_column_reader_matches_the_field_grammar(tmp_path: Path, fields) -> None:
    fields = [f for f in fields if f.strip("\r")]
    if not fields:
        return
    path = tmp_path / "n.facts"
    data = "".join(f + "\n" for f in fields).encode()
    path.write_bytes(data)
    try:
        expected = _read_rows(path, data, 1, ["number"], 32)
    except FactFileError as err:
        with pytest.raises(FactFileError) as got:
            read_relation(path, column_types=["number"], int_bits=32)
        assert (got.value.line, got.value.col, got.value.message) == (
            err.line,
            err.col,
            err.message,
        )
        return
    assert typed(read_relation(path, column_types=["number"], int_bits=32)) == typed(expected)


def test_field_grammar_examples() -> None:
    assert parse_field("5") == 5 and type(parse_field("5")) is int
    assert type(parse_field("1.0")) is float
    assert parse_field("9223372036854775807") == 2**63 - 1
    for text in ("9223372036854775808", "1_000", "\u0661\u0662", " 5", "5 ", "+5", "inf", ".5"):
        assert parse_field(text) == text and type(parse_field(text)) is str
    assert math.copysign(1, parse_field("-0.0")) == 1.0
    assert parse_field(" 5", "number", 32) == 5
    assert parse_field("-2147483648", "number", 32) == -(2**31)
    # 1e-400 read as 0.0 would merge with a real 0.0: out of range, as 1e999 is
    for text in ("1e999", "1e-400", "-1e-400", "0." + "0" * 400 + "1"):
        assert parse_field(text) == text and type(parse_field(text)) is str
        with pytest.raises(FieldError, match="outside the float range"):
            parse_field(text, "float")
    for text, value in (("0.0e-999", 0.0), ("5e-324", 5e-324), ("0e5", 0.0)):
        assert parse_field(text) == value and type(parse_field(text)) is float
        assert parse_field(text, "float") == value


def test_columnar_float_columns_keep_out_of_range_text_apart_from_zero(tmp_path: Path) -> None:
    """A whole column of floats is converted at once: a 1e-400 in it came out as 0.0,
    one row with the real 0.0 beside it."""
    path = tmp_path / "f.facts"
    path.write_text("0.0\n1e-400\n2.5\n")
    assert typed(read_relation(path)) == [
        (("float", 0.0),),
        (("str", "1e-400"),),
        (("float", 2.5),),
    ]
    with pytest.raises(FactFileError, match="outside the float range") as err:
        read_relation(path, column_types=["float"])
    assert err.value.line == 2


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_is_written_so_it_reads_back_as_itself(x: float) -> None:
    back = parse_field(format_field(x))
    assert type(back) is float and back == x


values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f + 0.0),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r"),
        max_size=6,
    ).filter(lambda s: type(parse_field(s)) is str and s != ""),
)


@SETTINGS
@given(
    st.integers(1, 3).flatmap(
        lambda k: st.lists(st.tuples(*[values] * k), min_size=1, max_size=20, unique=True)
    ),
    st.booleans(),
)
def test_written_rows_read_back_with_their_types(tmp_path: Path, rows, sort: bool) -> None:
    rels = Relations({"r": set(rows)})
    path = tmp_path / "r.csv"
    assert write_relation(path, rels, "r", sort=sort) == len(rels["r"])
    back = read_relation(path)
    assert sorted(map(repr, typed(back))) == sorted(map(repr, typed(rels["r"])))


@pytest.mark.parametrize("sort", [False, True])
def test_int_columns_are_written_by_the_columnar_writer(tmp_path: Path, sort: bool) -> None:
    cols = [np.array([3, -1, 2**63 - 1, 3]), np.array([0, 5, -(2**63), 0])]
    rels = Relations({"r": Rel(cols=cols, distinct=False)})
    path = tmp_path / "r.csv"
    assert write_relation(path, rels, "r", sort=sort) == 3
    text = path.read_text().splitlines()
    expected = [f"{-1}\t5", "3\t0", f"{2**63 - 1}\t{-(2**63)}"]
    assert (text if sort else sorted(text, key=lambda s: int(s.split()[0]))) == expected


@pytest.mark.parametrize("sort", [False, True])
def test_encoded_columns_are_written_decoded(tmp_path: Path, sort: bool) -> None:
    # ids <= -1 stand for values[-1 - id]
    cols = [np.array([-1, 7, -2, -3]), np.array([4, -1, -1, 7])]
    rels = Relations({"r": Rel(cols=cols, decoder=(-1, ["a b", b"\x01", 'q"']))})
    path = tmp_path / "r.csv"
    write_relation(path, rels, "r", sort=sort)
    got = path.read_text().splitlines()
    expected = ["7\ta b", "a b\t4", 'q"\t7', "01\ta b"]  # numbers < strings < bytes
    assert (got if sort else sorted(got, key=expected.index)) == expected


@SETTINGS
@given(
    rows=st.lists(
        st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=2, max_size=2),
        min_size=1,
        max_size=60,
    ),
    blanks=st.sets(st.integers(0, 60), max_size=5),
    crlf=st.booleans(),
    last=st.sampled_from(["", "\t", "1.0", "x", "9223372036854775808", "\u0661"]),
)
def test_int_files_stream_into_one_matrix_across_blocks(
    tmp_path: Path, monkeypatch, rows, blanks, crlf, last
) -> None:
    """A file of ints is read block by block into one int64 matrix (ADR 0108): with many
    tiny blocks, empty lines, CRLF ends and a non-int in the last block (which sends the
    whole file to the typed-per-field path), it reads as the per-field grammar says."""
    import merklog.engine.tsv as tsv

    monkeypatch.setattr(tsv, "STREAM_BLOCK", 64)
    end = "\r\n" if crlf else "\n"
    lines = ["\t".join(map(str, r)) for r in rows]
    for i in sorted(blanks, reverse=True):
        lines.insert(min(i, len(lines)), "")
    if last:
        lines.append(f"7\t{last}")
    data = "".join(line + end for line in lines).encode()
    path = tmp_path / "e.facts"
    path.write_bytes(data)
    if last == "\t":  # three fields on the last line: the same error from both readers
        with pytest.raises(FactFileError) as err:
            read_relation(path)
        assert (err.value.line, err.value.col) == (len(lines), 1)
        return
    got = read_relation(path)
    assert typed(got) == typed(_read_rows(path, data, 2, None, 64))
    if not last:
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.int64 and got.flags.f_contiguous and got.shape == (len(rows), 2)


def test_souffle_number_matrix_out_of_range_names_the_field(tmp_path: Path, monkeypatch) -> None:
    import merklog.engine.tsv as tsv

    monkeypatch.setattr(tsv, "STREAM_BLOCK", 64)
    path = tmp_path / "n.facts"
    path.write_text("".join(f"{i}\t{i}\n" for i in range(40)) + "1\t2147483648\n")
    with pytest.raises(FactFileError) as err:
        read_relation(path, column_types=["number", "number"], int_bits=32)
    assert (err.value.line, err.value.col) == (41, 3)
    assert "outside the 32-bit number range" in err.value.message


def test_a_leading_byte_order_mark_is_no_text_on_every_reading_path(tmp_path: Path) -> None:
    """Only pyarrow skipped it: a file holding just a BOM was one fact (the BOM), a BOM on
    an empty first line gave the file one field, and the reference reader (a lone CR
    sends a file there) kept it in the first field."""
    path = tmp_path / "r.facts"
    path.write_bytes(b"\xef\xbb\xbf")
    assert read_relation(path) == []
    assert read_relation(path, arity=2) == []
    assert read_relation(path, arity=0) == []
    path.write_bytes(b"\xef\xbb\xbf\n1\t2\n")
    assert read_relation(path, arity=2).tolist() == [[1, 2]]
    assert row_line(path, 0) == 2
    path.write_bytes(b"\xef\xbb\xbfa\tb\nc\rd\te\n")
    assert read_relation(path) == [("a", "b"), ("c\rd", "e")]


def test_a_field_of_thousands_of_digits_is_read_not_refused_by_python(tmp_path: Path) -> None:
    """A field of 4,301 digits made eval print Python's "Exceeds the limit (4300 digits)
    for integer string conversion … use sys.set_int_max_str_digits()" with no file or
    line. Out of int64, it is a string where the grammar says so, and a number column
    says where it is out of range; leading zeros still read as the integer."""
    digits = "4" * 4301
    assert parse_field(digits) == digits and parse_field("-" + digits) == "-" + digits
    assert parse_field("0" * 5000 + "17") == 17 and parse_field("-" + "0" * 30 + "5") == -5
    with pytest.raises(FieldError, match="outside the 32-bit number range"):
        parse_field(digits, "number", 32)
    assert parse_field(" +" + "0" * 40 + "9", "number", 32) == 9
    path = tmp_path / "e.facts"
    path.write_text(f"abc\n{digits}\n")
    assert sorted(map(tuple, read_relation(path, 1))) == [(digits,), ("abc",)]
    path.write_text(f"{digits}\n")
    with pytest.raises(FactFileError, match="outside the 32-bit number range"):
        read_relation(path, column_types=["number"], int_bits=32)
