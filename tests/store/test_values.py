"""Values and facts: validation, canonical encoding, reference vs fast codec."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.store import (
    InvalidBlock,
    InvalidValue,
    Link,
    decode_fact,
    encode_fact,
    encode_facts,
    fact_block,
    fact_block_reference,
    make_fact,
)

links = st.binary(min_size=32, max_size=32).map(lambda d: Link(bytes([1, 0x71, 0x12, 0x20]) + d))
values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(),
    st.booleans(),
    links,
    # byte strings shaped like CIDs: the fast encoder must not turn them into links
    st.binary(min_size=32, max_size=32).map(lambda d: bytes([1, 0x71, 0x12, 0x20]) + d),
)
relations = st.from_regex(r"[a-z][a-zA-Z0-9_]{0,12}", fullmatch=True)
LONG = os.environ.get("MERKLOG_LONG") == "1"


# 1,000 examples in CI (each value kind, CID-shaped bytes and links many times over, in
# lists of up to six; ~6 ms each under load), 3,000 with MERKLOG_LONG=1.
@settings(max_examples=3000 if LONG else 1000)
@given(relations, st.lists(values, max_size=6))
def test_fast_codec_is_byte_identical_to_reference(rel, args):
    fact = make_fact(rel, args)
    assert fact_block(fact) == fact_block_reference(fact)
    cid, data = encode_fact(fact)
    assert cid.verifies(data)
    assert encode_facts([fact, fact]) == [(cid, data)] * 2
    back = decode_fact(data)
    assert back == fact
    assert [type(v) for v in back.args] == [type(v) for v in fact.args]


@pytest.mark.parametrize(
    "value",
    [0, -1, 2**63 - 1, -(2**63), 1.5, -2.25e-300, "", "héllo", b"", b"\x00\xff", True, False],
)
def test_round_trip_each_type(value):
    fact = make_fact("r", [value])
    back = decode_fact(fact_block(fact)).args[0]
    assert back == value and type(back) is type(value)


def test_link_round_trip_and_text_form():
    cid, _ = encode_fact(make_fact("edge", [1, 2]))
    fact = make_fact("ref", [cid])
    back = decode_fact(fact_block(fact)).args[0]
    assert isinstance(back, Link) and back == cid
    assert str(cid).startswith("bafyrei")
    assert Link.parse(str(cid)) == cid


def test_canonical_regardless_of_construction():
    a = make_fact("edge", [1, "x"])
    b = make_fact("edge", (1, "x"))
    c = make_fact("edge", [int("1"), "".join(["x"])])
    assert fact_block(a) == fact_block(b) == fact_block(c)
    assert encode_fact(a)[0] == encode_fact(c)[0]


def test_negative_zero_is_zero():
    assert encode_fact(make_fact("f", [-0.0]))[0] == encode_fact(make_fact("f", [0.0]))[0]


def test_bool_is_not_int():
    assert encode_fact(make_fact("f", [True]))[0] != encode_fact(make_fact("f", [1]))[0]


@pytest.mark.parametrize(
    "bad, message",
    [
        (math.nan, "not finite"),
        (math.inf, "not finite"),
        (2**63, "64 signed bits"),
        (-(2**63) - 1, "64 signed bits"),
        ({1, 2}, "set is not a merklog value"),
        ({"a": 1}, "dict is not a merklog value"),
        ([1], "list is not a merklog value"),
        (None, "NoneType is not a merklog value"),
        ("ok\ud800", "lone surrogate"),
    ],
)
def test_rejects_bad_values(bad, message):
    with pytest.raises(InvalidValue, match=message):
        make_fact("r", [bad])


@pytest.mark.parametrize("rel", ["", "1abc", "a-b", 3])
def test_rejects_bad_relation_names(rel):
    with pytest.raises(InvalidValue):
        make_fact(rel, [])


@pytest.mark.parametrize(
    "block, message",
    [
        (b"\xa1crelae", "exactly the keys"),  # {"rel": "e"}
        (b"\xa2crelaedargs\x01", "must be a list"),  # args: 1
        (b"\xa2crel\x01dargs\x80", "invalid value"),  # rel: 1
        (b"\xa2crelaedargs\x81\xf6", "invalid value"),  # args: [null]
        (b"\xa3axa\x00crelaedargs\x80", "exactly the keys"),  # an extra key
        (b"\xa3crelaedargs\x80axa\x00", "canonical order"),  # keys out of order
        (b"\xa2dargs\x80crelae", "canonical order"),  # a fact, but not canonical
        (b"\xff", "malformed"),
    ],
)
def test_decode_fact_rejects_bad_blocks(block, message):
    with pytest.raises(InvalidBlock, match=message):
        decode_fact(block)


def test_decode_fact_fast_path_keeps_bool_and_float_types():
    fact = make_fact("r", [True, 1, 1.0, "1"])
    back = decode_fact(fact_block(fact))
    assert [type(v) for v in back.args] == [bool, int, float, str]


@settings(max_examples=200, deadline=None)
@given(st.one_of(links, st.binary(max_size=64).map(Link.for_dag_cbor)))
def test_link_text_is_the_multiformats_base32_form(link):
    """``str(Link)`` (libipld, in C) is exactly the reference CID's base32 text."""
    from multiformats import CID

    assert str(link) == str(CID.decode(link.raw).encode("base32"))
    assert Link.parse(str(link)) == link


