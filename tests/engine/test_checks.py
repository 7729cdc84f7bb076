"""Static checks: each error class with its message, line and column."""

from __future__ import annotations

import pytest

from merklog.engine.ast import Atom, Const, Declaration, Program, Var
from merklog.engine.checks import check_program, check_query
from merklog.engine.errors import (
    AggregateScopeError,
    ArityError,
    AsyncHeadError,
    EngineError,
    NextRuleFinitenessError,
    RangeRestrictionError,
    UnknownRelationError,
    UnsafeNegationError,
    UnstratifiableError,
)
from merklog.engine.parser import parse_program, parse_query

SEED_EXAMPLES = """
xCoordinate(X) :- point(X, _).
zeroPoint(0, Y) :- point(0, Y).
zeroPoint(X, 0) :- point(X, 0).
popularProfile(X) :-
    profile(X),
    C := count : follower(X, _),
    C >= 1000.
suggestedMeal(PersonA, PersonB, Food) :-
  person(PersonA), person(PersonB), PersonA != PersonB,
  likes(PersonA, Food), !dislikes(PersonB, Food).
totalStock(Total) :- Total := sum Quantity : product(Name, Category, Quantity).
categoryStock(Category, Total) :-
  productCategory(Category),
  Total := sum Quantity : product(_, Category, Quantity).
diagonal(X, Y) :- point(X, Y), X <= Y.
categoryCount(Category, Count) :-
    Category := category(...),
    Count := count : product(Category, ...).
checkbox(Id, S)@next     :- checkbox(Id, S), !clicks(Id).
checkbox(Id, true)@next  :- checkbox(Id, false), clicks(Id).
checkbox(Id, false)@next :- checkbox(Id, true), clicks(Id).
ping(@P, X)@async :- peer(P), want(X).
next(X, Y) :- point(X, Y), Y == X + 1.
"""


def test_every_seed_example_passes_the_checks():
    checked = check_program(parse_program(SEED_EXAMPLES))
    assert checked.arities["point"] == 2 and checked.arities["product"] == 3
    assert "point" in checked.edb and "clicks" in checked.edb
    assert {"checkbox", "ping", "diagonal"} <= checked.idb
    assert checked.int_bits == 64


def err(text: str, cls: type[EngineError]) -> EngineError:
    with pytest.raises(cls) as info:
        check_program(parse_program(text))
    assert type(info.value) is cls
    return info.value


def where(e: EngineError) -> tuple[int, int]:
    return e.line, e.col


def test_range_restriction_head_variable():
    e = err("p(X) :-\n  q(Y).", RangeRestrictionError)
    assert where(e) == (1, 3)
    assert e.message == "variable X in the head p(X) is not bound by a positive body predicate"
    assert str(e).startswith("1:3: variable X") and "\n  hint: bind it" in str(e)


def test_range_restriction_comparison_and_arithmetic_arguments():
    e = err("p(X) :- q(X), X < Y.", RangeRestrictionError)
    assert where(e) == (1, 19) and "comparison X < Y" in e.message
    e = err("fib(N, A) :- fib(N - 1, A), N <= 25.", RangeRestrictionError)
    assert where(e) == (1, 18) and "variable N in an arithmetic argument" in e.message


def test_range_restriction_wildcard_in_head():
    e = err("ok(_) :- ok(_).", RangeRestrictionError)
    assert where(e) == (1, 4)
    assert e.message == "a wildcard _ in the head ok(_) can never be bound"


def test_equality_binds_and_unbound_equality_does_not():
    check_program(parse_program("p(Y) :- q(X), Y == X * 2."))
    check_program(parse_program("p(Y) :- q(X), X + 1 == Z, Y == Z."))
    e = err("p(Y) :- q(X), Y == Z.", RangeRestrictionError)
    assert where(e) == (1, 15) and "comparison Y == Z" in e.message


def test_unsafe_negation():
    e = err("ok(X) :- person(X),\n    !banned(X, Y).", UnsafeNegationError)
    assert where(e) == (2, 16)
    assert e.message == (
        "variable Y of the negated atom banned(X, Y) is not bound by a positive predicate"
    )
    # A wildcard inside a negation means "any value": allowed.
    check_program(parse_program("ok(X) :- person(X), !banned(X, _)."))


def test_aggregate_parameter_must_be_otherwise_unbound():
    e = err(
        "totalStock(Total) :-\n"
        "  product(Name, Category, Quantity),\n"
        "  Total := sum Quantity : product(_, _, Quantity).",
        AggregateScopeError,
    )
    assert where(e) == (3, 16)
    assert "aggregated variable Quantity must be otherwise unbound" in e.message


def test_aggregate_parameter_appears_once():
    e = err("t(N) :- N := max Q : p(Q, Q).", AggregateScopeError)
    assert where(e) == (1, 18)
    assert "must appear exactly once in p(Q, Q) (it appears 2 times)" in e.message


def test_aggregate_local_variable_is_not_visible_outside():
    e = err(
        "totalStock(Category, Total) :- Total := sum Q : product(_, Category, Q).",
        AggregateScopeError,
    )
    assert where(e) == (1, 12)
    assert "Category is bound only inside the aggregate at 1:32" in e.message
    e = err("p(N) :- N := count : q(X), X > 1.", AggregateScopeError)
    assert "shared between the aggregate and the rest of the body" in e.message
    assert where(e) == (1, 24)


