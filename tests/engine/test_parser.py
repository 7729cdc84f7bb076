"""The merklog (Dialog) parser: every construct of the Dialog query-engine spec and docs/language.md, and its errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from merklog.engine.ast import (
    Aggregate,
    Atom,
    BinOp,
    Comparison,
    Const,
    Neg,
    Negated,
    Positive,
    Var,
)
from merklog.engine.errors import ParseError
from merklog.engine.parser import (
    parse_facts,
    parse_literal_value,
    parse_program,
    parse_query,
    parse_query_body,
)
from merklog.store import Link, format_value

CID = Link.for_dag_cbor(b"\xa0")


def test_facts_of_every_value_type():
    prog = parse_program(
        f'v(1, -2, 1.5, -2.5e3, "a\\"b\\n\\u{{e9}}", true, false, x"00ff", cid"{CID}").'
    )
    assert prog.rules == ()
    assert prog.facts == (("v", (1, -2, 1.5, -2500.0, 'a"b\né', True, False, b"\x00\xff", CID)),)


def test_int64_bounds():
    prog = parse_program("p(-9223372036854775808). p(9223372036854775807).")
    assert [f.args[0] for f in prog.facts] == [-(2**63), 2**63 - 1]
    with pytest.raises(ParseError) as err:
        parse_program("p(1).\np(9223372036854775808).")
    assert (err.value.line, err.value.col) == (2, 3)
    assert "64 signed bits" in err.value.message


def test_rules_both_arrows_and_comments():
    prog = parse_program(
        "% a comment\n"
        "path(X, Y) :- edge(X, Y).  // trailing\n"
        "/* block\n comment */ path(X, Z) :\u2212 path(X, Y), edge(Y, Z).\n"
    )
    assert [str(r) for r in prog.rules] == [
        "path(X, Y) :- edge(X, Y).",
        "path(X, Z) :- path(X, Y), edge(Y, Z).",
    ]
    assert prog.rules[1].pos.line == 4


def test_several_heads_expand_to_one_rule_each():
    prog = parse_program("a(X), b(X)@next :- c(X).")
    assert [(r.head.rel, r.time) for r in prog.rules] == [("a", "now"), ("b", "next")]
    assert prog.rules[0].body == prog.rules[1].body


def test_wildcards_are_distinct_anonymous_vars():
    (rule,) = parse_program("x(X) :- point(X, _), q(_).").rules
    w1 = rule.body[0].atom.args[1]
    w2 = rule.body[1].atom.args[0]
    assert w1.anonymous and w2.anonymous and w1 != w2
    assert str(rule) == "x(X) :- point(X, _), q(_)."


def test_negation_both_spellings():
    (rule,) = parse_program("p(X) :- q(X), !r(X), not s(X).").rules
    assert isinstance(rule.body[1], Negated) and rule.body[1].atom.rel == "r"
    assert isinstance(rule.body[2], Negated) and rule.body[2].atom.rel == "s"


def test_aggregates_and_cid_selection_and_rest():
    (r1, r2) = parse_program(
        "popular(X) :- profile(X), C := count : follower(X, _), C >= 1000.\n"
        "cc(Cat, N) :- Cat := category(...), N := sum Q : product(Cat, Q, ...).\n"
    ).rules
    agg = r1.body[1]
    assert isinstance(agg, Aggregate) and agg.func == "count" and agg.arg is None
    assert agg.result == Var("C") and agg.body[0].atom.rel == "follower"
    sel = r2.body[0]
    assert isinstance(sel, Positive) and sel.cid == Var("Cat") and sel.atom.rest
    assert sel.atom.args == ()
    s = r2.body[1]
    assert isinstance(s, Aggregate) and s.func == "sum" and s.arg == Var("Q")
    assert s.body[0].atom.rest and len(s.body[0].atom.args) == 2
    for func in ("min", "max"):
        (r,) = parse_program(f"m(M) :- M := {func} V : v(V).").rules
        assert r.body[0].func == func


def test_arithmetic_precedence_and_parentheses():
    (rule,) = parse_program("p(X + 2 * Y, -X, (X - 1) % 3) :- q(X, Y), X / 2 < Y - -1.").rules
    a0, a1, a2 = rule.head.args
    assert a0 == BinOp("+", Var("X"), BinOp("*", Const(2), Var("Y")))
    assert a1 == Neg(Var("X"))
    assert a2 == BinOp("%", BinOp("-", Var("X"), Const(1)), Const(3))
    cmp = rule.body[1]
    assert cmp == Comparison("<", BinOp("/", Var("X"), Const(2)), BinOp("-", Var("Y"), Const(-1)))


def test_subtraction_is_left_associative():
    (rule,) = parse_program("r(1 - 2 - 3) :- s(X).").rules
    assert rule.head.args[0] == BinOp("-", BinOp("-", Const(1), Const(2)), Const(3))


def test_percent_is_modulo_after_a_term_and_comment_elsewhere():
    (rule,) = parse_program("p(X) :- q(X), % comment here\n X % 2 == 0.").rules
    assert rule.body[1] == Comparison("==", BinOp("%", Var("X"), Const(2)), Const(0))


def test_all_comparison_operators():
    ops = ["==", "!=", "<", "<=", ">", ">="]
    (rule,) = parse_program("p(X) :- q(X), " + ", ".join(f"X {o} 1" for o in ops) + ".").rules
    assert [lit.op for lit in rule.body[1:]] == ops


def test_next_and_async_heads():
    r1, r2 = parse_program(
        "checkbox(Id, S)@next :- checkbox(Id, S), !clicks(Id).\n"
        "ping(@P, X)@async :- peer(P), want(X).\n"
    ).rules
    assert r1.time == "next" and r1.inductive
    assert r2.time == "async" and r2.head == Atom("ping", (Var("P"), Var("X")))
    assert str(r2) == "ping(@P, X)@async :- peer(P), want(X)."


def test_zero_arity_atoms():
    prog = parse_program("ok() :- p(1). flag. done :- ok, !flag().")
    assert prog.facts == (("flag", ()),)
    assert [str(r) for r in prog.rules] == ["ok() :- p(1).", "done() :- ok(), !flag()."]


def test_query_facts_and_value_entry_points():
    q = parse_query("path(1, X)")
    assert q == Atom("path", (Const(1), Var("X")))
    assert parse_query("path(_, X).").args[0].anonymous
    assert parse_facts('edge(1, 2).\nname(1, "a").') == [("edge", (1, 2)), ("name", (1, "a"))]
    assert parse_literal_value("-3") == -3
    assert parse_literal_value('x"0a"') == b"\n"
    assert parse_literal_value(f'cid"{CID}"') == CID


@pytest.mark.parametrize(
    ("text", "line", "col", "fragment"),
    [
        ("p(X) :- q(X)", 1, 13, "expected ',' or '.'"),
        ("p(X) :-\n  q(X), X = 1.", 2, 11, "'=' is not an operator"),
        ("P(X).", 1, 1, "expected a rule head"),
        ('p("abc).', 1, 3, "unterminated string"),
        ('p("\\q").', 1, 4, "unknown escape"),
        # A malformed \u was Python's "invalid literal for int() with base 16", no position.
        ('p("\\u{}").', 1, 4, "malformed unicode escape"),
        ('p("ab\\u12").', 1, 6, "malformed unicode escape"),
        ('p("\\u{e9").', 1, 4, "malformed unicode escape"),
        ('p("\\u{000000e9}").', 1, 4, "malformed unicode escape"),
        ('p(x"0").', 1, 3, "invalid bytes literal"),
        ('p(cid"bafynope").', 1, 3, "invalid CID literal"),
        ("p(X)@foo :- q(X).", 1, 6, "unknown head annotation"),
        ("p(X)@async :- q(X).", 1, 5, "must mark its destination peer"),
        ("p(@X, Y) :- q(X, Y).", 1, 10, "must be @async"),
        ("p(X, ...) :- q(X).", 1, 6, "not allowed in a rule head"),
        ("p(X) :- Y := X + 1.", 1, 14, "expected an atom or an aggregate"),
        ("p(X) :- q(X), S := sum : r(X).", 1, 24, "needs the aggregated variable"),
        ("p(X) :- q(x).", 1, 11, "unexpected name 'x'"),
        ("p(1) /* open", 1, 6, "unterminated /* comment"),
        ("p(1) # 2.", 1, 6, "unexpected character"),
        ("p(1).\n.decl q(x: number)", 2, 1, "expected a rule head"),
    ],
)
def test_syntax_errors_have_positions(text, line, col, fragment):
    with pytest.raises(ParseError) as err:
        parse_program(text)
    assert (err.value.line, err.value.col) == (line, col), str(err.value)
    assert fragment in err.value.message
    assert str(err.value).startswith(f"{line}:{col}: ")
    assert "\n  hint: " in str(err.value)


def test_parse_facts_rejects_rules_and_variables():
    # At the argument that is no constant, naming what it is.
    with pytest.raises(ParseError, match="found the variable X") as err:
        parse_facts("edge(1, 2).\nedge(X, 2).")
    assert (err.value.line, err.value.col) == (2, 6)
    with pytest.raises(ParseError, match="found the variable _") as err:
        parse_facts("edge(1, _).")
    assert (err.value.line, err.value.col) == (1, 9)
    for text in ("q(--1).", "q(-(1)).", "q(1 + 2)."):
        with pytest.raises(ParseError, match="expected a constant, found an expression") as err:
            parse_facts(text)
        assert (err.value.line, err.value.col) == (1, 3)
    with pytest.raises(ParseError, match="found a rule") as err:
        parse_facts("p(X) :- q(X).")
    assert (err.value.line, err.value.col) == (1, 1)


@pytest.mark.parametrize(
    ("text", "what"),
    [('x"01"', "bytes"), ('"a"', "a string"), ("true", "a boolean"), ("false", "a boolean")],
)
def test_minus_before_a_constant_that_is_no_number_is_refused_where_written(text, what):
    # It used to parse, as a fact in a program and in a rule, and derive nothing.
    for parse, source in (
        (parse_program, f"p({text}).\np(-{text})."),
        (parse_program, f"p(1).\nq(Y) :- p(X), Y == -{text}."),
        (parse_facts, f"p({text}).\np(-{text})."),
    ):
        with pytest.raises(ParseError, match=f"'-' applies to numbers, not to {what}") as err:
            parse(source)
        line = source.splitlines()[1]
        assert (err.value.line, err.value.col) == (2, line.rindex("-") + 1)
    assert parse_program("p(- 1.5). q(-(-2)).")  # numbers and expressions still parse


def test_bulk_fact_fast_path_agrees_with_the_tokenizer():
    from merklog.engine.parser import Parser

    text = (
        "% header\n"
        "edge(1, 2).\n"
        "p(X) :-\n"
        "  q(X),\n"
        "  edge(7, 8).\n"  # a body line that looks like a fact
        '  name(3, "x, y").  % trailing comment\n'
        "edge(-4, 5).\n"
        "v(1.5).\n"
        "big(123456789012345678901).\n"
        "empty().\n"
    )
    with pytest.raises(ParseError) as err:
        parse_program(text)
    assert (err.value.line, err.value.col) == (9, 5)
    text = text.replace("big(123456789012345678901).\n", "")
    fast = parse_program(text)
    slow = Parser(text).parse_program()
    assert fast.facts == slow.facts
    assert fast.fact_positions == slow.fact_positions
    assert fast.rules == slow.rules
    assert [f.rel for f in fast.facts] == ["edge", "name", "edge", "v", "empty"]
    assert fast.rules[0].body[1].atom.args == (Const(7), Const(8))


VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f if f != 0 else 0.0),
    st.text(),
    st.binary(max_size=16),
    st.booleans(),
    st.binary(min_size=1, max_size=8).map(Link.for_dag_cbor),
)


@given(st.lists(VALUES, max_size=5))
def test_format_value_round_trips_through_the_parser(values):
    text = "v(" + ", ".join(format_value(v) for v in values) + ").\n"
    (fact,) = parse_program(text).facts
    assert fact.args == tuple(values)
    assert [type(a) for a in fact.args] == [type(v) for v in values]
    for v in values:
        assert parse_literal_value(format_value(v)) == v


@given(
    st.lists(
        st.one_of(
            st.text(),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.booleans(),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        max_size=4,
    )
)
def test_a_rendered_fact_is_one_line_of_printable_text(values):
    """Output lines are ``CID<TAB>fact``: a string holding a tab, a carriage return, an
    escape or a Unicode line separator used to be printed raw, so the line could not be
    cut at its tab or read back with ``put -f``. Every such character is escaped, by
    :func:`format_value` and by the one-call rendering of ``put`` (``args_texts``)."""
    from merklog.store.values import args_texts

    rendered = ", ".join(format_value(v) for v in values)
    fast = args_texts([values])
    texts = [rendered] if fast is None else [rendered, fast[0]]
    for text in texts:
        assert text.splitlines() == ([text] if text else [])
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text), text
        (fact,) = parse_program(f"v({text}).\n").facts
        assert [(type(a), a) for a in fact.args] == [(type(v), v) for v in values]


@pytest.mark.parametrize(
    "char", ["\t", "\r", "\0", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\x0b"]
)
def test_every_control_and_line_break_is_escaped(char: str) -> None:
    text = format_value(f"a{char}b")
    assert char not in text and parse_literal_value(text) == f"a{char}b"


@pytest.mark.parametrize(
    "term, col",
    [
        ("Y" + " + 1" * 101, 422),  # a chain of additions: the 101st '+'
        ("- " * 101 + "Y", 220),  # minus signs on minus signs: the 101st '-'
        ("(" * 101 + "Y" + ")" * 101, 120),  # parentheses in parentheses: the 101st '('
        ("(" * 5000 + "Y" + ")" * 5000, 120),  # far beyond: still a position, no overflow
        # Operators in parentheses: the outermost '+' whose term is 101 operators deep.
        ("Y" + " * (1 + 1" * 60 + ")" * 60, 108),
    ],
)
def test_terms_nest_at_most_max_term_depth(term: str, col: int) -> None:
    """A term nested beyond MAX_TERM_DEPTH is a syntax error at the operator or
    parenthesis that goes too deep, not an overflow of Python's stack (an internal
    error); one level less parses."""
    from merklog.engine.parser import MAX_TERM_DEPTH

    assert MAX_TERM_DEPTH == 100
    text = f"q(1).\np(X) :- q(Y), X == {term}."
    with pytest.raises(ParseError, match="nests more than 100 levels deep") as err:
        parse_program(text)
    assert (err.value.line, err.value.col) == (2, col)
    for fine in ("Y" + " + 1" * 100, "- " * 100 + "Y", "(" * 100 + "Y" + ")" * 100):
        parse_program(f"q(1).\np(X) :- q(Y), X == {fine}.")
    with pytest.raises(ParseError, match="nests more than"):
        parse_facts("x(" + "(" * 200 + "1" + ")" * 200 + ").")


def test_a_zero_arity_query_may_omit_its_parentheses():
    """language.md writes zero-arity relations ``ok()`` (or ``ok``); ``merklog query 'ok'``
    failed with "unexpected name 'ok' where a term is expected"."""
    for text in ("ok", "ok.", "ok()"):
        assert parse_query(text) == Atom("ok", ())
        (lit,) = parse_query_body(text)
        assert lit.atom == Atom("ok", ())
    assert [lit.atom.rel for lit in parse_query_body("ok, done")] == ["ok", "done"]
    with pytest.raises(ParseError):
        parse_query("ok extra")


@pytest.mark.parametrize("literal", ["1" * 5001, "-" + "1" * 5001, "0x" + "f" * 5001])
def test_an_integer_literal_too_long_for_int_is_a_parse_error(literal: str) -> None:
    """A 5,001-digit literal gave Python's "Exceeds the limit (4300 digits) for integer
    string conversion … sys.set_int_max_str_digits()", with no position, from every
    parser path (put, eval, query)."""
    for parse in (parse_program, parse_facts):
        with pytest.raises(ParseError) as err:
            parse(f"e({literal}, 2).\n")
        assert "out of range" in err.value.message and err.value.line == 1
    with pytest.raises(ParseError):
        parse_query(f"e({literal})")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('s("\ud800").', (1, 4), "string holds '\\ud800'"),  # the fast fact reader's shape
        ('ok(1).\ns("a\\n\udc00", 1).', (2, 7), "string holds '\\udc00'"),
        ('p(X) :- e(X), X != "\ud83d".', (1, 21), "string holds '\\ud83d'"),
        ("% \ud800\ns(1).", (1, 3), "text holds '\\ud800'"),  # a comment
    ],
)
def test_a_lone_surrogate_is_a_parse_error_at_its_position(text, where, what) -> None:
    """Text decoded from JSON can hold a lone surrogate, which no UTF-8 (so no block, no
    stored program) holds: it failed later as the DAG-CBOR encoder's UnicodeEncodeError,
    with no position. The parser and the fast fact reader refuse it where it is."""
    for parse in (parse_program, parse_facts):
        if parse is parse_facts and ":-" in text:
            continue
        with pytest.raises(ParseError) as info:
            parse(text)
        assert (info.value.line, info.value.col) == where
        assert info.value.message == f"{what}, a lone surrogate (strings must be valid Unicode)"


@pytest.mark.parametrize(
    ("text", "place"),
    [
        ("p(X) :- q(X).\n\n   r(X) :- p(X), !s(X)\n", (3, 23)),  # right after !s(X)
        ("p(1, 2, 3)\n", (1, 11)),
        ("p(1) :- q(1)  /* a comment */ \n\n\n", (1, 13)),
        ("p(", (1, 3)),
    ],
)
def test_an_error_at_the_end_of_input_points_right_after_the_last_token(
    text: str, place: tuple[int, int]
) -> None:
    """A rule missing its final ``.`` was reported on the line after the text (``4:1``
    for a 3-line file), where an editor's "go to line" lands nowhere: the error now
    points just after the last token, where the ``.`` belongs."""
    with pytest.raises(ParseError) as err:
        parse_program(text)
    assert (err.value.line, err.value.col) == place
    assert "found end of input" in str(err.value)
