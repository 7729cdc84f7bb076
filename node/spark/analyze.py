"""The ``analyze`` Spark job: evaluate a merklog program over merged replicas in DataFrames.

Each relation is a DataFrame with one typed column per argument (``c0``, ``c1``,
…) plus the merklog kind of every column (int, float, str, bytes, bool, link),
so values keep their exact type. A rule is evaluated in the order of the engine's
plan (:mod:`merklog.engine.planner`, with expression arguments as fresh columns
plus equalities), each step becoming DataFrame operations:

- positive atoms: constant and repeated-variable filters, then inner joins on the
  shared variables;
- atoms sharing no variable with the rest of the rule: existence checks, their
  matching rows limited to one and crossed in as a guard (never a cross product);
- ``X == term`` with ``X`` unbound binds a new column; other comparisons filter;
- negation: ``left_anti`` join on the atom's bound variables;
- aggregates: the body's *distinct* bindings, ``groupBy`` the grouping
  variables, then a left join (count/sum over nothing give 0) or inner join (min/max);
- ``C := atom`` (CID selection): a Python UDF computes the fact CID with
  :func:`merklog.store.fact_cid`, which is why the package is shipped to executors.

Strata run in order; a recursive stratum iterates semi-naively (each recursive
atom in turn reads only the previous round's new tuples) and cuts the lineage
every round with ``localCheckpoint`` so plans stay small.

Values keep their identity (docs/language.md, "Value identity"): joins, constants in
atoms and negation match only values of the same type, so ``1``, ``1.0`` and ``true``
never meet. Arithmetic follows the engine: a result outside int64 has no value,
truncating ``/`` and ``%``, division by zero derives nothing. An int compared with a
float, and ``sum`` over floats, are decided by the engine's own functions
(:func:`merklog.engine.arith.compare`, :class:`~merklog.engine.arith.ExactSum`) in
UDFs; ``sum`` over ints is exact in ``decimal(38,0)`` and has no value outside int64.
Not supported (clear error with line:column):
``@next``/``@async`` rules (they belong to the epoch loop, not one batch),
columns holding several value types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merklog.engine import ast, planner
from merklog.engine.errors import EngineError, UnsupportedError
from merklog.store import Link, Value

KINDS = ("int", "float", "str", "bytes", "bool", "link")
NUMERIC = {"int", "float"}
SPARK_TYPE = {
    "int": "bigint",
    "float": "double",
    "str": "string",
    "bytes": "binary",
    "bool": "boolean",
    "link": "string",
}


class AnalyzeError(EngineError):
    """The program or the data cannot be evaluated by the Spark job."""

    code = "analyze_error"
    default_hint = "see docs/spark.md (analyze)"


def kind_of(value: Value) -> str:
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
    raise AnalyzeError(f"{value!r} is not a merklog value")


def _spark_value(value: Value) -> Any:
    return str(value) if isinstance(value, Link) else value


def _py_value(value: Any, kind: str) -> Value:
    if kind == "link":
        return Link.parse(value)
    if kind == "bytes":
        return bytes(value)
    return value


@dataclass
class Relation:
    """A relation's rows (``None`` when known to be empty) and its column kinds."""

    df: Any
    kinds: tuple[str, ...] | None

    @property
    def empty(self) -> bool:
        return self.df is None


# ----------------------------------------------------------------------------- inputs


def relations_from_rows(
    spark: Any, rows: Mapping[str, Iterable[tuple[Value, ...]]]
) -> dict[str, Relation]:
    """Python tuples → typed DataFrames (tests, small inputs, program facts)."""
    out: dict[str, Relation] = {}
    for rel, tuples in rows.items():
        # dedupe by identity (type and value): a Python set would merge 1, 1.0 and True
        tuples = sorted({_identity(t): t for t in tuples}.values(), key=repr)
        if not tuples:
            continue
        out[rel] = _relation_from_tuples(spark, rel, tuples)
    return out


def _identity(row: tuple[Value, ...]) -> tuple[tuple[str, Value], ...]:
    return tuple((kind_of(v), v) for v in row)


