"""The reference batch evaluator: stratified semi-naive fixpoint, tuple at a time.

Each rule is compiled once into a chain of closures over a slot array (one slot
per variable), one closure per step of the rule's plan (:mod:`merklog.engine.planner`,
the one planner every backend uses: existence checks first, the semi-naive delta
atom next, then selections by boundness, filters, negations and aggregates as soon
as their variables are bound).
Every selection looks tuples up in a hash index on its bound argument positions;
indexes are kept up to date as a relation grows, so a fixpoint never rebuilds them.

Large all-integer strata are handed to the set-at-a-time columnar executor in
:mod:`merklog.engine.columnar`; both paths give identical results (tested).

Values: inside the evaluator every value is in engine form
(:mod:`merklog.engine.values`), so joins, constants in atoms, negation, sets and
aggregates keep ``1``, ``1.0`` and ``true`` apart. Rows are converted on the way
in (:func:`as_rel`, constants when a rule is compiled) and back on the way out
(:class:`Relations` hands out :class:`~merklog.engine.rows.RowSet` views,
outboxes and CIDs use plain values). A relation's rows whose length differs from
the arity the rules read it with are never matched (relations are name/arity);
they are set aside on the way in and handed back unchanged in the result.

Relations are ``dict[str, set[tuple]]``; the higher-level API lives in
:mod:`merklog.engine.program`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from merklog.store import Fact, Link, fact_cid
from merklog.store.gcpause import gc_paused

from . import ast, interrupt, planner
from .arith import (
    NoBinding,
    equal_values,
    make_arith,
    make_compare,
    negate,
    sort_key,
    sum_values,
)
from .columnar import column_mask, decode_columns, distinct_columns, try_columnar
from .errors import MAX_FIXPOINT_ITERATIONS, IterationLimitError
from .rows import RowSet, engine_rows
from .values import row_from_engine, row_holds, to_engine

Row = tuple[Any, ...]
RelationSets = dict[str, set[Row]]


# ----------------------------------------------------------------------------- relations


class Rel:
    """A set of tuples with hash indexes on argument positions, maintained incrementally.

    A relation produced by the columnar executor holds int64 column arrays
    (``cols``) and materialises its tuple set only when something asks for it.
    """

    __slots__ = ("_tuples", "cols", "indexes", "distinct", "decoder")

    def __init__(
        self,
        tuples: Iterable[Row] = (),
        cols: list | None = None,
        distinct: bool = True,
        decoder: tuple[int, list] | None = None,
    ) -> None:
        self._tuples: set[Row] | None = None if cols is not None else set(tuples)
        self.cols = cols
        # (base, values): ids <= base in ``cols`` stand for values[base - id].
        self.decoder = decoder
        # False for columns handed in by a caller: rows may repeat until made a set.
        self.distinct = distinct
        self.indexes: dict[tuple[int, ...], dict[Any, list[Row]]] = {}

    @property
    def tuples(self) -> set[Row]:
        if self._tuples is None:
            self._tuples = decode_columns(self.cols or [], self.decoder)
        return self._tuples

    def __len__(self) -> int:
        if self._tuples is None and self.cols:
            return len(self.cols[0])  # an upper bound until make_distinct()
        return len(self.tuples)

    def make_distinct(self) -> None:
        """Drop repeated rows of caller-given columns (a relation is a set)."""
        if not self.distinct and self.cols:
            self.cols = distinct_columns(self.cols)
        self.distinct = True

    def index(self, positions: tuple[int, ...]) -> dict[Any, list[Row]]:
        idx = self.indexes.get(positions)
        if idx is None:
            idx = {}
            _index_into(idx, positions, self.tuples)
            self.indexes[positions] = idx
        return idx

    def add_new(self, new: set[Row]) -> None:
        """Add tuples known not to be present yet, updating every index."""
        self.tuples.update(new)
        self.cols = None
        self.decoder = None
        self.distinct = True
        for positions, idx in self.indexes.items():
            _index_into(idx, positions, new)


def _index_into(idx: dict[Any, list[Row]], positions: tuple[int, ...], rows: Iterable[Row]) -> None:
    if len(positions) == 1:
        p = positions[0]
        for t in rows:
            k = t[p]
            bucket = idx.get(k)
            if bucket is None:
                idx[k] = [t]
            else:
                bucket.append(t)
    else:
        for t in rows:
            k = tuple(t[p] for p in positions)
            bucket = idx.get(k)
            if bucket is None:
                idx[k] = [t]
            else:
                bucket.append(t)


EMPTY = Rel()


def as_rel(rows: Any) -> Rel:
    """A fresh Rel from tuples (plain or engine values: converted to engine form
    before they meet in a set), a :class:`RowSet`, a Rel (arrays shared, never
    mutated) or a 2-D int array. Raises TypeError for a non-merklog value."""
    if isinstance(rows, Rel):
        if rows.cols is not None:
            return Rel(cols=rows.cols, distinct=rows.distinct, decoder=rows.decoder)
        return Rel(rows.tuples)
    if hasattr(rows, "ndim") and getattr(rows, "ndim", 0) == 2 and rows.shape[1] > 0:
        import numpy as np

        if rows.dtype.kind != "i":  # only real ints go to int64 columns: 1.0 stays a float
            return Rel(engine_rows(map(tuple, rows.tolist())))
        arr = np.asarray(rows, dtype=np.int64)
        cols = [np.ascontiguousarray(arr[:, j]) for j in range(arr.shape[1])]
        return Rel(cols=cols, distinct=False)
    return Rel(engine_rows(rows))


# ----------------------------------------------------------------------------- results


class Relations(Mapping[str, RowSet]):
    """Evaluation results: relation name -> :class:`~merklog.engine.rows.RowSet`.

    A RowSet iterates plain merklog values but keeps engine identity (``(1,)``
    and ``(1.0,)`` are two rows); :meth:`engine` gives the engine-form set.
    Relations computed by the columnar executor stay as int64 arrays until a
    tuple set is asked for, so counting or handing columns on costs nothing.
    """

    def __init__(self, rels: Mapping[str, Rel | Iterable[Row]] | None = None) -> None:
        self._rels: dict[str, Rel] = {}
        for name, value in (rels or {}).items():
            self._rels[name] = value if isinstance(value, Rel) else as_rel(value)

    def __getitem__(self, rel: str) -> RowSet:
        return RowSet(self._rels[rel].tuples)

    def engine(self, rel: str) -> set[Row]:
        """The tuples of ``rel`` in engine form (shared: do not mutate)."""
        return self._rels[rel].tuples

    def __iter__(self):
        return iter(self._rels)

    def __contains__(self, rel: object) -> bool:
        return rel in self._rels

    def __len__(self) -> int:
        return len(self._rels)

    def count(self, rel: str) -> int:
        """Number of tuples of ``rel`` (0 when absent), without materialising them."""
        r = self._rels.get(rel)
        if r is None:
            return 0
        r.make_distinct()
        return len(r)

    def matching(self, rel: str, consts: Mapping[int, Any]) -> set[Row]:
        """The engine-form tuples of ``rel`` whose column ``c`` holds ``consts[c]`` (engine
        values, by identity: ``1`` is never ``1.0`` or ``true``). A relation still held
        as int64 columns is filtered by one numpy pass over the constrained columns, so
        a point query (``edge(1, Y)``) over a large relation makes a tuple only for the
        rows it answers; otherwise the tuple set is filtered."""
        r = self._rels.get(rel)
        if r is None:
            return set()
        if r._tuples is not None or r.cols is None:
            return {row for row in r.tuples if row_holds(row, consts)}
        if any(not 0 <= c < len(r.cols) for c in consts):
            return set()
        mask = column_mask(r.cols, consts, r.decoder)
        if mask is None:
            return set()
        return decode_columns([col[mask] for col in r.cols], r.decoder)

    def columns(self, rel: str) -> list | None:
        """``rel`` as int64 numpy columns when the columnar executor produced it from
        integers only, else None."""
        r = self._rels.get(rel)
        if r is None or r.decoder is not None:
            return None
        r.make_distinct()
        return r.cols

    def encoded_columns(self, rel: str) -> tuple[list, tuple[int, list] | None] | None:
        """``rel`` as the columnar executor left it: ``(int64 columns, decoder)``, else None.

        ``decoder`` is None when every value is an int; otherwise ``(base, values)``:
        a column entry ``id <= base`` stands for ``values[base - id]``. Lets writers
        format whole columns without materialising tuples.
        """
        r = self._rels.get(rel)
        if r is None or r.cols is None:
            return None
        r.make_distinct()
        return r.cols, r.decoder

    def sorted(self, rel: str) -> list[Row]:
        """The tuples of ``rel`` as plain values in a deterministic order (empty when absent)."""
        if rel not in self._rels:
            return []
        return [row_from_engine(r) for r in sort_rows(self._rels[rel].tuples)]

    def facts(self) -> Iterable[Fact]:
        """Every tuple as a :class:`~merklog.store.Fact`, relations in name order."""
        for name in sorted(self._rels):
            for row in self.sorted(name):
                yield Fact(name, row)

    def to_dict(self) -> dict[str, RowSet]:
        """``relation -> RowSet`` (copies: later evaluations do not change them)."""
        return {name: RowSet(set(self._rels[name].tuples)) for name in self._rels}

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {self.count(k)} tuples" for k in sorted(self._rels))
        return f"Relations({inner})"


# ----------------------------------------------------------------------------- helpers


class CidCache:
    """CIDs of facts, computed once per (relation, engine tuple) from the plain
    values, so ``C := p(X)`` binds exactly the CID the store gives ``p(X)``."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, Row], Link] = {}

    def get(self, rel: str, row: Row) -> Link:
        key = (rel, row)
        cid = self._cache.get(key)
        if cid is None:
            cid = fact_cid(Fact(rel, row_from_engine(row)))
            self._cache[key] = cid
        return cid


