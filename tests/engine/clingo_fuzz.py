"""Random stratified programs for differential testing against clingo (the oracle).

A stratified program has exactly one stable model, so clingo (the Potassco ASP
system) computes the same relations as any correct Datalog evaluator. This
module generates random programs with recursion, negation, count/sum/min/max
aggregates, arithmetic and comparisons, writes each as merklog source and as a
clingo program, and decodes clingo's model back into merklog values.

Columns have one of two kinds, fixed per relation column:

- ``I`` (int): small ints, written as clingo integers. Arithmetic (``+ - *``),
  ordering comparisons on ints, and ``sum`` use only ``I`` values, because
  clingo has no floats, and its arithmetic on anything but integers is
  undefined (merklog's ``1.5 + 1`` is ``2.5``).
- ``M`` (mixed): ints, floats, bools, strings and bytes together (``1``, ``1.0``,
  ``true``, ``"1"``, ``x"31"`` …), written as the clingo tuple ``(R, N, T, S)``:
  ``R`` the comparison class (0 bool, 1 number, 2 string, 3 bytes), ``N`` twice
  the numeric value (the generated floats are halves) or the bool as 0/1, ``T``
  1 for a float and 0 otherwise, ``S`` the string, or the bytes as lowercase hex
  (hex strings order as the bytes do). The tuples are distinct exactly when the merklog
  values are (``1``, ``1.0`` and ``true`` are three tuples), and clingo orders
  them lexicographically, which is merklog's ``sort_key`` order (bool < number <
  string < bytes; numbers numerically, an int before an equal float), so ``min``/``max``
  over ``M`` columns match. ``==`` on ``M`` values compares ``(R, N, S)`` (so
  ``1 == 1.0`` holds and ``true == 1`` does not, as docs/language.md says), and
  ``<`` holds only within one class, on ``(N, S)``.

Restrictions where clingo's semantics differ from merklog's (not generated):
no ``/`` or ``%`` (clingo's ``\\`` and merklog's ``%`` are not the same
operator), no arithmetic inside recursive rules (clingo and merklog would both
diverge), ints stay within clingo's 32-bit range, strings are ASCII (clingo
compares bytes, merklog code points), aggregates have one atom as their body.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import clingo

# Values of the mixed (M) kind. SAFE_MIXED holds values Python's == keeps apart;
# FULL_MIXED adds the ones Python conflates (1 == 1.0 == True), -0.0 and bytes
# (b"1" beside "1" and 1).
SAFE_MIXED: list[Any] = [0, 1, 2, 0.5, 2.5, "a", "b", "1"]
FULL_MIXED: list[Any] = SAFE_MIXED + [1.0, 0.0, -0.0, 2.0, True, False, b"\x01", b"1", b""]
INTS = [-1, 0, 1, 2, 3]

EDB = {"a": 2, "b": 2, "c": 1}
LEVELS = {"p0": 0, "p1": 0, "p2": 1, "p3": 1}


# ----------------------------------------------------------------------------- values


def canon(value: Any) -> tuple[str, Any]:
    """A typed key for a merklog value (plain or engine form): Python's == must
    not decide identity, so results are compared as sets of these keys."""
    if isinstance(value, bool) or type(value).__name__ == "Bool":
        return ("bool", bool(value))
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", float(value) if value != 0 else 0.0)
    return (type(value).__name__, value)


def canon_rows(rows: Any) -> set[tuple]:
    return {tuple(canon(v) for v in row) for row in rows}


class Rows:
    """A set of rows keyed by :func:`canon` (a Python set would hold only one of
    ``(1,)``, ``(1.0,)`` and ``(True,)``)."""

    def __init__(self, rows: Any = ()) -> None:
        self._rows: dict[tuple, tuple] = {}
        for row in rows:
            self.add(row)

    def add(self, row: tuple) -> None:
        self._rows[tuple(canon(v) for v in row)] = row

    def discard(self, row: tuple) -> None:
        self._rows.pop(tuple(canon(v) for v in row), None)

    def __ior__(self, other: Rows) -> Rows:
        self._rows.update(other._rows)
        return self

    def __isub__(self, other: Rows) -> Rows:
        for key in other._rows:
            self._rows.pop(key, None)
        return self

    def __iter__(self):
        return iter(list(self._rows.values()))

    def __len__(self) -> int:
        return len(self._rows)

    def __bool__(self) -> bool:
        return bool(self._rows)

    def copy(self) -> Rows:
        out = Rows()
        out._rows = dict(self._rows)
        return out

    def __repr__(self) -> str:
        return "Rows(" + repr(list(self._rows.values())) + ")"


def merklog_const(value: Any) -> str:
    """merklog source text of a constant."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value != 0 or math.copysign(1, value) > 0 else "-0.0"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, bytes):
        return 'x"' + value.hex() + '"'
    return str(value)