def _relation_from_tuples(spark: Any, rel: str, tuples: list[tuple[Value, ...]]) -> Relation:
    arity = len(tuples[0])
    kinds: list[set[str]] = [set() for _ in range(arity)]
    for t in tuples:
        if len(t) != arity:
            raise AnalyzeError(f"relation {rel} holds tuples of arities {arity} and {len(t)}")
        for i, v in enumerate(t):
            kinds[i].add(kind_of(v))
    fixed = tuple(_one_kind(rel, i, k) for i, k in enumerate(kinds))
    schema = ", ".join(f"c{i} {SPARK_TYPE[k]}" for i, k in enumerate(fixed)) or "dummy int"
    data = [tuple(_spark_value(v) for v in t) for t in tuples] if arity else [(0,)]
    df = spark.createDataFrame(data, schema)
    if not arity:
        df = df.select().limit(1)
    return Relation(df, fixed)


def _one_kind(rel: str, i: int, kinds: set[str]) -> str:
    if len(kinds) == 1:
        return next(iter(kinds))
    raise AnalyzeError(
        f"column {i} of relation {rel} holds several value types ({', '.join(sorted(kinds))});"
        " analyze needs one type per column"
    )


def used_relations(program: ast.Program) -> set[str]:
    """The relations a program's rules read (body atoms, negated and aggregated included)."""
    return {atom.rel for r in program.rules for lit in r.body for atom, _p in ast.body_atoms(lit)}


def relations_from_snapshot(
    snapshot: Any, relations: Iterable[str] | None = None
) -> dict[str, Relation]:
    """Visible facts (``relation``, ``args`` list<value>) → one typed DataFrame per relation.

    ``relations``: read only these (the ones a program uses, :func:`used_relations`), so a
    relation the program never reads costs nothing and its column types do not matter."""
    from pyspark.sql import functions as F

    if relations is not None:
        snapshot = snapshot.where(F.col("relation").isin(sorted(set(relations))))
    shapes = (
        snapshot.select(
            "relation",
            F.size("args").alias("n"),
            F.transform("args", lambda v: v["type"]).alias("types"),
        )
        .distinct()
        .collect()
    )
    per_rel: dict[str, list[tuple[int, list[str]]]] = {}
    for row in shapes:
        per_rel.setdefault(row["relation"], []).append((row["n"], list(row["types"])))
    out: dict[str, Relation] = {}
    for rel, variants in sorted(per_rel.items()):
        arities = {n for n, _ in variants}
        if len(arities) != 1:
            raise AnalyzeError(f"relation {rel} holds facts of arities {sorted(arities)}")
        arity = arities.pop()
        kinds = tuple(_one_kind(rel, i, {t[i] for _, t in variants}) for i in range(arity))
        df = snapshot.where(F.col("relation") == rel)
        cols = [F.col("args")[i][kind].alias(f"c{i}") for i, kind in enumerate(kinds)]
        out[rel] = Relation(df.select(*cols).distinct(), kinds)
    return out


# ----------------------------------------------------------------------------- terms


class _Bindings:
    """The DataFrame of a rule body evaluated so far, and the kind of each bound variable."""

    def __init__(self, df: Any, kinds: dict[str, str]) -> None:
        self.df = df
        self.kinds = kinds

    @property
    def bound(self) -> set[str]:
        return set(self.kinds)


def _vname(var: ast.Var) -> str:
    return "v_" + var.name


def _arith_kind(op: str, left: str | None, right: str | None) -> str | None:
    """Result kind of ``left op right`` (None: the operation never has a value)."""
    if left in NUMERIC and right in NUMERIC:
        return "int" if left == right == "int" else "float"
    if op == "+" and left == right and left in ("str", "bytes"):
        return left
    return None


def _term_kind(term: ast.Term, kinds: Mapping[str, str]) -> str | None:
    if isinstance(term, ast.Var):
        return kinds[term.name]
    if isinstance(term, ast.Const):
        return kind_of(term.value)
    if isinstance(term, ast.Neg):
        k = _term_kind(term.operand, kinds)
        return k if k in NUMERIC else None
    return _arith_kind(term.op, _term_kind(term.left, kinds), _term_kind(term.right, kinds))


def _finite(col: Any) -> Any:
    """NoBinding for NaN and infinities; -0.0 normalised to 0.0 (as the engine does)."""
    from pyspark.sql import functions as F

    return F.when(~F.isnan(col) & (F.abs(col) != F.lit(float("inf"))), col + F.lit(0.0))


