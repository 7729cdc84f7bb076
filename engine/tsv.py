"""TSV fact files in and out as columns: one exact field grammar, pyarrow underneath.

``merklog eval`` reads ``<rel>.facts`` and writes ``<rel>.csv``: one tuple per
line, fields separated by tabs, no header, no quoting (Soufflé's conventions, so
Soufflé fact directories work unchanged). Files are parsed by pyarrow's CSV
reader into whole columns and classified with vectorised regular expressions;
results are written from columns (pyarrow's CSV writer, or string columns
joined by pyarrow compute), so no Python code runs per row on the common
shapes. :func:`parse_field` / :func:`format_field` are the per-field definition
the columnar code implements (the tests compare them on random fields).

Field grammar, merklog dialect (each field typed on its own):

- ``-?[0-9]+`` within int64 is an int (ASCII digits only);
- ``-?[0-9]+.[0-9]+([eE][+-]?[0-9]+)?`` or ``-?[0-9]+[eE][+-]?[0-9]+`` (the
  merklog float literal syntax) is a float when finite (``-0.0`` reads as ``0.0``);
- anything else is a string, exactly as written: no trimming, so
  ``9223372036854775808`` (outside int64), ``1_000``, Arabic-Indic digits,
  `` 5 ``, ``inf`` and ``0x10`` are strings.

Soufflé dialect: columns are typed by ``.decl`` and read the way Soufflé reads
them (``std::stoll``/``std::stod``): ``number``/``unsigned`` take optional
leading white space, an optional sign and ASCII digits, and must fit the
dialect's integer width (32 bits) -- anything else is an error naming the file,
line and column, as Soufflé's "Error converting <…> in column … in line …";
``float`` takes a decimal float, finite; ``symbol`` takes the text unchanged.

Writing: ints in decimal, floats in the shortest round-trip form laid out as
:func:`merklog.store.format_value` does (``1e-07``, ``0.000025``, ``1e+16``; whole
columns at once, :func:`~merklog.engine.outcols.float_text`) that always has a
``.`` or an exponent (``1.0``, never ``1``), strings raw, bools
``true``/``false``, bytes as hex, CIDs as text. So ``1`` and ``1.0`` stay two
rows and every int and float reads back as itself. A nullary relation that
holds is written as ``()`` (as Soufflé does), one that does not as an empty
file; when reading a nullary relation any non-empty line makes it hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from merklog.store import Link, Value
from merklog.store.gcpause import gc_paused

from .arrowbuf import from_ints as _from_ints
from .arrowbuf import str_scalar as _str_scalar
from .arrowbuf import to_numpy as _to_numpy
from .errors import FactFileError, FieldError
from .lexer import NONZERO_MANTISSA_TEXT, float_in_range
from .outcols import float_text
from .pos import pos_at
from .values import Bool

Row = tuple[Any, ...]

#: What :func:`read_relation` returns: a 2-D int64 array (Fortran order, one
#: contiguous column per argument) when every field is an int, else tuples.
FactRows = np.ndarray | list[Row]

INT_TEXT = r"^-?[0-9]+$"
FLOAT_TEXT = r"^-?(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)$"
# Soufflé's readers (std::stoll / std::stod) skip leading white space and take a sign.
SOUFFLE_INT_TEXT = r"^[ \f\v\r]*[+-]?[0-9]+$"
SOUFFLE_FLOAT_TEXT = r"^[ \f\v\r]*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_LEAD = r"^[ \f\v\r]*\+?"

_INT_RE = re.compile(INT_TEXT, re.ASCII)
_FLOAT_RE = re.compile(FLOAT_TEXT, re.ASCII)
_SOUFFLE_INT_RE = re.compile(SOUFFLE_INT_TEXT, re.ASCII)
_SOUFFLE_FLOAT_RE = re.compile(SOUFFLE_FLOAT_TEXT, re.ASCII)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
I64, F64 = np.int64, np.float64


def int_range(column_type: str, int_bits: int) -> tuple[int, int]:
    """The values a typed integer column may hold (``unsigned``: ``[0, 2**bits)``)."""
    if column_type == "unsigned":
        return 0, min(2**int_bits - 1, INT64_MAX)
    return -(2 ** (int_bits - 1)), 2 ** (int_bits - 1) - 1


# ----------------------------------------------------------------------------- one field


def parse_field(text: str, column_type: str = "any", int_bits: int = 64) -> Value:
    """One TSV field as a value: typed per ``.decl`` (Soufflé), else by the grammar above."""
    if column_type == "symbol":
        return text
    if column_type in ("number", "unsigned"):
        if not _SOUFFLE_INT_RE.match(text):
            raise FieldError(f"cannot read {text!r} as {_article(column_type)} {column_type}")
        value = _int_of(text.lstrip(" \f\v\r"))
        lo, hi = int_range(column_type, int_bits)
        if value is None or not lo <= value <= hi:
            raise FieldError(f"{text!r} is outside the {int_bits}-bit {column_type} range")
        return value
    if column_type == "float":
        if not _SOUFFLE_FLOAT_RE.match(text):
            raise FieldError(f"cannot read {text!r} as a float")
        value = float_in_range(text.lstrip(" \f\v\r"))
        if value is None:  # too large, or not zero but read as 0.0 (1e-400)
            raise FieldError(f"{text!r} is outside the float range")
        return value + 0.0  # -0.0 is 0.0, as in the store
    if column_type in _WRITTEN_KINDS:
        return _written_value(text, column_type)
    if _INT_RE.match(text):
        value = _int_of(text)
        return value if value is not None and INT64_MIN <= value <= INT64_MAX else text
    if _FLOAT_RE.match(text):
        value = float_in_range(text)  # out of range (1e999, 1e-400): kept as its text
        return value + 0.0 if value is not None else text
    return text


def _int_of(text: str) -> int | None:
    """The integer of a decimal ``text`` (an optional sign, digits), or None when it has
    more significant digits than any 64-bit integer: Python refuses to convert more than
    4,300 digits ("Exceeds the limit … use sys.set_int_max_str_digits()", which eval
    printed with no file or line), and such a field is out of every range anyway."""
    if len(text) <= 24:
        return int(text)
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 20:
        return None
    return -int(digits or "0") if text.startswith("-") else int(digits or "0")


#: Merklog ``.decl`` column types read back from the text :func:`format_field` writes
#: for them (a ``str`` column is read as ``symbol``: the text unchanged).
_WRITTEN_KINDS = frozenset({"bool", "bytes", "cid"})
_HEX_RE = re.compile(r"(?:[0-9a-fA-F]{2})*", re.ASCII)


def _written_value(text: str, column_type: str) -> Value:
    """A ``bool``/``bytes``/``cid`` field as eval writes one: ``true``/``false``, hex
    digits two per byte (``x""`` is an empty field), a CID's text."""
    if column_type == "bool":
        if text in ("true", "false"):
            return text == "true"
        raise FieldError(f"cannot read {text!r} as a bool")
    if column_type == "bytes":
        if not _HEX_RE.fullmatch(text):
            raise FieldError(f"cannot read {text!r} as bytes (hex digits, two per byte)")
        return bytes.fromhex(text)
    try:
        return Link.parse(text)
    except ValueError:
        raise FieldError(f"cannot read {text!r} as a CID") from None


