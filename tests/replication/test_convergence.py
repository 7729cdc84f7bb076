"""Convergence property: random writes, retracts, grants/revokes and hostile sync schedules.

Replicas exchange blocks in-process (no HTTP): full pulls, prefixes (partial
delivery), shuffled batches (rejected whole when a parent is missing), dropped
batches, duplicated and replayed old batches, partitions then healing. After a
final full sync every replica has the same heads and visible set, which equals
the Datalog view over the log relations and the set built from change callbacks.
"""

from __future__ import annotations

import os
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.replication.blocks import Assert, Grant, Retract, Revoke
from merklog.replication.errors import MissingParents, ReplicationError, Unauthorized
from merklog.store import make_fact

from .repl_support import new_replicas, plan_pull, pull

LONG = os.environ.get("MERKLOG_LONG") == "1"
EXAMPLES = 1000 if LONG else 300

FACTS = [make_fact("p", [i]) for i in range(3)] + [make_fact("q", ["x", 1.5])]

op_st = st.tuples(st.sampled_from(["assert", "retract"]), st.integers(0, len(FACTS) - 1))

retract_st = st.tuples(st.just("retract"), st.integers(0, len(FACTS) - 1))
write_st = st.tuples(st.just("write"), st.integers(0, 4), st.lists(op_st, min_size=1, max_size=4))
action_st = st.one_of(
    write_st,
    write_st,
    st.tuples(st.just("write"), st.integers(0, 4), st.lists(retract_st, min_size=1, max_size=2)),
    st.tuples(st.just("grant"), st.integers(1, 4)),
    st.tuples(st.just("revoke"), st.integers(1, 4)),
    st.tuples(
        st.just("sync"),
        st.integers(0, 4),
        st.integers(0, 4),
        st.sampled_from(["full", "prefix", "shuffle", "drop", "dup"]),
        st.integers(1, 6),
    ),
    st.tuples(
        st.just("sync"), st.integers(0, 4), st.integers(0, 4), st.just("full"), st.integers(1, 6)
    ),
    st.tuples(st.just("replay"), st.integers(0, 1000)),
    st.tuples(st.just("partition"), st.integers(1, 30)),
    st.tuples(st.just("heal")),
)


def datalog_view(rel: dict) -> set:
    """visible(F) :- asserts(D, F), !killed(D, F).   killed(D, F) :- retracts(_, F, D)."""
    killed = {(d, f) for _r, f, d in rel["retracts"]}
    return {f for d, f in rel["asserts"] if (d, f) not in killed}


def snapshot(r) -> tuple:
    return (r.heads(), r.visible_cids(), r.delta_count())


def full_sync(reps) -> None:
    for _ in range(2):
        for r in reps[1:]:
            pull(reps[0], r)
        for r in reps[1:]:
            pull(r, reps[0])


@settings(max_examples=EXAMPLES)
@given(
    n=st.integers(3, 5),
    initial_writers=st.sets(st.integers(1, 4), min_size=2),
    actions=st.lists(action_st, min_size=10, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_replicas_converge(n, initial_writers, actions, seed):
    rng = random.Random(seed)
    reps = new_replicas(n, [w for w in initial_writers if w < n])
    events = [Counter() for _ in reps]
    for i, r in enumerate(reps):
        r.subscribe(lambda w, _f, cid, c=events[i]: c.update({cid: w}))
    sent: list[list] = []
    group = [0] * n
    for action in actions:
        kind = action[0]
        if kind == "write":
            r = reps[action[1] % n]
            ops = [(Assert if k == "assert" else Retract)(FACTS[f]) for k, f in action[2]]
            before = snapshot(r)
            try:
                r.write(ops)
            except Unauthorized:
                assert not r.is_writer(r.identity.public_key)
                assert snapshot(r) == before
        elif kind in ("grant", "revoke"):
            key = reps[action[1] % n].identity.public_key
            reps[0].write([(Grant if kind == "grant" else Revoke)(key)])
        elif kind == "sync":
            dst, src = reps[action[1] % n], reps[action[2] % n]
            if dst is src or group[reps.index(dst)] != group[reps.index(src)]:
                continue
            mode = action[3]
            deltas, _ = plan_pull(dst, src, k=action[4])
            if mode == "prefix":
                deltas = deltas[: rng.randint(0, len(deltas))]
            blocks = list(src.blocks_for(deltas))
            if mode == "shuffle":
                rng.shuffle(blocks)
            sent.append(blocks)
            if mode == "drop":
                continue
            before = snapshot(dst)
            try:
                res = dst.apply_blocks(blocks)
                if mode != "shuffle":
                    assert res.duplicates == 0, "sync sent a delta the caller already had"
            except ReplicationError as exc:
                # Only a reordering can make an honest batch fail, and then nothing applies.
                assert mode == "shuffle" and isinstance(exc, MissingParents), exc
                assert snapshot(dst) == before
            if mode == "dup":
                res = dst.apply_blocks(blocks)
                assert res.accepted == 0
        elif kind == "replay" and sent:
            blocks = sent[action[1] % len(sent)]
            dst = reps[rng.randrange(n)]
            before = snapshot(dst)
            try:
                dst.apply_blocks(blocks)
            except MissingParents:
                assert snapshot(dst) == before
        elif kind == "partition":
            group = [(action[1] >> i) & 1 for i in range(n)]
        elif kind == "heal":
            group = [0] * n
    full_sync(reps)
    heads = reps[0].heads()
    visible = reps[0].visible_cids()
    for i, r in enumerate(reps):
        assert r.heads() == heads
        assert r.visible_cids() == visible
        assert datalog_view(r.relations()) == visible
        assert {c for c, w in events[i].items() if w} == visible
        assert all(w in (0, 1) for w in events[i].values())
    assert {f for _c, f in reps[0].visible()} <= set(FACTS)
    # The memoised writer check agrees with the ancestry-walking statement of the rule.
    r = reps[rng.randrange(n)]
    for delta in r.iter_deltas():
        args = (delta.author, delta.parents, delta.clock)
        assert r._authorized(*args) == r._authorized_reference(*args) is True
    for key in (x.identity.public_key for x in reps):
        args = (key, r.heads(), 1 + max(d.clock for d in r.iter_deltas()) if r.delta_count() else 1)
        assert r._authorized(*args) == r._authorized_reference(*args)