def _term_col(term: ast.Term, kinds: Mapping[str, str]) -> Any:
    """A Spark column for a term, null where the engine's arithmetic has no binding
    (overflow, division by zero, non-finite floats, mismatched types)."""
    from pyspark.sql import functions as F

    if isinstance(term, ast.Var):
        return F.col(_vname(term))
    if isinstance(term, ast.Const):
        kind = kind_of(term.value)
        return F.lit(_spark_value(term.value)).cast(SPARK_TYPE[kind])
    kind = _term_kind(term, kinds)
    if kind is None:
        return F.lit(None)
    if isinstance(term, ast.Neg):
        inner = _term_col(term.operand, kinds)
        return F.try_subtract(F.lit(0).cast("bigint"), inner) if kind == "int" else _finite(-inner)
    left, right = _term_col(term.left, kinds), _term_col(term.right, kinds)
    op = term.op
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
    ok = (right != 0) & ~((left == F.lit(-(2**63))) & (right == -1))
    if op == "/":  # truncating division, exact through decimal(38, 6)
        dec = "decimal(38,0)"
        return F.when(ok, (left.cast(dec) / right.cast(dec)).cast("bigint"))
    return F.when(ok, left % right)  # Spark's % truncates like the engine's


def _compare_col(lit: ast.Comparison, kinds: Mapping[str, str]) -> Any:
    from pyspark.sql import functions as F

    lk, rk = _term_kind(lit.left, kinds), _term_kind(lit.right, kinds)
    if lk is None or rk is None:
        return F.lit(False)
    left, right = _term_col(lit.left, kinds), _term_col(lit.right, kinds)
    if lk != rk and not (lk in NUMERIC and rk in NUMERIC):
        return F.lit(lit.op == "!=")  # different types: never equal, never ordered
    if lk != rk:  # int vs float: exactly, as the engine does (never through doubles)
        return _engine_compare_udf(lit.op, lk, rk)(left, right)
    if "link" in (lk, rk) and lit.op not in ("==", "!="):
        raise AnalyzeError.at(lit.pos, f"ordering CIDs is not supported by analyze ({lit})")
    ops = {
        "==": left == right,
        "!=": left != right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }
    return ops[lit.op]


def _engine_compare_udf(op: str, left_kind: str, right_kind: str) -> Any:
    """``left op right`` decided by the engine's own comparison
    (:func:`merklog.engine.arith.compare`: an int and a float compare exactly, so
    ``2^53 + 1 > 2.0^53``), not restated over Spark doubles."""
    from pyspark.sql import functions as F

    def cmp(a, b):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.engine.arith import compare
        from merklog.engine.values import Float

        if a is None or b is None:
            return None
        a = Float(a) if left_kind == "float" else a
        b = Float(b) if right_kind == "float" else b
        return compare(op, a, b)

    return F.udf(cmp, "boolean")


def _engine_sum_udf(kind: str) -> Any:
    """``sum`` of a group's values by the engine's one definition
    (:class:`merklog.engine.arith.ExactSum`: exact, rounded once, no value outside int64)."""
    from pyspark.sql import functions as F

    def total(values):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.engine.arith import NoBinding, sum_values
        from merklog.engine.values import Float

        try:
            got = sum_values([Float(v) if kind == "float" else v for v in values])
        except NoBinding:
            return None
        return float(got) if kind == "float" else got

    return F.udf(total, SPARK_TYPE[kind])


# ----------------------------------------------------------------------------- rules


def _ground(term: ast.Term, bound: set[str]) -> bool:
    return all(v.name in bound for v in ast.term_vars(term))


