"""Optional relation declarations in the merklog dialect: ``.decl rel(col: type, …).``"""

from __future__ import annotations

import pytest

from merklog.engine import Program
from merklog.engine.errors import ArityError, DeclarationError, ParseError
from merklog.engine.program import detect_dialect
from merklog.engine.schema import Schema, value_fits
from merklog.node.errors import NodeInputError
from merklog.node.programs import compile_program
from merklog.store import Link, fact_cid, make_fact

DECL = ".decl edge(src: int, dst: int).\n.decl label(node: any, text: str).\n"


def test_declarations_parse_in_the_merklog_dialect() -> None:
    prog = Program.parse(DECL + "path(X, Y) :- edge(X, Y).")
    assert prog.dialect == "merklog" and detect_dialect(DECL) == "merklog"
    decls = {d.rel: d.columns for d in prog.ast.declarations}
    assert decls == {
        "edge": (("src", "int"), ("dst", "int")),
        "label": (("node", "any"), ("text", "str")),
    }
    assert Program.parse(".decl flag(bool).").ast.declarations[0].columns == (("_0", "bool"),)
    # Soufflé's .decl (no period, Soufflé types) still selects the Soufflé frontend.
    assert detect_dialect(".decl edge(x: number, y: number)\n") == "souffle"


def test_a_declaration_fixes_the_arity() -> None:
    with pytest.raises(ArityError) as err:
        Program.parse(DECL + "r(X) :-\n  edge(X).")
    assert err.value.message == "edge has arity 2 at 1:1 and 1 at 4:3"


def test_inline_facts_must_fit_their_declaration() -> None:
    with pytest.raises(DeclarationError) as err:
        Program.parse(DECL + "edge(1, 2).\nedge(1, 2.0).")
    assert (err.value.line, err.value.col) == (4, 1)
    assert "column dst of edge is int" in err.value.message and "got float 2.0" in err.value.message
    Program.parse(DECL + 'edge(1, 2). label(x"00", "a"). label(1.5, "b").')


def test_bad_declarations_are_parse_errors_with_positions() -> None:
    with pytest.raises(ParseError) as err:
        Program.parse(".decl edge(src: integer).")
    assert (err.value.line, err.value.col) == (1, 17) and "column type" in err.value.message
    with pytest.raises(DeclarationError, match="declared twice"):
        Program.parse(".decl e(int).\n.decl e(str).")


def test_types_follow_value_identity() -> None:
    assert value_fits(1, "int") and not value_fits(True, "int") and not value_fits(1.0, "int")
    assert value_fits(1.0, "float") and not value_fits(1, "float")
    assert value_fits(True, "bool") and not value_fits(1, "bool")
    link = fact_cid(make_fact("p", (1,)))
    assert isinstance(link, Link) and value_fits(link, "cid") and not value_fits(b"x", "cid")
    assert value_fits(b"\x01", "bytes") and value_fits("s", "str") and value_fits(None, "any")


def test_schema_checks_facts_for_put_and_evaluate() -> None:
    prog = Program.parse(DECL + "path(X, Y) :- edge(X, Y).")
    schema = prog.checked.schema
    assert isinstance(schema, Schema) and schema.problem("edge", (1, 2)) is None
    assert schema.problem("other", (1.5, True)) is None  # undeclared: anything goes
    assert "arity 2" in (schema.problem("edge", (1, 2, 3)) or "")
    with pytest.raises(DeclarationError) as err:
        prog.evaluate({"edge": [(1, 2), (1, "x")]})
    assert str(err.value).startswith('edge(1, "x") does not fit: column dst of edge is int')


def test_node_runner_refuses_a_fact_that_does_not_fit() -> None:
    runner = compile_program(DECL + "path(X, Y) :- edge(X, Y).")
    runner.check_fact(make_fact("edge", (1, 2)))
    with pytest.raises(NodeInputError, match=r"edge\(1, true\) does not fit"):
        runner.check_fact(make_fact("edge", (1, True)))


