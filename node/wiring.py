"""The one place where the node meets the store, replication and engine packages.

Everything the node needs from the other parts goes through these functions, so
a change of interface there is a change here only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from merklog.engine import ast
from merklog.replication.blocks import Assert, Retract
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import BlockStore, Fact, Link, MemoryBlockStore, make_fact

from .config import Config
from .errors import NodeInputError
from .files import private_dir, private_file, tighten
from .jsonvalues import value_to_json

__all__ = ["Identity", "NodeInputError"]

QUERY_REL = "__query"
QUERY_PROBE = "merklogQueryProbe"


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
    if not path.parent.exists():  # never chmod a directory the user chose and made
        private_dir(path.parent)
    private_file(path)  # SQLite gives -wal and -shm the database file's mode
    for suffix in ("-wal", "-shm"):
        tighten(path.with_name(path.name + suffix))
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
    """One transaction of as many signed deltas as receivers' limits need; the last CID."""
    return replica.write([Assert(f) for f in asserts] + [Retract(f) for f in retracts])


def all_blocks(replica: Replica) -> Iterable[tuple[Link, bytes]]:
    """Every delta with its fact blocks, facts first, in clock order."""
    return replica.missing_for([replica.dataset])


def apply_blocks(replica: Replica, blocks: Iterable[tuple[Link, bytes]]) -> dict[str, int]:
    return replica.apply_blocks(blocks).to_json()


def replica_heads(replica: Replica) -> list[Link]:
    return replica.heads()


def transaction(store: BlockStore) -> Any:
    """One atomic, durable section on the store's SQLite connection (nestable)."""
    from merklog.replication.txn import transaction as _tx

    return _tx(_conn(store), store)


def store_conn(store: BlockStore) -> Any:
    """The SQLite connection node-side tables (epoch state) live in."""
    return _conn(store)


def open_messaging(
    store: BlockStore,
    identity: Identity,
    resolve: Callable[[Any], str],
    on_message: Callable[[Any], None],
) -> tuple[Any, Any]:
    """The persisted ``@async`` outbox and the deduplicating inbox of this node."""
    from merklog.replication.messages import Inbox, Outbox

    conn = _conn(store)
    return (
        Outbox(conn, identity, resolve=resolve, blockstore=store),
        Inbox(conn, on_message=on_message, blockstore=store),
    )


def pending_messages(inbox: Any) -> list[tuple[Link, Fact]]:
    """Inbox messages no epoch has consumed yet, as (message CID, fact), arrival order."""
    return [(m.cid, m.fact) for m in inbox.pending()]


def ack_messages(inbox: Any, cids: list[Link]) -> None:
    inbox.ack(cids)


def queue_messages(outbox: Any, messages: list[tuple[Any, Fact]]) -> None:
    """Queue ``(destination, fact)`` pairs durably (the outbox sink of one epoch)."""
    outbox.put_many((dest, fact.rel, fact.args) for dest, fact in messages)


async def deliver_messages(outbox: Any, session: Any, timeout: float) -> Any:
    """One delivery pass over due messages (signed ``POST /v1/inbox``, batched per peer)."""
    return await outbox.deliver(session, timeout=timeout)


# ---------------------------------------------------------------- sync


async def sync_with(
    replica: Replica, url: str, cfg: Config, progress: Callable[[str, int, int], None] | None
) -> dict[str, Any]:
    """Pull then push with the peer at ``url`` (signed with this node's key);
    ``progress(direction, body bytes, deltas)`` after each request."""
    import dataclasses

    from merklog.replication.client import SyncClient

    async with SyncClient(
        replica.identity, timeout=float(cfg.get("sync.timeout")), progress=progress
    ) as client:
        stats = await client.sync(url, replica)
    out = dataclasses.asdict(stats)
    out["bytes_in"] = stats.bytes_received
    out["bytes_out"] = stats.bytes_sent
    out["deltas_in"] = stats.accepted
    return out


