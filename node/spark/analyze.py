"""The ``analyze`` Spark job: evaluate a merklog program over merged replicas in DataFrames.

Each relation is a DataFrame with one column per argument (``c0``, ``c1``, …) plus,
per column, the set of merklog kinds (int, float, str, bytes, bool, link) its values
may have (:mod:`merklog.node.spark.typed`): one kind is a native Spark column, several
kinds are the export's value struct, so values keep their exact type even when one
column mixes ``1``, ``1.0``, ``true``, strings, bytes and CIDs. A rule is evaluated in
the order of the engine's plan (:mod:`merklog.engine.planner`, with expression
arguments as fresh columns plus equalities), each step becoming DataFrame operations:

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
atoms, repeated variables and negation match only values of the same type, so ``1``,
``1.0`` and ``true`` never meet. Arithmetic follows the engine: a result outside int64
has no value, truncating ``/`` and ``%``, division by zero derives nothing. An int
compared with a float, a ``sum`` that is not over ints only, and the choice between
kinds in ``min``/``max`` are decided by the engine's own functions
(:func:`merklog.engine.arith.compare`, :func:`~merklog.engine.arith.sum_values`,
:func:`~merklog.engine.arith.sort_key`) in UDFs; ``sum`` over ints is exact in
``decimal(38,0)`` and has no value outside int64; CIDs order by their bytes.
Not supported (clear error with line:column):
``@next``/``@async`` rules (they belong to the epoch loop, not one batch) and
aggregates that only constrain their grouping variables.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merklog.engine import ast, planner
from merklog.engine.errors import EngineError, UnsupportedError
from merklog.node.errors import NodeError
from merklog.store import Value

from .outfolder import foreign
from .typed import (
    KINDS,
    NUMERIC,
    SPARK_TYPE,
    VALUE_DDL,
    Kinds,
    TCol,
    arith,
    compare,
    engine_sum_udf,
    identity_eq,
    literal,
    literal_text,
    min_max,
    negate,
    py_value,
    spark_value,
    value_row,
)
from .typed import kind_of as _kind_of

__all__ = [
    "KINDS",
    "NUMERIC",
    "AnalyzeError",
    "AnalyzeResult",
    "Relation",
    "evaluate",
    "kind_of",
    "output_relations",
    "relations_from_rows",
    "relations_from_snapshot",
    "OutputFolderTaken",
    "check_out_folders",
    "static_check",
    "strata_of",
    "used_relations",
    "write_outputs",
]


class AnalyzeError(EngineError):
    """The program or the data cannot be evaluated by the Spark job."""

    code = "analyze_error"
    default_hint = "see docs/spark.md (analyze)"


def kind_of(value: Value) -> str:
    """The merklog kind of a plain value (int, float, str, bytes, bool, link)."""
    try:
        return _kind_of(value)
    except TypeError:
        raise AnalyzeError(f"{value!r} is not a merklog value") from None


@dataclass
class Relation:
    """A relation's rows (``None`` when known to be empty) and, per column, the kinds
    its values may have (one kind: a native column; several: the value struct)."""

    df: Any
    kinds: tuple[Kinds, ...] | None

    @property
    def empty(self) -> bool:
        return self.df is None

    def column(self, i: int) -> TCol:
        from pyspark.sql import functions as F

        return TCol(F.col(f"c{i}"), (self.kinds or ())[i])


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
    fixed = tuple(frozenset(k) for k in kinds)
    schema = ", ".join(f"c{i} {_ddl(k)}" for i, k in enumerate(fixed)) or "dummy int"
    data = (
        [tuple(_cell(v, k) for v, k in zip(t, fixed, strict=True)) for t in tuples]
        if arity
        else [(0,)]
    )
    df = spark.createDataFrame(data, schema)
    if not arity:
        df = df.select().limit(1)
    return Relation(df, fixed)


def _ddl(kinds: Kinds) -> str:
    return SPARK_TYPE[next(iter(kinds))] if len(kinds) == 1 else VALUE_DDL


def _cell(value: Value, kinds: Kinds) -> Any:
    return spark_value(value) if len(kinds) == 1 else value_row(value)


def used_relations(program: ast.Program) -> dict[str, int | None]:
    """The relations a program's rules read (body atoms, negated and aggregated included),
    each with the arity the rules read it with (None: only through rest patterns
    ``r(X, ...)``). Facts of another arity are never matched (docs/language.md, "Relation
    identity"), so :func:`relations_from_snapshot` leaves them out."""
    read = ast.read_arities(program.rules)
    names = {atom.rel for r in program.rules for lit in r.body for atom, _p in ast.body_atoms(lit)}
    return {rel: (None if read[rel][1] else read[rel][0]) for rel in sorted(names)}


def relations_from_snapshot(
    snapshot: Any,
    relations: Iterable[str] | Mapping[str, int | None] | None = None,
    program: ast.Program | None = None,
) -> dict[str, Relation]:
    """Visible facts (``relation``, ``args`` list<value>) → one typed DataFrame per relation.

    ``relations``: read only these (the ones a program uses, :func:`used_relations`), so a
    relation the program never reads costs nothing; given as a mapping to arities, facts of
    other arities are left out, as the engine sets them aside. A column holding one value
    type becomes a native column; a column holding several keeps the export's value struct.
    ``program``, if given, places errors at its atoms (``LINE:COL``)."""
    from pyspark.sql import functions as F

    if relations is not None:
        snapshot = snapshot.where(F.col("relation").isin(sorted(set(relations))))
        if isinstance(relations, Mapping):
            fixed = {rel: n for rel, n in relations.items() if n is not None}
            if fixed:
                other = ~F.col("relation").isin(sorted(fixed))
                for rel, n in sorted(fixed.items()):
                    other = other | ((F.col("relation") == rel) & (F.size("args") == n))
                snapshot = snapshot.where(other)
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
            at = (
                next(  # the rest pattern that reads it: the program's place to change
                    (
                        atom.pos
                        for rule in program.rules
                        for lit in rule.body
                        for atom, _p in ast.body_atoms(lit)
                        if atom.rel == rel and atom.rest
                    ),
                    None,
                )
                if program is not None
                else None
            )
            raise AnalyzeError.at(
                at,
                f"{rel}(...) reads relation {rel}, which holds facts of arities"
                f" {sorted(arities)}: a rest pattern matches one arity",
                f"give the atom its arguments (e.g. {rel}(X, Y)) to read one arity",
            )
        arity = arities.pop()
        kinds = tuple(frozenset(t[i] for _, t in variants) for i in range(arity))
        unknown = set().union(*kinds) - set(KINDS) if kinds else set()
        if unknown:
            raise AnalyzeError(f"relation {rel} holds values of unknown type {sorted(unknown)}")
        df = snapshot.where(F.col("relation") == rel)
        cols = [
            (F.col("args")[i][next(iter(k))] if len(k) == 1 else F.col("args")[i]).alias(f"c{i}")
            for i, k in enumerate(kinds)
        ]
        if not cols:
            out[rel] = Relation(df.select().limit(1), kinds)
            continue
        out[rel] = Relation(df.select(*cols).distinct(), kinds)
    return out


# ----------------------------------------------------------------------------- terms


class _Bindings:
    """The DataFrame of a rule body evaluated so far, and the kinds of each bound variable."""

    def __init__(self, df: Any, kinds: dict[str, Kinds]) -> None:
        self.df = df
        self.kinds = kinds

    @property
    def bound(self) -> set[str]:
        return set(self.kinds)

    def var(self, name: str) -> TCol:
        from pyspark.sql import functions as F

        return TCol(F.col(_vname(ast.Var(name))), self.kinds[name])


def _vname(var: ast.Var) -> str:
    return "v_" + var.name


def _term(term: ast.Term, kinds: Mapping[str, Kinds]) -> TCol | None:
    """A term as a typed column (None: it never has a value, e.g. ``"a" * 2``); null on
    rows where the engine's arithmetic has no binding (overflow, division by zero,
    non-finite floats, operands of types the operator does not take)."""
    from pyspark.sql import functions as F

    if isinstance(term, ast.Var):
        return TCol(F.col(_vname(term)), kinds[term.name])
    if isinstance(term, ast.Const):
        return literal(term.value)
    if isinstance(term, ast.Neg):
        inner = _term(term.operand, kinds)
        return None if inner is None else negate(inner)
    left, right = _term(term.left, kinds), _term(term.right, kinds)
    if left is None or right is None:
        return None
    return arith(term.op, left, right)


def _compare_col(lit: ast.Comparison, kinds: Mapping[str, Kinds]) -> Any:
    from pyspark.sql import functions as F

    left, right = _term(lit.left, kinds), _term(lit.right, kinds)
    if left is None or right is None:
        return F.lit(False)
    return compare(lit.op, left, right)


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
            df = df.withColumn("__cid", self._cid_col(atom.rel, rel))
        conds = []
        select: dict[str, TCol] = {}
        for i, term in enumerate(atom.args):
            col = rel.column(i)
            if isinstance(term, ast.Var):
                if term.anonymous and not keep_anonymous:
                    continue
                if term.name in select:  # a repeated variable: one value, by identity
                    prev = select[term.name]
                    common = prev.kinds & col.kinds
                    if not common:
                        return None  # `r(X, X)` never matches r(1, 1.0)
                    conds.append(identity_eq(prev, col))
                    select[term.name] = TCol(prev.to(common), common)
                else:
                    select[term.name] = col
            elif isinstance(term, ast.Const):
                const = literal(term.value)
                if not const.kinds & col.kinds:
                    return None  # identity: `r(1, _)` never matches r(1.0, _) nor r(true, _)
                conds.append(identity_eq(col, const))
            else:
                raise AnalyzeError.at(
                    term.pos, f"arithmetic is not allowed inside a body atom ({term})"
                )
        for cond in conds:
            df = df.where(cond)
        cols = [t.col.alias(_vname(ast.Var(name))) for name, t in select.items()]
        var_kinds = {name: t.kinds for name, t in select.items()}
        if cid is not None:
            link = frozenset({"link"})
            if cid.name in select:
                df = df.where(identity_eq(select[cid.name], TCol(F.col("__cid"), link)))
            else:
                cols.append(F.col("__cid").alias(_vname(cid)))
                var_kinds[cid.name] = link
        return _Bindings(df.select(*cols), var_kinds)

    def _cid_col(self, rel: str, relation: Relation) -> Any:
        """The fact CID of each row (the store's :func:`merklog.store.fact_cid`, in a UDF)."""
        from pyspark.sql import functions as F

        n = len(relation.kinds or ())
        structs = [relation.column(i).struct() for i in range(n)]
        return self.cid_udf(F.lit(rel), F.array(*structs) if structs else F.array())

    def join(self, left: _Bindings | None, right: _Bindings | None) -> _Bindings | None:
        """Inner join on the shared variables, by identity: a variable never binds ``1``
        on one side and ``1.0`` (or ``true``) on the other."""
        if left is None or right is None:
            return None
        shared = sorted(set(left.kinds) & set(right.kinds))
        kinds = {**right.kinds, **left.kinds}
        ldf, rdf = left.df, right.df
        for n in shared:
            common = left.kinds[n] & right.kinds[n]
            if not common:
                return None
            kinds[n] = common
            col = _vname(ast.Var(n))
            if left.kinds[n] != common:
                ldf = ldf.withColumn(col, left.var(n).to(common))
            if right.kinds[n] != common:
                rdf = rdf.withColumn(col, right.var(n).to(common))
        on = [_vname(ast.Var(n)) for n in shared]
        df = ldf.join(rdf, on, "inner") if on else ldf.crossJoin(rdf)
        return _Bindings(df, kinds)

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
                value = _term(other, cur.kinds)
                if value is None:
                    return None
                df = cur.df.withColumn(_vname(var), value.col).where(F.col(_vname(var)).isNotNull())
                return _Bindings(df, {**cur.kinds, var.name: value.kinds})
            return _Bindings(
                cur.df.where(F.coalesce(_compare_col(lit, cur.kinds), F.lit(False))), cur.kinds
            )
        if isinstance(lit, ast.Negated):
            return self.negation(cur, lit, lookup)
        if isinstance(step, planner.Aggregate):
            return self.aggregate(cur, step, lookup)
        raise AnalyzeError.at(getattr(lit, "pos", None), f"unsupported literal {lit}")

    def negation(self, cur: _Bindings, lit: ast.Negated, lookup: Any) -> _Bindings | None:
        """``!atom``: a ``left_anti`` join on the atom's variables, by identity (``!s(X)``
        with ``s(1)`` keeps ``X = 1.0`` and ``X = true``)."""
        neg = self.atom_frame(lit.atom, lookup(lit.atom, False), lit.pos)
        if neg is None:
            return cur
        shared = sorted(set(neg.kinds) & set(cur.kinds))
        if any(not cur.kinds[n] & neg.kinds[n] for n in shared):
            return cur  # no value of the atom can equal the bound one: nothing is removed
        on = [_vname(ast.Var(n)) for n in shared]
        if not on:  # ground negation: anything in the relation removes every row
            return None if neg.df.limit(1).count() else cur
        # the atom's columns in the bindings' representation (other kinds: null, no match)
        right = neg.df.select(
            *[neg.var(n).to(cur.kinds[n]).alias(_vname(ast.Var(n))) for n in shared]
        )
        return _Bindings(cur.df.join(right.distinct(), on, "left_anti"), cur.kinds)

    def aggregate(self, cur: _Bindings, step: planner.Aggregate, lookup: Any) -> _Bindings | None:
        """``R := f arg : body``, as the engine: over the body's distinct bindings; a value
        whose arithmetic has no binding is skipped; ``count``/``sum`` over nothing give the
        int 0; ``min``/``max`` over nothing, and a ``sum`` without a value (overflow, a
        non-number), derive nothing."""
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
        int_kind = frozenset({"int"})
        zero = F.lit(0).cast("bigint")
        if inner is None:  # no bindings at all: count/sum give 0 for every group
            if agg.func in ("min", "max"):
                return None
            if agg.result.name in cur.kinds:  # result already bound: keep the rows where it is 0
                keep = identity_eq(cur.var(agg.result.name), TCol(zero, int_kind))
                return _Bindings(cur.df.where(F.coalesce(keep, F.lit(False))), cur.kinds)
            return _Bindings(cur.df.withColumn(res, zero), {**cur.kinds, agg.result.name: int_kind})
        names = sorted(inner.kinds)
        distinct = inner.df.select(*[_vname(ast.Var(n)) for n in names]).distinct()
        if agg.func == "count":
            value, kinds = F.count(F.lit(1)), int_kind
        else:
            arg = _term(agg.arg, inner.kinds)
            if arg is None:  # no binding has a value: sum over nothing, no min/max
                if agg.func != "sum":
                    return None
                value, kinds = zero, int_kind
            elif agg.func != "sum":
                value, kinds = min_max(agg.func, arg), arg.kinds
            elif arg.kinds == int_kind:  # exact in decimal; outside int64 the group has no sum
                dec = F.sum(arg.col.cast("decimal(38,0)"))
                value = F.when(F.count(arg.col) == 0, zero).when(
                    dec.between(F.lit(-(2**63)).cast("decimal(38,0)"), F.lit(2**63 - 1)),
                    dec.cast("bigint"),
                )
                kinds = int_kind
            else:  # floats or non-numbers: the engine's exact, order-independent sum
                kinds = int_kind | (arg.kinds & {"float"})
                total = TCol(engine_sum_udf()(F.collect_list(arg.struct())), frozenset(KINDS))
                value = total.to(kinds)
        aggs = [value.alias(res), F.lit(True).alias(res + "_has")]
        # the grouping variables in the bindings' representation (other kinds never join)
        gsel = [inner.var(g).to(cur.kinds[g]).alias(_vname(ast.Var(g))) for g in group]
        gcols = [_vname(ast.Var(g)) for g in group]
        if gcols:
            grouped = distinct.groupBy(*gsel).agg(*aggs)
            for c in gcols:
                grouped = grouped.where(F.col(c).isNotNull())
        else:
            grouped = distinct.agg(*aggs)
        result = TCol(F.col(res), kinds)
        if agg.result.name in cur.kinds:  # result already bound: filter on identity
            grouped = grouped.withColumnRenamed(res, res + "_agg").withColumnRenamed(
                res + "_has", res + "_agg_has"
            )
            counted = agg.func in ("count", "sum")  # a group with no rows gives 0
            how = "left" if counted else "inner"
            joined = cur.df.join(grouped, gcols, how) if gcols else cur.df.crossJoin(grouped)
            got_col = F.col(res + "_agg")
            if counted:
                joined = joined.where(F.col(res + "_agg_has").isNull() | got_col.isNotNull())
                got_col = F.coalesce(got_col, TCol(zero, int_kind).to(kinds))
            keep = identity_eq(cur.var(agg.result.name), TCol(got_col, kinds))
            return _Bindings(
                joined.where(F.coalesce(keep, F.lit(False))).drop(res + "_agg", res + "_agg_has"),
                cur.kinds,
            )
        if agg.func in ("count", "sum"):
            joined = cur.df.join(grouped, gcols, "left") if gcols else cur.df.crossJoin(grouped)
            # a group with values but no sum (overflow, non-number) derives nothing;
            # no group at all sums to 0
            joined = joined.where(F.col(res + "_has").isNull() | F.col(res).isNotNull())
            joined = joined.withColumn(res, F.coalesce(F.col(res), TCol(zero, int_kind).to(kinds)))
        else:
            joined = cur.df.join(grouped, gcols, "inner") if gcols else cur.df.crossJoin(grouped)
            joined = joined.where(result.col.isNotNull())
        return _Bindings(joined.drop(res + "_has"), {**cur.kinds, agg.result.name: kinds})


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


def static_check(program: ast.Program) -> None:
    """Every check of ``program`` alone that :func:`evaluate` makes (``@next`` rules, the
    engine's static checks, Soufflé arithmetic): no Spark needed, so the CLI makes them
    before the JVM starts."""
    _check_supported(program)
    strata_of(program)


def strata_of(program: ast.Program) -> list[list[ast.Rule]]:
    """Run the engine's static checks (line:column errors) and return its deductive strata
    in dependency order (Dialog query-engine spec §1.3.3, :mod:`merklog.engine.stratify`)."""
    from merklog.engine.checks import check_program

    checked = check_program(program)
    if checked.int_bits != 64:  # Soufflé's numbers wrap at 32 bits: sums and arithmetic
        for rule in program.rules:
            if any(isinstance(t, ast.BinOp | ast.Neg) for t in _rule_terms(rule)) or any(
                isinstance(lit, ast.Aggregate) and lit.func == "sum" for lit in _literals(rule)
            ):
                raise UnsupportedError.at(
                    rule.pos,
                    "analyze implements merklog's int64 arithmetic and sums, not Soufflé's"
                    " 32-bit numbers",
                    "run Soufflé programs with arithmetic or sum on the local engine"
                    " (merklog eval)",
                    construct="souffle-arithmetic",
                )
    return [list(s.rules) for s in checked.strata if not s.temporal]


def _literals(rule: ast.Rule) -> list[ast.BodyLiteral]:
    """Every body literal of ``rule``, those inside aggregates too."""
    out: list[ast.BodyLiteral] = []

    def walk(lits: tuple[ast.BodyLiteral, ...]) -> None:
        for lit in lits:
            out.append(lit)
            if isinstance(lit, ast.Aggregate):
                walk(lit.body)

    walk(rule.body)
    return out


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

    def fact_cid_of(rel, args):  # no annotations: pyspark would read them as a pandas UDF
        from merklog.node.spark.schema import decode_args
        from merklog.store import Fact, fact_cid

        return str(fact_cid(Fact(rel, decode_args(args or ()))))

    return F.udf(fact_cid_of, "string")


def _row_values(row: Any, kinds: tuple[Kinds, ...]) -> tuple[Value, ...]:
    from .schema import decode_value

    return tuple(
        py_value(row[i], next(iter(k))) if len(k) == 1 else decode_value(row[i])
        for i, k in enumerate(kinds)
    )


@dataclass
class AnalyzeResult:
    relations: dict[str, Relation]
    iterations: dict[str, int]

    def rows(self, rel: str) -> Any:
        """Collect one relation back to Python merklog values, as a
        :class:`merklog.engine.rows.RowSet` (a set that keeps ``1``, ``1.0`` and ``true``
        apart; iterating gives plain tuples)."""
        from merklog.engine.rows import RowSet, engine_rows

        r = self.relations.get(rel)
        if r is None or r.empty:
            return RowSet(engine_rows([]))
        kinds = r.kinds or ()
        return RowSet(engine_rows([_row_values(row, kinds) for row in r.df.collect()]))


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
            value = _term(term, b.kinds)
            if value is None:
                return None
            kinds.append(value.kinds)
            cols.append(value.col.alias(f"c{i}"))
        df = b.df.select(*cols)
        for i in range(len(cols)):
            df = df.where(F.col(f"c{i}").isNotNull())
        return Relation(df, tuple(kinds))

    strata = strata_of(program)
    for i, stratum in enumerate(strata):
        later = {
            atom.rel
            for s in strata[i + 1 :]
            for r in s
            for lit in r.body
            for atom, _p in ast.body_atoms(lit)
        }
        solver = _StratumSolver(ev, stratum, rels, project, cut, cut_every, later)
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
        read_later: set[str] | None = None,
    ) -> None:
        self.ev, self.stratum, self.rels = ev, stratum, rels
        self.project, self.cut, self.cut_every = project, cut, max(1, cut_every)
        self.heads = {r.head.rel for r in stratum}
        #: Heads no later stratum reads (``read_later``: the relations later rules read;
        #: None: every head may be read). A non-recursive stratum leaves them lazy: a
        #: checkpoint would be one more Spark job computing what the output's write (its
        #: one reader) computes anyway (~0.5 s a relation on a small input).
        self.leaves = self.heads - read_later if read_later is not None else set()
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
            full = self.full[rel]
            if not full.empty and full.kinds != r.kinds:  # a column gained a kind
                kinds = _common_kinds(full, r)
                full = self.full[rel] = Relation(_represent(full, kinds), kinds)
                r = Relation(_represent(r, kinds), kinds)
            fresh = Relation(_minus(r.df.distinct(), full), r.kinds)
            if self.recursive:
                fresh = self.cut(fresh)
                self.delta[rel] = fresh
            merged = _union(self.full[rel], fresh, rel)
            lazy = not self.recursive and rel in self.leaves
            cut = round_no % self.cut_every == 0 and not lazy
            self.full[rel] = self.cut(merged) if cut else merged

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
    """Both relations' rows; a column whose kinds differ between them becomes the union
    of both (the value struct when that is several kinds)."""
    if a is None or a.empty:
        return b
    if b.empty:
        return a
    if a.kinds == b.kinds:
        return Relation(a.df.unionByName(b.df), a.kinds)
    kinds = _common_kinds(a, b)
    return Relation(_represent(a, kinds).unionByName(_represent(b, kinds)), kinds)


