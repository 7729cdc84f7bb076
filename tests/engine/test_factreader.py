"""The ground-fact fast path (engine/factreader.py) gives exactly what the full parser
gives: the same values with the same types on mixed-type facts in every literal
spelling, and, for anything outside its subset, the parser's own error and line:col."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merklog.engine.errors import EngineError, ParseError
from merklog.engine.factreader import read_ground_facts, split_fact_lines
from merklog.engine.parser import Parser, parse_facts, parse_facts_general, parse_program
from merklog.store import Link

CID = Link.for_dag_cbor(b"\xa0")


def typed(facts: list) -> list:
    """Facts with each value tagged by its exact type (``1``, ``1.0``, ``true`` differ;
    ``-0.0`` and ``0.0`` differ by repr)."""
    return [(rel, tuple((type(v).__name__, repr(v)) for v in args)) for rel, args in facts]


def outcome(fn, text: str):
    try:
        return ("ok", typed(fn(text)))
    except ParseError as exc:
        return ("error", str(exc), exc.line, exc.col)


def _int_spellings(n: int) -> st.SearchStrategy[str]:
    mag = abs(n)
    sign = "-" if n < 0 else ""
    return st.sampled_from(
        [f"{sign}{mag}", f"{sign}{mag:#x}", f"{sign}{mag:#X}", f"{sign}{mag:#b}", f"{sign}0{mag}"]
    )


def _str_spelling(s: str) -> str:
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) > 127 and ord(ch) % 2:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_BOUNDS = [
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",  # one past int64 either way: the parser's error
    "-9223372036854775809",
    "0x7fffffffffffffff",
    "-0x8000000000000000",
    "1.7976931348623157e308",
    "5e-324",
    "-1E-7",
    "1e+2",
    "-0.0",
    "0.0",
    "1.0",
]
_literal = st.one_of(
    st.integers(-(2**63), 2**63 - 1).flatmap(_int_spellings),
    st.sampled_from(_BOUNDS),
    st.integers(-(2**70), 2**70).map(str),  # some out of int64: the parser's error
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0.0", "-0.0", "1.5e3", "-2E-3", "1e999", "1e-400", "0.0e-999", "7e0", "1.0"]),
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\f"), max_size=6
    ).map(_str_spelling),
    st.sampled_from(["true", "false", 'x"00ff"', 'x""', 'x"abc"', 'x"00 11"', f'cid"{CID}"']),
    st.sampled_from(['"\\q"', '"\\u{d800}"', 'cid"bnot"', "X", "_", "1 + 2", "- 5", "f(1)"]),
    st.sampled_from(['"a,b)."', '"%"', '"//"', '"/*"']),
)
_space = st.sampled_from(["", " ", "  ", "\t"])
_gap = st.sampled_from(["\n", "\n\n", " ", "\n% note\n", "\n// note\n", "\r\n", "\n/* c */\n"])


@st.composite
def fact_texts(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        rel = draw(st.sampled_from(["edge", "p", "true", "a_B9", "Bad", "x"]))
        args = draw(st.lists(_literal, max_size=4))
        sp = draw(_space)
        body = f"{sp},{draw(_space)}".join(args)
        end = draw(st.sampled_from([".", ".", ".", ". ", "", ":- q(X).", "@next."]))
        parts.append(f"{rel}{draw(_space)}({sp}{body}{sp}){sp}{end}")
        parts.append(draw(_gap))
    return "".join(parts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fact_texts())
def test_fast_path_equals_the_parser(text: str) -> None:
    assert outcome(parse_facts, text) == outcome(parse_facts_general, text)
    fast = read_ground_facts(text)
    if fast is not None:  # when the fast path answers, it is the parser's answer
        assert ("ok", typed(fast)) == outcome(parse_facts_general, text)


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from('ab(),.-1x"\\ \n%/*e0'), max_size=30))
def test_fast_path_equals_the_parser_on_noise(text: str) -> None:
    assert outcome(parse_facts, text) == outcome(parse_facts_general, text)


def test_fast_path_reads_every_value_type() -> None:
    text = (
        f'v(1, -2, 0x10, -0b11, 1.5, -2.5e3, -0.0, "a\\"b\\n\\u{{e9}}", true, false, '
        f'x"00ff", cid"{CID}").\n% c\nw().\n'
    )
    facts = read_ground_facts(text)
    assert facts is not None
    assert typed(facts) == typed(
        [
            ("v", (1, -2, 16, -3, 1.5, -2500.0, -0.0, 'a"b\né', True, False, b"\x00\xff", CID)),
            ("w", ()),
        ]
    )


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("p(1).\np(9223372036854775808).", 2, 3),
        ('p(1).\np("\\q").', 2, 4),
        ('p(1).\np(x"abc").', 2, 3),
        ("p(1).\np(1e999).", 2, 3),
        ("p(1).\np(1e-400).", 2, 3),
        ("p(0.0, 1.5).\np(0.0, 1e-400).", 2, 8),
        ("p(1).\np(X).", 2, 3),
    ],
)
def test_errors_keep_line_and_column(text: str, line: int, col: int) -> None:
    assert read_ground_facts(text) is None
    with pytest.raises(ParseError) as err:
        parse_facts(text)
    assert (err.value.line, err.value.col) == (line, col)
    assert outcome(parse_facts, text) == outcome(parse_facts_general, text)


_line_literal = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(_BOUNDS),
    st.integers(-(2**70), 2**70).map(str),  # out of int64: the parser's error
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        ["0.0", "-0.0", "1.5e3", "-2E-3", "1e999", "1e-400", "0.0e-999", "7e0", "1.0", "-0", "007"]
    ),
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters='\\"\n\r\f'),
        max_size=6,
    ).map(lambda s: f'"{s}"'),
    st.sampled_from(["true", "false", "NaN", "Infinity", "-Infinity", "null", 'x"00"']),
    st.sampled_from(["0x1F", "[1]", "{}", '"[", "]"', "1,", ",", "- 5", "X"]),
)


@st.composite
def fact_lines(draw: st.DrawFn) -> str:
    """Texts in the one-fact-per-line shape the JSON bulk path reads, and near misses."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        rel = draw(st.sampled_from(["edge", "p", "true", "a_B9", "Bad"]))
        sep = draw(st.sampled_from([", ", ",", " , ", ",\t"]))
        args = sep.join(draw(st.lists(_line_literal, max_size=4)))
        end = draw(st.sampled_from([".", ".", " .", ". ", "", ". % c", ".\r", ". p(1)."]))
        lines.append(f"{draw(_space)}{rel}({args}){end}")
        lines.extend([""] * draw(st.integers(0, 1)))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fact_lines())