any_value = st.one_of(
    values,
    st.integers(min_value=-(2**70), max_value=2**70),  # some outside int64
    st.floats(),  # NaN, infinities and -0.0 too
    st.text(st.characters(), max_size=4),  # lone surrogates too
    st.sampled_from([None, [1], 1j, bytearray(b"\x01")]),
)


def _outcome(fn, facts):
    try:
        return ("ok", [(f.rel, [(type(v), repr(v)) for v in f.args]) for f in fn(facts)])
    except InvalidValue as exc:
        return ("error", str(exc))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["p", "edge", "Bad name", "", "q_1"]),
            st.lists(any_value, max_size=4),
            st.booleans(),
        ),
        max_size=6,
    )
)
def test_check_facts_is_make_fact_in_bulk(items) -> None:
    """The bulk check gives exactly make_fact's facts (types kept: 1, 1.0, true differ;
    -0.0 becomes 0.0) and make_fact's first error."""
    from merklog.store import Fact, check_facts

    facts = [Fact(rel, tuple(args) if as_tuple else args) for rel, args, as_tuple in items]
    assert _outcome(check_facts, facts) == _outcome(
        lambda fs: [make_fact(f.rel, f.args) for f in fs], facts
    )


def test_check_facts_names_the_first_bad_relation_in_input_order() -> None:
    """Two bad relation names: the error is the first fact's, as make_fact's loop gives
    it, not whichever a set of names yields first (found by the property above)."""
    from merklog.store import Fact, check_facts

    facts = [Fact("Bad name", ()), Fact("", ())]
    for order in (facts, facts[::-1]):
        assert _outcome(check_facts, order) == _outcome(
            lambda fs: [make_fact(f.rel, f.args) for f in fs], order
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=6))
def test_format_value_round_trips_through_the_parser(args) -> None:
    """``str(fact)`` (the rendering ``put`` prints) parses back to the same typed fact."""
    from merklog.engine.parser import parse_facts_general

    fact = make_fact("p", args)
    (back,) = parse_facts_general(f"{fact}.")
    again = make_fact(back.rel, back.args)
    assert [(type(v), repr(v)) for v in again.args] == [(type(v), repr(v)) for v in fact.args]


def test_every_format_character_is_escaped_and_reads_back() -> None:
    """Unicode's format characters (category Cf: zero-width spaces, bidirectional
    controls, the byte-order mark…) show on no terminal, so ``"ab"`` and ``"a\u200bb"``,
    two values with two CIDs, printed alike. Each is now written as ``\\u{…}``, in the
    bulk rendering too, and parses back to the same string."""
    import unicodedata

    from merklog.engine.parser import parse_facts_general
    from merklog.store.values import args_texts, format_value

    found = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    assert len(found) > 150
    for char in found:
        text = format_value("a" + char + "b")
        assert text == f'"a\\u{{{ord(char):x}}}b"', (hex(ord(char)), text)
        assert args_texts([("a" + char + "b",)]) in (None, [text])
        (back,) = parse_facts_general(f"p({text}).")
        assert back.args == ("a" + char + "b",)
    assert format_value("ab") != format_value("a\u200bb")
    assert format_value("日本語") == '"日本語"' and format_value("e\u0301") == '"e\u0301"'


