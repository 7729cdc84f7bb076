"""Circuits: nodes wired by streams, evaluated in order each timestamp (Dialog dataflow spec §2.6–2.8).

A :class:`Circuit` is a list of nodes; a node may only read nodes added before
it, so insertion order is a topological order. :class:`FeedbackNode` is the one
exception: it is created first and ``connect``-ed later; its output is its
input at the previous timestamp (``z^-1``), so it never forms a cycle within a
timestamp (§2.8.3).

The root circuit advances one epoch per :meth:`Circuit.step`. A
:class:`ChildNode` owns a child circuit whose timestamps refine the parent's as
``(epoch, iteration)``; each parent step runs the child to a fixed point —
iterating until no feedback carries a delta and no operator has output queued
for a later iteration — and exposes the sum over iterations (``consolidate``) of
chosen inner streams to the parent through :class:`ExportNode`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import interrupt
from ..errors import IterationLimitError
from .operators import Operator
from .timestamp import Timestamp
from .zset import ZSet, add_into


class Node:
    """A vertex; ``value`` is its output at the current timestamp."""

    kind = "node"

    def __init__(self) -> None:
        self.value: Any = {}
        self.local_id = -1
        self.circuit: Circuit | None = None
        self.label = ""

    @property
    def global_id(self) -> tuple[int, ...]:
        """Path of local ids from the root circuit down to this node (§2.8)."""
        path = [self.local_id]
        circuit = self.circuit
        while circuit is not None and circuit.owner is not None:
            path.append(circuit.owner.local_id)
            circuit = circuit.owner.circuit
        return tuple(reversed(path))

    def inputs(self) -> Sequence[Node]:
        return ()

    def eval(self, ts: Timestamp) -> None:
        raise TypeError(f"{type(self).__name__} does not define eval")

    def __repr__(self) -> str:
        label = f" {self.label}" if self.label else ""
        return f"<{self.kind} {self.global_id}{label}>"


class OperatorNode(Node):
    """Applies an :class:`Operator` to its input streams (§2.8.1)."""

    kind = "operator"

    def __init__(self, op: Operator, inputs: Sequence[Node]) -> None:
        super().__init__()
        self.op = op
        self._inputs = tuple(inputs)

    def inputs(self) -> Sequence[Node]:
        return self._inputs

    def eval(self, ts: Timestamp) -> None:
        op = self.op
        inputs = self._inputs
        if len(inputs) == 1:
            value = inputs[0].value
            if not value and op.idle():
                self.value = {}
            else:
                self.value = op.eval(ts, value)
            return
        values = [n.value for n in inputs]
        if not any(values) and op.idle():
            self.value = {}
            return
        self.value = op.eval(ts, *values)


class SourceNode(Node):
    """Emits ``poll(ts)`` each timestamp; no inputs (§2.8.6)."""

    kind = "source"

    def __init__(self, poll: Callable[[Timestamp], Any]) -> None:
        super().__init__()
        self.poll = poll

    def eval(self, ts: Timestamp) -> None:
        value = self.poll(ts)
        self.value = value if value is not None else {}


class SinkNode(Node):
    """Calls ``receive(ts, *values)`` each timestamp; no output (§2.8.5)."""

    kind = "sink"

    def __init__(self, receive: Callable[..., object], inputs: Sequence[Node]) -> None:
        super().__init__()
        self.receive = receive
        self._inputs = tuple(inputs)

    def inputs(self) -> Sequence[Node]:
        return self._inputs

    def eval(self, ts: Timestamp) -> None:
        self.receive(ts, *[n.value for n in self._inputs])


class FeedbackNode(Node):
    """Delays its input by one timestamp (§2.8.3); starts (and, nested, restarts) empty."""

    kind = "feedback"

    def __init__(self) -> None:
        super().__init__()
        self.source: Node | None = None
        self._next: Any = {}

    def connect(self, source: Node) -> None:
        if self.source is not None:
            raise ValueError("feedback node already connected")
        self.source = source

    def inputs(self) -> Sequence[Node]:
        return (self.source,) if self.source is not None else ()

    def eval(self, ts: Timestamp) -> None:
        self.value, self._next = self._next, {}

    def latch(self) -> None:
        """Remember the input's current value for the next timestamp."""
        if self.source is None:
            raise ValueError("feedback node was never connected")
        self._next = self.source.value

    def pending(self) -> bool:
        return bool(self._next)

    def reset(self) -> None:
        self._next = {}


