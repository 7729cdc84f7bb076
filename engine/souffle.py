"""Soufflé frontend (``--dialect souffle``; auto-detected when a program has ``.decl``).

Accepts the Datalog core of Soufflé programs unchanged and produces the same
:mod:`merklog.engine.ast` normal form as the merklog parser, with
``Program.dialect == "souffle"`` so evaluators use Soufflé's 32-bit integer
arithmetic (two's-complement wrap, truncating division; :mod:`.arith`).

Supported: ``.type`` subtypes/aliases/unions of ``number``/``unsigned``/
``float``/``symbol`` (resolved to the base type), ``.decl`` (storage qualifiers
``btree``/``brie``/``btree_delete``/``inline``/``no_inline``/``magic``/``no_magic``
are accepted and have no semantic effect), ``.input``/``.output`` (plain or with
``IO=file``/``IO=stdout``: merklog reads ``<rel>.facts`` and writes ``<rel>.csv``,
tab-separated), facts, rules with several heads, lowercase or uppercase
variables, ``_``, ``!``/``not`` negation, ``=`` and ``!= < <= > >=``, arithmetic
``+ - * / %``, disjunction ``;`` and parenthesised groups (expanded into one
rule per alternative), aggregates ``x = count : { … }``, ``x = sum y : { … }``,
``min``/``max`` (and the single-atom form ``count : a(x)``) with Soufflé's
variable scoping (injected, local and witness variables: :mod:`.souffle_scope`),
``.plan`` (ignored),
``//`` and ``/* */`` comments.

Outside merklog's semantics, each raising :class:`UnsupportedError` naming the
construct at ``line:col``: ADTs and records (``[a, b]``, ``nil``), components
(``.comp``/``.init``/``.override``), functors (``cat``, ``strlen``, ``min(a, b)``,
``to_number`` …), the string constraints ``match``/``contains`` and user-defined
functors (``@f``, ``.functor``), ``choice-domain``,
``eqrel``, subsumption, ``$`` counters, ``mean``, bitwise/logical operators,
``^``, ``as`` casts, ``.printsize``/``.limitsize``/``.pragma``, other I/O
parameters and the C preprocessor.

Every relation used must be declared (as in Soufflé): otherwise
:class:`UnknownRelationError`.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from merklog.store import Fact

from .ast import (
    Aggregate,
    Atom,
    BodyLiteral,
    Const,
    Declaration,
    Negated,
    Pos,
    Positive,
    Program,
    Rule,
    Term,
    Var,
    body_atoms,
)
from .errors import ParseError, UnknownRelationError, UnsupportedError
from .factreader import split_fact_lines
from .lexer import Source, Token, tokenize
from .parser import Parser, describe, parse_query, with_fact_lines
from .souffle_scope import resolve_aggregate_scopes

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

_BASE_TYPES = {"number": "number", "unsigned": "unsigned", "float": "float", "symbol": "symbol"}
_KEYWORDS = frozenset(
    {"true", "false", "nil", "not", "count", "sum", "min", "max", "mean", "as"}
    | {"band", "bor", "bxor", "bshl", "bshr", "bshru", "bnot", "land", "lor", "lxor", "lnot"}
)
_BITWISE = frozenset(
    {"band", "bor", "bxor", "bshl", "bshr", "bshru", "bnot", "land", "lor", "lxor", "lnot"}
)
#: Soufflé's built-in string constraints, written like atoms: ``match("a.*", s)``.
_STRING_CONSTRAINTS = frozenset({"match", "contains"})
_STORAGE = frozenset({"btree", "brie", "btree_delete", "inline", "no_inline", "magic", "no_magic"})
_CMP = frozenset({"=", "==", "!=", "<", "<=", ">", ">="})
_ARITH = frozenset({"+", "-", "*", "/", "%", "^"})
_UNSUPPORTED_DIRECTIVES = {
    ".comp": "components (.comp)",
    ".init": "component instantiation (.init)",
    ".override": "component overrides (.override)",
    ".functor": "user-defined functors (.functor)",
    ".printsize": ".printsize",
    ".limitsize": ".limitsize",
    ".pragma": ".pragma",
}


def unsupported(src: Source, tok: Token, construct: str, hint: str | None = None):
    line, col = src.linecol(tok.offset)
    err = UnsupportedError(
        f"unsupported Soufflé construct: {construct}",
        line,
        col,
        hint or "merklog runs the Datalog core of Soufflé; rewrite without this construct",
    )
    err.construct = construct
    return err


def _retype(toks: list[Token]) -> list[Token]:
    """Identifiers followed by ``(`` are relations (or functors); others are variables."""
    out: list[Token] = []
    for i, tok in enumerate(toks):
        if tok.kind in ("NAME", "VAR"):
            nxt = toks[i + 1]
            if nxt.kind == "OP" and nxt.value == "(":
                out.append(Token("REL", tok.value, tok.offset))
                continue
            if tok.kind == "NAME" and tok.value not in _KEYWORDS:
                out.append(Token("VAR", tok.value, tok.offset))
                continue
        out.append(tok)
    return out


class SouffleParser(Parser):
    """The merklog parser with Soufflé's directives, ``=``, disjunction and ``{}`` aggregates."""

    dialect = "souffle"
    int_min = INT32_MIN
    int_max = INT32_MAX
    eq_op = "="

    def __init__(self, text: str) -> None:
        src = Source(text)
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("#"):
                col = len(line) - len(line.lstrip()) + 1
                err = UnsupportedError(
                    "unsupported Soufflé construct: C preprocessor directive",
                    lineno,
                    col,
                    "expand #include/#define before loading the program",
                )
                err.construct = "C preprocessor directive"
                raise err
        super().__init__(text, _retype(tokenize(text, src)))
        for tok in self.toks:
            if tok.kind == "OP" and tok.value == "@":
                raise self.unsupported(tok, "user-defined functor @…")
        self.types: dict[str, tuple[str, Token]] = {}
        self.decls: dict[str, tuple[tuple[tuple[str, str], ...], Token]] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.io_tokens: list[tuple[str, Token]] = []

    @classmethod
    def for_fragment(cls, text: str) -> Parser:
        """A plain :class:`Parser` over Soufflé-typed tokens (for queries)."""
        src = Source(text)
        return Parser(text, _retype(tokenize(text, src)))

    def unsupported(self, tok: Token, construct: str, hint: str | None = None) -> UnsupportedError:
        return unsupported(self.src, tok, construct, hint)

    # ------------------------------------------------------------ program

    def parse_program(self, check: bool = True) -> Program:
        """The program; ``check=False`` leaves :meth:`check_declared` to the caller
        (:func:`parse_souffle` adds the fact lines the reader took first)."""
        rules: list[Rule] = []
        facts: list[Fact] = []
        while self.peek().kind != "EOF":
            tok = self.peek()
            if tok.kind == "DIRECTIVE":
                self.directive()
            else:
                self.statement(rules, facts)
        declarations = tuple(
            Declaration(rel, tuple((n, self.base_type(t, tok)) for n, t in cols), self.pos(tok))  # type: ignore[misc]
            for rel, (cols, tok) in self.decls.items()
        )
        program = Program(
            rules=tuple(rules),
            facts=tuple(facts),
            declarations=declarations,
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            dialect="souffle",
            fact_positions=tuple(self.fact_pos),
        )
        if check:
            self.check_declared(program)
        return program

    def check_declared(self, program: Program) -> None:
        declared = set(self.decls)
        for i, (rel, _args) in enumerate(program.facts):
            if rel not in declared:
                self.undeclared(rel, program.fact_positions[i])
        for rule in program.rules:
            if rule.head.rel not in declared:
                self.undeclared(rule.head.rel, rule.head.pos)
            for lit in rule.body:
                for atom, _ in body_atoms(lit):
                    if atom.rel not in declared:
                        self.undeclared(atom.rel, atom.pos)
        for rel, tok in self.io_tokens:
            if rel not in declared:
                self.undeclared(rel, self.pos(tok))

    def undeclared(self, rel: str, pos: Pos) -> None:
        if rel in _STRING_CONSTRAINTS:  # keywords in Soufflé: never a relation of its own
            err = UnsupportedError.at(
                pos,
                f"unsupported Soufflé construct: string constraint {rel}(…)",
                "merklog runs the Datalog core of Soufflé; rewrite without this construct",
            )
            err.construct = f"string constraint {rel}(…)"
            raise err
        raise UnknownRelationError.at(
            pos,
            f"relation {rel} is not declared",
            f"declare it: .decl {rel}(x: number, …)",
            relation=rel,
        )

    def base_type(self, name: str, tok: Token, seen: frozenset[str] = frozenset()) -> str:
        if name in _BASE_TYPES:
            return _BASE_TYPES[name]
        if name in seen or name not in self.types:
            raise self.error(
                tok, f"unknown type {name}", "declare it with .type or use number/symbol/float"
            )
        return self.base_type(self.types[name][0], self.types[name][1], seen | {name})

    # ------------------------------------------------------------ directives

    def directive(self) -> None:
        tok = self.peek()
        name = tok.value
        if name in _UNSUPPORTED_DIRECTIVES:
            raise self.unsupported(tok, _UNSUPPORTED_DIRECTIVES[name])  # type: ignore[index]
        self.i += 1
        if name == ".decl":
            self.decl(tok)
        elif name == ".type":
            self.type_decl(tok)
        elif name in (".number_type", ".symbol_type"):
            ident = self.ident("a type name")
            self.types[ident.value] = (name[1:-5], ident)  # type: ignore[index]
        elif name in (".input", ".output"):
            self.io(tok)
        elif name == ".plan":
            self.skip_plan()
        else:
            raise self.unsupported(tok, f"directive {name}")

    def ident(self, what: str) -> Token:
        tok = self.peek()
        if tok.kind in ("NAME", "VAR", "REL"):
            self.i += 1
            return tok
        raise self.error(tok, f"expected {what}, found {describe(tok)}")

    def decl(self, at: Token) -> None:
        names = [self.ident("a relation name")]
        while self.accept(","):
            names.append(self.ident("a relation name"))
        self.expect("(", "'(' after the relation name")
        cols: list[tuple[str, str]] = []
        if not self.accept(")"):
            while True:
                attr = self.ident("an attribute name")
                self.expect(":", "':' and a type")
                typ = self.ident("a type")
                if self.is_op("["):
                    raise self.unsupported(self.peek(), "record types")
                cols.append((attr.value, typ.value))  # type: ignore[arg-type]
                if self.accept(","):
                    continue
                self.expect(")", "',' or ')'")
                break
        while True:
            tok = self.peek()
            if tok.kind in ("NAME", "VAR") and tok.value in _STORAGE:
                self.i += 1
                continue
            if tok.kind in ("NAME", "VAR") and tok.value == "eqrel":
                raise self.unsupported(tok, "eqrel relations")
            if tok.kind in ("NAME", "VAR") and tok.value == "choice":
                raise self.unsupported(tok, "choice-domain")
            if tok.kind in ("NAME", "VAR") and tok.value in ("overridable",):
                raise self.unsupported(tok, "components (overridable)")
            break
        for name_tok in names:
            if name_tok.value in self.decls:
                raise self.error(
                    name_tok,
                    f"relation {name_tok.value} is declared twice",
                    "keep one .decl per relation",
                )
            self.decls[name_tok.value] = (tuple(cols), name_tok)  # type: ignore[index]

    def type_decl(self, at: Token) -> None:
        name = self.ident("a type name")
        op = self.peek()
        if op.kind == "OP" and op.value == "<":
            self.i += 1
            self.expect(":", "'<:'")
            base = self.ident("a base type")
            self.types[name.value] = (base.value, base)  # type: ignore[index]
            return
        self.expect("=", "'<:' or '='")
        if self.is_op("["):
            raise self.unsupported(self.peek(), "record types")
        first = self.ident("a type")
        if self.is_op("{") or first.kind == "REL":
            raise self.unsupported(first, "algebraic data types (ADTs)")
        members = [first]
        while self.accept("|"):
            member = self.ident("a type")
            if self.is_op("{"):
                raise self.unsupported(member, "algebraic data types (ADTs)")
            members.append(member)
        if len(members) == 1:
            self.types[name.value] = (first.value, first)  # type: ignore[index]
            return
        bases = {self.base_type(m.value, m) for m in members}  # type: ignore[arg-type]
        if len(bases) != 1:
            raise self.error(name, f"union type {name.value} mixes base types {sorted(bases)}")
        self.types[name.value] = (bases.pop(), name)

    def io(self, at: Token) -> None:
        names = [self.ident("a relation name")]
        while self.accept(","):
            names.append(self.ident("a relation name"))
        if self.accept("("):
            while not self.accept(")"):
                key = self.ident("an I/O parameter")
                self.expect("=", "'=' in the I/O parameter")
                value = self.peek()
                self.i += 1
                if not (key.value == "IO" and value.value in ("file", "stdout")):
                    # IO itself is supported: name the value it was given (QA: IO=stdin
                    # said "unsupported … I/O parameter IO")
                    what = (
                        f"I/O parameter IO={value.value}"
                        if key.value == "IO"
                        else f"I/O parameter {key.value}"
                    )
                    raise self.unsupported(
                        value if key.value == "IO" else key,
                        what,
                        "merklog reads <rel>.facts and writes <rel>.csv, tab-separated",
                    )
                self.accept(",")
        target = self.inputs if at.value == ".input" else self.outputs
        for name in names:
            self.io_tokens.append((name.value, name))  # type: ignore[arg-type]
            if name.value not in target:
                target.append(name.value)  # type: ignore[arg-type]

    def skip_plan(self) -> None:
        # ``.plan 0:(1,2), 1:(2,1)`` only reorders joins: no effect on results.
        while True:
            tok = self.peek()
            if tok.kind in ("EOF", "DIRECTIVE"):
                return
            if tok.kind in ("REL",) or (tok.kind in ("NAME", "VAR") and self.is_op(":-", 1)):
                return
            if tok.kind == "OP" and tok.value == ")" and self.peek(1).kind != "OP":
                self.i += 1
                return
            self.i += 1

    # ------------------------------------------------------------ clauses

    def clause(self, rules: list[Rule], facts: list[Fact]) -> None:
        start = self.peek()
        heads = [self.head()]
        while self.accept(","):
            heads.append(self.head())
        if self.is_op("<="):
            raise self.unsupported(self.peek(), "subsumption rules (<=)")
        alternatives: list[tuple[BodyLiteral, ...]] = [()]
        if self.accept(":-"):
            alternatives = self.disjunction()
        self.end_clause()
        for body in alternatives:
            for atom, time, hpos in heads:
                if (
                    not body
                    and time == "now"
                    and all(type(a).__name__ == "Const" for a in atom.args)
                ):
                    facts.append(Fact(atom.rel, tuple(a.value for a in atom.args)))  # type: ignore[union-attr]
                    self.fact_pos.append(atom.pos)
                else:
                    rule = Rule(atom, body, time, hpos or self.pos(start))  # type: ignore[arg-type]
                    rules.append(resolve_aggregate_scopes(rule))

    def head_time(self, atom: Atom, peer_marked: bool) -> str:
        return "now"

    def disjunction(self) -> list[tuple[BodyLiteral, ...]]:
        alts = self.conjunction()
        while self.accept(";"):
            alts = alts + self.conjunction()
        return alts

    def conjunction(self) -> list[tuple[BodyLiteral, ...]]:
        parts = [self.group()]
        while self.accept(","):
            parts.append(self.group())
        return [tuple(itertools.chain.from_iterable(combo)) for combo in itertools.product(*parts)]

    def group(self) -> list[tuple[BodyLiteral, ...]]:
        tok = self.peek()
        if tok.kind == "OP" and tok.value == "(" and self.is_group(self.i):
            self.i += 1
            alts = self.disjunction()
            self.expect(")", "')' closing the group")
            return alts
        if tok.kind == "OP" and tok.value == "!" and self.is_op("(", 1):
            raise self.unsupported(tok, "negation of a parenthesised formula")
        return [(self.literal(),)]

    def is_group(self, i: int) -> bool:
        """Is the ``(`` at ``i`` a formula group (not an arithmetic parenthesis)?"""
        depth = 0
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if t.kind == "OP" and t.value == "(":
                depth += 1
            elif t.kind == "OP" and t.value == ")":
                depth -= 1
                if depth == 0:
                    after = self.toks[j + 1]
                    return not (
                        after.kind == "OP" and (after.value in _CMP or after.value in _ARITH)
                    )
            elif t.kind == "EOF":
                return False
        return False

    # ------------------------------------------------------------ literals

    def literal(self) -> BodyLiteral:
        tok = self.peek()
        if tok.kind == "REL":
            close = self.matching(self.i + 1)
            after = self.toks[close + 1]
            if after.kind == "OP" and (after.value in _CMP or after.value in _ARITH):
                raise self.unsupported(tok, f"functor {tok.value}(…)")
        if tok.kind == "NAME" and tok.value in ("true", "false"):
            nxt = self.peek(1)
            if nxt.kind == "OP" and nxt.value in (",", ".", ";", ")"):
                raise self.unsupported(tok, f"nullary constraint {tok.value}")
        if self.is_var_token(tok) and self.is_op("=", 1):
            agg_tok = self.peek(2)
            if agg_tok.kind == "NAME" and agg_tok.value in ("count", "sum", "min", "max", "mean"):
                var = Var(tok.value, False, self.pos(tok))  # type: ignore[arg-type]
                self.i += 2
                return self.souffle_aggregate(var, tok)
        if tok.kind == "NAME" and tok.value in ("count", "sum", "min", "max", "mean"):
            raise self.unsupported(tok, "aggregate inside an expression", "write x = count : { … }")
        return super().literal()

    def matching(self, i: int) -> int:
        depth = 0
        for j in range(i, len(self.toks)):
            t = self.toks[j]
            if t.kind == "OP" and t.value == "(":
                depth += 1
            elif t.kind == "OP" and t.value == ")":
                depth -= 1
                if depth == 0:
                    return j
        return len(self.toks) - 2

    def souffle_aggregate(self, result: Var, at: Token) -> Aggregate:
        func_tok = self.peek()
        func = func_tok.value
        if func == "mean":
            raise self.unsupported(func_tok, "mean aggregate")
        self.i += 1
        arg: Term | None = None
        if func != "count":
            if self.is_op(":"):
                raise self.error(self.peek(), f"{func} needs the aggregated expression")
            arg = self.term()
        self.expect(":", "':' after the aggregate")
        if self.accept("{"):
            lits = [self.literal()]
            while self.accept(","):
                lits.append(self.literal())
            if self.is_op(";"):
                raise self.unsupported(self.peek(), "disjunction inside an aggregate")
            self.expect("}", "'}' closing the aggregate body")
            body = tuple(lits)
        else:
            if not self.is_rel_start():
                raise self.error(
                    self.peek(), f"expected an atom or {{ body }}, found {describe(self.peek())}"
                )
            atom, _ = self.atom()
            body = (Positive(atom, None, atom.pos),)
        for lit in body:
            if isinstance(lit, Aggregate):
                raise self.unsupported(func_tok, "nested aggregates")
        return Aggregate(result, func, arg, body, self.pos(at))  # type: ignore[arg-type]

    # ------------------------------------------------------------ terms

    def term(self) -> Term:
        term = super().term()
        tok = self.peek()
        if tok.kind == "OP" and tok.value == "^":
            raise self.unsupported(tok, "exponentiation ^")
        if tok.kind == "NAME" and tok.value in _BITWISE:
            raise self.unsupported(tok, f"bitwise/logical operator {tok.value}")
        return term

    def bad_term(self, tok: Token) -> Term:
        if tok.kind == "REL":
            raise self.unsupported(tok, f"functor {tok.value}(…)")
        if tok.kind == "OP" and tok.value == "@":
            raise self.unsupported(tok, "user-defined functor @…")
        if tok.kind == "OP" and tok.value == "$":
            raise self.unsupported(tok, "auto-increment counter $")
        if tok.kind == "OP" and tok.value == "[":
            raise self.unsupported(tok, "records [ … ]")
        if tok.kind == "NAME" and tok.value == "nil":
            raise self.unsupported(tok, "records (nil)")
        if tok.kind == "NAME" and tok.value == "as":
            raise self.unsupported(tok, "type casts as(…)")
        if tok.kind == "NAME" and tok.value in ("count", "sum", "min", "max", "mean"):
            raise self.unsupported(tok, "aggregate inside an expression", "write x = count : { … }")
        if tok.kind == "NAME" and tok.value in _BITWISE:
            raise self.unsupported(tok, f"bitwise/logical operator {tok.value}")
        return super().bad_term(tok)


def parse_souffle(text: str) -> Program:
    """Parse a Soufflé program into a merklog :class:`Program` (``dialect="souffle"``)."""
    fast, rest = split_fact_lines(text, INT32_MIN, INT32_MAX)  # the one ground-fact reader
    try:
        parser = SouffleParser(rest)
        program = with_fact_lines(parser.parse_program(check=False), fast)
        parser.check_declared(program)
        return _float_literals(program)
    except RecursionError:
        raise ParseError("program is nested too deeply", 1, 1) from None


#: Integers a double holds exactly: a literal beyond is left an int (and refused where
#: a float column is checked), never rounded.
_EXACT_IN_DOUBLE = 2**53


def _float_literals(program: Program) -> Program:
    """``program`` with every integer literal written as an argument of a ``float``
    column made a float, as Soufflé's type analysis makes it: ``g(1) :- f(_).`` with
    ``.decl g(x: float)`` derives ``1.0``. merklog's values keep their identity (``1`` is
    not ``1.0``), so the int stayed an int in a float relation: it joined nothing, was
    not negated away, was counted beside ``1.0``, and an inline fact ``f(1).`` was
    refused (QA). Literals inside expressions and comparisons are not typed here
    (docs/language.md, "Known differences")."""
    floats = {
        d.rel: frozenset(i for i, (_name, kind) in enumerate(d.columns) if kind == "float")
        for d in program.declarations
    }
    floats = {rel: cols for rel, cols in floats.items() if cols}
    if not floats:
        return program

    def value(v: object) -> object:
        exact = type(v) is int and -_EXACT_IN_DOUBLE <= v <= _EXACT_IN_DOUBLE
        return float(v) if exact else v

    def atom(a: Atom) -> Atom:
        cols = floats.get(a.rel)
        if not cols:
            return a
        args = tuple(
            Const(value(t.value), t.pos) if i in cols and isinstance(t, Const) else t
            for i, t in enumerate(a.args)
        )
        return a if args == a.args else replace(a, args=args)

    def literal(lit: BodyLiteral) -> BodyLiteral:
        if isinstance(lit, Positive | Negated):
            return replace(lit, atom=atom(lit.atom))
        if isinstance(lit, Aggregate):
            return replace(lit, body=tuple(literal(b) for b in lit.body))
        return lit

    def fact(f: tuple) -> tuple:
        rel, args = f
        cols = floats.get(rel)
        if not cols:
            return f
        typed = tuple(value(v) if i in cols else v for i, v in enumerate(args))
        return tuple.__new__(type(f), (rel, typed))  # a Fact stays a Fact

    facts = tuple(fact(f) for f in program.facts)
    rules = tuple(
        replace(r, head=atom(r.head), body=tuple(literal(b) for b in r.body)) for r in program.rules
    )
    return replace(program, facts=facts, rules=rules)


def parse_souffle_query(text: str) -> Atom:
    """One query atom in Soufflé syntax (lowercase identifiers are variables: ``path(1, x)``)."""
    return parse_query(text, SouffleParser.for_fragment(text))


__all__ = ["SouffleParser", "parse_souffle", "parse_souffle_query"]