def test_json_line_path_equals_the_parser(text: str) -> None:
    """``1``, ``1.0``, ``true`` and ``"1"`` keep their types; anything JSON reads other
    than the parser (NaN, null, 007, out-of-range numbers) falls back to the parser."""
    from merklog.engine.factreader import read_fact_lines

    assert outcome(parse_facts, text) == outcome(parse_facts_general, text)
    bulk = read_fact_lines(text)
    if bulk is not None:
        facts, lines = bulk
        assert ("ok", typed(facts)) == outcome(parse_facts_general, text)
        assert len(lines) == len(facts)
        for line, fact in zip(lines, facts, strict=True):  # each line holds its own fact
            assert typed(parse_facts_general(line)) == typed([fact])


def test_json_line_path_keeps_value_types() -> None:
    from merklog.engine.factreader import read_fact_lines

    text = 'p(1).\np(1.0).\np(true).\np("1").\n\np(-0.0, 9223372036854775807, "a b").\n'
    bulk = read_fact_lines(text)
    assert bulk is not None
    assert typed(bulk[0]) == typed(
        [("p", (1,)), ("p", (1.0,)), ("p", (True,)), ("p", ("1",)), ("p", (-0.0, 2**63 - 1, "a b"))]
    )
    for fallback in ("p(NaN).", "p(null).", "p(007).", "p(1). p(2).", "p(1e999).", "p([1])."):
        assert read_fact_lines(fallback) is None, fallback


def program_outcome(parse, text: str):
    """A program's facts (typed), their ``line:col``, its rules and declarations, or
    its error with ``line:col``."""
    try:
        prog = parse(text)
    except EngineError as exc:  # syntax, or a later check such as an undeclared relation
        return ("error", type(exc).__name__, str(exc), exc.line, exc.col)
    positions = [(p.line, p.col) for p in prog.fact_positions]
    return ("ok", typed(prog.facts), positions, prog.rules, prog.declarations)


_rule_lines = st.sampled_from(
    [
        "q(X) :- p(X, 1).",
        "q(X) :-",  # a rule over several lines: the next line is no clause start
        "  p(X, 2), X > 1.",
        "r(X) :- p(X, _), !q(X).",
        ".decl p(a: any, b: any).",
        "/* block",
        "p(1, 2). */",
        "c(N) :- N := count : p(_, _).",
        "p(X).",
        "% p(1, 2).",
        "p(1), p(2).",
        "p(1) :- q(1).",
        "p(1 + 2).",
    ]
)


