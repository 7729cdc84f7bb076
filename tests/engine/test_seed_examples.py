"""Every example of the Dialog query-engine spec, with the spec's expected output.

Where the spec's text has typos the test runs the intended program and says so:
- popularProfile writes the count variable lowercase (``c``); Dialog variables are
  uppercase, so the test uses ``C``;
- suggestedMeal's body writes ``personA``/``personB`` (lowercase) for the head's
  ``PersonA``/``PersonB`` and omits the final ``.``;
- the per-category totalStock writes ``Total :- sum …`` for ``Total := sum …``.
"""

from __future__ import annotations

import pytest

from merklog.engine import Program
from merklog.engine.errors import EngineError
from merklog.store import Fact, fact_cid

GRID = {"point": [(x, y) for x in range(3) for y in range(3)]}


def test_points_x_coordinate_with_variable_and_wildcard() -> None:
    for text in ("xCoordinate(X) :− point(X, Y).", "xCoordinate(X) :− point(X, _)."):
        rels = Program.parse(text).evaluate(GRID)
        assert rels["xCoordinate"] == {(0,), (1,), (2,)}


def test_zero_point_two_heads() -> None:
    text = "zeroPoint(0, Y) :− point(0, Y).\nzeroPoint(X, 0) :− point(X, 0)."
    rels = Program.parse(text).evaluate(GRID)
    assert rels["zeroPoint"] == {(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)}


def test_zero_point_inductive_rule_carries_tuples_forward() -> None:
    text = "zeroPoint(X, Y)@next :− zeroPoint(X, Y)."
    results = Program.parse(text).run([{"zeroPoint": [(0, 5)]}, {}, {}])
    assert [r.relations["zeroPoint"] for r in results] == [{(0, 5)}] * 3


def test_popular_profile() -> None:
    text = """
        popularProfile(X) :−
            profile(X),
            C := count : follower(X, _),
            C >= 1000.
    """
    followers = [("alice", i) for i in range(1000)] + [("bob", i) for i in range(999)]
    rels = Program.parse(text).evaluate(
        {"profile": [("alice",), ("bob",), ("carol",)], "follower": followers}
    )
    assert rels["popularProfile"] == {("alice",)}


def test_suggested_meal() -> None:
    text = """
        suggestedMeal(PersonA, PersonB, Food) :-
          person(PersonA),
          person(PersonB),
          PersonA != PersonB,
          likes(PersonA, Food),
          !dislikes(PersonB, Food).
    """
    edb = """
        person("Quinn").
        person("Brooke").
        likes("Quinn", "Ramen").
        likes("Brooke", "Vegan").
        likes("Brooke", "Schnitzel").
        dislikes("Quinn", "Vegan").
        dislikes("Brooke", "Mushrooms").
    """
    rels = Program.parse(text + edb).evaluate()
    assert rels["suggestedMeal"] == {
        ("Quinn", "Brooke", "Ramen"),
        ("Brooke", "Quinn", "Schnitzel"),
    }


PRODUCTS = [
    ("dune", "books", 3),
    ("emma", "books", 4),
    ("kite", "toys", 2),
    ("yoyo", "toys", 2),
]


def test_total_stock() -> None:
    text = "totalStock(Total) :- Total := sum Quantity : product(Name, Category, Quantity)."
    rels = Program.parse(text).evaluate({"product": PRODUCTS})
    assert rels["totalStock"] == {(11,)}


def test_total_stock_per_category() -> None:
    text = """
        totalStock(Category, Total) :-
          productCategory(Category),
          Total := sum Quantity : product(_, Category, Quantity).
    """
    rels = Program.parse(text).evaluate(
        {"product": PRODUCTS, "productCategory": [("books",), ("toys",), ("garden",)]}
    )
    assert rels["totalStock"] == {("books", 7), ("toys", 4), ("garden", 0)}


@pytest.mark.parametrize(
    "text",
    [
        # the aggregated variable is bound outside the aggregate
        """totalStock(Total) :-
             product(Name, Category, Quantity),
             Total := sum Quantity : product(_, _, Quantity).""",
        # Category is local to the aggregate, so the head is not range restricted
        "totalStock(Category, Total) :- Total := sum Quantity : product(_, Category, Quantity).",
    ],
)
def test_total_stock_invalid_forms_are_rejected(text: str) -> None:
    with pytest.raises(EngineError):
        Program.parse(text)


def test_diagonal() -> None:
    rels = Program.parse("diagonal(X, Y) :- point(X, Y), X <= Y.").evaluate(GRID)
    assert rels["diagonal"] == {(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)}


def test_category_count_with_cids() -> None:
    text = """
        categoryCount(Category, Count) :-
            Category := category(...),
            Count := count : product(Category, ...).
    """
    categories = [("books",), ("toys",), ("garden",)]
    cid = {c[0]: fact_cid(Fact("category", c)) for c in categories}
    products = [
        (cid["books"], "dune", 3),
        (cid["books"], "emma", 4),
        (cid["toys"], "kite", 2),
    ]
    rels = Program.parse(text).evaluate({"category": categories, "product": products})
    assert rels["categoryCount"] == {(cid["books"], 2), (cid["toys"], 1), (cid["garden"], 0)}


def test_checkbox_over_epochs_with_click_events() -> None:
    text = """
        checkbox(Id, S)@next     :- checkbox(Id, S), !clicks(Id).
        checkbox(Id, true)@next  :- checkbox(Id, false), clicks(Id).
        checkbox(Id, false)@next :- checkbox(Id, true), clicks(Id).
    """
    program = Program.parse(text)
    assert program.stateful == {"checkbox"}
    clicks = [set(), {("a",)}, set(), {("a",), ("b",)}, {("b",)}, set()]
    results = program.run(
        [{"clicks": c} for c in clicks],
        initial={"checkbox": [("a", False), ("b", False)]},
    )
    states = [dict(r.relations["checkbox"]) for r in results]
    assert states == [
        {"a": False, "b": False},
        {"a": False, "b": False},  # the click at epoch 1 takes effect at epoch 2
        {"a": True, "b": False},
        {"a": True, "b": False},
        {"a": False, "b": True},
        {"a": False, "b": False},
    ]