class RuleEvaluator:
    """Evaluates one rule body into bindings, given the relations to read."""

    def __init__(self, spark: Any, cid_udf: Any) -> None:
        self.spark = spark
        self.cid_udf = cid_udf

    def atom_frame(
        self,
        atom: ast.Atom,
        rel: Relation,
        pos: ast.Pos,
        cid: ast.Var | None = None,
        keep_anonymous: bool = False,
    ) -> _Bindings | None:
        """The bindings one atom produces on its own (filters for constants and repeats).
        ``keep_anonymous``: wildcards stay columns (aggregates count distinct *bindings*)."""
        from pyspark.sql import functions as F

        if rel.empty:
            return None
        kinds = rel.kinds or ()
        if len(atom.args) > len(kinds) or (not atom.rest and len(atom.args) != len(kinds)):
            raise AnalyzeError.at(
                pos,
                f"{atom.rel} has arity {len(kinds)} in the data but is used with {len(atom.args)}",
            )
        df = rel.df
        if cid is not None:
            df = df.withColumn("__cid", self._cid_col(atom.rel, kinds))
        conds = []
        select: dict[str, Any] = {}
        var_kinds: dict[str, str] = {}
        for i, term in enumerate(atom.args):
            col = F.col(f"c{i}")
            if isinstance(term, ast.Var):
                if term.anonymous and not keep_anonymous:
                    continue
                if term.name in select:
                    conds.append(select[term.name] == col)
                else:
                    select[term.name] = col
                    var_kinds[term.name] = kinds[i]
            elif isinstance(term, ast.Const):
                if kind_of(term.value) != kinds[i]:
                    return None  # identity: `r(1, _)` never matches r(1.0, _) nor r(true, _)
                conds.append(col == F.lit(_spark_value(term.value)))
            else:
                raise AnalyzeError.at(
                    term.pos, f"arithmetic is not allowed inside a body atom ({term})"
                )
        for cond in conds:
            df = df.where(cond)
        cols = [c.alias(_vname(ast.Var(name))) for name, c in select.items()]
        if cid is not None:
            if cid.name in select:
                df = df.where(F.col("__cid") == select[cid.name])
            else:
                cols.append(F.col("__cid").alias(_vname(cid)))
                var_kinds[cid.name] = "link"
        return _Bindings(df.select(*cols), var_kinds)

    def _cid_col(self, rel: str, kinds: tuple[str, ...]) -> Any:
        from pyspark.sql import functions as F

        cols = [
            F.col(f"c{i}").cast("string") if k == "link" else F.col(f"c{i}")
            for i, k in enumerate(kinds)
        ]
        return self.cid_udf(
            F.lit(rel), F.lit(",".join(kinds)), F.struct(*cols) if cols else F.lit(None)
        )

    def join(self, left: _Bindings | None, right: _Bindings | None) -> _Bindings | None:
        if left is None or right is None:
            return None
        shared = sorted(set(left.kinds) & set(right.kinds))
        if any(left.kinds[n] != right.kinds[n] for n in shared):
            return None  # identity: a shared variable never binds 1 and 1.0 (or true) at once
        on = [_vname(ast.Var(n)) for n in shared]
        df = left.df.join(right.df, on, "inner") if on else left.df.crossJoin(right.df)
        return _Bindings(df, {**right.kinds, **left.kinds})

    def body(
        self,
        plan: planner.Plan,
        lookup: Any,
        seed: _Bindings | None = None,
        keep_anonymous: bool = False,
    ) -> _Bindings | None:
        """Evaluate a body in the order of its plan (:mod:`merklog.engine.planner`, the
        engine's one planner); ``lookup(atom, delta)`` gives the relation an atom reads
        (``delta``: the semi-naive variant's delta atom)."""
        cur = seed
        if cur is None:
            cur = _Bindings(self.spark.range(1).select(), {})
        for step in plan.steps:
            cur = self.literal(cur, step, lookup, keep_anonymous)
            if cur is None:
                return None
        return cur

    def literal(
        self,
        cur: _Bindings,
        step: planner.Step,
        lookup: Any,
        keep_anonymous: bool = False,
    ) -> _Bindings | None:
        from pyspark.sql import functions as F

        lit = step.lit
        if isinstance(step, planner.Exists):
            # A guard: at most one empty row, crossed with the bindings (never a product
            # with the atom's rows).
            frame = self.atom_frame(step.atom, lookup(step.atom, step.delta), lit.pos)
            if frame is None:
                return None
            return _Bindings(cur.df.crossJoin(frame.df.limit(1).select()), cur.kinds)
        if isinstance(step, planner.Scan):
            frame = self.atom_frame(
                step.atom, lookup(step.atom, step.delta), lit.pos, step.lit.cid, keep_anonymous
            )
            return self.join(cur, frame)
        if isinstance(lit, ast.Comparison):
            bound = cur.bound
            if lit.op == "==" and not (_ground(lit.left, bound) and _ground(lit.right, bound)):
                var, other = (
                    (lit.left, lit.right)
                    if isinstance(lit.left, ast.Var) and lit.left.name not in bound
                    else (lit.right, lit.left)
                )
                kind = _term_kind(other, cur.kinds)
                if kind is None:
                    return None
                df = cur.df.withColumn(_vname(var), _term_col(other, cur.kinds)).where(
                    F.col(_vname(var)).isNotNull()
                )
                return _Bindings(df, {**cur.kinds, var.name: kind})
            return _Bindings(
                cur.df.where(F.coalesce(_compare_col(lit, cur.kinds), F.lit(False))), cur.kinds
            )
        if isinstance(lit, ast.Negated):
            neg = self.atom_frame(lit.atom, lookup(lit.atom, False), lit.pos)
            if neg is None:
                return cur
            shared = sorted(set(neg.kinds) & set(cur.kinds))
            if any(cur.kinds[n] != neg.kinds[n] for n in shared):
                return cur  # identity: `!s(X)` with s(1) keeps X = 1.0 and X = true
            on = [_vname(ast.Var(n)) for n in shared]
            if not on:  # ground negation: anything in the relation removes every row
                return None if neg.df.limit(1).count() else cur
            return _Bindings(cur.df.join(neg.df.select(*on).distinct(), on, "left_anti"), cur.kinds)
        if isinstance(step, planner.Aggregate):
            return self.aggregate(cur, step, lookup)
        raise AnalyzeError.at(getattr(lit, "pos", None), f"unsupported literal {lit}")

    def aggregate(self, cur: _Bindings, step: planner.Aggregate, lookup: Any) -> _Bindings | None:
        from pyspark.sql import functions as F

        agg, group = step.lit, list(step.groups)
        if step.inner_free is None:
            raise AnalyzeError.at(
                agg.pos,
                f"the aggregate {agg} only constrains its grouping variables "
                "(a correlated aggregate), which analyze does not evaluate",
                "bind the grouping variables with an atom inside the aggregate",
            )
        inner = self.body(
            step.inner_free, lambda atom, _delta: lookup(atom, False), keep_anonymous=True
        )
        res = _vname(agg.result)
        gcols = [_vname(ast.Var(g)) for g in group]
        if inner is None:
            value_kind = "int" if agg.func == "count" else None
            if agg.func in ("min", "max"):
                return None
            if agg.func == "sum" and agg.arg is not None:
                try:
                    value_kind = _term_kind(agg.arg, cur.kinds)
                except KeyError:
                    value_kind = "int"
            zero = F.lit(0).cast("bigint") if value_kind == "int" else F.lit(0.0)
            return _Bindings(
                cur.df.withColumn(res, zero), {**cur.kinds, agg.result.name: value_kind or "int"}
            )
        names = sorted(inner.kinds)
        distinct = inner.df.select(*[_vname(ast.Var(n)) for n in names]).distinct()
        if agg.func == "count":
            value = F.count(F.lit(1))
            kind = "int"
        else:
            kind = _term_kind(agg.arg, inner.kinds)
            if kind is None or (agg.func == "sum" and kind not in NUMERIC):
                raise AnalyzeError.at(agg.pos, f"{agg.func} over values of type {kind}")
            arg = _term_col(agg.arg, inner.kinds)
            if agg.func != "sum":
                value = {"min": F.min, "max": F.max}[agg.func](arg)
            elif kind == "int":  # exact in decimal; outside int64 the group has no sum
                dec = F.sum(arg.cast("decimal(38,0)"))
                value = F.when(
                    dec.between(F.lit(-(2**63)).cast("decimal(38,0)"), F.lit(2**63 - 1)),
                    dec.cast("bigint"),
                )
            else:  # floats: the engine's exact, order-independent sum
                value = _engine_sum_udf(kind)(F.collect_list(arg))
        aggs = [value.alias(res), F.lit(True).alias(res + "_has")]
        grouped = distinct.groupBy(*gcols).agg(*aggs) if gcols else distinct.agg(*aggs)
        if agg.result.name in cur.kinds:  # result already bound: filter on equality
            grouped = grouped.withColumnRenamed(res, res + "_agg")
            joined = cur.df.join(grouped, gcols, "inner") if gcols else cur.df.crossJoin(grouped)
            return _Bindings(
                joined.where(F.col(res) == F.col(res + "_agg")).drop(res + "_agg", res + "_has"),
                cur.kinds,
            )
        if agg.func in ("count", "sum"):
            joined = cur.df.join(grouped, gcols, "left") if gcols else cur.df.crossJoin(grouped)
            zero = F.lit(0).cast("bigint") if kind == "int" else F.lit(0.0)
            # a group with values but no sum (overflow, non-finite) derives nothing;
            # no group at all sums to 0
            joined = joined.where(F.col(res + "_has").isNull() | F.col(res).isNotNull())
            joined = joined.withColumn(res, F.coalesce(F.col(res), zero))
        else:
            joined = cur.df.join(grouped, gcols, "inner") if gcols else cur.df.crossJoin(grouped)
            joined = joined.where(F.col(res).isNotNull())
        return _Bindings(joined.drop(res + "_has"), {**cur.kinds, agg.result.name: kind})