class ImportNode(Node):
    """Brings a parent stream into a child circuit as ``δ0``: its value at iteration 0,
    nothing afterwards (§2.8.4), so the child sees the parent's delta exactly once."""

    kind = "import"

    def __init__(self, parent_node: Node) -> None:
        super().__init__()
        self.parent_node = parent_node

    def eval(self, ts: Timestamp) -> None:
        self.value = self.parent_node.value if ts.iteration == 0 else {}


class Circuit:
    """A root circuit (``owner is None``) or the child circuit of a :class:`ChildNode`."""

    def __init__(self, owner: ChildNode | None = None) -> None:
        self.owner = owner
        self.nodes: list[Node] = []
        self.feedbacks: list[FeedbackNode] = []
        self.stateful: list[Operator] = []
        self.epoch = -1
        self._checked = False

    @property
    def nested(self) -> bool:
        return self.owner is not None

    # -- building
    def add(self, node: Node, label: str = "") -> Node:
        for n in node.inputs():
            if n.circuit is not self:
                raise ValueError(f"{n!r} belongs to another circuit; import it first")
        self._checked = False
        node.local_id = len(self.nodes)
        node.circuit = self
        node.label = label
        self.nodes.append(node)
        if isinstance(node, OperatorNode):
            node.op.bind(self.nested)
            self.stateful.append(node.op)
        if isinstance(node, FeedbackNode):
            self.feedbacks.append(node)
        return node

    def operator(self, op: Operator, *inputs: Node, label: str = "") -> OperatorNode:
        node = OperatorNode(op, inputs)
        self.add(node, label)
        return node

    def source(self, poll: Callable[[Timestamp], Any], label: str = "") -> SourceNode:
        node = SourceNode(poll)
        self.add(node, label)
        return node

    def sink(self, receive: Callable[..., object], *inputs: Node, label: str = "") -> SinkNode:
        node = SinkNode(receive, inputs)
        self.add(node, label)
        return node

    def feedback(self, label: str = "") -> FeedbackNode:
        node = FeedbackNode()
        self.add(node, label)
        return node

    def import_(self, parent_node: Node, label: str = "") -> ImportNode:
        if self.owner is None:
            raise ValueError("only a child circuit imports streams")
        if parent_node.circuit is not self.owner.circuit:
            raise ValueError("import from the parent circuit only")
        if parent_node.local_id > self.owner.local_id:
            raise ValueError("import only parent nodes added before the child node")
        node = ImportNode(parent_node)
        self.add(node, label or parent_node.label)
        return node

    def child(self, label: str = "") -> ChildNode:
        node = ChildNode()
        self.add(node, label)
        return node

    # -- running
    def check(self) -> None:
        """Raise ValueError if a feedback node (here or in a child) was never connected."""
        for node in self.nodes:
            if isinstance(node, FeedbackNode) and node.source is None:
                raise ValueError(f"{node!r} was never connected")
            if isinstance(node, ChildNode):
                node.child.check()

    def step(self) -> int:
        """Root circuit: evaluate one epoch; returns its number (0, 1, 2, …)."""
        if self.owner is not None:
            raise ValueError("step() runs the root circuit; children run inside it")
        if not self._checked:
            self.check()
            self._checked = True
        self.epoch += 1
        ts = Timestamp(self.epoch, 0)
        for node in self.nodes:
            node.eval(ts)
        for fb in self.feedbacks:
            fb.latch()
        return self.epoch

    def release(self, why: str) -> None:
        """Drop every operator's state and every stream value of this (child) circuit
        after an evaluation of it stopped half way, replacing each operator by one that
        raises ``RuntimeError(why)``: the engine that owns it is spent."""
        spent = _Spent(why)
        for node in self.nodes:
            node.value = {}
            if isinstance(node, OperatorNode):
                node.op = spent
            elif isinstance(node, FeedbackNode):
                node.reset()
            elif isinstance(node, ChildNode):
                node.child.release(why)
                node.results = []
        self.stateful = []

    def _iterate(self, epoch: int, after: Callable[[], object]) -> int:
        """Child circuit: run to a fixed point for ``epoch``, calling ``after()`` once
        per iteration evaluated; returns the number of iterations evaluated."""
        i = 0
        runs = 0
        limit = self.owner.max_iterations if isinstance(self.owner, ChildNode) else None
        # a recursive stratum's child is labelled "stratum REL,REL" (the incremental engine)
        deriving = (
            self.owner.label.removeprefix("stratum ").replace(",", ", ") if self.owner else ""
        )
        while True:
            interrupt.check(runs, deriving)
            if limit is not None and runs >= limit:
                raise self.owner.limit_error()
            ts = Timestamp(epoch, i)
            for node in self.nodes:
                node.eval(ts)
            after()
            runs += 1
            for fb in self.feedbacks:
                fb.latch()
            if any(fb.pending() for fb in self.feedbacks):
                i += 1
                continue
            later = [p for p in (op.next_pending() for op in self.stateful) if p is not None]
            if not later:
                break
            i = min(later)
            if i <= ts.iteration:
                raise RuntimeError("operator queued output for a past iteration")
        for fb in self.feedbacks:
            fb.reset()
        for op in self.stateful:
            op.end_epoch()
        return runs


