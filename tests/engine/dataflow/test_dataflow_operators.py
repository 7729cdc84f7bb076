"""Each operator of Dialog dataflow spec §2.9 on the spec's own examples, plus incremental behaviour."""

from __future__ import annotations

from merklog.engine.dataflow import (
    Z1,
    Aggregate,
    Consolidate,
    Distinct,
    DistinctTrace,
    Filter,
    IndexWith,
    Inspect,
    Join,
    JoinStream,
    JoinTrace,
    Map,
    Minus,
    Negate,
    NestedTrace,
    Plus,
    Timestamp,
    Trace,
    TraceAppend,
    Z1Trace,
    aggregate,
    zset,
)
from merklog.engine.values import Float

T0 = Timestamp(0)


def test_zset_consolidates_and_drops_zero_weights() -> None:
    z = zset([((1,), 1), ((1,), -1), ((2,), 2), ((2,), 1)])
    assert z == {(2,): 3}


def test_timestamps_use_product_order() -> None:
    assert Timestamp(0, 0) <= Timestamp(0, 1) <= Timestamp(1, 1)
    assert not Timestamp(0, 2) <= Timestamp(1, 1)
    assert not Timestamp(1, 1) <= Timestamp(2, 0)
    assert not Timestamp(2, 0) <= Timestamp(1, 1)
    assert Timestamp(0, 2).join(Timestamp(1, 1)) == Timestamp(1, 2)


def test_aggregate_count_matches_spec_example() -> None:
    indexed = {(1,): {(1, "foo"): 1, (1, "bar"): 1}, (2,): {(2, "baz"): 1}}
    assert aggregate("count", indexed) == {(1, 2): 1, (2, 1): 1}


def test_aggregate_is_incremental_with_retractions() -> None:
    op = Aggregate("sum", lambda row: row[1])
    assert op.eval(T0, {("a",): {("a", 5): 1, ("a", 7): 1}}) == {("a", 12): 1}
    assert op.eval(T0, {("a",): {("a", 5): -1}}) == {("a", 12): -1, ("a", 7): 1}
    assert op.eval(T0, {("a",): {("a", 7): -1}}) == {("a", 7): -1}
    assert op.groups == {}


def test_aggregate_min_and_max_survive_retracting_the_extreme() -> None:
    mn = Aggregate("min", lambda row: row[0])
    mx = Aggregate("max", lambda row: row[0])
    rows = {(): {(3,): 1, (1,): 1, (2,): 1}}
    assert mn.eval(T0, rows) == {(1,): 1}
    assert mx.eval(T0, rows) == {(3,): 1}
    assert mn.eval(T0, {(): {(1,): -1}}) == {(1,): -1, (2,): 1}
    assert mx.eval(T0, {(): {(3,): -1}}) == {(3,): -1, (2,): 1}
    assert mn.eval(T0, {(): {(1,): 1}}) == {(2,): -1, (1,): 1}
    assert mx.eval(T0, {(): {(2,): -1}}) == {(2,): -1, (1,): 1}
    assert mx.eval(T0, {(): {(1,): -1}}) == {(1,): -1}  # group empties: no result
    assert mx.groups == {}


def test_aggregate_float_sum_is_exact() -> None:
    op = Aggregate("sum", lambda row: row[0])
    op.eval(T0, {(): {(Float(0.1),): 1, (Float(0.2),): 1, (Float(1e16),): 1}})
    out = op.eval(T0, {(): {(Float(1e16),): -1}})
    # Engine-form results: a float sum is a Float, never equal to an int.
    assert out == {(Float(0.1 + 0.2 + 1e16),): -1, (Float(0.30000000000000004),): 1}


def test_consolidate_matches_spec_example() -> None:
    trace = Trace()
    for k, v, w in [
        (0, 0, 1), (0, 0, -1), (0, 1, 1), (0, 1, 1), (1, 2, 2), (1, 3, 1),
        (1, 3, -1), (1, 4, -1), (2, 2, 1), (2, 4, 1),
    ]:  # fmt: skip
        trace.insert({k: {(k, v): w}})
    assert Consolidate().eval(T0, trace) == {
        (0, 1): 2, (1, 2): 2, (1, 4): -1, (2, 2): 1, (2, 4): 1
    }  # fmt: skip


def test_distinct_filter_map_negate_plus_minus() -> None:
    assert Distinct().eval(T0, {(0,): 1, (1,): 2, (2,): -1}) == {(0,): 1, (1,): 1}
    assert Filter(lambda r: r[0] >= 1).eval(T0, {(0,): 1, (1,): 2, (2,): -3}) == {
        (1,): 2,
        (2,): -3,
    }
    assert Map(lambda r: (r[0] % 2,)).eval(T0, {(0,): 1, (1,): 2, (2,): 3}) == {(0,): 4, (1,): 2}
    assert Negate().eval(T0, {(0,): 1, (1,): -1}) == {(0,): -1, (1,): 1}
    a = {(0,): 1, (1,): 1, (2,): 2, (3,): 1}
    b = {(0,): 1, (1,): -1, (2,): 1}
    assert Minus().eval(T0, a, b) == {(1,): 2, (2,): 1, (3,): 1}
    assert Plus().eval(T0, a, b) == {(0,): 2, (2,): 3, (3,): 1}


