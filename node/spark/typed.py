"""Typed value columns of the ``analyze`` job: a Spark column plus the merklog kinds it may hold.

Every column of a relation, and every bound variable, carries the set of value
kinds (int, float, str, bytes, bool, link) its rows may hold, known before any
job runs (from the data's type tags, the constants and the arithmetic). The
representation follows the set:

- one kind: a native Spark column (``bigint``, ``double``, ``string``,
  ``binary``, ``boolean``; a link as its base32 text), compared, joined and
  aggregated by the JVM;
- several kinds: the export's value struct (:data:`merklog.node.spark.schema.VALUE_TYPE`,
  ``type`` tag plus one field per kind, ADR 0045), whose struct equality *is*
  merklog identity: ``1``, ``1.0`` and ``true`` are three different structs.

Where the engine's semantics are not Spark's, the engine decides, through its own
functions called in UDFs (ADR 0049, 0060): an int compared with a float
(:func:`merklog.engine.arith.compare`), a ``sum`` that holds a float or a
non-number (:func:`merklog.engine.arith.sum_values`), and the pick between the
per-kind candidates of ``min``/``max`` on a mixed column
(:func:`merklog.engine.arith.sort_key`). Within one kind Spark's order is the
engine's (numbers numerically, strings by code point, bytes unsigned, ``false <
true``), except for CIDs, which the engine orders by their raw bytes: their
base32 text is translated to an order-preserving alphabet (:func:`link_order_key`)
before it is compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from merklog.store import Link, Value
from merklog.store.values import escaped_code_points

KINDS = ("int", "float", "str", "bytes", "bool", "link")
NUMERIC = frozenset({"int", "float"})
SPARK_TYPE = {
    "int": "bigint",
    "float": "double",
    "str": "string",
    "bytes": "binary",
    "bool": "boolean",
    "link": "string",
}
#: The value struct as Spark DDL (the same fields, in the same order, as the export's).
VALUE_DDL = "struct<`type`:string," + ",".join(f"`{k}`:{SPARK_TYPE[k]}" for k in KINDS) + ">"

Kinds = frozenset[str]

#: RFC 4648 base32 (lower case, as in ``bafy…``) and an alphabet in ascending ASCII
#: order: translating one into the other makes text order the order of the bytes.
_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_B32_ORDERED = "ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"


def kind_of(value: Value) -> str:
    """The merklog kind of a plain value (``bool`` before ``int``: a bool is no number)."""
    kind = type(value)
    if kind is bool:
        return "bool"
    if kind is int:
        return "int"
    if kind is float:
        return "float"
    if kind is str:
        return "str"
    if kind is bytes:
        return "bytes"
    if kind is Link:
        return "link"
    raise TypeError(f"{value!r} is not a merklog value")


def spark_value(value: Value) -> Any:
    """A plain value as Spark holds it in its kind's field (a link as its text)."""
    return str(value) if isinstance(value, Link) else value


def py_value(value: Any, kind: str) -> Value:
    """A collected field of ``kind`` back to a plain merklog value."""
    if kind == "link":
        return Link.parse(value)
    if kind == "bytes":
        return bytes(value)
    if kind == "float":
        return float(value)
    return value


def value_row(value: Value) -> tuple:
    """A plain value as a value-struct row (for ``createDataFrame``)."""
    kind = kind_of(value)
    return (kind, *(spark_value(value) if k == kind else None for k in KINDS))


def link_order_key(col: Any) -> Any:
    """A string column whose order is the order of the CIDs' raw bytes.

    A canonical CID text is ``b`` plus the RFC 4648 base32 of the bytes (no padding):
    5 bits per character, most significant first, the last character zero-padded.
    Mapping the alphabet onto characters in ascending order keeps the order of the bit
    strings, and a CID whose bytes are a prefix of another's sorts first in both."""
    from pyspark.sql import functions as F

    return F.translate(col, _B32, _B32_ORDERED)


def link_from_order_key(col: Any) -> Any:
    """The inverse of :func:`link_order_key`."""
    from pyspark.sql import functions as F

    return F.translate(col, _B32_ORDERED, _B32)


def typed_null(kinds: Iterable[str]) -> Any:
    """A null of the representation of ``kinds``."""
    from pyspark.sql import functions as F

    kinds = frozenset(kinds)
    typ = SPARK_TYPE[next(iter(kinds))] if len(kinds) == 1 else VALUE_DDL
    return F.lit(None).cast(typ)


