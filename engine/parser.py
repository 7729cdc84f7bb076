"""Recursive-descent parser for merklog's Dialog syntax (the Dialog query-engine spec; docs/language.md).

Produces the normal form of :mod:`merklog.engine.ast`: one head per rule, each
``_`` a fresh anonymous variable, ground bodiless clauses as ``Program.facts``.
Every syntax error is a :class:`~merklog.engine.errors.ParseError` at ``line:col``.

The :class:`Parser` works on tokens from :mod:`merklog.engine.lexer`; other
frontends reuse it by retyping tokens (the conformance adapter turns lowercase
identifiers into variables) or by subclassing (the Soufflé frontend), so the
core grammar itself stays strict.
"""

from __future__ import annotations

from dataclasses import replace

from merklog.store import Fact, Value

from .ast import (
    Aggregate,
    Atom,
    BinOp,
    BodyLiteral,
    Comparison,
    Const,
    Declaration,
    Neg,
    Negated,
    Pos,
    Positive,
    Program,
    Rule,
    Term,
    Var,
)
from .errors import ParseError
from .factreader import read_ground_facts, split_fact_lines
from .lexer import INT64_MAX, INT64_MIN, Source, Token, tokenize

#: Column types of a merklog ``.decl`` (also in merklog.engine.schema, which checks facts).
MERKLOG_TYPES = ("int", "float", "str", "bytes", "bool", "cid", "any")

_LITERAL_KINDS = frozenset({"INT", "FLOAT", "STRING", "BYTES", "CID"})
#: Literal kinds that are no number, and their names in errors: ``-`` before one of them
#: is refused where it is written (it would derive nothing).
_KIND_NAMES = {"STRING": "a string", "BYTES": "bytes", "CID": "a CID"}
_NOT_NUMBER_KINDS = frozenset(_KIND_NAMES)
#: How deep a term may nest: parentheses in parentheses, minus signs on minus signs,
#: operators on operators (``1 + 2 + …`` is a chain of additions). Far beyond real
#: programs, and well below where the parser's or the evaluator's recursion would
#: overflow Python's stack (which gave an internal error instead of a LINE:COL).
MAX_TERM_DEPTH = 100
_CMP_OPS = frozenset({"==", "!=", "<", "<=", ">", ">="})
_AGG_FUNCS = frozenset({"count", "sum", "min", "max"})