def format_field(value: Any) -> str:
    """One value as a TSV field (strings raw, floats always with ``.`` or an exponent)."""
    kind = type(value)
    if kind is int or kind is str:
        return str(value)
    if kind is bool or kind is Bool:
        return "true" if value else "false"
    if isinstance(value, float):  # the column writer's own text, one value long
        return str(float_text(np.array([value], dtype=np.float64))[0])
    if kind is bytes:
        return value.hex()
    if kind is Link:
        return str(value)
    return str(value)


# ----------------------------------------------------------------------------- reading


#: A UTF-8 byte order mark: skipped at the start of a fact file (as pyarrow does), so a
#: file holding only one is empty.
BOM = b"\xef\xbb\xbf"


def _lines(data: bytes) -> Iterable[tuple[int, bytes]]:
    """(1-based line number, line without its end) of every non-empty line."""
    lines = data.split(b"\n")
    lines[0] = lines[0].removeprefix(BOM)
    for number, line in enumerate(lines, 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            yield number, line


def _error(path: Path, line: int, col: int, message: str, hint: str) -> FactFileError:
    err = FactFileError(message, line, col, hint=hint)
    err.path = str(path)
    return err


def _decode(path: Path, data: bytes) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        at = pos_at(data, err.start)
        byte = f"byte 0x{data[err.start]:02x}"
        raise _error(
            path, at.line, at.col, f"not UTF-8 text ({byte})", "save the file as UTF-8"
        ) from None


def _read_rows(
    path: Path,
    data: bytes,
    width: int,
    types: Sequence[str] | None,
    int_bits: int,
    uses: int | None = None,
) -> list[Row]:
    """The reference reader, one field at a time (used when pyarrow cannot take a file).
    ``uses``: the arity the program reads the relation with, when the first line set
    ``width``: a later line of that arity blames the first line, not itself."""
    _decode(path, data)
    rows: list[Row] = []
    kinds = list(types) if types is not None else ["any"] * width
    for number, raw in _lines(data):
        fields = raw.decode("utf-8").split("\t")
        if len(fields) != width and uses is not None and len(fields) == uses != width:
            # a stray first line (a header) made a right line look wrong (QA)
            raise _error(
                path,
                1,
                1,
                f"{_fields(width)}, but the program uses {path.stem} with"
                f" {_arguments(uses)} (as line {number} has)",
                "every line of a fact file has one field per argument, separated by tabs",
            )
        if len(fields) != width:
            raise _error(
                path,
                number,
                1,
                f"{_fields(len(fields))}, expected {width}",
                "every line of a fact file has one field per argument, separated by tabs",
            )
        row = []
        for j, (text, kind) in enumerate(zip(fields, kinds, strict=True)):
            try:
                row.append(parse_field(text, kind, int_bits))
            except FieldError as err:
                col = sum(len(f) + 1 for f in fields[:j]) + 1
                raise _error(
                    path, number, col, f"column {j + 1}: {err.message}", _type_hint(kind)
                ) from None
        rows.append(tuple(row))
    return rows


def _type_hint(kind: str) -> str:
    if kind == "float":
        return "a float column takes decimal numbers such as 1.5 or 2e3"
    if kind == "bool":
        return "a bool column takes true or false"
    if kind == "bytes":
        return "a bytes column takes hex digits, two per byte (ab01), as eval writes bytes"
    if kind == "cid":
        return "a cid column takes a CID as text (bafy…), as eval writes CIDs"
    return f"{_article(kind)} {kind} column takes ASCII decimal digits with an optional sign"


def _article(word: str) -> str:
    """``an`` before ``unsigned``, ``a`` before ``number``."""
    return "an" if word[:1] in "aeiou" else "a"


def _first_line(data: bytes) -> tuple[int, bytes] | None:
    """(line number, text) of the first non-empty line, without splitting the whole file
    (a leading byte order mark is no text)."""
    pos, number = (len(BOM) if data.startswith(BOM) else 0), 1
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            end = len(data)
        line = data[pos:end]
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            return number, line
        pos, number = end + 1, number + 1
    return None


#: Bytes that pyarrow's int64 parser accepts around or inside digits (white space
#: trimming, ``0x`` prefixes) but the merklog grammar does not: a file holding
#: none of them can use pyarrow's typed int64 reader and still be exact.
_LOOSE_INT_BYTES = (b" ", b"x", b"X", b"+", b"\v", b"\f")


#: Bytes per block of the streamed int reader: pyarrow's working memory (one parsed
#: block and its converted batch) stays a few MB whatever the size of the file.
STREAM_BLOCK = 1 << 20


def _csv_options(types: list[Any], block_size: int) -> dict[str, Any]:
    """pyarrow CSV options for the TSV grammar: tabs, no quoting or escapes, no nulls,
    empty lines skipped, one column of each given type."""
    import pyarrow.csv as pacsv

    names = [f"c{j}" for j in range(len(types))]
    return {
        "read_options": pacsv.ReadOptions(
            column_names=names, use_threads=False, block_size=block_size
        ),
        "parse_options": pacsv.ParseOptions(
            delimiter="\t",
            quote_char=False,
            escape_char=False,
            double_quote=False,
            newlines_in_values=False,
            ignore_empty_lines=True,
        ),
        "convert_options": pacsv.ConvertOptions(
            column_types=dict(zip(names, types, strict=True)),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            null_values=[],
            check_utf8=True,
        ),
    }


def _arrow_read(data: bytes, types: list[Any]) -> Any:
    """The file as a pyarrow table of the given column types (None when pyarrow refuses it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(pa.py_buffer(data), **_csv_options(types, 1 << 24))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # ragged lines, bad UTF-8, a non-int in an int column ...


def _arrow_int_matrix(data: bytes, width: int) -> np.ndarray | None:
    """The file as an ``(n, width)`` int64 matrix in Fortran order (None when some field
    is not an int pyarrow reads exactly, or a line is ragged).

    pyarrow's streaming reader parses a block at a time and each batch is copied
    straight into its rows of the matrix, which is allocated once from the file's line
    count: the columns are never held twice (a whole pyarrow table and then the
    matrix) and pyarrow's memory pool never grows to the file's size.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rows = data.count(b"\n") + (not data.endswith(b"\n"))  # empty lines make it an upper bound
    out = np.empty((rows, width), dtype=np.int64, order="F")
    pos = 0
    try:
        reader = pacsv.open_csv(
            pa.py_buffer(data), **_csv_options([pa.int64()] * width, STREAM_BLOCK)
        )
        for batch in reader:
            end = pos + batch.num_rows
            if end > rows:  # not a line per row after all: let the reference reader judge
                return None
            for j in range(width):
                out[pos:end, j] = _to_numpy(batch.column(j), I64)
            pos = end
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return out if pos == rows else np.asfortranarray(out[:pos])


def _arrow_columns(data: bytes, first: bytes, kinds: list[str]) -> np.ndarray | list[Any] | None:
    """Columns of the file: int64 where the first line suggests ints and that is exact,
    pyarrow strings elsewhere (None when pyarrow cannot take the file). A file of ints
    only comes back as one int64 matrix (:func:`_arrow_int_matrix`)."""
    import pyarrow as pa

    guess = [
        kind in ("any", "number") and _INT_RE.match(text) is not None
        for kind, text in zip(kinds, first.decode("utf-8", "replace").split("\t"), strict=True)
    ]
    exact = not any(b in data for b in _LOOSE_INT_BYTES)
    if all(guess) and exact:
        matrix = _arrow_int_matrix(data, len(kinds))
        if matrix is not None:
            return matrix
    elif any(guess) and exact:
        table = _arrow_read(data, [pa.int64() if g else pa.string() for g in guess])
        if table is not None:
            return [
                _to_numpy(table.column(j), I64) if g else table.column(j)
                for j, g in enumerate(guess)
            ]
    table = _arrow_read(data, [pa.string()] * len(kinds))
    return None if table is None else [table.column(j) for j in range(len(kinds))]


def _all(mask: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.all(mask).as_py()) if len(mask) else True


def _any(mask: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(mask).as_py()) if len(mask) else False


def _column(col: Any, kind: str, int_bits: int) -> np.ndarray | list | None:
    """One string column as values: an int64/float64 array, a list, or None (fall back)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "symbol":
        return col.to_pylist()
    if kind in _WRITTEN_KINDS:
        try:
            return [_written_value(text, kind) for text in col.to_pylist()]
        except FieldError:
            return None  # the reference reader says where
    if kind in ("number", "unsigned"):
        if not _all(pc.match_substring_regex(col, SOUFFLE_INT_TEXT)):
            return None
        try:
            ints = _to_numpy(pc.cast(pc.replace_substring_regex(col, _LEAD, ""), pa.int64()), I64)
        except pa.ArrowInvalid:
            return None  # outside int64: the reference reader says where
        lo, hi = int_range(kind, int_bits)
        if len(ints) and (int(ints.min()) < lo or int(ints.max()) > hi):
            return None
        return ints
    if kind == "float":
        if not _all(pc.match_substring_regex(col, SOUFFLE_FLOAT_TEXT)):
            return None
        floats = _to_numpy(pc.cast(pc.replace_substring_regex(col, _LEAD, ""), pa.float64()), F64)
        if not _floats_in_range(col, floats):
            return None
        return floats + 0.0
    is_int = pc.match_substring_regex(col, INT_TEXT)
    if _all(is_int):
        try:
            return _to_numpy(pc.cast(col, pa.int64()), I64)
        except pa.ArrowInvalid:
            pass  # some field is outside int64: a string, decided field by field below
    elif not _any(is_int):
        is_float = pc.match_substring_regex(col, FLOAT_TEXT)
        if not _any(is_float):
            return col.to_pylist()  # no numbers at all: every field is a string
        if _all(is_float):
            floats = _to_numpy(pc.cast(col, pa.float64()), F64)
            if _floats_in_range(col, floats):
                return floats + 0.0
    return [parse_field(text) for text in col.to_pylist()]


def _fields(n: int) -> str:
    return "1 field" if n == 1 else f"{n} fields"


def _arguments(n: int) -> str:
    return "1 argument" if n == 1 else f"{n} arguments"


def _floats_in_range(col: Any, floats: np.ndarray) -> bool:
    """Whether every float of ``floats`` (read from the text column ``col``) is the value
    its text says: finite, and 0.0 only where the text is a zero (``1e-400`` is not)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not np.isfinite(floats).all():
        return False
    zero = floats == 0.0
    if not zero.any():
        return True
    texts = pc.filter(col, pa.array(zero))
    return not _any(pc.match_substring_regex(texts, NONZERO_MANTISSA_TEXT))


def _fits(matrix: np.ndarray, kinds: list[str], int_bits: int) -> bool:
    """Whether every typed integer column of ``matrix`` is within its declared range."""
    for j, kind in enumerate(kinds):
        if kind in ("number", "unsigned") and len(matrix):
            lo, hi = int_range(kind, int_bits)
            if int(matrix[:, j].min()) < lo or int(matrix[:, j].max()) > hi:
                return False
    return True


#: Bytes read at a time from a fact file that is no regular file (its size is unknown).
READ_STEP = 16 << 20


def _read_bytes(path: Path) -> bytes:
    """The whole of the fact file ``path``. One that is no regular file (a device, a
    pipe) is read ``READ_STEP`` bytes at a time, each step checked against this thread's
    memory budget (:func:`merklog.engine.interrupt.check_reading`)."""
    import os
    import stat

    from .interrupt import check_reading

    with open(path, "rb") as f:
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return f.read()
        parts = []
        while chunk := f.read(READ_STEP):
            parts.append(chunk)
            check_reading(str(path))
        return b"".join(parts)


def read_relation(
    path: Path,
    arity: int | None = None,
    column_types: Sequence[str] | None = None,
    int_bits: int = 64,
    uses: int | None = None,
) -> FactRows:
    """The tuples of one ``<rel>.facts`` file (empty lines skipped).

    ``arity`` (or ``column_types``, one per argument) fixes the number of fields
    a line must have; without either the first line decides (``uses``, the arity the
    program reads the relation with, only says which line to blame). Raises
    :class:`~merklog.engine.errors.FactFileError` (``path``, ``line``, ``col``)
    for a line that does not fit.
    """
    path = Path(path)
    data = _read_bytes(path)
    if column_types is not None:
        arity = len(column_types)
    if arity == 0:
        return [()] if data.removeprefix(BOM).translate(None, b"\r\n") else []
    first = _first_line(data)
    if first is None:
        return []
    width = first[1].count(b"\t") + 1
    if arity is not None and width != arity:
        raise _error(
            path,
            first[0],
            1,
            f"{_fields(width)}, but the program uses {path.stem} with {_arguments(arity)}",
            "every line of a fact file has one field per argument, separated by tabs",
        )
    kinds = list(column_types) if column_types is not None else ["any"] * width
    # A lone CR would end a line for pyarrow but is part of a field for us (and Soufflé).
    columns = None
    if b"\r" not in data or data.count(b"\r") == data.count(b"\r\n"):
        columns = _arrow_columns(data, first[1], kinds)
    if columns is None:
        return _read_rows(path, data, width, column_types, int_bits, uses)
    if isinstance(columns, np.ndarray):
        if "number" not in kinds or _fits(columns, kinds, int_bits):
            return columns
        return _read_rows(path, data, width, column_types, int_bits)  # say which field
    cols: list[np.ndarray | list] = []
    for col, kind in zip(columns, kinds, strict=True):
        got = col if isinstance(col, np.ndarray) else _column(col, kind, int_bits)
        if kind in ("number", "unsigned") and isinstance(got, np.ndarray) and len(got):
            lo, hi = int_range(kind, int_bits)
            if int(got.min()) < lo or int(got.max()) > hi:
                got = None
        if got is None:  # a typed field that does not fit: find it, say where
            return _read_rows(path, data, width, column_types, int_bits)
        cols.append(got)
    if all(isinstance(c, np.ndarray) and c.dtype == np.int64 for c in cols):
        out = np.empty((len(cols[0]), width), dtype=np.int64, order="F")
        for j, c in enumerate(cols):
            out[:, j] = c
        return out
    lists = [c.tolist() if isinstance(c, np.ndarray) else c for c in cols]
    return list(zip(*lists, strict=True))


def row_line(path: Path, row: int) -> int:
    """The 1-based line of the fact file ``path`` that holds its ``row``-th row (0-based;
    empty lines hold none, as :func:`read_relation` reads them): where to point a user
    at a row that a later check refuses."""
    seen = -1
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, 1):
            if number == 1:
                line = line.removeprefix(BOM)
            if line.rstrip(b"\n").removesuffix(b"\r"):
                seen += 1
                if seen == row:
                    return number
    raise ValueError(f"{path} has no row {row}")