class _Spent(Operator):
    """The operator of a circuit released after a failed evaluation (:meth:`Circuit.release`)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def eval(self, ts: Timestamp, *inputs: Any) -> Any:
        raise RuntimeError(
            f"this incremental engine cannot evaluate another epoch, {self.why};"
            " evaluate with a new engine"
        )


class ChildNode(Node):
    """Owns a child circuit run to a fixed point each parent timestamp (§2.8.2)."""

    kind = "child"

    def __init__(self) -> None:
        super().__init__()
        self.child = Circuit(owner=self)
        self.exports: list[Node] = []
        self.results: list[ZSet] = []
        self.iterations = 0
        #: Rounds a fixed point may take (None: unlimited), and the error raised when it
        #: runs out of them. Set by whoever builds a recursion that computes values.
        self.max_iterations: int | None = None
        self.limit_error: Callable[[], Exception] = lambda: IterationLimitError.after(())

    def export(self, inner: Node, label: str = "") -> ExportNode:
        """Expose the per-epoch sum over iterations of ``inner`` to the parent."""
        if inner.circuit is not self.child:
            raise ValueError("export a node of this child circuit")
        self.exports.append(inner)
        assert self.circuit is not None
        node = ExportNode(self, len(self.exports) - 1)
        self.circuit.add(node, label or inner.label)
        return node

    def eval(self, ts: Timestamp) -> None:
        sums: list[ZSet] = [{} for _ in self.exports]
        exports = self.exports

        def collect() -> None:
            for acc, node in zip(sums, exports, strict=True):
                if node.value:
                    add_into(acc, node.value)

        try:
            self.iterations = self.child._iterate(ts.epoch, collect)
        except BaseException as exc:
            # Stopped mid-epoch (a round limit, the memory budget, a close): what the
            # rounds built stays in the child's traces, gigabytes after a runaway
            # recursion, and is wrong for any later epoch. Let it go now (the node goes
            # on running; ADR 0207) and refuse to run this recursion again.
            self.child.release(f"its recursion stopped in epoch {ts.epoch} ({type(exc).__name__})")
            raise
        self.results = sums


class ExportNode(Node):
    """A parent-side output of a :class:`ChildNode`: one consolidated inner stream."""

    kind = "export"

    def __init__(self, child: ChildNode, index: int) -> None:
        super().__init__()
        self.child_node = child
        self.index = index

    def inputs(self) -> Sequence[Node]:
        return (self.child_node,)

    def eval(self, ts: Timestamp) -> None:
        self.value = self.child_node.results[self.index]