# ----------------------------------------------------------------------------- program


def _check_supported(program: ast.Program) -> None:
    for rule in program.rules:
        if rule.time != "now":
            raise UnsupportedError.at(
                rule.pos,
                f"@{rule.time} rules are not supported by analyze ({rule.head.rel})",
                "analyze evaluates one batch of deductive rules; @next and @async belong to the node's epoch loop",
                construct=f"@{rule.time}",
            )


def strata_of(program: ast.Program) -> list[list[ast.Rule]]:
    """Run the engine's static checks (line:column errors) and return its deductive strata
    in dependency order (Dialog query-engine spec §1.3.3, :mod:`merklog.engine.stratify`)."""
    from merklog.engine.checks import check_program

    checked = check_program(program)
    if checked.int_bits != 64 and any(
        isinstance(t, ast.BinOp | ast.Neg) for rule in program.rules for t in _rule_terms(rule)
    ):
        raise UnsupportedError.at(
            program.rules[0].pos,
            "analyze implements merklog's int64 arithmetic, not Soufflé's 32-bit numbers",
            "run Soufflé programs with arithmetic on the local engine (merklog eval)",
            construct="souffle-arithmetic",
        )
    return [list(s.rules) for s in checked.strata if not s.temporal]


def _rule_terms(rule: ast.Rule) -> list[ast.Term]:
    terms: list[ast.Term] = list(rule.head.args)

    def walk(lits: tuple[ast.BodyLiteral, ...]) -> None:
        for lit in lits:
            if isinstance(lit, ast.Positive | ast.Negated):
                terms.extend(lit.atom.args)
            elif isinstance(lit, ast.Comparison):
                terms.extend((lit.left, lit.right))
            elif isinstance(lit, ast.Aggregate):
                if lit.arg is not None:
                    terms.append(lit.arg)
                walk(lit.body)

    walk(rule.body)
    return terms


