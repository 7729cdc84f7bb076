"""Stratification exactly as Dialog query-engine spec §1.3.3.

1. Precedence graph ``G``: a vertex per relation; for every *deductive* rule
   with head ``H``, an edge ``H -> B`` per body atom ``B``: positive for a
   selection, negative for a negation or an aggregation.
2. Condensation ``C(G)``: strongly connected components (iterative Tarjan).
3. Topological order of ``C(G)`` (dependencies first); each component that
   heads at least one rule is a stratum holding the rules whose head is in it.
4. A final stratum holds every inductive (``@next``) rule, and the ``@async``
   rules (they, too, only emit tuples after the epoch's fixpoint).

A negative edge inside a component makes the program unstratifiable; the
error names the cycle (``a -> b -> a``: *a* depends on *b*, which depends on *a*).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .ast import NOPOS, Pos, Rule, body_atoms
from .errors import UnstratifiableError


@dataclass(frozen=True, slots=True)
class Stratum:
    """Rules evaluated together to a fixpoint; ``recursive`` if they depend on each other.

    ``temporal`` marks the final stratum of ``@next``/``@async`` rules.
    """

    index: int
    relations: frozenset[str]
    rules: tuple[Rule, ...]
    recursive: bool
    temporal: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    """``head`` depends on ``body`` through a literal of ``rule`` at ``pos``."""

    head: str
    body: str
    negative: bool
    pos: Pos
    rule: Rule


def precedence_graph(rules: Iterable[Rule]) -> tuple[list[str], list[Edge]]:
    """Vertices (relations, in first-appearance order) and edges of ``G`` (deductive rules)."""
    seen: dict[str, None] = {}
    edges: list[Edge] = []
    for rule in rules:
        seen.setdefault(rule.head.rel)
        for lit in rule.body:
            for atom, polarity in body_atoms(lit):
                seen.setdefault(atom.rel)
                if rule.time == "now":
                    pos = lit.pos if polarity != "pos" else atom.pos
                    edges.append(Edge(rule.head.rel, atom.rel, polarity != "pos", pos, rule))
    return list(seen), edges


def strongly_connected(vertices: Sequence[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components come out dependencies-first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in vertices:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(succ.get(root, ())))]
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    advanced = True
                    break
                if w in on_stack and index[w] < low[node]:
                    low[node] = index[w]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(comp)
    return out


def _cycle_through(edge: Edge, members: set[str], succ: dict[str, list[str]]) -> list[str]:
    """A shortest path ``edge.head -> edge.body -> … -> edge.head`` inside one component."""
    start, goal = edge.body, edge.head
    prev: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for w in succ.get(node, ()):
            if w in members and w not in prev:
                prev[w] = node
                queue.append(w)
    path: list[str] = []
    node: str | None = goal
    while node is not None:
        path.append(node)
        node = prev[node]
    path.reverse()  # start … goal
    return [edge.head, *path] if start != goal else [edge.head, edge.head]


def stratify(rules: Sequence[Rule]) -> list[Stratum]:
    """Dialog query-engine spec §1.3.3 stratification; raises UnstratifiableError naming a bad cycle."""
    vertices, edges = precedence_graph(rules)
    succ: dict[str, list[str]] = {}
    for e in edges:
        targets = succ.setdefault(e.head, [])
        if e.body not in targets:
            targets.append(e.body)
    components = strongly_connected(vertices, succ)
    comp_of = {rel: i for i, comp in enumerate(components) for rel in comp}

    for e in edges:
        if e.negative and comp_of[e.head] == comp_of[e.body]:
            members = set(components[comp_of[e.head]])
            cycle = _cycle_through(e, members, succ)
            path = " -> ".join(cycle)
            raise UnstratifiableError.at(
                e.pos if e.pos != NOPOS else e.rule.pos,
                f"negation or aggregation through recursion: {path}",
                (
                    f"{e.head} depends negatively on itself; "
                    if e.head == e.body
                    else f"{e.head} depends negatively on {e.body}, which depends on {e.head}; "
                )
                + "negate or aggregate only relations computed in an earlier stratum",
                cycle=tuple(cycle),
            )

    deductive: dict[str, list[Rule]] = {}
    temporal: list[Rule] = []
    for rule in rules:
        if rule.time == "now":
            deductive.setdefault(rule.head.rel, []).append(rule)
        else:
            temporal.append(rule)
    self_loop = {e.head for e in edges if e.head == e.body}

    strata: list[Stratum] = []
    for comp in components:
        comp_rules = tuple(r for rel in comp for r in deductive.get(rel, ()))
        if not comp_rules:
            continue
        ordered = tuple(r for r in rules if r.time == "now" and r.head.rel in set(comp))
        recursive = len(comp) > 1 or comp[0] in self_loop
        strata.append(Stratum(len(strata), frozenset(comp), ordered, recursive))
    if temporal:
        strata.append(
            Stratum(
                len(strata),
                frozenset(r.head.rel for r in temporal),
                tuple(temporal),
                recursive=False,
                temporal=True,
            )
        )
    return strata


__all__ = ["Edge", "Stratum", "precedence_graph", "strongly_connected", "stratify"]