def row_text(path: Path, line: int) -> str:
    """The text of line ``line`` (1-based) of the fact file ``path``, without its line end
    or a leading byte order mark: where :func:`row_line` points, to find a field's column."""
    with open(path, "rb") as lines:
        for number, text in enumerate(lines, 1):
            if number == line:
                text = text.removeprefix(BOM) if number == 1 else text
                return text.rstrip(b"\n").removesuffix(b"\r").decode("utf-8")
    raise ValueError(f"{path} has no line {line}")


def read_facts_dir(
    directory: Path,
    relations: Iterable[str] | None = None,
    column_types: Mapping[str, Sequence[str]] | None = None,
    arities: Mapping[str, int] | None = None,
    int_bits: int = 64,
    uses: Mapping[str, int] | None = None,
) -> dict[str, FactRows]:
    """``<rel>.facts`` files of a directory: only ``relations`` when given (missing = empty).
    ``arities`` fix a relation's number of fields; ``uses`` only say which line of a
    file whose lines disagree is wrong (:func:`read_relation`)."""
    directory = Path(directory)
    types = column_types or {}
    sizes = arities or {}
    read_with = uses or {}
    if relations is None:
        names = sorted(p.stem for p in directory.glob("*.facts"))
    else:
        names = list(relations)
    out: dict[str, FactRows] = {}
    for name in names:
        path = directory / f"{name}.facts"
        if fact_file_present(path):
            try:
                out[name] = read_relation(
                    path, sizes.get(name), types.get(name), int_bits, read_with.get(name)
                )
            except OSError as exc:  # a read error (EIO) said no file (QA)
                if exc.filename is None and exc.errno is not None:
                    raise OSError(exc.errno, exc.strerror, str(path)) from None
                raise
        else:
            out[name] = []
    return out