def _common_kinds(a: Relation, b: Relation) -> tuple[Kinds, ...]:
    return tuple(x | y for x, y in zip(a.kinds or (), b.kinds or (), strict=True))


def _represent(r: Relation, kinds: tuple[Kinds, ...]) -> Any:
    """``r``'s rows with each column in the representation of ``kinds`` (a superset)."""
    if r.kinds == kinds:
        return r.df
    return r.df.select(*[r.column(i).to(k).alias(f"c{i}") for i, k in enumerate(kinds)])


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


def output_arities(program: ast.Program) -> dict[str, int]:
    """Each relation's arity as the program writes it (rule heads, then declarations):
    the CSV header of a relation nothing derived."""
    arities = {r.head.rel: len(r.head.args) for r in program.rules}
    arities.update({d.rel: len(d.columns) for d in program.declarations})
    return arities


class OutputFolderTaken(NodeError):
    """``--out`` holds a file or folder named like an output relation that no analyze
    wrote: replacing it would delete what is in it."""


#: What Spark's writers (and :func:`_write_csv`) leave in a relation's folder.
_OUTPUT_FILES = ("_SUCCESS", "._SUCCESS.crc", "part-*", ".part-*.crc")


def _earlier_output(path: Path) -> bool:
    """Whether the folder ``path`` is an earlier analyze output (Spark's ``_SUCCESS``
    marker and part files only; or, from a write that never finished, Spark's
    ``_temporary`` folder and part files), or empty: replacing it loses nothing."""
    entries = list(path.iterdir())
    if not entries:
        return True
    names = {e.name for e in entries}
    files = [e for e in entries if e.name != _TEMPORARY]
    spark_files = all(e.is_file() and not e.is_symlink() for e in files) and all(
        any(e.match(g) for g in _OUTPUT_FILES) for e in files
    )
    if _TEMPORARY in names:  # a write that never finished (an interrupted analyze)
        temporary = path / _TEMPORARY
        return temporary.is_dir() and not temporary.is_symlink() and spark_files
    return "_SUCCESS" in names and spark_files


