"""The package layering, read from the source with ``ast`` (nothing is imported).

store -> (nothing of ours); engine -> store; replication -> store; node -> all.
Every ``import`` counts: top-level, inside functions (lazy imports) and under
``if TYPE_CHECKING:`` — a cycle hidden in a function body is still a cycle.
Replication does not use the engine today, so it may not import it at all.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "store", "replication", "node")


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.where})"


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods["merklog." + ".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module name ``path`` imports (resolved relative imports), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((sub if sub in MODULES else module, node.lineno))
    return out


def _edges() -> list[Edge]:
    edges = []
    for name, path in MODULES.items():
        for target, line in _imports(name, path):
            if target != name:
                edges.append(Edge(name, target, f"{path.relative_to(ROOT)}:{line}"))
    return edges


EDGES = _edges()


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "merklog" and len(parts) > 1:
        return parts[1]
    return parts[0]


def _target_name(target: str) -> str:
    """Our layer for ``merklog.*`` targets, else the top-level distribution (``aiohttp``)."""
    return _layer(target) if target.startswith("merklog.") else target.split(".")[0]


def _offending(source_layer: str, forbidden: set[str]) -> list[str]:
    return sorted(
        str(e)
        for e in EDGES
        if _layer(e.source) == source_layer and _target_name(e.target) in forbidden
    )


def test_the_scan_sees_every_package() -> None:
    layers = {_layer(m) for m in MODULES}
    assert layers == set(PACKAGES)
    assert "merklog.engine.planner" in MODULES and "merklog.store.errors" in MODULES
    # Relative and lazy imports are resolved (a known edge inside a function body).
    assert any(
        e.source == "merklog.engine.batch" and e.target == "merklog.engine.planner" for e in EDGES
    )


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("store", {"engine", "replication", "node", "aiohttp"}),
        ("engine", {"replication", "node", "aiohttp"}),
        ("replication", {"engine", "node"}),
    ],
)
def test_lower_layers_never_import_higher_ones(layer: str, forbidden: set[str]) -> None:
    bad = _offending(layer, forbidden)
    assert not bad, f"{layer} imports what it must not:\n  " + "\n  ".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if e.target in MODULES:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles_between_modules_lazy_imports_included() -> None:
    cycles = _cycles()
    report = []
    for comp in cycles:
        members = set(comp)
        inside = sorted({str(e) for e in EDGES if e.source in members and e.target in members})
        report.append("cycle " + " <-> ".join(comp) + ":\n    " + "\n    ".join(inside))
    assert not cycles, "\n".join(report)


#: The modules built on top of the ``Node`` facade: the package root, ``merklog.open``,
#: the HTTP server and its handlers, and the CLI. Everything else in ``node/`` is a part
#: the facade wires together and receives what it needs, so it never imports node.py
#: (which would be a cycle as soon as the facade delegates to it).
ABOVE_THE_FACADE = (
    "merklog.node.public",
    "merklog.node.api",
    "merklog.node.server",
    "merklog.node.handlers",
    "merklog.node.target",
    "merklog.node.commands.",
)


def test_only_the_layers_above_the_node_facade_import_it() -> None:
    bad = sorted(
        str(e)
        for e in EDGES
        if e.target == "merklog.node.node"
        and e.source != "merklog.node.node"
        and not any(
            e.source == above or (above.endswith(".") and e.source.startswith(above))
            for above in ABOVE_THE_FACADE
        )
    )
    assert not bad, "a part of the node imports the facade node.py:\n  " + "\n  ".join(bad)