class Parser:
    """Parse a token stream in the merklog dialect; subclasses adapt other dialects."""

    dialect = "merklog"
    int_min = INT64_MIN
    int_max = INT64_MAX
    eq_op = "=="

    def __init__(self, text: str, tokens: list[Token] | None = None) -> None:
        self.src = Source(text)
        self.toks = tokens if tokens is not None else tokenize(text, self.src)
        self.i = 0
        self._anon = 0
        self.fact_pos: list[Pos] = []
        #: Parentheses and minus signs the term parser is inside of (its recursion).
        self._nesting = 0
        #: Operator terms built so far and their depth, by ``id`` (the term is kept, so
        #: its id is not reused; constants and variables are not here: depth 0).
        self._depth: dict[int, tuple[Term, int]] = {}

    # ------------------------------------------------------------ token helpers

    def pos(self, tok: Token) -> Pos:
        line, col = self.src.linecol(tok.offset)
        return Pos(line, col)

    def error(self, tok: Token, message: str, hint: str | None = None) -> ParseError:
        # At the end of input, the place is right after the last token (its value)
        offset = tok.value if tok.kind == "EOF" and isinstance(tok.value, int) else tok.offset
        return self.src.error(offset, message, hint)

    def peek(self, k: int = 0) -> Token:
        return self.toks[self.i + k]

    def is_op(self, value: str, k: int = 0) -> bool:
        tok = self.toks[self.i + k]
        return tok.kind == "OP" and tok.value == value

    def accept(self, value: str) -> Token | None:
        tok = self.toks[self.i]
        if tok.kind == "OP" and tok.value == value:
            self.i += 1
            return tok
        return None

    def expect(self, value: str, what: str | None = None) -> Token:
        tok = self.toks[self.i]
        if tok.kind == "OP" and tok.value == value:
            self.i += 1
            return tok
        raise self.error(tok, f"expected {what or repr(value)}, found {describe(tok)}")

    def fresh_anon(self, tok: Token) -> Var:
        self._anon += 1
        return Var(f"_{self._anon}", True, self.pos(tok))

    # ------------------------------------------------------------ classification hooks

    def is_rel_start(self, k: int = 0) -> bool:
        """Does the token at ``k`` start an atom (a relation name followed by ``(``)?"""
        tok = self.toks[self.i + k]
        if tok.kind == "REL":
            return True
        return tok.kind == "NAME" and self.is_op("(", k + 1)

    def is_var_token(self, tok: Token) -> bool:
        return tok.kind == "VAR"

    def check_int(self, tok: Token, value: int) -> int:
        if not self.int_min <= value <= self.int_max:
            raise self.error(
                tok,
                f"integer literal {value} does not fit in {self.int_bits()} signed bits",
                f"use a value between {self.int_min} and {self.int_max}",
            )
        return value

    def int_bits(self) -> int:
        return 64 if self.int_max == INT64_MAX else 32

    # ------------------------------------------------------------ program

    def parse_program(self) -> Program:
        rules: list[Rule] = []
        facts: list[Fact] = []
        decls: list[Declaration] = []
        while self.peek().kind != "EOF":
            tok = self.peek()
            if tok.kind == "DIRECTIVE" and tok.value == ".decl":
                decls.append(self.declaration())
                continue
            self.statement(rules, facts)
        return Program(
            rules=tuple(rules),
            facts=tuple(facts),
            declarations=tuple(decls),
            dialect=self.dialect,
            fact_positions=tuple(self.fact_pos),
        )

    def declaration(self) -> Declaration:
        """``.decl rel(name: type, …).`` with merklog types; ``name:`` may be omitted."""
        at = self.peek()
        self.i += 1
        name_tok = self.peek()
        if not self.is_rel_start():
            raise self.error(
                name_tok,
                f"expected a relation after .decl, found {describe(name_tok)}",
                ".decl edge(src: int, dst: int).",
            )
        self.i += 2
        columns: list[tuple[str, str]] = []
        if not self.accept(")"):
            while True:
                tok = self.peek()
                col = f"_{len(columns)}"
                if tok.kind in ("NAME", "VAR") and self.is_op(":", 1):
                    col = str(tok.value)
                    self.i += 2
                    tok = self.peek()
                if tok.kind == "NAME" and tok.value in ("number", "unsigned", "symbol"):
                    raise self.error(
                        at,
                        f"expected a rule head (an atom), found {describe(at)} with Soufflé "
                        f"column type {tok.value}",
                        head_hint(at),
                    )
                if tok.kind != "NAME" or tok.value not in MERKLOG_TYPES:
                    raise self.error(
                        tok,
                        f"expected a column type, found {describe(tok)}",
                        "column types are " + ", ".join(MERKLOG_TYPES),
                    )
                self.i += 1
                columns.append((col, str(tok.value)))
                if self.accept(","):
                    continue
                self.expect(")", "',' or ')' in the declaration")
                break
        self.end_clause()
        return Declaration(str(name_tok.value), tuple(columns), self.pos(at))  # type: ignore[arg-type]

    def statement(self, rules: list[Rule], facts: list[Fact]) -> None:
        """One clause (a fact, or rules); dialects override :meth:`clause`."""
        self.clause(rules, facts)

    def clause(self, rules: list[Rule], facts: list[Fact]) -> None:
        start = self.peek()
        heads = [self.head()]
        while self.accept(","):
            heads.append(self.head())
        body: tuple[BodyLiteral, ...] = ()
        if self.accept(":-"):
            body = self.body()
        self.end_clause()
        for atom, time, hpos in heads:
            if not body and time == "now" and all(isinstance(a, Const) for a in atom.args):
                facts.append(Fact(atom.rel, tuple(a.value for a in atom.args)))  # type: ignore[union-attr]
                self.fact_pos.append(atom.pos)
            else:
                rules.append(Rule(atom, body, time, hpos or self.pos(start)))

    def end_clause(self) -> None:
        tok = self.peek()
        if tok.kind == "OP" and tok.value == ".":
            self.i += 1
            return
        raise self.error(
            tok,
            f"expected ',' or '.', found {describe(tok)}",
            "end every fact and rule with '.'",
        )

    # ------------------------------------------------------------ heads

    def head(self) -> tuple[Atom, str, Pos]:
        tok = self.peek()
        if not self.is_rel_start():
            if tok.kind == "NAME":
                # zero-arity head written without parentheses: ``ok :- …``
                self.i += 1
                atom = Atom(tok.value, (), False, self.pos(tok))  # type: ignore[arg-type]
                return atom, self.head_time(atom, False), atom.pos
            raise self.error(
                tok, f"expected a rule head (an atom), found {describe(tok)}", head_hint(tok)
            )
        atom, peer_marked = self.atom(head=True)
        time = self.head_time(atom, peer_marked)
        return atom, time, atom.pos

    def head_time(self, atom: Atom, peer_marked: bool) -> str:
        at = self.peek()
        time = "now"
        if self.accept("@"):
            word = self.peek()
            if word.kind == "NAME" and word.value in ("next", "async"):
                self.i += 1
                time = word.value  # type: ignore[assignment]
            else:
                raise self.error(
                    word, f"unknown head annotation @{word.value}", "use @next or @async"
                )
        if time == "async" and not peer_marked:
            raise self.error(
                at,
                "an @async head must mark its destination peer",
                "write the peer as the first argument with @: p(@Peer, X)@async",
            )
        if peer_marked and time != "async":
            raise self.error(
                at, "a head with an @peer argument must be @async", "append @async to the head"
            )
        return time

    # ------------------------------------------------------------ atoms

    def atom(self, head: bool = False, allow_rest: bool = True) -> tuple[Atom, bool]:
        """``rel(args)``; returns the atom and whether its first arg was ``@``-marked."""
        name_tok = self.peek()
        self.i += 1
        self.expect("(")
        args: list[Term] = []
        rest = False
        peer_marked = False
        if not self.accept(")"):
            while True:
                tok = self.peek()
                if tok.kind == "OP" and tok.value == "...":
                    if head:
                        raise self.error(
                            tok, "'...' is not allowed in a rule head", "list every head argument"
                        )
                    if not allow_rest:
                        raise self.error(tok, "'...' is not allowed here")
                    self.i += 1
                    rest = True
                    self.expect(")", "')' after '...'")
                    break
                if tok.kind == "OP" and tok.value == "@":
                    if not head or args:
                        raise self.error(
                            tok,
                            "'@' may only mark the first argument of an @async head",
                            "write p(@Peer, X)@async",
                        )
                    self.i += 1
                    peer_marked = True
                    continue
                args.append(self.term())
                if self.accept(","):
                    continue
                self.expect(")", "',' or ')' in the argument list")
                break
        return Atom(name_tok.value, tuple(args), rest, self.pos(name_tok)), peer_marked  # type: ignore[arg-type]

    # ------------------------------------------------------------ bodies

    def body(self) -> tuple[BodyLiteral, ...]:
        lits = [self.literal()]
        while self.accept(","):
            lits.append(self.literal())
        return tuple(lits)

    def literal(self) -> BodyLiteral:
        tok = self.peek()
        if tok.kind == "OP" and tok.value == "!":
            self.i += 1
            return self.negation(tok)
        if (
            tok.kind == "NAME"
            and tok.value == "not"
            and (self.is_rel_start(1) or self.peek(1).kind == "NAME")
        ):
            self.i += 1
            return self.negation(tok)
        if self.is_var_token(tok) and self.is_op(":=", 1):
            return self.assignment()
        if self.is_rel_start():
            atom, _ = self.atom()
            return Positive(atom, None, atom.pos)
        if tok.kind == "NAME" and tok.value not in ("true", "false"):
            nxt = self.peek(1)
            # ``ok`` for ``ok()``: before ',' or '.', or ending a query (``query 'ok'``)
            if (nxt.kind == "OP" and nxt.value in (",", ".")) or nxt.kind == "EOF":
                self.i += 1
                atom = Atom(tok.value, (), False, self.pos(tok))  # type: ignore[arg-type]
                return Positive(atom, None, atom.pos)
        return self.comparison()

    def negation(self, bang: Token) -> Negated:
        tok = self.peek()
        if self.is_rel_start():
            atom, _ = self.atom()
        elif tok.kind == "NAME":
            self.i += 1
            atom = Atom(tok.value, (), False, self.pos(tok))  # type: ignore[arg-type]
        else:
            raise self.error(tok, f"expected an atom after negation, found {describe(tok)}")
        return Negated(atom, self.pos(bang))

    def assignment(self) -> BodyLiteral:
        var_tok = self.peek()
        var = Var(var_tok.value, False, self.pos(var_tok))  # type: ignore[arg-type]
        self.i += 2
        tok = self.peek()
        if tok.kind == "NAME" and tok.value in _AGG_FUNCS and not self.is_op("(", 1):
            return self.aggregate(var, var_tok)
        if self.is_rel_start():
            atom, _ = self.atom()
            return Positive(atom, var, self.pos(var_tok))
        raise self.error(
            tok,
            f"expected an atom or an aggregate after ':=', found {describe(tok)}",
            "':=' selects a fact's CID (C := rel(...)) or aggregates (N := count : rel(...));"
            " to compare values write X == expr",
        )

    def aggregate(self, result: Var, at: Token) -> Aggregate:
        func_tok = self.peek()
        func = func_tok.value
        self.i += 1
        arg: Term | None = None
        if func != "count":
            if self.is_op(":"):
                raise self.error(
                    self.peek(),
                    f"{func} needs the aggregated variable",
                    f"write N := {func} V : rel(..., V, ...)",
                )
            arg = self.term()
        self.expect(":", "':' after the aggregate")
        body = self.aggregate_body()
        return Aggregate(result, func, arg, body, self.pos(at))  # type: ignore[arg-type]

    def aggregate_body(self) -> tuple[BodyLiteral, ...]:
        tok = self.peek()
        if not self.is_rel_start():
            raise self.error(
                tok,
                f"expected an atom after ':', found {describe(tok)}",
                "write N := count : rel(X, _)",
            )
        atom, _ = self.atom()
        return (Positive(atom, None, atom.pos),)

    def comparison(self) -> Comparison:
        start = self.peek()
        left = self.term()
        op_tok = self.peek()
        op = op_tok.value if op_tok.kind == "OP" else None
        if op == "=" and self.eq_op == "==":
            raise self.error(op_tok, "'=' is not an operator here", "write X == Y to compare")
        if op == "=" and self.eq_op == "=":
            op = "=="
        elif op == "==" and self.eq_op == "=":
            pass
        elif op not in _CMP_OPS:
            raise self.error(
                op_tok,
                f"expected a comparison operator after {left}, found {describe(op_tok)}",
                "body literals are atoms, !atom, C := atom, N := count : atom, or comparisons",
            )
        self.i += 1
        right = self.term()
        return Comparison(op, left, right, self.pos(start))  # type: ignore[arg-type]

    # ------------------------------------------------------------ terms

    def term(self) -> Term:
        """``+ -`` over ``* / %`` over unary minus over primaries, left-associative."""
        toks = self.toks
        tok = toks[self.i]
        nxt = toks[self.i + 1] if self.i + 1 < len(toks) else tok
        # Fast path: a lone constant or variable followed by a separator.
        if nxt.kind == "OP" and (nxt.value == "," or nxt.value == ")"):
            if tok.kind in _LITERAL_KINDS:
                self.i += 1
                value = tok.value
                if type(value) is int:
                    self.check_int(tok, value)
                return Const(value, self.pos(tok))  # type: ignore[arg-type]
            if self.is_var_token(tok):
                self.i += 1
                return Var(tok.value, False, self.pos(tok))  # type: ignore[arg-type]
        left = self.product()
        while True:
            tok = toks[self.i]
            if tok.kind == "OP" and (tok.value == "+" or tok.value == "-"):
                self.i += 1
                right = self.product()
                left = self.deep(tok, BinOp(tok.value, left, right, left.pos), left, right)  # type: ignore[arg-type]
            else:
                return left

    def product(self) -> Term:
        left = self.unary()
        toks = self.toks
        while True:
            tok = toks[self.i]
            if tok.kind == "OP" and tok.value in ("*", "/", "%"):
                self.i += 1
                right = self.unary()
                left = self.deep(tok, BinOp(tok.value, left, right, left.pos), left, right)  # type: ignore[arg-type]
            else:
                return left

    def deep(self, tok: Token, term: Term, *parts: Term) -> Term:
        """``term``, built at operator ``tok`` from ``parts``, unless it nests more than
        :data:`MAX_TERM_DEPTH` operators deep (then a ParseError at ``tok``)."""
        depth = 1 + max(self._depth.get(id(part), (part, 0))[1] for part in parts)
        if depth > MAX_TERM_DEPTH:
            raise self.too_deep(tok)
        self._depth[id(term)] = (term, depth)
        return term

    def enter(self, tok: Token) -> None:
        """One more parenthesis or minus sign around the term being parsed; refused
        (ParseError at ``tok``) beyond :data:`MAX_TERM_DEPTH`."""
        self._nesting += 1
        if self._nesting > MAX_TERM_DEPTH:
            raise self.too_deep(tok)

    def too_deep(self, tok: Token) -> ParseError:
        return self.error(
            tok,
            f"this term nests more than {MAX_TERM_DEPTH} levels deep",
            "split it with intermediate variables: Y == A + B, X == Y + C",
        )

    def unary(self) -> Term:
        tok = self.peek()
        if tok.kind == "OP" and tok.value == "-":
            self.i += 1
            nxt = self.peek()
            if nxt.kind in ("INT", "FLOAT"):
                self.i += 1
                value = -nxt.value  # type: ignore[operator]
                if type(value) is int:
                    self.check_int(nxt, value)
                return Const(value, self.pos(tok))
            if nxt.kind in _NOT_NUMBER_KINDS or (
                nxt.kind == "NAME" and nxt.value in ("true", "false")
            ):
                # Negating a constant that is no number derives nothing, silently: say so.
                raise self.error(
                    tok,
                    f"'-' applies to numbers, not to {_KIND_NAMES.get(nxt.kind, 'a boolean')}",
                )
            self.enter(tok)
            inner = self.unary()
            self._nesting -= 1
            return self.deep(tok, Neg(inner, self.pos(tok)), inner)
        return self.primary()

    def primary(self) -> Term:
        tok = self.peek()
        kind = tok.kind
        if kind in _LITERAL_KINDS:
            self.i += 1
            value = tok.value
            if type(value) is int:
                self.check_int(tok, value)
            return Const(value, self.pos(tok))  # type: ignore[arg-type]
        if self.is_var_token(tok):
            self.i += 1
            return Var(tok.value, False, self.pos(tok))  # type: ignore[arg-type]
        if kind == "WILD":
            self.i += 1
            return self.fresh_anon(tok)
        if kind == "NAME" and tok.value in ("true", "false"):
            self.i += 1
            return Const(tok.value == "true", self.pos(tok))
        if kind == "OP" and tok.value == "(":
            self.i += 1
            self.enter(tok)
            inner = self.term()
            self._nesting -= 1
            self.expect(")", "')'")
            return inner
        return self.bad_term(tok)

    def bad_term(self, tok: Token) -> Term:
        if tok.kind == "NAME":
            raise self.error(
                tok,
                f"unexpected name {tok.value!r} where a term is expected",
                "variables start with an uppercase letter; strings are written in double quotes",
            )
        raise self.error(tok, f"expected a term, found {describe(tok)}")