@st.composite
def program_texts(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            lines.append(draw(_rule_lines))
            continue
        facts = []
        for _ in range(draw(st.integers(1, 2))):
            rel = draw(st.sampled_from(["p", "q", "edge", "true"]))
            args = f"{draw(_space)},{draw(_space)}".join(draw(st.lists(_literal, max_size=3)))
            facts.append(f"{rel}({args}).")
        tail = draw(st.sampled_from(["", " % note", " // note", "\r", " "]))
        lines.append(draw(_space) + " ".join(facts) + tail.replace("\\r", "\r"))
    return "\n".join(lines)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program_texts())
def test_program_facts_read_as_the_parser_reads_them(text: str) -> None:
    """``parse_program`` (the reader takes the fact lines first) gives the facts, their
    ``line:col``, the rules and the errors the parser alone gives, on mixed-type values."""
    assert program_outcome(parse_program, text) == program_outcome(
        lambda t: Parser(t).parse_program(), text
    )


def test_program_fact_lines_keep_their_positions() -> None:
    text = (
        "p(1).\n  p(1.0). p(true). % three values\nq(X) :-\n  p(X).\n"
        'p("1"). p(x"01"). p(-0.0).\n\tp(9223372036854775807, -9223372036854775808).\n'
    )
    found, rest = split_fact_lines(text)
    assert [(p.line, p.col) for p, _ in found] == [
        (1, 1),
        (2, 3),
        (2, 11),
        (5, 1),
        (5, 9),
        (5, 19),
        (6, 2),
    ]
    assert typed([f for _, f in found]) == typed(
        [
            ("p", (1,)),
            ("p", (1.0,)),
            ("p", (True,)),
            ("p", ("1",)),
            ("p", (b"\x01",)),
            ("p", (-0.0,)),
            ("p", (2**63 - 1, -(2**63))),
        ]
    )
    assert rest.split("\n") == ["", "", "q(X) :-", "  p(X).", "", "", ""]
    assert program_outcome(parse_program, text) == program_outcome(
        lambda t: Parser(t).parse_program(), text
    )


@pytest.mark.parametrize("text", ["% p(1, 2).\n", "p(0). // p(1, 2).\n", "p(0).\n  %p(1).\n"])
def test_commented_out_facts_are_not_read(text: str) -> None:
    """Regression: the per-fact regex let a comment give back its text, so ``put`` of
    ``% p(1, 2).`` stored ``p(1, 2)``."""
    assert typed(parse_facts(text)) == typed(parse_facts_general(text))
    assert ("p", (1, 2)) not in parse_facts(text)
    assert [f for _, f in split_fact_lines(text)[0]] == [f for f in parse_facts(text)]


def test_program_errors_keep_line_and_column() -> None:
    text = "p(1).\np(2). p(9223372036854775808).\nq(X) :- p(X).\n"
    with pytest.raises(ParseError) as err:
        parse_program(text)
    assert (err.value.line, err.value.col) == (2, 9)


_souffle_literal = st.one_of(
    _literal,
    st.sampled_from(["2147483647", "-2147483648", "2147483648", "-2147483649", "0x7fffffff"]),
)
_souffle_rules = st.sampled_from(
    [
        "r(x) :- p(x, _).",
        "r(x) :-",
        "  p(x, 2), x > 1.",
        ".output r",
        "p(1, 2) :- q(1).",
        "z(1, 2).",  # undeclared: the parser's error, at its position
        "p(x, 1).",
    ]
)


@st.composite
def souffle_texts(draw: st.DrawFn) -> str:
    lines = [".decl p(a: number, b: number)", ".decl q(a: number)", ".decl r(a: number)"]
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            lines.append(draw(_souffle_rules))
            continue
        rel = draw(st.sampled_from(["p", "q", "r"]))
        args = ", ".join(draw(st.lists(_souffle_literal, max_size=2)))
        lines.append(f"{draw(_space)}{rel}({args}).{draw(st.sampled_from(['', ' // c', ' ']))}")
    return "\n".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(souffle_texts())
def test_souffle_program_facts_read_as_its_parser_reads_them(text: str) -> None:
    """The Soufflé frontend takes fact lines through the same reader, with its 32-bit
    integer range: same facts, positions, rules and errors as its parser alone."""
    from merklog.engine.souffle import SouffleParser, parse_souffle

    assert program_outcome(parse_souffle, text) == program_outcome(
        lambda t: SouffleParser(t).parse_program(), text
    )
