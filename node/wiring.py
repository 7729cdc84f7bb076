"""The one place where the node meets the store, replication and engine packages.

Everything the node needs from the other parts goes through these functions, so
a change of interface there is a change here only.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import Any

from merklog.engine import ast
from merklog.replication.blocks import Assert, Retract
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import BlockStore, Fact, Link, MemoryBlockStore, make_fact

from .config import Config

__all__ = ["Identity"]

QUERY_REL = "__query"
QUERY_PROBE = "merklogQueryProbe"


class NodeInputError(ValueError):
    """Bad input from a user (syntax, values): reported with position, nothing changed."""


# ---------------------------------------------------------------- store and replica


def open_store(cfg: Config) -> BlockStore:
    """The configured block store (SQLite file by default)."""
    backend = cfg.get("store.backend")
    if backend == "memory":
        return MemoryBlockStore()
    if backend != "sqlite":
        raise NodeInputError(f"store.backend must be sqlite or memory, got {backend!r}")
    from merklog.store.sqlite import SQLiteBlockStore

    path = cfg.path("store.path")
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteBlockStore(path)


def _conn(store: BlockStore) -> Any:
    conn = getattr(store, "conn", None)
    if conn is None:
        from merklog.replication.txn import connect

        conn = connect(":memory:")
        store.conn = conn  # type: ignore[attr-defined]
    return conn


def create_dataset(store: BlockStore, identity: Identity, name: str) -> Link:
    """A new dataset owned by ``identity``; returns its genesis CID."""
    replica = Replica.create(_conn(store), store, identity, name or "merklog")
    return replica.dataset


def open_replica(
    store: BlockStore,
    dataset: Link,
    identity: Identity,
    on_change: Callable[[Fact, int], None],
) -> Replica:
    replica = Replica.open(_conn(store), store, identity, dataset)
    replica.subscribe(lambda weight, fact, _cid: on_change(fact, weight))
    return replica


def visible_facts(replica: Replica) -> Iterable[Fact]:
    for _cid, fact in replica.visible():
        yield fact


def replica_write(replica: Replica, asserts: list[Fact], retracts: list[Fact]) -> Link | None:
    """One signed delta (or several if over the per-delta op limit); the last CID."""
    ops = [Assert(f) for f in asserts] + [Retract(f) for f in retracts]
    from merklog.replication.blocks import MAX_OPS

    last = None
    for i in range(0, len(ops), MAX_OPS):
        cid = replica.write(ops[i : i + MAX_OPS])
        last = cid or last
    return last


def all_blocks(replica: Replica) -> Iterable[tuple[Link, bytes]]:
    """Every delta with its fact blocks, facts first, in clock order."""
    return replica.missing_for([replica.dataset])


def apply_blocks(replica: Replica, blocks: Iterable[tuple[Link, bytes]]) -> dict[str, int]:
    return replica.apply_blocks(blocks).to_json()


def replica_heads(replica: Replica) -> list[Link]:
    return replica.heads()


def drain_inbox(replica: Replica) -> list[tuple[Fact, int]]:
    """``@async`` tuples delivered to this node since the last epoch (none without an inbox)."""
    inbox = getattr(replica, "node_inbox", None)
    if inbox is None:
        return []
    return [(fact, +1) for fact in inbox.drain()]


def send_outbox(replica: Replica, outbox: list[tuple[Any, Fact]]) -> None:
    outbox_obj = getattr(replica, "node_outbox", None)
    if outbox_obj is not None:
        outbox_obj.enqueue(outbox)


# ---------------------------------------------------------------- sync


async def sync_with(
    replica: Replica, url: str, cfg: Config, progress: Callable[[int, int], None] | None
) -> dict[str, Any]:
    """Pull then push with the peer at ``url`` (signed with this node's key)."""
    import dataclasses

    from merklog.replication.client import SyncClient

    async with SyncClient(replica.identity, timeout=float(cfg.get("sync.timeout"))) as client:
        stats, their_heads = await client._pull(url, replica)
        if progress:
            progress(1, 2)
        if set(their_heads) != set(replica.heads()):
            stats += await client.push(url, replica, their_heads)
        if progress:
            progress(2, 2)
    out = dataclasses.asdict(stats)
    out["bytes_in"] = stats.bytes_received
    out["bytes_out"] = stats.bytes_sent
    out["deltas_in"] = stats.accepted
    return out


async def fetch_genesis(url: str) -> tuple[Link, bytes]:
    """A peer's dataset id and genesis block, from its open local API (verified)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(url.rstrip("/") + "/v1/genesis") as resp:
            if resp.status != 200:
                raise NodeInputError(f"{url} did not give its genesis (HTTP {resp.status})")
            data = await resp.read()
            dataset = Link.parse(resp.headers["X-Dataset"])
    if not dataset.verifies(data):
        raise NodeInputError(f"{url} sent a genesis block that does not hash to {dataset}")
    return dataset, data


def join_dataset(store: BlockStore, identity: Identity, dataset: Link, genesis: bytes) -> Link:
    replica = Replica.open(_conn(store), store, identity, dataset, genesis)
    return replica.dataset


class _ConfigAllowList:
    """Peers allowed to sync: the keys in ``[peers]`` of config.toml, re-read when it changes
    (so ``merklog peers add`` takes effect on a running node)."""

    def __init__(self, cfg: Config) -> None:
        from merklog.replication.auth import AllowList

        self._cls = AllowList
        self.cfg = cfg
        self._mtime = -1.0
        self._allow = AllowList()

    def _current(self) -> Any:
        path = self.cfg.home / "config.toml"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return self._allow
        if mtime != self._mtime:
            fresh = Config.load(self.cfg.home)
            allow = self._cls()
            for peer in fresh.peers.values():
                if isinstance(peer, dict) and peer.get("key"):
                    allow.allow(peer["key"], [fresh.get("dataset.id")])
            self._allow, self._mtime = allow, mtime
        return self._allow

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


# ---------------------------------------------------------------- language


def parse_facts(text: str) -> list[Fact]:
    """Ground facts in Datalog syntax (``edge(1, 2). edge(2, 3).``)."""
    from merklog.engine.parser import parse_facts as _parse

    try:
        parsed = _parse(text)
    except Exception as exc:  # parser errors carry line:column
        raise NodeInputError(str(exc)) from exc
    return [f if isinstance(f, Fact) else make_fact(f[0], f[1]) for f in parsed]


def parse_query(text: str) -> tuple[ast.BodyLiteral, ...]:
    """An atom (``path(1, X)``) or a conjunction (``edge(X, Y), !edge(Y, X)``)."""
    from merklog.engine.parser import parse_program
    from merklog.engine.parser import parse_query as _parse

    try:
        return (ast.Positive(_parse(text)),)
    except Exception as exc:
        first = exc
    try:
        program = parse_program(f"{QUERY_PROBE}() :- {text.strip().rstrip('.')}.")
        if len(program.rules) == 1 and not program.facts:
            return program.rules[0].body
    except Exception:
        pass
    raise NodeInputError(str(first)) from first


def query_relations(query: tuple[ast.BodyLiteral, ...]) -> set[str]:
    return {atom.rel for lit in query for atom, _ in ast.body_atoms(lit)}


def _query_columns(query: tuple[ast.BodyLiteral, ...]) -> list[ast.Var]:
    seen: dict[str, ast.Var] = {}
    for lit in query:
        if isinstance(lit, ast.Aggregate):
            names = [lit.result]
        else:
            names = list(ast.literal_vars(lit))
        for v in names:
            if not v.anonymous and v.name not in seen:
                seen[v.name] = v
    return list(seen.values())


def evaluate_query(
    query: tuple[ast.BodyLiteral, ...], relation: Callable[[str], set[tuple]]
) -> tuple[list[str], list[tuple]]:
    """Columns (the query's named variables) and the distinct rows answering it."""
    columns = _query_columns(query)
    names = [v.name for v in columns]
    if len(query) == 1 and isinstance(query[0], ast.Positive) and query[0].cid is None:
        fast = _match_atom(query[0].atom, relation, names)
        if fast is not None:
            return names, fast
    from merklog.engine.batch import BatchEvaluator

    head = ast.Atom(QUERY_REL, tuple(columns))
    rule = ast.Rule(head, query)
    base = {rel: relation(rel) for rel in query_relations(query)}
    result = BatchEvaluator([rule]).evaluate(base)
    return names, list(result.get(QUERY_REL, ()))


def _match_atom(
    atom: ast.Atom, relation: Callable[[str], set[tuple]], names: list[str]
) -> list[tuple] | None:
    """Direct scan for a single atom of constants and variables (None: use the evaluator)."""
    if not all(isinstance(a, ast.Var | ast.Const) for a in atom.args):
        return None
    n = len(atom.args)
    out = set()
    for row in relation(atom.rel):
        if len(row) < n or (len(row) != n and not atom.rest):
            continue
        env: dict[str, Any] = {}
        ok = True
        for arg, value in zip(atom.args, row, strict=False):
            if isinstance(arg, ast.Const):
                if not _same(arg.value, value):
                    ok = False
                    break
            elif arg.anonymous:
                continue
            elif arg.name in env:
                if not _same(env[arg.name], value):
                    ok = False
                    break
            else:
                env[arg.name] = value
        if ok:
            out.add(tuple(env[name] for name in names))
    return list(out)


def _same(a: Any, b: Any) -> bool:
    return (
        type(a) is type(b)
        and a == b
        or (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and a == b
        )
    )


# ---------------------------------------------------------------- programs


class CompiledProgram:
    """A checked program and its evaluator. Each epoch re-evaluates over the base relations
    (reference batch evaluator) and reports the net changes of derived relations."""

    def __init__(self, program: ast.Program) -> None:
        from merklog.engine.batch import BatchEvaluator

        self.program = program
        self.evaluator = BatchEvaluator(program.rules)
        self.heads = {r.head.rel for r in program.rules}
        self.facts = [make_fact(rel, args) for rel, args in program.facts]
        self.derived: dict[str, set[tuple]] = {}
        self.base: dict[str, set[tuple]] = {}
        for f in self.facts:
            self.base.setdefault(f.rel, set()).add(f.args)


def compile_program(text: str, source: str = "<program>") -> CompiledProgram:
    from merklog.engine.parser import parse_program

    try:
        program = parse_program(text)
        try:
            from merklog.engine.checks import check_program
        except ImportError:
            check_program = None
        if check_program is not None:
            checked = check_program(program)
            if isinstance(checked, ast.Program):
                program = checked
    except Exception as exc:
        raise NodeInputError(f"{source}: {exc}") from exc
    return CompiledProgram(program)


def engine_step(
    engine: CompiledProgram, changes: list[tuple[Fact, int]], carry: list[Fact]
) -> tuple[list[tuple[Fact, int]], list[Fact], list[tuple[Any, Fact]]]:
    """Apply EDB changes, evaluate one epoch with the ``@next`` carry-over; return
    (derived-relation deltas, tuples for the next epoch, ``@async`` outbox)."""
    for fact, weight in changes:
        rows = engine.base.setdefault(fact.rel, set())
        if weight > 0:
            rows.add(fact.args)
        else:
            rows.discard(fact.args)
    base: dict[str, set[tuple]] = {rel: set(rows) for rel, rows in engine.base.items()}
    for fact in carry:
        base.setdefault(fact.rel, set()).add(fact.args)
    result = engine.evaluator.step(base)
    out: list[tuple[Fact, int]] = []
    new_derived: dict[str, set[tuple]] = {}
    for rel, rows in result.relations.items():
        derived = rows - engine.base.get(rel, set())
        if derived:
            new_derived[rel] = derived
    for rel in set(new_derived) | set(engine.derived):
        new = new_derived.get(rel, set())
        old = engine.derived.get(rel, set())
        out.extend((Fact(rel, r), +1) for r in new - old)
        out.extend((Fact(rel, r), -1) for r in old - new)
    engine.derived = new_derived
    nxt = [Fact(rel, r) for rel, rows in result.next_tuples.items() for r in rows]
    return out, nxt, result.outbox


# ---------------------------------------------------------------- JSON


def json_value(value: Any) -> Any:
    """A value in JSON: CIDs as ``{"/": "bafy…"}``, bytes as ``{"bytes": base64}``."""
    if isinstance(value, Link):
        return {"/": str(value)}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    return value


def query_columns_of(query: tuple[ast.BodyLiteral, ...]) -> list[str]:
    return [v.name for v in _query_columns(query)]


def add_peer_routes(app: Any, node: Any) -> None:
    """Mount replication's peer endpoints (heads/sync/push/inbox) for this node's replica."""
    from merklog.replication.server import sync_routes

    routes, service = sync_routes(
        {node.replica.dataset: node.replica}, _ConfigAllowList(node.config)
    )
    app.add_routes(routes)


def replication_errors() -> tuple[type[BaseException], ...]:
    from merklog.replication.errors import ReplicationError

    return (ReplicationError,)