def _vars_of_literals(lits: Iterable[ast.BodyLiteral]) -> set[str]:
    return {v.name for lit in lits for v in ast.literal_vars(lit)}


def _term_names(term: ast.Term) -> set[str]:
    return {v.name for v in ast.term_vars(term)}


def _ground(term: ast.Term, bound: set[str]) -> bool:
    return _term_names(term) <= bound


# ----------------------------------------------------------------------------- compilation

Step = Callable[[list], None]


@dataclass
class Context:
    """What compiled steps read at run time: the current relations and caches."""

    full: dict[str, Rel] = field(default_factory=dict)
    delta: dict[str, Rel] = field(default_factory=dict)
    cids: CidCache = field(default_factory=CidCache)
    agg_cache: dict[Any, dict[Any, Any]] = field(default_factory=dict)
    encoder: Any = None  # the columnar executor's value dictionary, shared by strata


class RuleCompiler:
    """Compiles a rule's body (in a chosen order) into a chain of closures over slots."""

    def __init__(self, ctx: Context, int_bits: int) -> None:
        self.ctx = ctx
        self.int_bits = int_bits
        self.slots: dict[str, int] = {}
        # Inside aggregates, a rest pattern's unmatched arguments act as anonymous
        # variables (so ``count : product(C, ...)`` counts matched tuples): their
        # values go to a hidden slot that is part of the distinct binding.
        self.rest_slots: dict[int, int] = {}
        self.ops = {op: make_arith(op, int_bits) for op in ("+", "-", "*", "/", "%")}

    def slot(self, name: str) -> int:
        s = self.slots.get(name)
        if s is None:
            s = self.slots[name] = len(self.slots)
        return s

    # terms -------------------------------------------------------------
    def term(self, term: ast.Term) -> Callable[[list], Any]:
        """An evaluator for a ground term; raises NoBinding when arithmetic has no result."""
        if isinstance(term, ast.Const):
            value = to_engine(term.value)
            return lambda env: value
        if isinstance(term, ast.Var):
            s = self.slot(term.name)
            return lambda env: env[s]
        if isinstance(term, ast.Neg):
            inner = self.term(term.operand)
            bits = self.int_bits
            return lambda env: negate(inner(env), bits)
        if isinstance(term, ast.BinOp):
            left, right, fn = self.term(term.left), self.term(term.right), self.ops[term.op]
            return lambda env: fn(left(env), right(env))
        raise TypeError(f"unknown term {term!r}")

    # literals ----------------------------------------------------------
    def chain(self, plan: planner.Plan, final: Step) -> Step:
        """The closures of ``plan``'s steps, ending in ``final``."""
        step = final
        for at, ps in reversed(list(enumerate(plan.steps))):
            if at == 0 and len(plan.steps) > 1:
                step = _checking(step)
            b = set(ps.bound)
            if isinstance(ps, planner.Scan):
                step = self.positive(ps.lit, b, step, use_delta=ps.delta)
            elif isinstance(ps, planner.Exists):
                step = self.exists(ps, step)
            elif isinstance(ps, planner.Negate):
                step = self.negated(ps.lit, b, step)
            elif isinstance(ps, planner.Filter | planner.Assign):
                step = self.comparison(ps.lit, b, step)
            else:
                step = self.aggregate(ps, b, step)
        return step

    def _match_plan(self, atom: ast.Atom, bound: set[str]):
        """Split an atom's arguments into index-key parts, bindings and repeat checks."""
        key_pos: list[int] = []
        key_fns: list[Callable[[list], Any]] = []
        binds: list[tuple[int, int]] = []
        checks: list[tuple[int, int]] = []
        seen: dict[str, int] = {}
        for i, arg in enumerate(atom.args):
            if isinstance(arg, ast.Var) and arg.name not in bound:
                if arg.name in seen:
                    checks.append((i, seen[arg.name]))
                else:
                    seen[arg.name] = i
                    binds.append((i, self.slot(arg.name)))
            else:
                key_pos.append(i)
                key_fns.append(self.term(arg))
        return tuple(key_pos), key_fns, binds, checks

    def positive(self, lit: ast.Positive, bound: set[str], nxt: Step, use_delta: bool) -> Step:
        atom = lit.atom
        rel = atom.rel
        ctx = self.ctx
        key_pos, key_fns, binds, checks = self._match_plan(atom, bound)
        exprs = _expression_keys(atom, bound)
        cid_slot = self.slot(lit.cid.name) if lit.cid is not None else None
        cid_bound = lit.cid is not None and lit.cid.name in bound
        cids = ctx.cids
        source = ctx.delta if use_delta else ctx.full
        rest_slot = self.rest_slots.get(id(atom))
        nargs = len(atom.args)
        single = len(key_fns) == 1
        kf0 = key_fns[0] if single else None

        def rows(env: list) -> Iterable[Row]:
            r = source.get(rel, EMPTY)
            if not key_pos:
                return r.tuples
            try:
                key = kf0(env) if single else tuple(f(env) for f in key_fns)
            except NoBinding:
                return ()
            if exprs:  # q(X * 2): its value compares as ==, so 2 finds q(2.0) too
                keys = _equal_keys(key, exprs, single)
                if len(keys) > 1:
                    index = r.index(key_pos)
                    return [t for k in keys for t in index.get(k, ())]
            return r.index(key_pos).get(key, ())

        if not checks and cid_slot is None and rest_slot is None:
            if len(binds) == 1:
                ((p0, s0),) = binds

                def step(env: list) -> None:
                    for t in rows(env):
                        env[s0] = t[p0]
                        nxt(env)

                return step
            if len(binds) == 2:
                (p0, s0), (p1, s1) = binds

                def step(env: list) -> None:
                    for t in rows(env):
                        env[s0] = t[p0]
                        env[s1] = t[p1]
                        nxt(env)

                return step

        # ``C := rel(C, …)``: C is bound by the arguments too and must equal both
        # (never true for real hashes, but the answer must be "no match", not the argument).
        cid_also_arg = cid_slot is not None and any(s == cid_slot for _p, s in binds)

        def step(env: list) -> None:
            for t in rows(env):
                if checks and any(t[a] != t[b] for a, b in checks):
                    continue
                if cid_slot is not None:
                    cid = cids.get(rel, t)
                    if cid_bound:
                        if env[cid_slot] != cid:
                            continue
                    else:
                        env[cid_slot] = cid
                for p, s in binds:
                    env[s] = t[p]
                if cid_also_arg and env[cid_slot] != cid:
                    continue
                if rest_slot is not None:
                    env[rest_slot] = t[nargs:]
                nxt(env)

        return step

    def exists(self, ps: planner.Exists, nxt: Step) -> Step:
        """A guard: continue iff the atom has a matching tuple (looked up, never joined)."""
        atom = ps.atom
        rel = atom.rel
        source = self.ctx.delta if ps.delta else self.ctx.full
        key_pos, key_fns, _binds, checks = self._match_plan(atom, set())
        key = tuple(f([]) for f in key_fns)
        single = len(key_pos) == 1

        def step(env: list) -> None:
            r = source.get(rel, EMPTY)
            if key_pos:
                rows = r.index(key_pos).get(key[0] if single else key, ())
            else:
                rows = r.tuples
            if not checks:
                if rows:
                    nxt(env)
                return
            if any(all(t[a] == t[b] for a, b in checks) for t in rows):
                nxt(env)

        return step

    def negated(self, lit: ast.Negated, bound: set[str], nxt: Step) -> Step:
        atom = lit.atom
        rel = atom.rel
        full = self.ctx.full
        key_pos, key_fns, binds, checks = self._match_plan(atom, bound)
        exact = not atom.rest and not binds
        exprs = _expression_keys(atom, bound)

        def step(env: list) -> None:
            try:
                key = tuple(f(env) for f in key_fns)
            except NoBinding:
                return  # an argument without a value: the binding is dropped, not kept
            r = full.get(rel, EMPTY)
            keys = _equal_keys(key, exprs, False) if exprs else (key,)
            if exact:
                if any(k in r.tuples for k in keys):
                    return
            elif not key_pos:
                if any(not checks or all(t[a] == t[b] for a, b in checks) for t in r.tuples):
                    return
            else:
                idx = r.index(key_pos)
                one = len(key_pos) == 1
                for k in keys:
                    bucket = idx.get(k[0] if one else k, ())
                    if any(not checks or all(t[a] == t[b] for a, b in checks) for t in bucket):
                        return
            nxt(env)

        return step

    def comparison(self, lit: ast.Comparison, bound: set[str], nxt: Step) -> Step:
        lg, rg = _ground(lit.left, bound), _ground(lit.right, bound)
        if lg and rg:
            left, right, cmp = self.term(lit.left), self.term(lit.right), make_compare(lit.op)

            def step(env: list) -> None:
                try:
                    ok = cmp(left(env), right(env))
                except NoBinding:
                    return
                if ok:
                    nxt(env)

            return step
        # ``Var == ground``: bind the variable.
        var, other = (lit.left, lit.right) if rg else (lit.right, lit.left)
        assert isinstance(var, ast.Var)
        s, value = self.slot(var.name), self.term(other)

        def bind(env: list) -> None:
            try:
                env[s] = value(env)
            except NoBinding:
                return
            nxt(env)

        return bind

    def aggregate(self, ps: planner.Aggregate, bound: set[str], nxt: Step) -> Step:
        agg = ps.lit
        groups = list(ps.groups)
        group_slots = [self.slot(g) for g in groups]
        local = sorted(_vars_of_literals(agg.body) - set(groups))
        body_vars = groups + local
        body_slots = [self.slot(v) for v in body_vars]
        for inner_step in ps.inner.steps:
            if isinstance(inner_step, planner.Scan) and inner_step.atom.rest:
                slot = self.slot(f"\0rest{len(self.slots)}")
                self.rest_slots[id(inner_step.atom)] = slot
                body_slots.append(slot)
        collected: list[set[Row]] = []

        def collect(env: list) -> None:
            collected[-1].add(tuple(env[s] for s in body_slots))

        inner = self.chain(ps.inner, collect)
        arg_fn = self.term(agg.arg) if agg.arg is not None else None
        func = agg.func
        bits = self.int_bits
        res_slot = self.slot(agg.result.name)
        res_bound = agg.result.name in bound
        cache_key = object()
        agg_cache = self.ctx.agg_cache
        scratch_slots = body_slots

        def compute(env: list) -> Any:
            collected.append(set())
            saved = [env[s] for s in scratch_slots]
            try:
                inner(env)
            finally:
                rows = collected.pop()
                for s, v in zip(scratch_slots, saved, strict=True):
                    env[s] = v
            if func == "count":
                return len(rows)
            tmp = list(env)
            values = []
            for row in rows:
                for s, v in zip(body_slots, row, strict=True):
                    tmp[s] = v
                try:
                    values.append(arg_fn(tmp))  # type: ignore[misc]
                except NoBinding:
                    continue
            if func == "sum":
                try:
                    return sum_values(values, bits)
                except NoBinding:
                    return _NO_RESULT
            if not values:
                return _NO_RESULT
            return min(values, key=sort_key) if func == "min" else max(values, key=sort_key)

        def step(env: list) -> None:
            cache = agg_cache.setdefault(cache_key, {})
            gkey = tuple(env[s] for s in group_slots)
            result = cache.get(gkey, _MISSING)
            if result is _MISSING:
                result = cache[gkey] = compute(env)
            if result is _NO_RESULT:
                return
            if res_bound:
                if env[res_slot] != result:
                    return
                nxt(env)
            else:
                env[res_slot] = result
                nxt(env)

        return step