def _cid_udf() -> Any:
    from pyspark.sql import functions as F

    def fact_cid_of(rel, kinds, row):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.store import Fact, Link, fact_cid

        values = []
        for kind, v in zip(kinds.split(",") if kinds else [], row or (), strict=True):
            if kind == "link":
                v = Link.parse(v)
            elif kind == "bytes":
                v = bytes(v)
            values.append(v)
        return str(fact_cid(Fact(rel, tuple(values))))

    return F.udf(fact_cid_of, "string")


@dataclass
class AnalyzeResult:
    relations: dict[str, Relation]
    iterations: dict[str, int]

    def rows(self, rel: str) -> set[tuple[Value, ...]]:
        """Collect one relation back to Python merklog values."""
        r = self.relations.get(rel)
        if r is None or r.empty:
            return set()
        kinds = r.kinds or ()
        return {tuple(_py_value(row[i], k) for i, k in enumerate(kinds)) for row in r.df.collect()}


def evaluate(
    spark: Any,
    program: ast.Program,
    base: dict[str, Relation],
    checkpoint: bool = True,
    max_iterations: int = 10_000,
    cut_every: int = 4,
) -> AnalyzeResult:
    """Evaluate every stratum of ``program`` over ``base`` relations.

    ``cut_every``: the accumulated relation of a recursive stratum is
    checkpointed every that many rounds (each round's delta always is)."""
    from pyspark.sql import functions as F

    _check_supported(program)
    rels = dict(base)
    if program.facts:
        extra: dict[str, list[tuple[Value, ...]]] = {}
        for rel, args in program.facts:
            extra.setdefault(rel, []).append(tuple(args))
        for rel, tuples in extra.items():
            add = _relation_from_tuples(spark, rel, tuples)
            rels[rel] = _union(rels.get(rel), add, rel)
    ev = RuleEvaluator(spark, _cid_udf())
    iterations: dict[str, int] = {}
    cut = _cutter(spark, checkpoint)
    # materialise every input relation the rules read once, instead of re-running its
    # lineage (Parquet scan, dedupe, OR-set) in every rule and every round
    used = {atom.rel for r in program.rules for lit in r.body for atom, _p in ast.body_atoms(lit)}
    for rel in used & set(rels):
        rels[rel] = cut(rels[rel])

    def project(rule: ast.Rule, b: _Bindings | None) -> Relation | None:
        if b is None:
            return None
        cols, kinds = [], []
        for i, term in enumerate(rule.head.args):
            kind = _term_kind(term, b.kinds)
            if kind is None:
                return None
            kinds.append(kind)
            cols.append(_term_col(term, b.kinds).alias(f"c{i}"))
        df = b.df.select(*cols)
        for i in range(len(cols)):
            df = df.where(F.col(f"c{i}").isNotNull())
        return Relation(df, tuple(kinds))

    for stratum in strata_of(program):
        solver = _StratumSolver(ev, stratum, rels, project, cut, cut_every)
        rounds = solver.run(max_iterations)
        for h in solver.heads:
            iterations[h] = rounds
        rels.update(solver.full)
    return AnalyzeResult(rels, iterations)