SOUFFLE = ".decl p(x: number)\n.decl u(x: unsigned)\n.decl q(x: number)\n.output q\nq(x + 1) :- p(x).\n"


def test_souffle_integer_columns_hold_32_bits_on_every_path() -> None:
    """eval refused 2147483648 in a fact file but took ``p(1.5).`` inline, while a node
    refused 1.5 at put but stored ``p(9223372036854775807)``, from which the rule's
    32-bit arithmetic derived ``q(0)``: one rule now, on each path."""
    assert value_fits(2**31 - 1, "number") and not value_fits(2**31, "number")
    assert value_fits(-(2**31), "number") and not value_fits(-(2**31) - 1, "number")
    assert value_fits(2**32 - 1, "unsigned") and not value_fits(2**32, "unsigned")
    assert not value_fits(-1, "unsigned") and not value_fits(True, "number")
    runner = compile_program(SOUFFLE)
    runner.check_fact(make_fact("p", (2**31 - 1,)))
    with pytest.raises(NodeInputError, match="outside its 32-bit range"):
        runner.check_fact(make_fact("p", (2**63 - 1,)))
    with pytest.raises(NodeInputError, match="got float 1.5"):
        runner.check_fact(make_fact("p", (1.5,)))
    with pytest.raises(DeclarationError) as err:  # inline facts, as in the merklog dialect
        Program.parse(SOUFFLE + "p(1).\np(1.5).\n")
    assert (err.value.line, err.value.col) == (7, 1)


@pytest.mark.parametrize("lead", ["\ufeff", "\ufeff\n", "\ufeff// saved by an editor\n"])
def test_a_program_saved_with_a_byte_order_mark_reads_as_without_it(lead: str) -> None:
    """Editors on Windows save UTF-8 with a byte-order mark. The lexer skips it as
    whitespace, and a ``.decl`` right after it is still a declaration: it was "expected a
    rule head (an atom), found '.'" at 1:2."""
    text = DECL + 'path(X, Y) :- edge(X, Y).\nlabel(1, "x").\n'
    plain, marked = Program.parse(text), Program.parse(lead + text)
    assert marked.dialect == plain.dialect == "merklog" and detect_dialect(lead + text) == "merklog"
    assert marked.ast.declarations == plain.ast.declarations
    assert [str(r) for r in marked.ast.rules] == [str(r) for r in plain.ast.rules]


def test_a_souffle_program_saved_with_a_byte_order_mark_is_still_souffle() -> None:
    """The dialect is told by the first directive, also right after a byte-order mark."""
    text = ".decl e(a: number)\n.decl p(a: number)\n.output p\ne(1).\np(X) :- e(X).\n"
    assert detect_dialect("\ufeff" + text) == detect_dialect(text) == "souffle"
    assert Program.parse("\ufeff" + text).dialect == "souffle"


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        (".decl e(a: int). e(1). r(X) :- e(X).", "merklog"),  # declaration and clauses, one line
        (".decl e(a: int,\n        b: str).\ne(1, \"x\").", "merklog"),  # over two lines
        (".decl e(a: int). /* c */\ne(1).", "merklog"),  # a comment after it
        ("e(1).\n/* old version:\n.output r\n*/\nr(X) :- e(X).", "merklog"),  # in a comment
        ('p(".decl x").', "merklog"),  # in a string
        (".decl edge(x: number, y: number)\n.input edge\n", "souffle"),
        (".decl a(x: number) btree\n", "souffle"),
        (".decl e(a: int)\n.output e", "souffle"),  # no period: Soufflé's
        ('#include "x.dl"\n.decl a(x: number)\n', "souffle"),  # no merklog token: by lines
    ],
)
def test_auto_tells_the_dialects_apart_on_tokens(text: str, dialect: str) -> None:
    """QA: auto read the text line by line, so valid merklog programs were parsed as
    Soufflé (and failed) when a declaration shared its line with clauses or a comment,
    spanned two lines, or a Soufflé directive sat in a block comment."""
    assert detect_dialect(text) == dialect
    if dialect == "merklog":
        Program.parse(text)  # and auto parses it