def test_blank_and_ignorable_characters_are_escaped_and_read_back() -> None:
    """Characters outside Cf that a terminal shows as nothing or as blank space printed
    raw, so ``inv("ab")``, ``inv("a\\u034fb")`` and ``inv("a\\ufe0fb")`` (three values,
    three CIDs) printed alike, and ``"a b"`` like ``"a\\u00a0b"``: every space but the
    ASCII one (Zs), Unicode's other default-ignorable code points, the braille blank and
    the noncharacters are now written as ``\\u{…}`` and parse back to the same string."""
    import unicodedata

    from merklog.engine.parser import parse_facts_general
    from merklog.store.values import args_texts, format_value

    spaces = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"]
    ignorable = [0x34F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F]
    ignorable += [0x2065, 0x3164, 0xFFA0, 0xE0000, 0xE0100, 0xE01EF, 0xE0FFF]
    ignorable += [*range(0xFE00, 0xFE10), *range(0xFFF0, 0xFFF9)]
    nonchars = [*range(0xFDD0, 0xFDF0)] + [
        p + e for p in range(0, 0x110000, 0x10000) for e in (0xFFFE, 0xFFFF)
    ]
    blank = [c for c in spaces if c != " "] + [chr(c) for c in (*ignorable, 0x2800, *nonchars)]
    assert len(spaces) == 17 and len(blank) == 16 + 41 + 1 + 66
    for char in blank:
        text = format_value("a" + char + "b")
        assert text == f'"a\\u{{{ord(char):x}}}b"', (hex(ord(char)), text)
        assert args_texts([("a" + char + "b",)]) in (None, [text])
        (back,) = parse_facts_general(f"p({text}).")
        assert back.args == ("a" + char + "b",)
    shown = {
        format_value(s) for s in ("ab", "a\u034fb", "a\ufe0fb", "a\u180bb", "a\u3164b", "a\u115fb")
    }
    assert len(shown) == 6
    assert format_value("a b") == '"a b"' != format_value("a\u00a0b")
    assert format_value("é") == '"é"' and format_value("한국어 ⠁") == '"한국어 ⠁"'


# Values the bulk renderer takes and the ones it must hand back: strings with quotes,
# backslashes, brackets and control characters, floats that look like ints.
render_values = st.one_of(
    values,
    st.sampled_from(
        [1, 1.0, True, "1", b"\x01", 0.0, -0.0, -0.05, 1e16, -1.5e-7, 2**63 - 1, -(2**63)]
    ),
    st.text(
        alphabet='ab"\\[]\t\n\x00\x7f\u2028é, \u200b\ufeff\u00ad\U000e0041\u034f\u00a0\u3164',
        max_size=6,
    ),
)


# 500 examples in CI (up to 40 values each: thousands of values rendered both ways),
# 1,500 with MERKLOG_LONG=1.
@settings(max_examples=1500 if LONG else 500)
@given(st.lists(st.lists(render_values, max_size=5), max_size=8))
def test_args_texts_is_format_value_in_bulk(arg_lists):
    """``args_texts`` gives exactly what ``format_value`` gives, value by value, or
    declines (None); it never declines for ints, bools, floats and plain strings."""
    from merklog.store.values import args_texts, format_value

    checked = [make_fact("p", args).args for args in arg_lists]
    got = args_texts(checked)
    want = [", ".join(map(format_value, args)) for args in checked]
    if got is not None:
        assert got == want
    # Unchecked lists too (``put`` renders what it read, before the store makes -0.0 0.0).
    raw = args_texts([tuple(args) for args in arg_lists])
    if raw is not None:
        assert raw == [", ".join(map(format_value, args)) for args in arg_lists]
    plain = all(
        # alphanumeric strings that print as they are (a Hangul filler is a letter)
        type(v) in (int, bool, float)
        or (type(v) is str and v.isalnum() and f'"{v}"' == format_value(v))
        for args in checked
        for v in args
    )
    if plain:
        assert got == want


def test_args_texts_keeps_mixed_types_apart():
    from merklog.store.values import args_texts

    args = [(1, 1.0, True, "1"), (), ("a", -0.0), (b"\x01",)]
    assert args_texts(args[:2]) == ['1, 1.0, true, "1"', ""]
    assert args_texts(args[2:3]) is None  # -0.0: format_value renders it as 0.0
    assert args_texts(args) is None  # bytes: rendered one by one
    assert args_texts([("a], [b",)]) is None  # a bracket in a string
    assert args_texts([]) == []


