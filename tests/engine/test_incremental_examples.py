"""The incremental engine on the specs' example programs, over epochs.

Each run is cross-checked against the batch evaluator (``Program.run``) on the same inputs.
"""

from __future__ import annotations

from merklog.engine.incremental import IncrementalEngine, Outbox
from merklog.engine.program import Program

CHECKBOX = """
checkbox(Id, S)@next     :- checkbox(Id, S), !clicks(Id).
checkbox(Id, true)@next  :- checkbox(Id, false), clicks(Id).
checkbox(Id, false)@next :- checkbox(Id, true), clicks(Id).
"""

# Dedalus paper, queues: one job per user leaves the queue per epoch, lowest priority first.
QUEUE = """
m_priority_queue(A, B, C) :- enqueue(A, B, C).
m_priority_queue(A, B, C)@next :- m_priority_queue(A, B, C), !del_m_priority_queue(A, B, C).
omin(A, C) :- m_priority_queue(A, _, _), C := min X : m_priority_queue(A, _, X).
priority_queue(A, B, C) :- m_priority_queue(A, B, C), omin(A, C).
del_m_priority_queue(A, B, C) :- m_priority_queue(A, B, C), omin(A, C).
"""

# Lamport clocks over @async (the Dedalus paper, Lamport clocks): a local event ticks the clock,
# a received message moves it past the message's stamp; sends carry the sender's clock.
LAMPORT = """
clock(T)@next :- clock(T), !event(_), !recv(_, _, _).
clock(T1)@next :- clock(T), event(_), !recv(_, _, _), T1 == T + 1.
clock(T1)@next :- clock(T), recv(_, _, _), M := max N : recv(_, _, N), M >= T, T1 == M + 1.
clock(T1)@next :- clock(T), recv(_, _, _), M := max N : recv(_, _, N), M < T, T1 == T + 1.
recv(@D, X, T)@async :- send(D, X), clock(T).
log(X, T) :- recv(_, X, T).
"""


def run_both(text: str, epochs: list[dict]) -> tuple[IncrementalEngine, list[dict]]:
    """Run ``epochs`` (events per epoch) incrementally and in batch; assert equal states."""
    program = Program.parse(text)
    engine = IncrementalEngine(program.checked)
    batch = program.run([{k: list(v) for k, v in e.items()} for e in epochs])
    states = []
    for t, events in enumerate(epochs):
        engine.step(events=events)
        state = engine.relations()
        expected = {rel: set(rows) for rel, rows in batch[t].relations.items() if rows}
        assert state == expected, t
        assert sorted(engine.outbox) == sorted(batch[t].outbox) or not batch[t].outbox
        states.append(state)
    return engine, states


def test_checkbox_toggles_on_clicks_over_epochs() -> None:
    epochs = [
        {"checkbox": [("a", False), ("b", True)]},
        {"clicks": [("a",)]},
        {},
        {"clicks": [("a",), ("b",)]},
        {"clicks": [("b",)]},
        {},
    ]
    _engine, states = run_both(CHECKBOX, epochs)
    boxes = [sorted(s.get("checkbox", ())) for s in states]
    assert boxes == [
        [("a", False), ("b", True)],
        [("a", False), ("b", True)],  # the click shows at the next epoch
        [("a", True), ("b", True)],
        [("a", True), ("b", True)],
        [("a", False), ("b", False)],
        [("a", False), ("b", True)],
    ]


def test_dedalus_queue_releases_one_job_per_user_per_epoch() -> None:
    epochs = [
        {
            "enqueue": [
                ("bob", "bash", 200),
                ("eve", "john", 1),
                ("alice", "ssh", 204),
                ("bob", "ssh", 205),
            ]
        },
        {},
        {"enqueue": [("eve", "ls", 7)]},
        {},
        {},
    ]
    _engine, states = run_both(QUEUE, epochs)
    released = [sorted(s.get("priority_queue", ())) for s in states]
    assert released == [
        [("alice", "ssh", 204), ("bob", "bash", 200), ("eve", "john", 1)],
        [("bob", "ssh", 205)],
        [("eve", "ls", 7)],
        [],
        [],
    ]
    assert states[-1].get("m_priority_queue", set()) == set()


def test_lamport_clocks_order_causally_related_messages() -> None:
    program = Program.parse(LAMPORT)
    alice, bob = IncrementalEngine(program.checked), IncrementalEngine(program.checked)
    alice_out, bob_out = Outbox(), Outbox()
    alice.add_sink(alice_out)
    bob.add_sink(bob_out)
    inbox = {"alice": [], "bob": []}

    def deliver(messages: list) -> None:
        for _epoch, dest, fact in messages:
            inbox[dest].append(fact.args)

    def tick(engine: IncrementalEngine, me: str, events: dict) -> None:
        ev = dict(events)
        if inbox[me]:
            ev["recv"] = list(inbox[me])
            inbox[me].clear()
        engine.step(events=ev)

    tick(alice, "alice", {"clock": [(10,)]})
    tick(bob, "bob", {"clock": [(0,)]})
    # alice has done 10 units of work; she sends m1 stamped 10.
    tick(alice, "alice", {"send": [("bob", "m1")]})
    deliver(alice_out.drain())
    assert inbox["bob"] == [("bob", "m1", 10)]
    tick(bob, "bob", {})  # receives m1 while his clock is 0
    assert bob.relation("log") == {("m1", 10)}
    tick(bob, "bob", {"send": [("alice", "m2")]})  # causally after m1
    assert bob.relation("clock") == {(11,)}
    deliver(bob_out.drain())
    (reply,) = inbox["alice"]
    assert reply == ("alice", "m2", 11) and reply[2] > 10
    tick(alice, "alice", {})
    assert alice.relation("log") == {("m2", 11)}
    tick(alice, "alice", {"event": [("work",)]})
    assert alice.relation("clock") == {(12,)}
    tick(alice, "alice", {})
    assert alice.relation("clock") == {(13,)}
    # Clocks only move forward while idle epochs pass.
    for _ in range(3):
        tick(bob, "bob", {})
    assert bob.relation("clock") == {(11,)}