_NO_RESULT = object()
_MISSING = object()
#: Bindings of a rule's first step between two interrupt checks (a power of two, less 1).
CHECK_EVERY = 1023


def _checking(nxt: Step) -> Step:
    """``nxt``, calling :func:`.interrupt.check` every :data:`CHECK_EVERY` + 1 bindings:
    what follows a rule's first step is the nested work of a join, and a rule has no
    rounds of its own to check between. QA: a node's query joining two relations of
    15,000 tuples (one 50 s call) kept its node from stopping for as long; the check
    stops it within one binding's inner loop, and applies the memory budget there too."""
    count = 0
    check = interrupt.check

    def step(env: list) -> None:
        nonlocal count
        count += 1
        if not count & CHECK_EVERY:
            check()
        nxt(env)

    return step


# ----------------------------------------------------------------------------- rule plans


def _positive_rels(rule: ast.Rule) -> list[int]:
    return [i for i, lit in enumerate(rule.body) if isinstance(lit, ast.Positive)]


class CompiledRule:
    """One rule compiled for a stratum: a full variant and one delta variant per recursive atom."""

    def __init__(self, rule: ast.Rule, recursive: set[str], ctx: Context, int_bits: int) -> None:
        self.rule = rule
        self.out: set[Row] = set()
        comp = RuleCompiler(ctx, int_bits)
        head_fns = [comp.term(a) for a in rule.head.args]
        out = self.out

        def emit(env: list) -> None:
            try:
                out.add(tuple(f(env) for f in head_fns))
            except _ARITH_ERRORS:
                return

        body = rule.body
        self.full = comp.chain(planner.plan_rule(rule), emit)
        self.deltas: list[Step] = []
        for i in _positive_rels(rule):
            lit = body[i]
            if lit.atom.rel in recursive:  # type: ignore[union-attr]
                self.deltas.append(comp.chain(planner.plan_rule(rule, delta=i), emit))
        self.nslots = len(comp.slots)

    def run(self, variant: Step) -> set[Row]:
        self.out.clear()
        variant([None] * max(self.nslots, 1))
        result = set(self.out)
        self.out.clear()
        return result