#: The folder Spark's writers stage a write's files in until the write commits.
_TEMPORARY = "_temporary"


def remove_unfinished(out_dir: str | Path, names: Iterable[str]) -> None:
    """Remove the output folders of ``names`` under ``out_dir`` that a write left
    unfinished (Spark's ``_temporary`` still in them, and nothing but Spark's files): what
    an analyze that failed or was interrupted part way leaves, once its JVM has ended."""
    out = Path(out_dir)
    for name in names:
        path = out / name
        if (path / _TEMPORARY).is_dir() and not path.is_symlink() and _earlier_output(path):
            shutil.rmtree(path, ignore_errors=True)


def check_out_folders(out_dir: str | Path, names: Iterable[str]) -> None:
    """Refuse (:class:`OutputFolderTaken`) when ``out_dir/REL`` exists for an output
    relation and is not an earlier analyze output: writing REL replaces its folder."""
    out = Path(out_dir)
    for name in names:
        path = out / name
        what = foreign(path, _earlier_output)
        if what is None:
            continue
        raise OutputFolderTaken(
            f"{path} is a {what} that no analyze wrote, and the output relation {name}"
            " would replace it: give --out a folder of its own (nothing was written)"
        )


def write_outputs(
    result: AnalyzeResult,
    names: list[str],
    out_dir: str | Path,
    fmt: str = "parquet",
    arities: dict[str, int] | None = None,
) -> dict[str, str]:
    """Write each relation: Parquet keeps exact values (``args`` list<value> like the export);
    CSV writes columns ``c0…`` in Datalog literal syntax (an empty relation's header has
    ``arities[name]`` columns). Returns relation → path."""
    from pyspark.sql import functions as F

    out = Path(out_dir)
    local = "://" not in str(out_dir) and not str(out_dir).startswith("file:")
    if local:
        check_out_folders(out, names)
    # Staged, then moved into place once every relation is written: an analyze stopped
    # part way left some relations new and some old, and had deleted an earlier run's
    # folder of a relation it never wrote (QA).
    stage = staging_folder(out) if local else out
    written: dict[str, str] = {}
    for name in names:
        rel = result.relations.get(name)
        path = stage / name
        if rel is None or rel.empty:
            df = None
        else:
            df = rel.df
        if fmt == "parquet":
            if df is None:
                df = result_spark(result).createDataFrame(
                    [], f"relation string, args array<{VALUE_DDL}>"
                )
            else:
                df = df.select(
                    F.lit(name).alias("relation"),
                    F.array(*[rel.column(i).struct() for i in range(len(rel.kinds or ()))]).alias(
                        "args"
                    ),
                )
            df.write.mode("overwrite").parquet(str(path))
        elif fmt == "csv":
            arity = len(rel.kinds or ()) if df is not None else (arities or {}).get(name, 0)
            _write_csv(df, arity, rel, path)
        else:
            raise ValueError(f"unknown output format {fmt!r} (parquet or csv)")
        written[name] = str(path)
    if local and all((stage / name).is_dir() for name in names):
        _move_into_place(stage, out, names)
        written = {name: str(out / name) for name in names}
    return written