def describe(tok: Token) -> str:
    if tok.kind == "EOF":
        return "end of input"
    if tok.kind == "OP":
        return repr(tok.value)
    if tok.kind in ("NAME", "VAR", "REL", "DIRECTIVE"):
        return f"{tok.value!r}"
    if tok.kind == "WILD":
        return "'_'"
    return f"{tok.kind.lower()} literal"


def head_hint(tok: Token) -> str:
    if tok.kind == "DIRECTIVE":
        return "Soufflé directives need the souffle dialect (--dialect souffle)"
    if tok.kind == "VAR":
        return "relation names start with a lowercase letter"
    return "a clause starts with an atom such as rel(X, Y)"


# ---------------------------------------------------------------- public entry points


def parse_program(text: str) -> Program:
    """Parse a whole merklog program (facts and rules)."""
    fast, rest = split_fact_lines(text)
    return with_fact_lines(Parser(rest).parse_program(), fast)


def with_fact_lines(prog: Program, fast: list[tuple[Pos, Fact]]) -> Program:
    """``prog`` (parsed from the text :func:`split_fact_lines` left) with the facts the
    reader took, every fact in source order with its position."""
    if not fast:
        return prog
    if not prog.facts:  # every fact was on a line the reader took: already in order
        merged = fast
    else:
        merged = sorted(
            [*fast, *zip(prog.fact_positions, prog.facts, strict=True)],
            key=lambda pf: (pf[0].line, pf[0].col),
        )
    return replace(
        prog, facts=tuple(f for _, f in merged), fact_positions=tuple(p for p, _ in merged)
    )