class _StratumSolver:
    """Semi-naive fixpoint of one stratum (a single round when nothing is recursive)."""

    def __init__(
        self,
        ev: RuleEvaluator,
        stratum: list[ast.Rule],
        rels: dict[str, Relation],
        project: Any,
        cut: Any,
        cut_every: int,
    ) -> None:
        self.ev, self.stratum, self.rels = ev, stratum, rels
        self.project, self.cut, self.cut_every = project, cut, max(1, cut_every)
        self.heads = {r.head.rel for r in stratum}
        for r in stratum:
            for lit in r.body:
                for atom, pol in ast.body_atoms(lit):
                    if atom.rel in self.heads and pol != "pos":
                        raise AnalyzeError.at(
                            lit.pos,
                            f"{atom.rel} depends on itself through negation or an aggregate",
                        )
        self.recursive = [
            (
                r,
                [
                    i
                    for i, lit in enumerate(r.body)
                    if isinstance(lit, ast.Positive) and lit.atom.rel in self.heads
                ],
            )
            for r in stratum
        ]
        self.recursive = [(r, ks) for r, ks in self.recursive if ks]
        self.full: dict[str, Relation] = {h: rels.get(h, Relation(None, None)) for h in self.heads}
        self.delta: dict[str, Relation] = {}

    def lookup_full(self, atom: ast.Atom, _delta: bool = False) -> Relation:
        if atom.rel in self.full:
            return self.full[atom.rel]
        return self.rels.get(atom.rel, Relation(None, None))

    def _derive(
        self, rule: ast.Rule, delta: int | None, lookup: Any, into: dict[str, Relation]
    ) -> None:
        plan = planner.plan_rule(rule, delta, expr_keys=False)
        got = self.project(rule, self.ev.body(plan, lookup))
        if got is not None:
            into[rule.head.rel] = _union(into.get(rule.head.rel), got, rule.head.rel)

    def _absorb(self, new: dict[str, Relation], round_no: int) -> None:
        self.delta = {}
        for rel, r in new.items():
            fresh = Relation(_minus(r.df.distinct(), self.full[rel]), r.kinds)
            if self.recursive:
                fresh = self.cut(fresh)
                self.delta[rel] = fresh
            merged = _union(self.full[rel], fresh, rel)
            self.full[rel] = self.cut(merged) if round_no % self.cut_every == 0 else merged

    def run(self, max_iterations: int) -> int:
        new: dict[str, Relation] = {}
        for rule in self.stratum:  # round 0: every rule over the full relations
            self._derive(rule, None, self.lookup_full, new)
        self._absorb(new, 0)
        rounds = 1
        while self.recursive and any(not d.df.isEmpty() for d in self.delta.values()):
            if rounds >= max_iterations:
                raise AnalyzeError(f"no fixpoint after {max_iterations} rounds")
            new = {}
            for rule, positions in self.recursive:
                for k in positions:  # the k-th recursive atom reads last round's delta
                    self._derive(rule, k, self._lookup_variant, new)
            self._absorb(new, rounds)
            rounds += 1
        for rel, r in self.full.items():
            if not r.empty and rounds % self.cut_every != 1:
                self.full[rel] = self.cut(r)
        return rounds

    def _lookup_variant(self, atom: ast.Atom, delta: bool) -> Relation:
        if delta:
            return self.delta.get(atom.rel, Relation(None, None))
        return self.lookup_full(atom)


