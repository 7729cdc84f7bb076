"""JSON fact bodies of ``POST /v1/facts`` read in bulk (node/jsonvalues.py): the same
typed facts and the same per-item errors as reading each item on its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.node.errors import NodeInputError
from merklog.node.jsonvalues import fact_from_json, facts_from_json

json_value = st.one_of(
    st.integers(-(2**64), 2**64),  # some outside int64
    st.floats(),  # NaN, infinities, -0.0
    st.booleans(),
    st.text(max_size=4),
    st.none(),
    st.sampled_from([{"/": {"bytes": "AQ"}}, {"/": "bnot-a-cid"}, [1], {"x": 1}]),
)
item = st.one_of(
    st.fixed_dictionaries(
        {
            "rel": st.sampled_from(["p", "edge", "Bad name", "", "Up", "é", "_x", "pQ_1"]),
            "args": st.lists(json_value),
        }
    ),
    st.fixed_dictionaries({"rel": st.just("p")}),  # no args: refused, not p()
    st.sampled_from(
        [
            {"args": [1]},
            {"rel": 1, "args": []},
            {"rel": "p", "args": 1},
            {"rel": "p", "args": [1], "arg": [2]},
            {"rel": "p", "x": [1]},
            [],
            "p(1)",
        ]
    ),
)


def _outcome(fn, items):
    try:
        return ("ok", [(f.rel, [(type(v), repr(v)) for v in f.args]) for f in fn(items)])
    except NodeInputError as exc:
        return ("error", str(exc))


def _item_by_item(items):
    return [fact_from_json(x, f"assert[{i}]") for i, x in enumerate(items)]


@settings(max_examples=300, deadline=None)
@given(st.lists(item, max_size=6))
def test_bulk_json_facts_equal_item_by_item(items) -> None:
    """1, 1.0, true and "1" stay four values; the first bad item is named as before."""
    bulk = _outcome(lambda xs: facts_from_json(xs, "assert"), items)
    assert bulk == _outcome(_item_by_item, items)


def test_bulk_json_facts_keep_types() -> None:
    items = [{"rel": "p", "args": [v]} for v in (1, 1.0, True, "1", -0.0)]
    facts = facts_from_json(items)
    assert [(type(f.args[0]), repr(f.args[0])) for f in facts] == [
        (int, "1"),
        (float, "1.0"),
        (bool, "True"),
        (str, "'1'"),
        (float, "0.0"),
    ]


def test_a_json_fact_names_a_relation_datalog_can_write_and_has_exactly_rel_and_args() -> None:
    """``Up``, ``P`` or ``é`` were stored although no query or retract could name them;
    a fact without ``args`` became ``p()`` and a misspelt key was ignored."""
    import pytest

    for rel in ("Up", "P", "é", "a-b", "_x", "1abc"):
        with pytest.raises(NodeInputError, match="cannot be written in Datalog|identifier"):
            facts_from_json([{"rel": rel, "args": [1]}])
    with pytest.raises(NodeInputError, match=r"assert\[1\]: expected"):
        facts_from_json([{"rel": "p", "args": []}, {"rel": "p"}])
    with pytest.raises(NodeInputError, match="unknown key 'arg'"):
        facts_from_json([{"rel": "p", "args": [1], "arg": [2]}])
    assert [f.rel for f in facts_from_json([{"rel": "pQ_1", "args": []}])] == ["pQ_1"]


@given(st.binary(max_size=40))
def test_bytes_have_one_base64_spelling(data: bytes) -> None:
    """QA: ``{"/": {"bytes": "AR"}}`` was accepted as ``x"01"``, the bytes of ``"AQ"``: a
    value had two JSON spellings. The canonical one (padded or not) is taken; one with
    unused bits set is refused, naming the canonical spelling."""
    import base64

    import pytest

    text = base64.b64encode(data).decode()
    for spelled in (text, text.rstrip("=")):
        (fact,) = facts_from_json([{"rel": "b", "args": [{"/": {"bytes": spelled}}]}])
        assert fact.args == (data,)
    if text.endswith("="):  # the last character carries unused bits: set one
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        bare = text.rstrip("=")
        bent = bare[:-1] + alphabet[alphabet.index(bare[-1]) + 1]
        with pytest.raises(NodeInputError, match="not canonical base64"):
            facts_from_json([{"rel": "b", "args": [{"/": {"bytes": bent}}]}])