_ARITH_ERRORS = (NoBinding,)


# ----------------------------------------------------------------------------- strata


def local_strata(rules: Iterable[ast.Rule]) -> list[list[ast.Rule]]:
    """Dialog query-engine spec §1.3.3 strata of the deductive rules (when the caller supplies none)."""
    from .stratify import stratify

    return [list(s.rules) for s in stratify(tuple(rules)) if not s.temporal]


@dataclass
class StepResult:
    """One epoch's outcome: every relation, the @next tuples, and the @async outbox
    (``(destination, Fact)`` pairs in plain values)."""

    relations: Relations
    next_tuples: dict[str, RowSet]
    outbox: list[tuple[Any, Fact]]


class BatchEvaluator:
    """Evaluates a program's strata over a set of base facts (one epoch)."""

    def __init__(
        self,
        rules: Iterable[ast.Rule],
        strata: list[list[ast.Rule]] | None = None,
        int_bits: int = 64,
        semi_naive: bool = True,
        backend: str = "auto",
    ) -> None:
        rules = tuple(rules)
        self.int_bits = int_bits
        self.semi_naive = semi_naive
        self.backend = backend
        deductive = [r for r in rules if r.time == "now"]
        self.temporal = [r for r in rules if r.time != "now"]
        if strata is None:
            strata = local_strata(deductive)
        self.strata = [[r for r in s if r.time == "now"] for s in strata]
        self.strata = [s for s in self.strata if s]
        self.cids = CidCache()
        self.arities = ast.read_arities(rules)

    # ------------------------------------------------------------------
    def _load(self, base: Mapping[str, Iterable[Row]]) -> tuple[Context, RelationSets]:
        """The context over ``base`` in engine form, and the rows set aside because
        their length is not the arity the rules read the relation with."""
        ctx = Context(cids=self.cids)
        aside: RelationSets = {}
        for rel, rows in base.items():
            r = as_rel(rows)
            want = self.arities.get(rel)
            if want is not None:
                r, other = _split_arity(r, *want)
                if other:
                    aside[rel] = other
            ctx.full[rel] = r
        return ctx, aside

    @staticmethod
    def _result(ctx: Context, aside: RelationSets) -> Relations:
        for rel, rows in aside.items():
            r = ctx.full.get(rel)
            ctx.full[rel] = Rel(rows | r.tuples) if r is not None else Rel(rows)
        return Relations(ctx.full)

    def evaluate(self, base: Mapping[str, Iterable[Row]]) -> Relations:
        """All relations (base and derived) after every deductive stratum reaches its fixpoint.

        ``base`` rows may hold plain or engine values; a TypeError names a value
        that is not a merklog value. The cyclic GC is paused meanwhile: rows holding
        floats stay GC-tracked (``Float`` is a Python subclass), and collections
        re-traversing millions of them cost as much as the evaluation."""
        with gc_paused():
            ctx, aside = self._load(base)
            for stratum in self.strata:
                self._stratum(stratum, ctx)
            return self._result(ctx, aside)

    def step(self, base: Mapping[str, Iterable[Row]]) -> StepResult:
        """One epoch: deductive strata, then the final stratum of @next and @async rules."""
        with gc_paused():
            return self._step(base)

    def _step(self, base: Mapping[str, Iterable[Row]]) -> StepResult:
        ctx, aside = self._load(base)
        for stratum in self.strata:
            self._stratum(stratum, ctx)
        nxt: dict[str, RowSet] = {}
        outbox: list[tuple[Any, Fact]] = []
        for rule in self.temporal:
            derived = CompiledRule(rule, set(), ctx, self.int_bits)
            rows = derived.run(derived.full)
            if rule.time == "next":
                prev = nxt.get(rule.head.rel)
                nxt[rule.head.rel] = RowSet(rows if prev is None else prev.engine | rows)
            else:
                for row in sorted(rows, key=_sort_key):
                    plain = row_from_engine(row)
                    outbox.append((plain[0] if plain else None, Fact(rule.head.rel, plain)))
        return StepResult(self._result(ctx, aside), nxt, outbox)

    # ------------------------------------------------------------------
    def _stratum(self, rules: list[ast.Rule], ctx: Context) -> None:
        heads = {r.head.rel for r in rules}
        for rel in heads:
            ctx.full.setdefault(rel, Rel())
        if self.backend != "tuple":
            done = try_columnar(rules, ctx, self.int_bits, self.semi_naive, self.backend)
            if done is not None:
                for rel, (cols, decoder) in done.items():
                    ctx.full[rel] = Rel(cols=cols, decoder=decoder)
                return
        ctx.agg_cache.clear()
        compiled = [CompiledRule(r, heads, ctx, self.int_bits) for r in rules]
        # Iteration 0: every rule over the full relations.
        delta: dict[str, set[Row]] = {}
        for c in compiled:
            rel = c.rule.head.rel
            new = c.run(c.full) - ctx.full[rel].tuples
            if new:
                delta.setdefault(rel, set()).update(new)
        recursive = [c for c in compiled if c.deltas]
        bounded = any(c.rule.computes_values for c in recursive)
        deriving = ", ".join(sorted({c.rule.head.rel for c in recursive}))
        rounds = 0
        while delta:
            for rel, new in delta.items():
                ctx.full[rel].add_new(new)
            if not recursive:
                break
            rounds += 1
            interrupt.check(rounds, deriving)
            if bounded and rounds > MAX_FIXPOINT_ITERATIONS:
                raise IterationLimitError.after([c.rule for c in recursive])
            ctx.delta.clear()
            ctx.delta.update((rel, Rel(new)) for rel, new in delta.items())
            fresh: dict[str, set[Row]] = {}
            for c in recursive:
                rel = c.rule.head.rel
                variants = c.deltas if self.semi_naive else [c.full]
                for variant in variants:
                    got = c.run(variant)
                    got -= ctx.full[rel].tuples
                    if got:
                        fresh.setdefault(rel, set()).update(got)
            delta = fresh
        ctx.delta.clear()