def staging_folder(out_dir: str | Path) -> Path:
    """Where this process's analyze writes its relations before they replace those in
    ``out_dir`` (:func:`write_outputs`); removed after, or by the command that failed."""
    return Path(out_dir) / f".merklog-analyze-{os.getpid()}"


def _move_into_place(stage: Path, out: Path, names: list[str]) -> None:
    """Move each staged relation folder to ``out``: an earlier one of its name is moved
    aside into ``stage`` first (renames, so no relation is ever missing from ``out``),
    then ``stage`` and the earlier folders in it are removed."""
    for name in names:
        target = out / name
        if target.exists() or target.is_symlink():
            os.replace(target, stage / f".earlier-{name}")
        os.replace(stage / name, target)
    shutil.rmtree(stage, ignore_errors=True)


def _write_csv(df: Any, arity: int, rel: Any, path: Path) -> None:
    """One ``part-00000.csv`` under ``path``: the header ``c0,…`` and a line per tuple,
    its fields' literals (``format_value``) joined by commas, so ``rel(LINE).`` reads
    back exactly. Spark writes the lines as text (its CSV writer wrapped a field holding
    a comma or a carriage return in its quote character, NUL when quoting is "off");
    the header goes in front here, where the order of the file is certain."""
    import shutil

    from pyspark.sql import functions as F

    header = (",".join(f"c{i}" for i in range(arity)) + "\n").encode()
    if df is None or arity == 0:  # no tuple, or a nullary relation: true is one empty line
        holds = df is not None and bool(df.limit(1).count())
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        (path / "part-00000.csv").write_bytes(header + (b"\n" if holds else b""))
        (path / "_SUCCESS").write_bytes(b"")
        return
    fields = [literal_text(rel.column(i)) for i in range(arity)]
    lines = df.select(F.concat_ws(",", *fields).alias("value"))
    lines.coalesce(1).write.mode("overwrite").text(str(path))
    (part,) = sorted(path.glob("part-*.txt"))
    target = path / "part-00000.csv"
    with open(target, "wb") as out, open(part, "rb") as body:
        out.write(header)
        shutil.copyfileobj(body, out, 1 << 20)
    part.unlink()
    for crc in path.glob(".part-*.crc"):  # the checksum of the file that is gone
        crc.unlink()


def result_spark(result: AnalyzeResult) -> Any:
    for rel in result.relations.values():
        if not rel.empty:
            return rel.df.sparkSession
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()