def test_aggregate_result_inside_its_own_body():
    e = err("p(N) :- q(N2), N := count : r(N).", AggregateScopeError)
    assert where(e) == (1, 16) and "aggregate result N also appears inside" in e.message


def test_arity_mismatch_between_facts_rules_and_declarations():
    e = err("edge(1, 2).\nedge(1, 2, 3).", ArityError)
    assert where(e) == (2, 1)
    assert e.message == "edge has arity 2 at 1:1 and 3 at 2:1"
    e = err("p(X) :- q(X).\nr(X) :- q(X, X).", ArityError)
    assert where(e) == (2, 9)
    e = err("p(X) :- q(X, Y, ...).\nq(1).", ArityError)
    assert where(e) == (1, 9) and "names 2" in e.message
    prog = Program(
        rules=parse_program("p(X) :- q(X).").rules,
        declarations=(Declaration("q", (("a", "number"), ("b", "number"))),),
    )
    with pytest.raises(ArityError):
        check_program(prog)


def test_rest_pattern_arity():
    check_program(parse_program("p(X) :- q(X, ...). q(1, 2, 3)."))
    e = err("q(1).\np(X) :- q(X, Y, ...).", ArityError)
    assert where(e) == (2, 9) and "names 2" in e.message


def test_unstratifiable_names_the_cycle():
    e = err("a(X) :- b(X), !c(X).\nc(X) :- d(X), a(X).", UnstratifiableError)
    assert where(e) == (1, 15)
    assert e.message == "negation or aggregation through recursion: a -> c -> a"
    assert e.cycle == ("a", "c", "a")
    e = err("ok() :- !ok().", UnstratifiableError)
    assert e.cycle == ("ok", "ok")
    e = err("n(X, C) :- n(X, _), C := count : n(_, _).", UnstratifiableError)
    assert "n -> n" in e.message


def test_next_rule_finiteness():
    e = err("counter(0).\ncounter(N + 1)@next :- counter(N).", NextRuleFinitenessError)
    assert where(e) == (2, 1)
    assert e.message.startswith("the @next rule for counter could change the database forever")
    # (1) head repeated with the same bindings
    check_program(parse_program("keep(X)@next :- keep(X), !drop(X)."))
    # (2) a positive instantaneous (event) relation
    check_program(parse_program("state(X)@next :- click(X)."))
    # deductive relations derived from @next heads are not instantaneous
    err("s(X)@next :- t(X). t(X) :- s(X).", NextRuleFinitenessError)


def test_async_head_peer_must_be_bound():
    e = err("ping(@P, X)@async :- want(X).", AsyncHeadError)
    assert where(e) == (1, 7)
    assert e.message == "the destination peer P of the @async head is not bound in the body"
    e = err("ping(@P + 1, X)@async :- peer(P), want(X).", AsyncHeadError)
    assert where(e) == (1, 1)
    check_program(parse_program('ping(@"peer-a", X)@async :- want(X).'))


def test_unknown_relation_in_query():
    checked = check_program(parse_program("path(X, Y) :- edge(X, Y)."))
    check_query(checked, parse_query("path(1, X)"))
    with pytest.raises(UnknownRelationError) as info:
        check_query(checked, parse_query("pathh(1, X)"))
    e = info.value
    assert where(e) == (1, 1) and e.message == "unknown relation pathh in the query"
    assert e.hint == "did you mean path?"
    with pytest.raises(ArityError):
        check_query(checked, Atom("path", (Const(1),)))
    check_query(checked, Atom("path", (Var("X"),), rest=True))


def test_a_body_over_the_literal_limit_is_a_line_col_error_on_every_path() -> None:
    """About 1,000 literals overflowed Python's stack in the tuple executor's closure
    chain and in the node (an internal RecursionError, exit 70)."""
    import merklog
    from merklog.engine import Program
    from merklog.engine.checks import MAX_BODY_LITERALS
    from merklog.engine.errors import ParseError

    n = MAX_BODY_LITERALS
    fits = "p(1).\nq(X) :- p(X)" + ", p(X)" * (n - 1) + "."
    assert Program.parse(fits).evaluate()["q"] == {(1,)}
    # the aggregate's own body counts: 1 + 1 + 254 + 1 is one too many
    agg = "p(1).\nq(X, N) :- p(X), N := count : p(_)" + ", p(X)" * (n - 2) + "."
    for text in (fits[:-1] + ", p(X).", agg):
        with pytest.raises(ParseError) as caught:
            Program.parse(text)
        assert caught.value.line == 2
        assert f"more than {n} literals" in str(caught.value)
    long = "p(1).\nq(X) :- p(X)" + ", p(X)" * 999 + "."
    with pytest.raises(ParseError, match=f"more than {n} literals"):
        Program.parse(long)
    with merklog.open(memory=True) as node:
        with pytest.raises(
            merklog.Error, match=f"x.dl:2:{len('q(X) :- p(X)') + 6 * (n - 1) + 3}: this"
        ):
            node.load_program(long, source="x.dl")
        node.write(asserts=["p(1)."])
        with pytest.raises(merklog.Error, match="more than 256 literals"):
            node.query("p(X)" + ", p(X)" * 999)