async def fetch_genesis(url: str, token: str = "") -> tuple[Link, bytes]:
    """A peer's dataset id and genesis block from its local API (``token``: the peer's
    read token unless it allows anonymous reads), verified against the id."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url.rstrip("/") + "/v1/genesis", headers=headers) as resp:
            if resp.status == 401:
                raise NodeInputError(f"{url} wants a token: pass --token with its api.read_token")
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


class AtomicApply:
    """A replica whose ``apply_blocks`` runs through ``run(fn, *args)`` (the node uses it
    to hand all visible changes of one applied batch to the same epoch)."""

    def __init__(self, replica: Replica, run: Callable[..., Any]) -> None:
        self._replica = replica
        self._run = run

    def apply_blocks(self, *args: Any, **kw: Any) -> Any:
        return self._run(lambda: self._replica.apply_blocks(*args, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._replica, name)


def config_allow_list(cfg: Config) -> Any:
    """The peers allowed to sync: keys in ``[peers]``, re-read when config.toml changes."""
    return _ConfigAllowList(cfg)


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
        if self.cfg.home is None:  # a memory node: its peers are the configured ones
            allow = self._cls()
            for peer in self.cfg.peers.values():
                if isinstance(peer, dict) and peer.get("key"):
                    allow.allow(peer["key"], [self.cfg.get("dataset.id")])
            return allow
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
    from merklog.engine.errors import EngineError
    from merklog.engine.parser import parse_program
    from merklog.engine.parser import parse_query as _parse

    try:
        return (ast.Positive(_parse(text)),)
    except (EngineError, ValueError) as exc:
        first = exc  # not a single atom: try it as a rule body, but report this error
    try:
        program = parse_program(f"{QUERY_PROBE}() :- {text.strip().rstrip('.')}.")
    except (EngineError, ValueError):
        raise NodeInputError(str(first)) from first
    if len(program.rules) == 1 and not program.facts:
        return program.rules[0].body
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
    match = atom_matcher(query)
    if match is not None:
        rel = query[0].atom.rel  # type: ignore[union-attr]
        rows = {m for m in map(match, relation(rel)) if m is not None}
        return names, list(rows)
    from merklog.engine.batch import BatchEvaluator

    head = ast.Atom(QUERY_REL, tuple(columns))
    rule = ast.Rule(head, query)
    base = {rel: relation(rel) for rel in query_relations(query)}
    result = BatchEvaluator([rule]).evaluate(base)
    return names, list(result.get(QUERY_REL, ()))


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


def compile_program(text: str, source: str = "<program>", engine: str = "auto") -> Any:
    """Parse, statically check and compile ``text`` into a
    :class:`~merklog.node.programs.ProgramRunner`; a bad program raises
    :class:`NodeInputError` (``SOURCE:LINE:COL: message``)."""
    from .programs import compile_program as _compile

    return _compile(text, source, engine)


def empty_program() -> Any:
    from .programs import empty_program as _empty

    return _empty()


def atom_matcher(
    query: tuple[ast.BodyLiteral, ...],
) -> Callable[[tuple], tuple | None] | None:
    """For a single-atom query of constants and variables, a function mapping one tuple of
    its relation to the answer row it yields (None if it does not match); None otherwise."""
    if len(query) != 1 or not isinstance(query[0], ast.Positive) or query[0].cid is not None:
        return None
    atom = query[0].atom
    if not all(isinstance(a, ast.Var | ast.Const) for a in atom.args):
        return None
    names = [v.name for v in _query_columns(query)]
    n = len(atom.args)

    def match(row: tuple) -> tuple | None:
        if len(row) < n or (len(row) != n and not atom.rest):
            return None
        env: dict[str, Any] = {}
        for arg, value in zip(atom.args, row, strict=False):
            if isinstance(arg, ast.Const):
                if not _same(arg.value, value):
                    return None
            elif arg.anonymous:
                continue
            elif arg.name in env:
                if not _same(env[arg.name], value):
                    return None
            else:
                env[arg.name] = value
        return tuple(env[name] for name in names)

    return match


# ---------------------------------------------------------------- JSON


def json_value(value: Any) -> Any:
    """A value in JSON (DAG-JSON tagged forms for CIDs and bytes)."""
    return value_to_json(value)


def query_columns_of(query: tuple[ast.BodyLiteral, ...]) -> list[str]:
    return [v.name for v in _query_columns(query)]


def replication_errors() -> tuple[type[BaseException], ...]:
    from merklog.replication.errors import ReplicationError

    return (ReplicationError,)