def clingo_value(value: Any, kind: str) -> str:
    """clingo term of a value in a column of ``kind``."""
    if kind == "I":
        assert type(value) is int
        return str(value)
    if isinstance(value, bool):
        return f'(0,{int(value)},0,"")'
    if isinstance(value, int):
        return f'(1,{2 * value},0,"")'
    if isinstance(value, float):
        return f'(1,{int(2 * value)},1,"")'
    if isinstance(value, bytes):
        return f'(3,0,0,"{value.hex()}")'
    return f'(2,0,0,"{value}")'


def decode(sym: clingo.Symbol, kind: str) -> Any:
    """The merklog value of a clingo term (inverse of :func:`clingo_value`)."""
    if kind == "I":
        return sym.number
    r, n, t, s = sym.arguments
    if r.number == 0:
        return bool(n.number)
    if r.number == 1:
        return n.number / 2 if t.number else n.number // 2
    if r.number == 3:
        return bytes.fromhex(s.string)
    return s.string


# ----------------------------------------------------------------------------- programs


@dataclass
class Case:
    """One generated program with its column kinds and epochs of EDB changes."""

    kinds: dict[str, list[str]]
    rules: list[str]  # merklog source, one rule a line
    clingo_rules: list[str]
    epochs: list[tuple[dict[str, Rows], dict[str, Rows]]] = field(default_factory=list)

    @property
    def merklog(self) -> str:
        return "\n".join(self.rules) + "\n"

    def clingo(self, facts: dict[str, Rows]) -> str:
        lines = list(self.clingo_rules)
        for rel, rows in facts.items():
            kinds = self.kinds[rel]
            for row in rows:
                args = ",".join(clingo_value(v, k) for v, k in zip(row, kinds, strict=True))
                lines.append(f"r_{rel}({args}).")
        lines += [f"#show r_{rel}/{len(k)}." for rel, k in self.kinds.items()]
        return "\n".join(lines) + "\n"

    def derived(self) -> list[str]:
        return [rel for rel in self.kinds if rel not in EDB]

    def describe(self) -> str:
        ep = "\n".join(f"  epoch {i}: +{ins} -{dels}" for i, (ins, dels) in enumerate(self.epochs))
        return f"kinds={self.kinds}\n{self.merklog}{ep}"


def solve(case: Case, facts: dict[str, Rows]) -> dict[str, list[tuple]]:
    """clingo's stable model, decoded: ``relation -> list of merklog tuples`` (a list:
    a Python set would merge ``(1,)`` and ``(1.0,)``; compare with :func:`canon_rows`)."""
    ctl = clingo.Control(["--warn=none"])
    ctl.add("base", [], case.clingo(facts))
    ctl.ground([("base", [])])
    models: list[dict[str, list[tuple]]] = []
    with ctl.solve(yield_=True) as handle:
        for model in handle:
            out: dict[str, list[tuple]] = {rel: [] for rel in case.kinds}
            for sym in model.symbols(shown=True):
                rel = sym.name[2:]
                kinds = case.kinds[rel]
                out[rel].append(
                    tuple(decode(a, k) for a, k in zip(sym.arguments, kinds, strict=True))
                )
            models.append(out)
    assert len(models) == 1, f"a stratified program has one stable model, got {len(models)}"
    return models[0]