def parse_query(text: str, parser: Parser | None = None) -> Atom:
    """Parse one atom such as ``path(1, X)`` (a trailing ``.`` is allowed).

    ``parser``: a parser of another dialect over ``text``; the Soufflé frontend passes
    its own (:func:`merklog.engine.souffle.parse_souffle_query`), so this module never
    imports the frontends built on it.
    """
    p = parser if parser is not None else Parser(text)
    tok = p.peek()
    if tok.kind == "NAME" and tok.value not in ("true", "false") and not p.is_rel_start():
        nxt = p.peek(1)
        if nxt.kind == "EOF" or (nxt.kind == "OP" and nxt.value == "." and p.peek(2).kind == "EOF"):
            p.i += 1  # ``ok`` for ``ok()``, as in a rule body
            p.accept(".")
            return Atom(tok.value, (), False, p.pos(tok))  # type: ignore[arg-type]
    if not p.is_rel_start():
        raise p.error(
            p.peek(),
            f"expected a query atom such as rel(X, 1), found {describe(p.peek())}",
            head_hint(p.peek()),
        )
    atom, _ = p.atom()
    p.accept(".")
    if p.peek().kind != "EOF":
        raise p.error(
            p.peek(), f"unexpected {describe(p.peek())} after the query atom", "a query is one atom"
        )
    return atom


