"""Adapter for the PyPI ``datalog-conformance`` corpus (its plain-Datalog family).

The corpus writes rules in a looser dialect than merklog: lowercase variables
(``A(a, b, a+b) :- R(a, b)``), relation names with an uppercase initial
(``Ok()``, ``J1(...)``), ``not`` for negation, no final ``.``, and constraints in
parentheses (``(n <= 25)``). Instead of loosening merklog's grammar, this
module rewrites the *tokens* of each rule and feeds them to the unchanged
:class:`~merklog.engine.parser.Parser`:

- an identifier followed by ``(`` is a relation name (token kind ``REL``);
- ``not`` before an atom becomes ``!``;
- any other lowercase identifier except ``true``/``false`` is a variable;
- a parenthesised comparison standing as a whole body literal loses its parentheses;
- a missing final ``.`` is added.

Facts come as Python values and go straight into ``Program.facts``.

Errors: merklog's own error classes already carry the corpus' codes
(``unbound_variable``, ``arity_mismatch``, ``cyclic_negation``); the corpus
groups unsafe negation and a ``_`` in a head as *safety violations*, so those
are re-raised as :class:`SafetyViolationError` (code ``safety_violations``),
chained to the original merklog error.

Documented divergence: the Nemo case ``negation/nemo_negation`` uses variables
that occur only inside a negated atom (``not s3(X, 5, P)``), which Nemo reads
as "there is no P". The Dialog query-engine spec requires every variable of a negated atom to be
bound, and the corpus' own ``errors/review_v2_unsafe_negation`` demands that
such rules be rejected: merklog follows the spec and rejects the program.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from merklog.store import Fact

from .ast import Program
from .checks import CheckedProgram, check_program
from .errors import EngineError, RangeRestrictionError, UnsafeNegationError
from .lexer import Source, Token, tokenize
from .parser import Parser

_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "="})


class SafetyViolationError(EngineError):
    """The corpus' name for unsafe negation and unbindable head wildcards."""

    code = "safety_violations"


def _matching_paren(toks: Sequence[Token], i: int) -> int:
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind == "OP":
            if t.value == "(":
                depth += 1
            elif t.value == ")":
                depth -= 1
                if depth == 0:
                    return j
    return -1


def translate_tokens(toks: list[Token]) -> list[Token]:
    """Rewrite one corpus rule's tokens into the merklog dialect (module docstring)."""
    out: list[Token] = []
    n = len(toks)
    drop: set[int] = set()
    literal_start = False
    for i, tok in enumerate(toks):
        if i in drop:
            continue
        nxt = toks[i + 1] if i + 1 < n else tok
        kind = tok.kind
        if kind == "OP" and tok.value == "(" and literal_start:
            close = _matching_paren(toks, i)
            inner = toks[i + 1 : close]
            after = toks[close + 1] if close + 1 < n else None
            has_cmp = any(t.kind == "OP" and t.value in _COMPARISONS for t in inner)
            ends = (
                after is None
                or after.kind == "EOF"
                or (after.kind == "OP" and after.value in (",", "."))
            )
            if close > 0 and has_cmp and ends:
                drop.add(close)
                literal_start = True
                continue
        literal_start = kind == "OP" and tok.value in (":-", ",")
        if kind in ("NAME", "VAR") and nxt.kind == "OP" and nxt.value == "(":
            out.append(Token("REL", tok.value, tok.offset))
        elif kind == "NAME" and tok.value == "not" and nxt.kind in ("NAME", "VAR"):
            out.append(Token("OP", "!", tok.offset))
            literal_start = True
        elif kind == "NAME" and tok.value not in ("true", "false"):
            out.append(Token("VAR", tok.value, tok.offset))
        elif kind == "OP" and tok.value == "=":
            out.append(Token("OP", "==", tok.offset))
        else:
            out.append(tok)
    if out[-1].kind == "EOF" and (
        len(out) < 2 or not (out[-2].kind == "OP" and out[-2].value == ".")
    ):
        out.insert(len(out) - 1, Token("OP", ".", out[-1].offset))
    return out


def parse_rule_text(text: str) -> Program:
    """Parse one corpus rule (or several, separated by ``.``) into a merklog Program."""
    src = Source(text)
    tokens = translate_tokens(tokenize(text, src))
    parser = Parser(text, tokens)
    return parser.parse_program()


def program_from_case(
    facts: Mapping[str, Iterable[Sequence[Any]]], rules: Iterable[str]
) -> Program:
    """Build a merklog Program from a corpus case's ``facts`` and ``rules``."""
    all_rules = []
    all_facts: list[Fact] = []
    for text in rules:
        prog = parse_rule_text(text)
        all_rules.extend(prog.rules)
        all_facts.extend(prog.facts)
    for rel, rows in facts.items():
        all_facts.extend(Fact(rel, tuple(row)) for row in rows)
    return Program(rules=tuple(all_rules), facts=tuple(all_facts))


def check_case(program: Program) -> CheckedProgram:
    """:func:`check_program`, with errors renamed to the corpus' vocabulary."""
    try:
        return check_program(program)
    except UnsafeNegationError as exc:
        raise SafetyViolationError(exc.message, exc.line, exc.col, exc.hint) from exc
    except RangeRestrictionError as exc:
        if getattr(exc, "wildcard", False):
            raise SafetyViolationError(exc.message, exc.line, exc.col, exc.hint) from exc
        raise


class MerklogConformanceEvaluator:
    """``datalog_conformance.DatalogEvaluator``: parses, checks and evaluates a case
    with merklog's reference batch evaluator; returns ``{relation: set(tuples)}``."""

    def evaluate(self, program: Any) -> dict[str, set[tuple]]:
        from .batch import BatchEvaluator

        prog = program_from_case(program.facts, program.rules)
        checked = check_case(prog)
        strata = [list(s.rules) for s in checked.strata if not s.temporal]
        base: dict[str, set[tuple]] = {}
        for rel, args in prog.facts:
            base.setdefault(rel, set()).add(tuple(args))
        result = BatchEvaluator(prog.rules, strata, checked.int_bits).evaluate(base)
        return {rel: set(result[rel]) for rel in result}


__all__ = [
    "MerklogConformanceEvaluator",
    "SafetyViolationError",
    "check_case",
    "parse_rule_text",
    "program_from_case",
    "translate_tokens",
]