class _Rule:
    """Builds one rule in both languages at once."""

    def __init__(self, gen: Generator) -> None:
        self.gen = gen
        self.m: list[str] = []  # merklog body literals
        self.c: list[str] = []  # clingo body literals
        self.bound: dict[str, str] = {}  # variable -> kind
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"V{self.n}"

    def atom(self, rel: str, negated: bool = False) -> None:
        """A positive or negated atom over ``rel``; binds fresh variables when positive."""
        rnd = self.gen.rnd
        margs, cargs = [], []
        for kind in self.gen.kinds[rel]:
            options = [v for v, k in self.bound.items() if k == kind]
            pick = rnd.random()
            if not options:
                pick = 0.5 + pick / 2  # nothing to reuse: a constant, _ or a fresh variable
            if options and pick < 0.5:
                var = rnd.choice(options)
                margs.append(var)
                cargs.append(var)
            elif pick < 0.6:
                value = self.gen.value(kind)
                margs.append(merklog_const(value))
                cargs.append(clingo_value(value, kind))
            elif negated or pick < 0.7:
                margs.append("_")
                cargs.append("_")
            else:
                var = self.fresh()
                self.bound[var] = kind
                margs.append(var)
                cargs.append(var)
        m = f"{rel}({', '.join(margs)})"
        c = f"r_{rel}({','.join(cargs)})"
        self.m.append("!" + m if negated else m)
        self.c.append("not " + c if negated else c)

    def comparison(self, arithmetic: bool) -> None:
        rnd = self.gen.rnd
        kind = rnd.choice(["I", "M"])
        options = [v for v, k in self.bound.items() if k == kind]
        if not options:
            return
        left = rnd.choice(options)
        if kind == "I" and arithmetic and rnd.random() < 0.5:
            # Y == X op c binds a new int variable.
            op = rnd.choice(["+", "-", "*"])
            const = rnd.choice([1, 2, -1])
            var = self.fresh()
            self.m.append(f"{var} == {left} {op} ({const})")
            self.c.append(f"{var} = {left} {op} ({const})")
            self.bound[var] = "I"
            return
        op = rnd.choice(["==", "!=", "<", "<=", ">", ">="])
        if rnd.random() < 0.5 and len(options) > 1:
            right_m = right_c = rnd.choice(options)
        else:
            value = self.gen.value(kind)
            right_m, right_c = merklog_const(value), clingo_value(value, kind)
        self.m.append(f"{left} {op} {right_m}")
        if kind == "I":
            self.c.append(f"{left} {'=' if op == '==' else op} {right_c}")
            return
        a, b = self.fresh(), self.fresh()
        self.c.append(f"{left} = ({a}R,{a}N,_,{a}S)")
        self.c.append(f"{right_c} = ({b}R,{b}N,_,{b}S)")
        if op == "==":
            self.c.append(f"({a}R,{a}N,{a}S) = ({b}R,{b}N,{b}S)")
        elif op == "!=":
            self.c.append(f"({a}R,{a}N,{a}S) != ({b}R,{b}N,{b}S)")
        else:
            self.c.append(f"{a}R = {b}R")
            self.c.append(f"({a}N,{a}S) {op} ({b}N,{b}S)")

    def aggregate(self, rel: str) -> tuple[str, str] | None:
        """``R := func V : rel(...)``; returns the result variable and its kind."""
        rnd = self.gen.rnd
        kinds = self.gen.kinds[rel]
        func = rnd.choice(["count", "sum", "min", "max"])
        value_pos = [i for i, k in enumerate(kinds) if func != "sum" or k == "I"]
        if func != "count" and not value_pos:
            func = "count"
        target = rnd.choice(value_pos) if func != "count" else None
        margs, cargs, locals_ = [], [], []
        for i, kind in enumerate(kinds):
            options = [v for v, k in self.bound.items() if k == kind]
            if i == target:
                var = self.fresh()
                margs.append(var)
                cargs.append(var)
                locals_.insert(0, var)
            elif options and rnd.random() < 0.4:
                var = rnd.choice(options)  # a grouping variable
                margs.append(var)
                cargs.append(var)
            elif rnd.random() < 0.3:
                value = self.gen.value(kind)
                margs.append(merklog_const(value))
                cargs.append(clingo_value(value, kind))
            else:
                var = self.fresh()
                margs.append("_")
                cargs.append(var)
                locals_.append(var)
        result = self.fresh()
        arg = f" {margs[target]}" if target is not None else ""
        self.m.append(f"{result} := {func}{arg} : {rel}({', '.join(margs)})")
        element = ",".join(locals_) if locals_ else "0"
        cond = f"r_{rel}({','.join(cargs)})"
        self.c.append(f"{result} = #{func}{{ {element} : {cond} }}")
        if func == "min":
            self.c.append(f"{result} != #sup")
        elif func == "max":
            self.c.append(f"{result} != #inf")
        kind = "I" if func in ("count", "sum") else kinds[target]  # type: ignore[index]
        self.bound[result] = kind
        return result, kind