def parse_query_body(text: str) -> tuple[BodyLiteral, ...]:
    """Parse a query: one atom (``path(1, X)``) or a conjunction of body literals
    (``edge(X, Y), !edge(Y, X), X < 3``); a trailing ``.`` is allowed. Positions
    are those of ``text`` itself, so errors point at what the user typed."""
    p = Parser(text)
    if p.peek().kind == "EOF":
        raise p.error(p.peek(), "empty query", "write an atom such as rel(X, 1)")
    body = p.body()
    p.accept(".")
    if p.peek().kind != "EOF":
        raise p.error(
            p.peek(),
            f"unexpected {describe(p.peek())} after the query",
            "separate the literals of a query with ','",
        )
    return body


def parse_facts(text: str) -> list[Fact]:
    """Parse ground facts ``rel(c, …).`` (for ``merklog put``); rules and variables are errors.

    Bulk data takes the ground-fact reader (:mod:`merklog.engine.factreader`); any text
    outside its subset goes through :func:`parse_facts_general` (same values, and the
    errors with their ``line:col``)."""
    fast = read_ground_facts(text)
    if fast is not None:
        return fast
    return parse_facts_general(text)


def parse_facts_general(text: str) -> list[Fact]:
    """:func:`parse_facts` through the full lexer and parser only."""
    return [fact for fact, _pos in parse_facts_placed(text)]