def _cutter(spark: Any, checkpoint: bool) -> Any:
    connect = type(spark).__module__.startswith("pyspark.sql.connect")

    def cut(rel: Relation) -> Relation:
        if rel.df is None or not checkpoint:
            return rel
        df = rel.df.localCheckpoint(eager=True) if not connect else rel.df.localCheckpoint()
        return Relation(df, rel.kinds)

    return cut


def _union(a: Relation | None, b: Relation, rel: str) -> Relation:
    if a is None or a.empty:
        return b
    if b.empty:
        return a
    if a.kinds != b.kinds:
        raise AnalyzeError(
            f"rules derive {rel} with different column types {a.kinds} and {b.kinds};"
            " analyze needs one type per column"
        )
    return Relation(a.df.unionByName(b.df), a.kinds)


def _minus(df: Any, full: Relation) -> Any:
    if full.empty:
        return df
    return (
        df.join(full.df, [f"c{i}" for i in range(len(full.kinds or ()))], "left_anti")
        if full.kinds
        else df.exceptAll(full.df)
    )


# ----------------------------------------------------------------------------- outputs


def output_relations(program: ast.Program) -> list[str]:
    """Declared outputs, else every relation a rule derives."""
    if program.outputs:
        return list(program.outputs)
    return sorted({r.head.rel for r in program.rules})


def write_outputs(
    result: AnalyzeResult, names: list[str], out_dir: str | Path, fmt: str = "parquet"
) -> dict[str, str]:
    """Write each relation: Parquet keeps exact values (``args`` list<value> like the export);
    CSV writes columns ``c0…`` in Datalog literal syntax. Returns relation → path."""
    from pyspark.sql import functions as F

    out = Path(out_dir)
    written: dict[str, str] = {}
    for name in names:
        rel = result.relations.get(name)
        path = out / name
        if rel is None or rel.empty:
            df = None
        else:
            df = rel.df
        if fmt == "parquet":
            from .compact import VALUE_DDL

            if df is None:
                df = result_spark(result).createDataFrame(
                    [], f"relation string, args array<{VALUE_DDL}>"
                )
            else:
                df = df.select(
                    F.lit(name).alias("relation"),
                    F.array(*[_value_struct(i, k) for i, k in enumerate(rel.kinds or ())]).alias(
                        "args"
                    ),
                )
            df.write.mode("overwrite").parquet(str(path))
        elif fmt == "csv":
            if df is None:
                df = result_spark(result).createDataFrame([], "c0 string")
            else:
                df = df.select(*[_literal_text(i, k) for i, k in enumerate(rel.kinds or ())])
            df.coalesce(1).write.mode("overwrite").option("header", "true").option(
                "quote", "\u0000"
            ).csv(str(path))
        else:
            raise ValueError(f"unknown output format {fmt!r} (parquet or csv)")
        written[name] = str(path)
    return written


def result_spark(result: AnalyzeResult) -> Any:
    for rel in result.relations.values():
        if not rel.empty:
            return rel.df.sparkSession
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _value_struct(i: int, kind: str) -> Any:
    from pyspark.sql import functions as F

    col = F.col(f"c{i}")
    fields = []
    for name in KINDS:
        typ = SPARK_TYPE[name]
        fields.append((col if name == kind else F.lit(None).cast(typ)).alias(name))
    return F.struct(F.lit(kind).alias("type"), *fields)


def _literal_text(i: int, kind: str) -> Any:
    """Datalog literal syntax as Spark expressions (``format_value`` for every kind but float)."""
    from pyspark.sql import functions as F

    col = F.col(f"c{i}")
    if kind == "int":
        text = col.cast("string")
    elif kind == "bool":
        text = F.when(col, F.lit("true")).otherwise(F.lit("false"))
    elif kind == "str":
        esc = F.regexp_replace(
            F.regexp_replace(F.regexp_replace(col, r"\\", r"\\\\"), '"', '\\\\"'), "\n", "\\\\n"
        )
        text = F.concat(F.lit('"'), esc, F.lit('"'))
    elif kind == "bytes":
        text = F.concat(F.lit('x"'), F.lower(F.hex(col)), F.lit('"'))
    elif kind == "link":
        text = F.concat(F.lit('cid"'), col, F.lit('"'))
    else:
        text = _float_udf()(col)
    return text.alias(f"c{i}")


def _float_udf() -> Any:
    from pyspark.sql import functions as F

    def fmt(v):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.store import format_value

        return format_value(v)

    return F.udf(fmt, "string")