@given(st.lists(st.one_of(links, st.binary(max_size=64).map(Link.for_dag_cbor)), max_size=5))
def test_link_texts_are_their_str(some):
    assert Link.texts(some) == [str(link) for link in some]


@given(st.binary(min_size=32, max_size=32))
def test_a_cid_has_one_base32_spelling(digest: bytes) -> None:
    """``Link.parse`` read a base32 string whose unused trailing bits were set, or one in
    mixed case, as the CID written otherwise, so one block answered to several names."""
    import base64

    link = Link(bytes([1, 0x71, 0x12, 0x20]) + digest)
    text = str(link)
    assert Link.parse(text) == link
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    last = alphabet.index(text[-1])
    # 36 bytes = 288 bits in 58 characters (290 bits): the last character's 2 low bits
    # are unused; each other value of them is another spelling of the same bytes.
    for other in {last ^ 1, last ^ 2, last ^ 3}:
        spelled = text[:-1] + alphabet[other]
        body = spelled[1:].upper()
        assert base64.b32decode(body + "=" * (-len(body) % 8)) == link.raw
        with pytest.raises(InvalidValue, match="not a canonical base32 CID"):
            Link.parse(spelled)
    with pytest.raises(InvalidValue, match="not a canonical base32 CID"):
        Link.parse("b" + text[1:].upper())
    # a CIDv0 (base58 Qm…) is named as one, with how to write it (it said "not a CID", QA)
    with pytest.raises(InvalidValue, match=r"is a CIDv0 \(base58, Qm…\); write it as a CIDv1"):
        Link.parse("QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG")


# Values that Python's ``==`` takes for one another: 1, 1.0, True, 0, 0.0, -0.0, False…
confusable = st.sampled_from([0, 1, 0.0, -0.0, 1.0, True, False, "1", b"\x01", 2**53, float(2**53)])


@settings(max_examples=500)
@given(
    st.lists(st.one_of(confusable, values), max_size=3),
    st.lists(st.one_of(confusable, values), max_size=3),
)
def test_facts_are_equal_exactly_when_their_cids_are(left, right) -> None:
    """``merklog.Fact`` is public (``list_facts``, sinks and write results give it) and was
    a plain tuple: ``Fact("e", (1,)) == Fact("e", (1.0,)) == Fact("e", (True,))``, so a set
    of the three facts a node stores held one. Equal exactly when the CIDs are; and equal
    facts hash alike."""
    from merklog.store import fact_cid

    a, b = make_fact("e", left), make_fact("e", right)
    assert (a == b) is (fact_cid(a) == fact_cid(b)) is (not a != b)
    if a == b:
        assert hash(a) == hash(b)
    assert len({make_fact("e", [v]) for v in (1, 1.0, True)}) == 3
    assert make_fact("e", [1]) == ("e", (1,)) and ("e", (1,)) == make_fact("e", [1])


def test_an_empty_relation_name_is_refused_not_a_crash() -> None:
    """The JSON fact form checks a name with check_writable_relation alone; naming the
    character that breaks the rule read the first character of "" (IndexError)."""
    from merklog.store.values import check_writable_relation

    with pytest.raises(InvalidValue, match=r"\(it is empty\)$"):
        check_writable_relation("")


def test_a_cid_every_peer_cannot_read_is_no_value() -> None:
    """QA: ``cid"bagm3gaqaaf5a"`` (codec 0x9999, unknown to multiformats) was written, then
    refused by every receiver's decoder and by the writer's own reads: the dataset never
    synced again. A CID with a non-minimal varint was kept as bytes and failed later.
    Both are refused where a Link is made, so nothing holding one is ever written."""
    import hashlib

    import pytest

    from merklog.store import InvalidValue, Link, make_fact

    with pytest.raises(InvalidValue, match="codec 0x9999"):
        Link.parse("bagm3gaqaaf5a")
    digest = hashlib.sha256(b"x").digest()
    with pytest.raises(InvalidValue, match="non-minimal varint"):
        Link(b"\x01\xd5\x00\x12\x20" + digest)
    with pytest.raises(InvalidValue, match="multihash 0x1999"):
        Link(b"\x01\x71\x99\x33\x20" + digest)
    raw = Link(b"\x01\x55\x12\x20" + digest)  # raw codec, sha2-256: readable
    assert make_fact("lk", [raw]).args == (raw,)