def fact_file_present(path: Path) -> bool:
    """Whether the fact file ``path`` is there to read: a missing one, or a dangling
    symbolic link, is no file (no facts); a link that loops, or any other failure to
    look at it, is raised (OSError naming it): read as no facts, a link pointing at
    itself derived nothing without a word (QA)."""
    import errno
    import os

    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        # A name too long for the file system names no file that could be there (QA: a
        # relation name of 250 characters, which the language allows, stopped eval).
        if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):
            return False
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    return True


# ----------------------------------------------------------------------------- writing


def _int_order(cols: list[np.ndarray]) -> np.ndarray:
    """Row order sorting int64 columns lexicographically (one packed key when it fits)."""
    from .columnar import Ineligible, Packer

    try:
        packer = Packer.for_columns(cols)
    except Ineligible:
        return np.lexsort(cols[::-1])
    return np.argsort(packer.pack(cols), kind="stable")


#: Rows formatted and written per batch (bounds the memory the text needs).
WRITE_BATCH = 1 << 20


def _write_strings(fh: Any, arrays: list[Any]) -> None:
    """Write string columns as tab-separated lines, joined by pyarrow (no quoting)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = arrays[0]
    if len(arrays) > 1:
        lines = pc.binary_join_element_wise(*arrays, _str_scalar("\t"))
    lines = pc.binary_join_element_wise(lines, _str_scalar(""), _str_scalar("\n"))
    chunks = lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        _validity, offsets_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(
            offsets_buf, dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4
        )
        fh.write(memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])])


def _write_ints(fh: Any, cols: list[np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = pa.Table.from_arrays(
        [_from_ints(c) for c in cols], names=[f"c{j}" for j in range(len(cols))]
    )
    pacsv.write_csv(
        table,
        fh,
        write_options=pacsv.WriteOptions(
            include_header=False, delimiter="\t", quoting_style="none", batch_size=1 << 16
        ),
    )


def write_relation(path: Path, relations: Any, rel: str, sort: bool = False) -> int:
    """Write relation ``rel`` of ``relations`` (a :class:`~merklog.engine.batch.Relations`)
    to ``path``, tab-separated, one tuple a line; rows sorted (by
    :func:`~merklog.engine.batch.sort_rows`' order) only when ``sort``. Returns the row count.

    Every path is columnar (ADR 0101): the columnar executor's int64 columns as they
    are, the tuple executor's rows after one dictionary encoding per column; sorting is
    ``np.lexsort`` over :mod:`merklog.engine.outcols`' keys, text is pyarrow's."""
    from .outcols import Column, column_text, dictionary_text, row_order

    path = Path(path)
    encoded = relations.encoded_columns(rel) if rel in relations else None
    # gc paused: splitting a million tuples into columns allocates no cycles, and
    # collections triggered by it re-traverse every live row (twice the writer's CPU)
    with open(path, "wb") as fh, gc_paused():
        if encoded is not None and encoded[0]:
            raw, decoder = encoded
            cols = [Column.encoded(c, decoder) for c in raw]
        else:
            # Engine-form rows: 1, 1.0 and true are distinct members (plain values collapse).
            rows: Any = relations.engine(rel) if rel in relations else ()
            if not rows:
                return 0
            if len(next(iter(rows))) == 0:
                fh.write(b"()\n")  # a nullary relation that holds, written as Soufflé does
                return 1
            cols = [Column.of_values(c) for c in zip(*rows, strict=True)]
        n = len(cols[0].ints)
        ints_only = all(c.mask is None for c in cols)
        if sort:
            order = _int_order([c.ints for c in cols]) if ints_only else row_order(cols)
            cols = [c.take(order) for c in cols]
        tables = [dictionary_text(c, format_field) for c in cols]  # each dictionary's text once
        for start in range(0, n, WRITE_BATCH):
            part = (
                cols
                if n <= WRITE_BATCH
                else [c.take(slice(start, start + WRITE_BATCH)) for c in cols]
            )
            if ints_only:
                _write_ints(fh, [c.ints for c in part])
            else:
                _write_strings(fh, [column_text(c, t) for c, t in zip(part, tables, strict=True)])
        return n


__all__ = [
    "row_line",
    "row_text",
    "FLOAT_TEXT",
    "INT_TEXT",
    "FactRows",
    "FieldError",
    "format_field",
    "parse_field",
    "read_facts_dir",
    "read_relation",
    "write_relation",
]