def lift(col: Any, kind: str) -> Any:
    """A native column of one kind as the value struct (null stays null)."""
    from pyspark.sql import functions as F

    fields = [(col if k == kind else F.lit(None).cast(SPARK_TYPE[k])).alias(k) for k in KINDS]
    return F.when(col.isNotNull(), F.struct(F.lit(kind).alias("type"), *fields))


def literal(value: Value) -> TCol:
    """A constant as a typed column."""
    from pyspark.sql import functions as F

    kind = kind_of(value)
    return TCol(F.lit(spark_value(value)).cast(SPARK_TYPE[kind]), frozenset({kind}))


@dataclass(frozen=True)
class TCol:
    """A Spark column and the kinds its values may have (module docstring)."""

    col: Any
    kinds: Kinds

    @property
    def single(self) -> str | None:
        """The one kind of a native column, else None."""
        return next(iter(self.kinds)) if len(self.kinds) == 1 else None

    def is_kind(self, kind: str) -> Any:
        """A boolean column: does this row's value have ``kind``?"""
        from pyspark.sql import functions as F

        if kind not in self.kinds:
            return F.lit(False)
        if self.single:
            return F.lit(True)
        return self.col["type"] == F.lit(kind)

    def field(self, kind: str) -> Any:
        """The native field of ``kind`` (meaningful only where :meth:`is_kind` holds)."""
        if kind not in self.kinds:
            return typed_null({kind})
        return self.col if self.single else self.col[kind]

    def narrow(self, kind: str) -> Any:
        """The native value where it has ``kind``, null elsewhere."""
        from pyspark.sql import functions as F

        if kind not in self.kinds:
            return typed_null({kind})
        if self.single:
            return self.col
        return F.when(self.is_kind(kind), self.col[kind])

    def struct(self) -> Any:
        """The value-struct form (whatever the representation)."""
        return lift(self.col, self.single) if self.single else self.col

    def to(self, kinds: Kinds) -> Any:
        """This column in the representation of ``kinds``; values of other kinds become null."""
        from pyspark.sql import functions as F

        if not kinds & self.kinds:
            return typed_null(kinds)
        if len(kinds) == 1:
            return self.narrow(next(iter(kinds)))
        if self.single:
            return lift(self.col, self.single)
        if self.kinds <= kinds:
            return self.col
        return F.when(self.col["type"].isin(sorted(kinds)), self.col)


def pairs(a: TCol, b: TCol) -> list[tuple[str, str, Any]]:
    """Every pair of kinds two columns may hold at once, with the row condition for it
    (None when both columns are native: the one pair always holds)."""
    out = []
    for ka in sorted(a.kinds):
        for kb in sorted(b.kinds):
            conds = [t.is_kind(k) for t, k in ((a, ka), (b, kb)) if not t.single]
            cond = None if not conds else conds[0] if len(conds) == 1 else conds[0] & conds[1]
            out.append((ka, kb, cond))
    return out


def by_case(cases: list[tuple[Any, Any]], default: Any) -> Any:
    """``CASE WHEN cond THEN value … ELSE default``; a case whose condition is None
    always holds (it must then be the only one)."""
    from pyspark.sql import functions as F

    if not cases:
        return default
    if len(cases) == 1 and cases[0][0] is None:
        return cases[0][1]
    expr = None
    for cond, value in cases:
        if cond is None:
            raise ValueError("an unconditional case must be the only one")
        expr = F.when(cond, value) if expr is None else expr.when(cond, value)
    return expr.otherwise(default) if default is not None else expr


def identity_eq(a: TCol, b: TCol) -> Any:
    """Identity (type and value): the equality of joins, atom constants, repeated
    variables and negation (docs/language.md, "Value identity")."""
    from pyspark.sql import functions as F

    common = a.kinds & b.kinds
    if not common:
        return F.lit(False)
    if a.single and b.single:
        return a.col == b.col
    if len(common) == 1:
        k = next(iter(common))
        return a.narrow(k) == b.narrow(k)
    return a.to(common) == b.to(common)


# ----------------------------------------------------------------------------- comparisons


def compare(op: str, a: TCol, b: TCol) -> Any:
    """``a op b`` as the engine's :func:`~merklog.engine.arith.compare` decides it, row by
    row: one native comparison per pair of kinds the two sides may hold (null: false)."""
    cases = [
        (cond, _pair_compare(op, ka, kb, a.field(ka), b.field(kb))) for ka, kb, cond in pairs(a, b)
    ]
    return by_case(cases, None)