def parse_facts_placed(text: str) -> list[tuple[Fact, Pos]]:
    """:func:`parse_facts_general`, each fact with the position where its clause starts:
    what names the place of a fact that is refused after it parsed (it does not fit the
    program's declarations, it is over the size limit)."""
    p = Parser(text)
    placed: list[tuple[Fact, Pos]] = []
    facts: list[Fact] = []
    while p.peek().kind != "EOF":
        start = p.peek()
        if start.kind == "DIRECTIVE":  # QA: hinted at --dialect souffle, which put lacks
            raise p.error(
                start,
                f"expected a fact, found {describe(start)}",
                "facts are ground atoms such as edge(1, 2); declarations and directives"
                " belong in a program (merklog load, merklog eval)",
            )
        rules: list[Rule] = []
        before = len(facts)
        p.clause(rules, facts)
        if rules:
            raise _not_ground(p, start, rules[0])
        if len(facts) == before:
            raise p.error(start, "expected a fact")
        pos = p.pos(start)
        placed.extend((fact, pos) for fact in facts[before:])
    return placed


def _not_ground(p: Parser, start: Token, rule: Rule) -> ParseError:
    """The error for a clause ``parse_facts`` cannot store: at the first argument that is
    no constant when the clause is a bare head (``p(X).``, ``q(--1).``), else at the clause."""
    hint = 'facts use constants only: rel(1, "a").'
    if not rule.body and rule.time == "now":
        for arg in rule.head.args:
            if isinstance(arg, Const):
                continue
            what = f"the variable {arg}" if isinstance(arg, Var) else "an expression"
            pos = arg.pos
            return ParseError(f"expected a constant, found {what}", pos.line, pos.col, hint)
    return p.error(start, "expected a ground fact, found a rule", hint)


def parse_literal_value(text: str) -> Value:
    """Parse one constant (``42``, ``-1.5``, ``"s"``, ``true``, ``x"00"``, ``cid"…"``)."""
    p = Parser(text)
    tok = p.peek()
    term = p.unary()
    if not isinstance(term, Const):
        raise p.error(tok, f"expected a constant, found {describe(tok)}")
    if p.peek().kind != "EOF":
        raise p.error(p.peek(), f"unexpected {describe(p.peek())} after the constant")
    return term.value