def _split_arity(r: Rel, n: int, at_least: bool) -> tuple[Rel, set[Row]]:
    """``r`` restricted to rows the rules can match (length ``n``, or ``>= n`` for
    rest patterns), and the other rows."""
    if r.cols is not None:
        ok = len(r.cols) >= n if at_least else len(r.cols) == n
        return (r, set()) if ok else (Rel(), set(r.tuples))
    tuples = r.tuples
    lengths = set(map(len, tuples))
    if all(k >= n if at_least else k == n for k in lengths):
        return r, set()
    if at_least:
        keep = {t for t in tuples if len(t) >= n}
    else:
        keep = {t for t in tuples if len(t) == n}
    return Rel(keep), tuples - keep


def _sort_key(row: Row) -> tuple:
    return tuple(sort_key(v) for v in row)


def sort_rows(rows: Iterable[Row]) -> list[Row]:
    """Deterministic order for tuples of mixed value types."""
    return sorted(rows, key=_sort_key)


def _expression_keys(atom: ast.Atom, bound: set[str]) -> tuple[int, ...]:
    """Positions, among an atom's lookup-key arguments (:meth:`RuleCompiler._match_plan`'s
    order), of the arithmetic expressions: their values compare as ``==`` does."""
    out: list[int] = []
    k = 0
    for arg in atom.args:
        if isinstance(arg, ast.Var) and arg.name not in bound:
            continue
        if isinstance(arg, ast.BinOp | ast.Neg):
            out.append(k)
        k += 1
    return tuple(out)


def _equal_keys(key: Any, exprs: tuple[int, ...], single: bool) -> list[Any]:
    """Every lookup key equal to ``key`` under ``==`` at the expression positions
    ``exprs`` (``2`` and ``2.0``; :func:`merklog.engine.arith.equal_values`)."""
    if single:
        return list(equal_values(key))
    options = [equal_values(v) if i in exprs else (v,) for i, v in enumerate(key)]
    return list(product(*options))