def _pair_compare(op: str, ka: str, kb: str, left: Any, right: Any) -> Any:
    from pyspark.sql import functions as F

    if ka != kb:
        if ka in NUMERIC and kb in NUMERIC:  # int vs float: exactly, never through doubles
            return engine_compare_udf(op, ka, kb)(left, right)
        return F.lit(op == "!=")  # different types: never equal, never ordered
    if ka == "link" and op not in ("==", "!="):
        left, right = link_order_key(left), link_order_key(right)
    return {
        "==": left == right,
        "!=": left != right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }[op]


def engine_compare_udf(op: str, left_kind: str, right_kind: str) -> Any:
    """``left op right`` decided by the engine's own comparison
    (:func:`merklog.engine.arith.compare`: an int and a float compare exactly, so
    ``2^53 + 1 > 2.0^53``), not restated over Spark doubles."""
    from pyspark.sql import functions as F

    def cmp(a, b):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.engine.arith import compare as engine_compare
        from merklog.engine.values import Float

        if a is None or b is None:
            return None
        a = Float(a) if left_kind == "float" else a
        b = Float(b) if right_kind == "float" else b
        return engine_compare(op, a, b)

    return F.udf(cmp, "boolean")


# ----------------------------------------------------------------------------- arithmetic


def arith_kind(op: str, left: str, right: str) -> str | None:
    """Result kind of ``left op right`` (None: the operation never has a value)."""
    if left in NUMERIC and right in NUMERIC:
        return "int" if left == right == "int" else "float"
    if op == "+" and left == right and left in ("str", "bytes"):
        return left
    return None


def _finite(col: Any) -> Any:
    """NoBinding for NaN and infinities; -0.0 normalised to 0.0 (as the engine does)."""
    from pyspark.sql import functions as F

    return F.when(~F.isnan(col) & (F.abs(col) != F.lit(float("inf"))), col + F.lit(0.0))


def _pair_arith(op: str, kind: str, left: Any, right: Any) -> Any:
    """``left op right`` of native columns whose result has ``kind``; null where the
    engine's arithmetic has no binding (overflow, division by zero, non-finite floats)."""
    from pyspark.sql import functions as F

    if kind in ("str", "bytes"):
        return F.concat(left, right)
    if kind == "float":
        left, right = left.cast("double"), right.cast("double")
        if op in ("/", "%"):
            value = F.when(right != 0, left / right if op == "/" else left % right)
        else:
            value = {"+": left + right, "-": left - right, "*": left * right}[op]
        return _finite(value)
    if op == "+":
        return F.try_add(left, right)
    if op == "-":
        return F.try_subtract(left, right)
    if op == "*":
        return F.try_multiply(left, right)
    if op == "%":  # Spark's % truncates like the engine's; -2^63 % -1 is 0, in range
        return F.when(right != 0, left % right)
    # Truncating division: left - left % right is an exact multiple of right (and never
    # overflows), so the decimal quotient is a whole number and no rounding can move it;
    # dividing the raw operands would round the scale-6 quotient half-up first
    # (9999999 / 10000000 would be 1). Only -2^63 / -1 leaves int64.
    ok = (right != 0) & ~((left == F.lit(-(2**63))) & (right == -1))
    dec = "decimal(38,0)"
    exact = (left - left % right).cast(dec)
    return F.when(ok, (exact / right.cast(dec)).cast("bigint"))


def combine(results: list[tuple[Any, str, Any]]) -> TCol | None:
    """One typed column from per-case results ``(condition, kind, native value)``: native
    when every case gives one kind, else the value struct. Null where no case has a value."""
    kinds = frozenset(k for _c, k, _v in results)
    if not kinds:
        return None
    if len(kinds) == 1:
        return TCol(by_case([(cond, value) for cond, _k, value in results], None), kinds)
    cases = [(cond, lift(value, kind)) for cond, kind, value in results]
    return TCol(by_case(cases, None), kinds)


def arith(op: str, a: TCol, b: TCol) -> TCol | None:
    """``a op b`` per pair of kinds (None: no pair ever has a value)."""
    results = []
    for ka, kb, cond in pairs(a, b):
        kind = arith_kind(op, ka, kb)
        if kind is not None:
            results.append((cond, kind, _pair_arith(op, kind, a.field(ka), b.field(kb))))
    return combine(results)


def negate(a: TCol) -> TCol | None:
    """``-a`` (numbers only; ``-(-2^63)`` has no value)."""
    from pyspark.sql import functions as F

    results = []
    for kind in sorted(a.kinds & NUMERIC):
        col = a.field(kind)
        value = F.try_subtract(F.lit(0).cast("bigint"), col) if kind == "int" else _finite(-col)
        results.append((None if a.single else a.is_kind(kind), kind, value))
    return combine(results)


# ----------------------------------------------------------------------------- aggregates