class Generator:
    """Seeded generator of :class:`Case` objects."""

    def __init__(self, seed: int, mixed: bool) -> None:
        self.rnd = random.Random(seed)
        self.all_mixed = FULL_MIXED if mixed else SAFE_MIXED
        self.pool = self.all_mixed
        self.ints = INTS
        self.kinds: dict[str, list[str]] = {}

    def value(self, kind: str) -> Any:
        return self.rnd.choice(self.ints if kind == "I" else self.pool)

    def case(self) -> Case:
        rnd = self.rnd
        # Small per-case domains, so joins, negations and groups actually meet.
        self.pool = rnd.sample(self.all_mixed, rnd.randint(2, 5))
        self.ints = rnd.sample(INTS, rnd.randint(2, 4))
        self.kinds = {rel: [rnd.choice("IM") for _ in range(n)] for rel, n in EDB.items()}
        for rel in LEVELS:
            self.kinds[rel] = [rnd.choice("IM") for _ in range(rnd.randint(1, 2))]
        mrules, crules = [], []
        for _ in range(rnd.randint(1, 6)):
            got = self.rule()
            if got is not None:
                mrules.append(got[0])
                crules.append(got[1])
        case = Case(dict(self.kinds), mrules, crules)
        facts = {rel: Rows() for rel in EDB}
        for rel in EDB:
            for _ in range(rnd.randint(0, 7)):
                facts[rel].add(self.row(rel))
        case.epochs.append(({r: rows.copy() for r, rows in facts.items()}, {}))
        for _ in range(rnd.randint(1, 3)):
            ins: dict[str, Rows] = {}
            dels: dict[str, Rows] = {}
            for rel in EDB:
                for row in facts[rel]:
                    if rnd.random() < 0.3:
                        dels.setdefault(rel, Rows()).add(row)
                for _ in range(rnd.randint(0, 2)):
                    ins.setdefault(rel, Rows()).add(self.row(rel))
            for rel, rows in dels.items():
                facts[rel] -= rows
            for rel, rows in ins.items():
                facts[rel] |= rows
            case.epochs.append((ins, dels))
        return case

    def row(self, rel: str) -> tuple:
        return tuple(self.value(k) for k in self.kinds[rel])

    def rule(self) -> tuple[str, str] | None:
        rnd = self.rnd
        head = rnd.choice(list(LEVELS))
        level = LEVELS[head]
        lower = list(EDB) + [p for p in LEVELS if LEVELS[p] < level]
        same = [p for p in LEVELS if LEVELS[p] == level]
        r = _Rule(self)
        recursive = False
        for i in range(rnd.randint(1, 2)):
            if i > 0 and rnd.random() < 0.5:
                rel = rnd.choice(same)
                recursive = True
            else:
                rel = rnd.choice(lower)
            r.atom(rel)
        if rnd.random() < 0.5:
            r.comparison(arithmetic=not recursive)
        if rnd.random() < 0.3:
            r.atom(rnd.choice(lower), negated=True)
        if rnd.random() < 0.35:
            r.aggregate(rnd.choice(lower))
        margs, cargs = [], []
        for kind in self.kinds[head]:
            options = [v for v, k in r.bound.items() if k == kind]
            if options and rnd.random() < 0.85:
                var = rnd.choice(options)
                if kind == "I" and not recursive and rnd.random() < 0.2:
                    margs.append(f"{var} + 1")
                    cargs.append(f"{var} + 1")
                else:
                    margs.append(var)
                    cargs.append(var)
            else:
                value = self.value(kind)
                margs.append(merklog_const(value))
                cargs.append(clingo_value(value, kind))
        if not r.m:
            return None
        m = f"{head}({', '.join(margs)}) :- {', '.join(r.m)}."
        c = f"r_{head}({','.join(cargs)}) :- {', '.join(r.c)}."
        return m, c


def tsv_safe(value: Any) -> bool:
    """Values a fact file / CSV round-trips without a declaration (engine/tsv.py):
    ints, floats (written with a ``.``), strings that do not read as numbers; not
    bools (``true`` reads back as a string) nor bytes."""
    if isinstance(value, bool | bytes):
        return False
    if isinstance(value, int | float):
        return True
    try:
        float(value)
    except ValueError:
        return "\t" not in value and value.strip() == value and value != ""
    return False