def test_index_with_matches_spec_example() -> None:
    out = IndexWith(lambda r: r[0]).eval(T0, {(0, 1, 1): 1, (1, 2, 1): 1, (1, 3, 2): -1})
    assert out == {0: {(0, 1, 1): 1}, 1: {(1, 2, 1): 1, (1, 3, 2): -1}}


def test_inspect_passes_through_and_reports() -> None:
    seen = []
    op = Inspect(lambda ts, z: seen.append((ts, dict(z))))
    z = {(0, 1): 1, (1, 1): 1}
    assert op.eval(Timestamp(3), z) is z
    assert seen == [(Timestamp(3), z)]


def test_join_stream_multiplies_weights() -> None:
    a = {1: {(1, "a"): 2}, 2: {(2, "b"): 1}}
    b = {1: {(1, "x"): -1, (1, "y"): 1}}
    out = JoinStream(lambda k, a, b: (a[1], b[1])).eval(T0, a, b)
    assert out == {("a", "x"): -2, ("a", "y"): 2}


def test_z1_delays_by_one_epoch() -> None:
    op = Z1()
    op.bind(False)
    assert op.eval(Timestamp(0), {(1,): 1}) == {}
    assert op.eval(Timestamp(1), {(2,): 1}) == {(1,): 1}


def test_z1trace_and_trace_append_and_join_trace_make_an_incremental_join() -> None:
    """δ(a⋈b) = δa ⋈ z1trace(b) + trace_append(δa) ⋈ δb, checked against a full join."""
    z1b = Z1Trace()
    z1b.bind(False)
    app_a = TraceAppend()
    app_a.bind(False)
    j1 = JoinTrace(lambda k, a, b: (a[0], a[1], b[1]))
    j2 = JoinTrace(lambda k, a, b: (a[0], a[1], b[1]), swap=True)
    full_a: dict = {}
    full_b: dict = {}
    view: dict = {}
    batches = [
        ({(1, "a"): 1}, {(1, "x"): 1}),
        ({(1, "b"): 1}, {(1, "y"): 1, (2, "z"): 1}),
        ({(2, "c"): 1, (1, "a"): -1}, {(1, "x"): -1}),
    ]
    for epoch, (da, db) in enumerate(batches):
        ts = Timestamp(epoch)
        ia = {}
        for row, w in da.items():
            ia.setdefault(row[0], {})[row] = w
        ib = {}
        for row, w in db.items():
            ib.setdefault(row[0], {})[row] = w
        tb = z1b.eval(ts, ib)
        out = j1.eval(ts, ia, tb)
        ta = app_a.eval(ts, ia)
        for row, w in j2.eval(ts, ib, ta).items():
            out[row] = out.get(row, 0) + w
        for row, w in out.items():
            view[row] = view.get(row, 0) + w
        view = {r: w for r, w in view.items() if w}
        for row, w in da.items():
            full_a[row] = full_a.get(row, 0) + w
        for row, w in db.items():
            full_b[row] = full_b.get(row, 0) + w
        expected = {}
        for ra, wa in full_a.items():
            for rb, wb in full_b.items():
                if ra[0] == rb[0] and wa * wb:
                    expected[(ra[0], ra[1], rb[1])] = wa * wb
        assert view == expected


def test_join_trace_nested_queues_outputs_at_the_least_upper_bound() -> None:
    trace = NestedTrace()
    trace.insert({1: {(1, "old"): 1}}, 3)  # an entry of a past epoch at iteration 3
    op = JoinTrace(lambda k, a, b: (a[1], b[1]))
    op.bind(True)
    assert op.eval(Timestamp(1, 0), {1: {(1, "new"): 1}}, trace) == {}
    assert op.next_pending() == 3
    assert op.eval(Timestamp(1, 3), {}, trace) == {("new", "old"): 1}
    assert op.next_pending() is None


def test_join_operator_equals_full_join_after_each_epoch() -> None:
    op = Join(lambda k, a, b: (a[0], b[1]))
    view: dict = {}
    op.eval(T0, {1: {(1,): 1}}, {1: {(1, 2): 1, (1, 3): 1}})
    out = op.eval(Timestamp(1), {2: {(2,): 1}, 1: {(1,): -1}}, {2: {(2, 9): 1}})
    assert out == {(2, 9): 1, (1, 2): -1, (1, 3): -1}
    assert sorted(op.left.consolidate()) == [(2,)]
    assert len(op.right) == 3
    assert view == {}


def test_distinct_trace_root_emits_only_changes_of_positivity() -> None:
    op = DistinctTrace()
    op.bind(False)
    assert op.eval(T0, {(1,): 2, (2,): 1}) == {(1,): 1, (2,): 1}
    assert op.eval(Timestamp(1), {(1,): -1}) == {}
    assert op.eval(Timestamp(2), {(1,): -1, (2,): -1, (3,): 1}) == {(1,): -1, (2,): -1, (3,): 1}
    assert op.integrated() == {(3,): 1}