def engine_sum_udf() -> Any:
    """``sum`` of a group's values (value structs) by the engine's one definition
    (:func:`merklog.engine.arith.sum_values`: exact, rounded once, no value outside
    int64 or when a value is not a number), as a value struct (null: no value)."""
    from pyspark.sql import functions as F

    def total(values):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.engine.arith import NoBinding, sum_values
        from merklog.engine.values import to_engine
        from merklog.node.spark.schema import decode_value, encode_value
        from merklog.node.spark.typed import KINDS

        try:
            got = sum_values([to_engine(decode_value(v)) for v in values])
        except NoBinding:
            return None
        row = encode_value(float(got) if isinstance(got, float) else got)
        return tuple(row[k] for k in ("type", *KINDS))

    return F.udf(total, VALUE_DDL)


def engine_pick_udf(func: str) -> Any:
    """The least (``min``) or greatest (``max``) of a group's per-kind candidates (value
    structs, nulls skipped) in the engine's total order across kinds
    (:func:`merklog.engine.arith.sort_key`: bool < number < str < bytes < CID, an int
    before an equal float)."""
    from pyspark.sql import functions as F

    def pick(candidates):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.engine.arith import sort_key
        from merklog.engine.values import from_engine, to_engine
        from merklog.node.spark.schema import decode_value, encode_value
        from merklog.node.spark.typed import KINDS

        values = [to_engine(decode_value(c)) for c in candidates if c is not None]
        if not values:
            return None
        best = min(values, key=sort_key) if func == "min" else max(values, key=sort_key)
        row = encode_value(from_engine(best))
        return tuple(row[k] for k in ("type", *KINDS))

    return F.udf(pick, VALUE_DDL)


def min_max(func: str, arg: TCol) -> Any:
    """The ``min``/``max`` aggregate expression of ``arg`` (in ``arg``'s representation).

    Within one kind Spark's order is the engine's (CIDs through :func:`link_order_key`);
    across kinds, the engine's :func:`~merklog.engine.arith.sort_key` picks among the
    per-kind candidates (at most six per group)."""
    from pyspark.sql import functions as F

    agg = F.min if func == "min" else F.max

    def native(kind: str, col: Any) -> Any:
        if kind == "link":
            return link_from_order_key(agg(link_order_key(col)))
        return agg(col)

    if arg.single:
        return native(arg.single, arg.col)
    candidates = [lift(native(k, arg.narrow(k)), k) for k in sorted(arg.kinds)]
    return engine_pick_udf(func)(F.array(*candidates))


def literal_text(t: TCol) -> Any:
    """Datalog literal syntax as a Spark string column (``format_value``)."""
    if t.single:
        return _literal_of(t.single, t.col)
    return by_case([(t.is_kind(k), _literal_of(k, t.field(k))) for k in sorted(t.kinds)], None)


def _literal_of(kind: str, col: Any) -> Any:
    from pyspark.sql import functions as F

    if kind == "int":
        return col.cast("string")
    if kind == "bool":
        return F.when(col, F.lit("true")).otherwise(F.lit("false"))
    if kind == "str":
        # The quote and the backslash in SQL; a string holding a control character or a
        # line separator (rare) through format_value itself, which writes \t, \r, \0 or
        # \u{hex} for them: one rendering of a value, and an output line stays one line.
        esc = F.regexp_replace(F.regexp_replace(col, r"\\", r"\\\\"), '"', '\\\\"')
        plain = F.concat(F.lit('"'), esc, F.lit('"'))
        return F.when(col.rlike(_NEEDS_ESCAPE_JAVA), _format_udf()(col)).otherwise(plain)
    if kind == "bytes":
        return F.concat(F.lit('x"'), F.lower(F.hex(col)), F.lit('"'))
    if kind == "link":
        return F.concat(F.lit('cid"'), col, F.lit('"'))
    return _format_udf()(col)


def _java_class(ranges: list[tuple[int, int]]) -> str:
    """A Java regular expression's character class of code point ranges."""
    parts = [f"\\x{{{lo:x}}}" + (f"-\\x{{{hi:x}}}" if hi != lo else "") for lo, hi in ranges]
    return "[" + "".join(parts) + "]"


#: The characters :func:`merklog.store.format_value` escapes in a string besides the
#: quote and the backslash (controls, line separators, format characters), as a Java
#: regular expression built from the same list.
_NEEDS_ESCAPE_JAVA = _java_class(escaped_code_points())


def _format_udf() -> Any:
    from pyspark.sql import functions as F

    def fmt(v):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.store import format_value

        return format_value(v)

    return F.udf(fmt, "string")
