"""The peer node: replica + Datalog program + epoch loop, embeddable without HTTP.

``Node.open(home)`` (or ``async with Node.open(home) as node``) opens a home
directory — creating keys, config, store and dataset on first use — and takes the
home lock (see :mod:`merklog.node.runtime`). Writes are durable when ``assert_`` /
``retract`` return: the signed delta, its fact blocks and the visible-state update
commit in one SQLite transaction (WAL, ``synchronous=FULL``).

Epochs are evaluated by the node's :class:`~.epoch.EpochDriver` (``node.epochs``):
it drains the sources — local writes and replicated facts, inbox ``@async``
tuples, ``@next`` carry-over, the optional ``tick`` clock — into the incremental
engine and hands the output deltas to the ``@async`` outbox, live-query
subscribers and user callbacks. The background epoch loop lives in :mod:`.tasks`,
the HTTP server in :mod:`.server`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from os import PathLike
from pathlib import Path
from typing import Any, BinaryIO

from merklog.replication.identity import Identity
from merklog.replication.messages import Inbox, Outbox
from merklog.store import Fact, Link, check_relation
from merklog.store.gcpause import gc_paused

from . import (
    carfiles,
    edb,
    factpages,
    grants,
    peersync,
    programs,
    programstore,
    queries,
    querybound,
    querycheck,
    storage,
    writeaccess,
    writes,
)
from . import dataset as dataset_mod
from .config import Config, check_tokens, generated_tokens, peer_name_problem
from .epoch import TICK_REL, EpochDriver, Sink
from .epochview import EpochView
from .errors import NodeInputError, NodeStopped, NotSettled
from .failures import ProgramFailing, UnknownPeer, UnknownRelation
from .homeinit import IDENTITY_FILE as IDENTITY_FILE  # re-exported (commands, tests)
from .homeinit import init_home as init_home  # re-exported: callers look here
from .homeinit import initialise, lock_is_new
from .inflight import CLOSED, InFlight
from .jsonvalues import value_to_json
from .metrics import NodeMetrics
from .peersync import PeerSync, load_history
from .runtime import HomeLock
from .status import node_status
from .storecheck import load_key
from .subscriptions import Callback, Row, Subscription
from .tasks import BackgroundTasks
from .writes import FactLike, WriteResult

log = logging.getLogger(__name__)

#: Seconds :meth:`Node.close` waits for an epoch that is still running.
CLOSE_WAIT = 60.0


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[Row]
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": self.columns,
            "rows": [[value_to_json(v) for v in r] for r in self.rows],
            "epoch": self.epoch,
        }


class Node:
    """One replica of one dataset plus the program evaluated over it."""

    def __init__(self, config: Config, lock: HomeLock | None = None, identity: Any = None) -> None:
        self.config = config
        self.home = config.home
        self._lock = lock
        #: Writes in progress: close waits for them, and refuses new ones.
        self._writes = InFlight()
        self.metrics = NodeMetrics()
        if identity is None:
            if self.home is None:
                raise NodeInputError("a node without a home needs an identity")
            identity = load_key(self.home)  # never a new one: only init makes keys
        self.identity = identity
        self.store = storage.open_store(config)
        try:
            self._open(config)
        except BaseException:
            self.store.close()  # a failed open leaves no store handle behind (Python API)
            raise

    def _open(self, config: Config) -> None:
        """The rest of :meth:`__init__`, once the store is open: replica, epoch driver,
        outbox and inbox, and the stored program. The first (reload) epoch, which reads
        the stored facts, runs when an epoch or a read first needs it (ADR 0154)."""
        if config.get("store.backend") == "memory":
            # Nothing outlives the process: a memory node owns a fresh dataset each time.
            name = self.home.name if self.home is not None else "memory"
            self.dataset = dataset_mod.create_dataset(self.store, self.identity, name)
        else:
            self.dataset = Link.parse(config.get("dataset.id"))
        #: The one epoch driver of this node (intake, evaluation, commit, sinks).
        self.epochs = EpochDriver(self)
        self._mutex = self.epochs.mutex
        self.replica = dataset_mod.open_replica(
            self.store,
            self.dataset,
            self.identity,
            self.epochs.on_visible_change,
            self.epochs.on_visible_new,
        )
        #: Sync history per peer URL (configured peers and URLs synced ad hoc).
        self.peer_sync: dict[str, PeerSync] = load_history(self.home)
        #: One sync per peer URL at a time (:func:`.peersync.sync_node`).
        self.sync_turns = peersync.SyncTurns()
        #: The syncs :meth:`sync` runs for its callers (an app's, a ``POST /v1/sync``):
        #: stopped by :meth:`stop`, as the node's own background syncs are.
        self._syncs: set[asyncio.Task] = set()
        self._syncs_stopped = False
        self.tasks = BackgroundTasks(self)
        #: The URL ``merklog.serve`` serves this node at (None when not served): one at a
        #: time, since the home's run file names one URL.
        self.served_url: str | None = None
        self.url: str | None = None
        #: Group commit of ``write_async`` (its queue of waiting requests).
        self._group_commit = writes.GroupCommit(self)
        self.program_text = ""
        conn = storage.store_conn(self.store)
        self.outbox = Outbox(
            conn,
            self.identity,
            resolve=self._resolve_destination,
            blockstore=self.store,
            give_up=float(config.get("node.outbox_give_up")),
            address=partial(peersync.async_address, config),
        )
        self.inbox = Inbox(
            conn,
            on_message=self._on_message,
            blockstore=self.store,
            recipient=self.identity.public_key,
        )
        # Restart: the visible set is the EDB (fed whole to the first epoch, read when that
        # epoch runs: ADR 0154), the epoch number and @next carry-over come from the last
        # committed epoch.
        self.engine: Any = programs.empty_program()
        #: ``load_progress(read, visible)``: told as the first epoch reads a large home's
        #: stored facts (the CLI draws it as a bar on a terminal); None tells nothing.
        self.load_progress: Callable[[int, int], None] | None = None
        self.epochs.restore(self._read_visible)
        programstore.restore(self, config.path("node.program"))

    def _read_visible(self) -> edb.Edb:
        return edb.read_visible(self.replica, self.load_progress)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, home: str | Path, **overrides: Any) -> Node:
        """Open (creating if needed) the node stored in ``home``; takes the home lock.

        Nothing is created when the options are bad, ``home`` is empty or not a directory; a
        home whose store is missing, empty, not SQLite or damaged raises
        :class:`~.failures.StoreDamaged` (the CLI's exit 5 and message) and is not
        written to: SQLite would otherwise make a new empty database in its place. An
        initialised home whose node key is gone raises :class:`~.failures.KeyMissing`
        (exit 5 too) rather than getting a new key that may not write to its dataset."""
        import sqlite3

        from .failures import StoreDamaged, classify
        from .storecheck import precheck

        _check_path(home, "home")
        if not str(home).strip():  # Path("") is ".": keys and store would land in cwd
            raise NodeInputError(
                "the home path is empty; name a directory, or pass None for the default"
                " ($MERKLOG_HOME, else ~/.merklog)"
            )
        home = Path(home).expanduser()
        settings = {k.replace("__", "."): v for k, v in overrides.items()}
        # a bad option (or token) fails before anything is created
        check_tokens(
            Config.load(None, settings), [k for k in generated_tokens() if k not in settings]
        )
        if home.exists() and not home.is_dir():
            raise NodeInputError(f"{home} is not a directory (a merklog home is one)")
        existed = home.exists()  # before the lock makes it
        lock_made = lock_is_new(home)
        try:
            lock = HomeLock.acquire(home)
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            # a parent that is a file, or a place this user cannot create a directory
            raise NodeInputError(f"cannot make {home} a merklog home: {exc.strerror}") from None
        try:
            try:
                if not (home / "config.toml").exists():
                    # all or nothing, as `merklog init`: an IPFS daemon that is down leaves
                    # no half-made home behind. With the settings given, as `merklog --set
                    # … init` saves them: made without them, a home opened with
                    # store.backend=ipfs was recorded as a SQLite home (its CLI commands
                    # then read another store than the app wrote) or left half-made.
                    initialise(home, settings, None, existed, lock_made)
                cfg = Config.load(home, settings)
                if not cfg.get("dataset.id"):
                    cfg, _ = initialise(home, settings, None, True)
                check_tokens(cfg)
                precheck(cfg)
                return cls(cfg, lock)
            except sqlite3.DatabaseError as exc:  # the first open's init met it too
                code, message = classify(exc, home)
                raise StoreDamaged(message, code) from None
        except BaseException:
            lock.release()
            raise

    @classmethod
    def memory(cls, overrides: dict[str, Any] | None = None) -> Node:
        """A node that lives in memory only: fresh key, fresh dataset, no file touched."""
        cfg = Config.load(None, {**(overrides or {}), "store.backend": "memory"})
        return cls(cfg, None, Identity.generate())

    def close(self) -> None:
        """Stop the background tasks (if any), let an epoch still running finish (a slow
        live-query callback, say: its commit needs the store), then close the store and
        release the home lock. Another process could otherwise take the home while that
        epoch still writes to it."""
        self.epochs.stopping.set()  # an evaluation running ends at its next round
        drained = self._writes.close(CLOSE_WAIT)  # writes in flight complete first
        self.tasks.cancel()
        if not drained:
            log.warning("a write still ran after %.0f s; closing the store anyway", CLOSE_WAIT)
        finished = self.epochs.mutex.acquire(timeout=CLOSE_WAIT)
        # An epoch saves after releasing the mutex (ADR 0180): that save ends first too.
        saved = finished and self.epochs.saving.acquire(timeout=CLOSE_WAIT)
        try:
            if not saved:
                log.warning("an epoch still ran after %.0f s; closing the store anyway", CLOSE_WAIT)
            self.store.close()
        finally:
            if saved:
                self.epochs.saving.release()
            if finished:
                self.epochs.mutex.release()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Node:
        self._require_open()  # `with node:` on a closed node said nothing
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Node:
        self.start()
        await writeaccess.sync_on_open(self)  # a freshly joined home: receive its grant first
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self.close()

    def start(self) -> None:
        """Run the epoch loop, ``@async`` delivery and automatic sync in this event loop.

        The first epoch of the loop hands the stored facts to the incremental engine
        (the first epoch evaluated them in one batch, ADR 0070), so the first write after
        start-up finds incremental state ready."""
        self._require_open()
        self.epochs.stopping.clear()  # a stop before this one no longer applies
        self._syncs_stopped = False
        try:
            self.epochs.ready()  # the stored facts and the program's state before serving
        except ProgramFailing:  # the program fails on them: serve, so it can be fixed
            failed: str | None = self.epochs.start_failure
            log.error("%s", failed)
        else:
            failed = None
        self.epochs.warm_up = True
        self.tasks.start(failed)
        if failed is None:  # else only a change runs the next epoch, as after any failure
            self.wake()
        from . import ipfs_sync

        task = ipfs_sync.start(self)  # heads over pubsub when the store is on IPFS
        if task is not None:
            self.tasks.tasks.append(task)  # stopped and cancelled with the others

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop the background tasks within about ``timeout`` seconds (see :mod:`.tasks`),
        and the syncs callers started with :meth:`sync`, which raise "this node is
        closed" (an app's sync with a peer that never answered kept its socket open for
        ``sync.timeout`` after ``async with`` ended, QA)."""
        self._syncs_stopped = True
        running = [task for task in self._syncs if not task.done()]
        for task in running:
            task.cancel()
        if running:  # each records itself as interrupted, in the store still open
            await asyncio.wait(running, timeout=timeout)
        await self.tasks.stop(timeout)

    @property
    def last_sync(self) -> dict[str, Any] | None:
        """This node's last good sync (``{"url", "at", **figures}``), read from its sync
        history, which the home keeps across restarts."""
        return peersync.last_sync(self.peer_sync)

    def peer_urls(self) -> dict[str, str]:
        """``{name: url}`` of the peers in ``[peers]``, re-read from config.toml so peers
        added while the node runs (``merklog peers add``) count."""
        return peersync.peer_urls(self.config)

    def _resolve_destination(self, dest: Any) -> str:
        """An ``@async`` head's first argument: a peer name from ``[peers]`` or a URL."""
        return peersync.async_destination(self.config, dest)

    def _on_message(self, message: Any) -> None:
        self.metrics.async_messages.labels("received").inc()
        self.wake()

    def wake(self) -> None:
        """Ask for an epoch as soon as possible (thread-safe)."""
        self.tasks.wake_epoch()

    # ------------------------------------------------------------------ writes
    def atomically(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` (a replica write or apply) so that every visible change it makes
        enters the same epoch; a write in flight, which :meth:`close` waits for."""
        with self._writes.enter():
            return self.epochs.atomically(fn, *args)

    def coerce_facts(self, facts: Iterable[FactLike]) -> list[Fact]:
        """Facts from Fact objects, ``(rel, args)`` pairs or Datalog text."""
        return writes.coerce_facts(_fact_list(facts, "facts"))

    def check_declared(self, facts: list[Fact]) -> None:
        """Refuse (NodeInputError, nothing stored) the first fact that does not fit the
        loaded program's ``.decl`` declarations (see :func:`.writes.check_declared`)."""
        writes.check_declared(self.engine, facts)

    def write(
        self,
        asserts: Iterable[FactLike] = (),
        retracts: Iterable[FactLike] = (),
        *,
        evaluate: bool = True,
    ) -> WriteResult:
        """Assert and retract in one signed delta; durable on return. A freshly joined
        home first syncs once with its origin, as ``put`` does (ADR 0076).

        ``asserts`` and ``retracts`` are lists of facts: Fact objects, ``(rel, args)``
        pairs or Datalog texts. Without an epoch loop (plain ``with``) the write is
        evaluated before it returns, as :meth:`assert_` is, unless ``evaluate=False`` (a
        bulk load whose next epoch, or the next open, evaluates it)."""
        self._require_open()
        if not isinstance(evaluate, bool):  # evaluate="no" evaluated (QA)
            raise NodeInputError(f"evaluate: expected True or False, got {evaluate!r}")
        asserts = _fact_list(asserts, "asserts")
        retracts = _fact_list(retracts, "retracts")
        with self._writes.enter():  # close waits for it from here on
            writeaccess.sync_before_first_write_here(self)
            result = self._write(asserts, retracts)
            return self._settle_sync(result) if evaluate else result

    def _require_open(self) -> None:
        """Raise NodeInputError once :meth:`close` ran: a closed home node raised a raw
        ``sqlite3.ProgrammingError`` and a closed memory node kept taking writes."""
        if self._writes.closed:
            raise NodeInputError(CLOSED)

    def _write(
        self,
        asserts: Iterable[FactLike],
        retracts: Iterable[FactLike],
        checked: bool = False,
        encoded_asserts: list[tuple[Link, bytes]] | None = None,
    ) -> WriteResult:
        """One durable write without the first-write sync (see :func:`.writes.write_facts`;
        ``checked``: the facts are already checked, as ``write_async`` hands them;
        ``encoded_asserts``: ``encode_facts(asserts)`` if the caller has it)."""
        with self._writes.enter():  # close waits for it from here on
            return writes.write_facts(self, asserts, retracts, checked, encoded_asserts)

    async def write_async(
        self,
        asserts: Iterable[FactLike],
        retracts: Iterable[FactLike] = (),
        encoded_asserts: list[tuple[Link, bytes]] | None = None,
    ) -> WriteResult:
        """``write`` for the event loop: concurrent callers share one delta and one fsync
        (group commit, :class:`.writes.GroupCommit`) while the commit itself runs on a
        worker thread. ``asserts`` and ``retracts`` take what :meth:`write` takes, and
        are checked as it checks them: a ``Fact`` made by hand with a value merklog has
        no encoding for (``None``) was stored unchecked and every later read of the home
        failed (QA). ``encoded_asserts``, if given, is ``encode_facts(asserts)``; it is
        used when the check changed no fact."""
        self._require_open()  # a closed home's store raised sqlite3.ProgrammingError
        given = _fact_list(asserts, "asserts")
        add = self.coerce_facts(given)
        rem = self.coerce_facts(_fact_list(retracts, "retracts"))
        if encoded_asserts is not None and not (
            len(add) == len(given) and all(map(operator.is_, add, given))
        ):
            encoded_asserts = None
        return await self._write_checked_async(add, rem, encoded_asserts)

    async def _write_checked_async(
        self,
        asserts: list[Fact],
        retracts: list[Fact],
        encoded_asserts: list[tuple[Link, bytes]] | None = None,
    ) -> WriteResult:
        """:meth:`write_async` of facts already checked (by a request's decoder, off the
        event loop: a 200k-fact body is not checked twice, ADR 0145)."""
        self._require_open()
        return await self._group_commit.write(asserts, retracts, encoded_asserts)

    def assert_(self, *fact: Any) -> WriteResult:
        """Assert one typed fact: ``node.assert_("edge", 1, 2)`` is ``edge(1, 2)``.

        Values keep their type: ``1``, ``1.0``, ``True``, ``"1"`` and ``b"\\x01"`` are
        five different values (``Link`` for CIDs). Durable on return. The older forms —
        Fact objects, ``(rel, args)`` pairs or Datalog text such as ``"edge(1, 2)."`` —
        are still accepted; for many facts in one delta use :meth:`write`.
        """
        return self.write(asserts=_typed_or_many(fact, "assert_"))

    def retract(self, *fact: Any) -> WriteResult:
        """Retract one typed fact (``node.retract("edge", 1, 2)``): every visible
        assertion of it (observed-remove). Older forms as in :meth:`assert_`."""
        return self.write(retracts=_typed_or_many(fact, "retract"))

    def _settle_sync(self, result: WriteResult) -> WriteResult:
        """Without a running epoch loop (plain ``with``), evaluate the write at once so the
        next query sees it; with one, ``await node.settled()`` does that. A program that
        fails on the write raises :class:`NotSettled`, which says the write is stored."""
        from merklog.engine.errors import EngineError

        if not self.tasks.running and not self._writes.closed:  # closing: next open evaluates
            try:
                self.run_epoch()
            except EngineError as exc:
                what = (
                    f"the write is stored (delta {result.delta})"
                    if result.delta is not None
                    else "the write changed nothing"
                )
                raise NotSettled(
                    f"{what}, but the epoch that evaluates it failed: {exc}; queries show the"
                    " last good epoch",
                    result,
                ) from None
        return result

    # ------------------------------------------------------------------ program
    def load_program(
        self, text: str, source: str = "<program>", engine: str = "auto", persist: bool = True
    ) -> None:
        """Parse, check and install a program, and run its first epoch: on return, queries
        answer with what it derives from the current EDB.

        Raises NodeInputError (``SOURCE:LINE:COL: …``) for a program that fails to parse or
        any static check (range restriction, unsafe negation, stratification, …), or whose
        first epoch fails (a recursion that never reaches a fixpoint, ``n(X + 1) :- n(X)``);
        then the running program stays. A program that ran is stored in the home as a
        block (see :mod:`.programstore`). ``persist=False`` (the home's own program, put
        back when it opens) stores nothing and leaves the first epoch to the next run.
        """
        from merklog.engine.errors import EngineError

        self._require_open()
        if not isinstance(text, str):
            raise NodeInputError(f"a program is Datalog text, got {type(text).__name__}")
        if not isinstance(source, str):  # it names the program in every error message
            raise NodeInputError(
                f"a program's source is a name (text), got {type(source).__name__}"
            )
        runner = programs.compile_program(text, source, engine)
        if persist:  # the home's own program was checked when it was loaded
            with self.epochs.reading() as view:
                facts = view.facts
                programs.check_stored_arities(runner, facts.arities, facts.relations())
        runner.memory_limit = programs.memory_limit(self.config)
        failed: EngineError | None = None
        # The swap, the new program's first epoch and then its save (or the old program put
        # back) are one step under the epoch mutex: two loads at once could leave one
        # program running and the other stored, or a failing load put back a program
        # another load had replaced meanwhile. Queries meanwhile answer the last epoch of
        # the program before, until the new one's first epoch is published (ADR 0205): a
        # query of a program that had derived nothing yet answered 0 rows.
        with self._mutex:
            before = self.engine, self.program_text
            self.engine = runner
            self.program_text = text
            self.epochs.program_changed()
            if persist:
                try:
                    self.run_epoch()
                except EngineError as exc:
                    failed = exc
                    self.engine, self.program_text = before
                    self.epochs.program_changed()  # the next epoch re-derives with it
                else:
                    conn = storage.store_conn(self.store)
                    programstore.save(
                        conn, self.store, storage.transaction(self.store), text, source
                    )
        self.wake()
        if failed is not None:  # SOURCE:LINE:COL when the error has a place in it
            where = f"{source}:" if failed.line else f"{source}: "
            raise programs.ProgramError(f"{where}{failed}") from None

    # ------------------------------------------------------------------ epochs
    @property
    def epoch(self) -> int:
        """Number of the last committed epoch."""
        return self.epochs.epoch

    def run_epoch(self) -> int:
        """Evaluate one epoch now (see :meth:`.epoch.EpochDriver.run`); returns the number
        of the epoch queries now answer: the last one's when nothing changed (ADR 0206).
        Safe to call from any thread."""
        self._require_open()
        return self.epochs.run()

    async def settled(self, timeout: float | None = 10.0) -> None:
        """Wait until an epoch has evaluated every change handed over so far (a write
        acknowledged before this call is then visible to queries and live queries).

        Raises :class:`NotSettled` when the epoch that took them failed (the program ran
        away on them; they stay stored and queries show the last good epoch) or none came
        within ``timeout`` seconds (a number above 0; None waits without a limit)."""
        self._require_open()
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            # -1 and 0 gave up at once, NaN waited for ever, "5" failed inside asyncio
            raise NodeInputError(
                "timeout must be a number of seconds above 0, or None to wait without a"
                f" limit, got {repr(timeout)[:40]}"
            )
        error = await self.epochs.settled(timeout)
        if error is not None:
            raise NotSettled(f"the writes are stored, but {error}")

    # ------------------------------------------------------------------ queries
    def relation(self, rel: str) -> set[tuple]:
        """Current tuples of ``rel`` (stored, derived, or this epoch's events), in engine
        form: floats and booleans wrapped (``Float``, ``Bool``) so that the set keeps
        ``1``, ``1.0`` and ``True`` apart; :meth:`query` answers plain values. A name no
        relation can have (``"a b"``, ``5``) raises ``merklog.Error``; one nothing has yet
        is an empty set."""
        self._require_open()
        return self.epochs.relation(check_relation(rel))

    def query(self, text: str) -> QueryResult:
        """Answer ``text`` (e.g. ``"path(1, X)"``) over the state of the last epoch: an
        epoch evaluating meanwhile is not waited for (ADR 0205), and ``epoch`` is the
        number of the epoch whose state the answer shows.

        Bounded like an epoch (ADR 0210): a query that would grow the process past the
        memory budget (``node.eval_memory_mb``) raises :class:`QueryTooLarge` (a
        ``merklog.Error``) once its memory is given back, and one running when the node
        closes stops."""
        q = self.parse_query(text)
        return querybound.bounded_call(self, self.answer_query, q)

    def answer_query(self, q: Any) -> QueryResult:
        """The answer to the parsed query ``q``, without the bounds :meth:`query` sets:
        for a caller that runs it under :func:`.querybound.bounded_call` itself (the
        HTTP handler, which also renders the answer under them).

        Only the query's inputs are read from the last published epoch while it is held
        (copies, see :meth:`.epoch.EpochDriver.reading`); the evaluation, which can take
        seconds, runs after, so that the next epoch publishes and the writes it takes
        are answered meanwhile (ADR 0210)."""
        self._require_open()
        # The answer's rows have no cycles: no collection walks the EDB because of them.
        with gc_paused():
            view, inputs = self._query_inputs(q)
            columns, rows = querycheck.evaluate(partial(queries.answer, inputs=inputs), q)
            del inputs
            return QueryResult(columns, querybound.plain_sorted(rows), view.epoch)

    def parse_query(self, text: str) -> Any:
        """``text`` parsed as a query (NodeInputError if it is none), for
        :meth:`answer_query`: the HTTP handler parses on the event loop, then answers
        on a worker thread under the query's bounds."""
        self._require_open()
        if not isinstance(text, str):
            raise NodeInputError(f"a query is Datalog text, got {type(text).__name__}")
        return queries.parse_query(text)

    def _known_query(self, text: str, live: bool = False) -> Any:
        """``text`` parsed, once its relations and arities are known here (see
        :meth:`_require_known`)."""
        q = self.parse_query(text)
        with self.epochs.reading() as view:
            self._require_known(q, view, live)
        return q

    def _query_inputs(self, q: Any) -> tuple[EpochView, dict]:
        """The last published epoch and the inputs of ``q`` read from it, once its
        relations are known (:meth:`_require_known`). A relation no epoch shows a fact
        of but that the dataset has had facts of (all retracted since) answers no rows,
        not "unknown relation" (an app's to-do list whose last item was deleted, ADR
        0216): it is asked of the store outside the epoch's read lock, and only for such
        a relation, then the epoch is read again."""
        emptied: set[str] = set()
        while True:
            try:
                with self.epochs.reading() as view:
                    self._require_known(q, view, emptied=emptied)
                    engine = view.engine
                    return view, queries.query_inputs(q, engine.relation, engine.relation_matching)
            except UnknownRelation as exc:
                rel = exc.unseen
                if rel is None or rel in emptied or not self.replica.ever_asserted(rel):
                    raise
                emptied.add(rel)

    def _require_known(
        self,
        q: Any,
        view: EpochView,
        live: bool = False,
        emptied: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """Raise :class:`UnknownRelation` for a relation or arity not known here: an
        error, not "(0 rows)" or a live query that never answers. Known means the
        program's (that of ``view``, the last completed epoch), that epoch's stored
        facts' or those of a write no epoch has published yet (whose rows come with
        it). ``live``: a relation nothing has yet is allowed (a live query waits for
        its first facts), one known with another arity is not."""
        epochs = self.epochs
        querycheck.require_known(
            q,
            querycheck.program_arities(view.engine.checked.program),
            lambda rel: view.facts.arities(rel) or epochs.pending_arities(rel),
            {TICK_REL: {1}} if self.config.get("node.tick") else None,
            new_relations=live,
            names=view.facts.relations,
            emptied=emptied,
        )

    def subscribe(self, text: str, callback: Callback) -> Subscription:
        """Call ``callback("result", rows, [])`` now, then ``("delta", added, removed)``.
        A relation known here with another arity is refused, as :meth:`query` refuses it;
        one nothing has yet is taken (its first facts arrive as a delta)."""
        if not callable(callback):
            raise NodeInputError(f"callback: expected a callable, got {type(callback).__name__}")
        q = self._known_query(text, live=True)
        sub = Subscription(
            q, frozenset(queries.query_relations(q)), callback, queries.atom_matcher(q)
        )
        self.epochs.subscribe(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop a live query (what :meth:`subscribe` returned)."""
        self._require_open()
        if not isinstance(sub, Subscription):
            raise NodeInputError(f"unsubscribe: expected a Subscription, got {type(sub).__name__}")
        self.epochs.unsubscribe(sub)

    def add_sink(self, sink: Sink) -> None:
        """``sink(epoch, changes)`` after every epoch that changed something."""
        self._require_open()
        if not callable(sink):
            raise NodeInputError(f"sink: expected a callable, got {type(sink).__name__}")
        self.epochs.add_sink(sink)

    # ------------------------------------------------------------------ sync and status
    async def sync(
        self,
        url: str,
        progress: Callable[[str, int, int], None] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Pull from and push to the peer at ``url``; new facts reach the next epoch.

        A peer that cannot be reached raises :class:`PeerUnreachable`, one that answers
        with a refusal (not allowed to sync, another dataset) :class:`PeerRefused`; both
        are a :class:`PeerError`, counted in ``merklog_sync_failures_total`` and logged
        at WARNING when it starts failing on a running node, whose operator reads its
        log (a one-shot caller such as the CLI's ``sync`` on a stopped home reports the
        error itself, so there it is only DEBUG); a failed sync changes nothing here. ``url`` may also name a peer of ``[peers]``; anything
        else is a :class:`NodeInputError`. ``timeout``: seconds per peer request for this
        sync instead of ``sync.timeout`` (a ``POST /v1/sync`` that asks for its own): a
        number above 0 and at most a day, else :class:`NodeInputError` before anything is
        sent or recorded (a string came back as :class:`PeerUnreachable`).
        ``progress(direction, bytes, deltas)`` is told the bytes and deltas pulled and
        pushed so far (``"pull"``, ``"push"``), and ``("waiting", 0, 0)`` first when
        another sync with that peer runs (one at a time per peer).
        """
        self._require_open()
        if progress is not None and not callable(progress):
            raise NodeInputError(f"progress: expected a callable, got {type(progress).__name__}")
        timeout = peersync.check_sync_timeout(timeout)
        run = asyncio.ensure_future(peersync.sync_node(self, self.peer_url(url), progress, timeout))
        self._syncs.add(run)
        run.add_done_callback(self._syncs.discard)
        try:
            return await run
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if run.cancelled() and self._syncs_stopped and not (caller and caller.cancelling()):
                raise NodeStopped(  # stopped by stop(), not the caller
                    f"the node stopped before this sync with {url} ended; what it applied is"
                    " kept: run the sync again when the node runs"
                ) from None
            raise

    def forget_peer_history(self, url: str) -> bool:
        """Forget the sync history of ``url`` (:func:`.peersync.forget_history`): what
        ``merklog peers remove`` asks, so an ad hoc URL leaves ``status``. On a closed
        node it raises: it saved the history into a home whose lock it no longer held."""
        self._require_open()
        return peersync.forget_history(self, url)

    def peer_url(self, name_or_url: str) -> str:
        """A configured peer's URL by name, or the http(s) URL itself (NodeInputError if
        ``name_or_url`` is neither, or the URL is malformed or holds a password:
        :func:`.peersync.check_peer_url`)."""
        if not isinstance(name_or_url, str):
            raise NodeInputError(f"a peer is a name or an URL, got {type(name_or_url).__name__}")
        url = peersync.resolve_peer(self.config, name_or_url.strip())
        if not url.startswith(("http://", "https://")):
            problem = peer_name_problem(url)  # not echoed whole: a name that long is none
            if problem is not None:
                raise NodeInputError(f"{problem}, and it is no http(s) URL")
            raise UnknownPeer(
                f"unknown peer {name_or_url!r}: [peers] has no such name and it is no http(s)"
                " URL (add it with `merklog peers add`)"
            )
        return peersync.check_peer_url(url)

    def list_facts(self, rel: str | None = None) -> list[tuple[Link, Fact]]:
        """Visible stored facts (optionally of one relation: read through its index) with
        their CIDs, in CID order."""
        self._require_open()
        return factpages.list_facts(self.replica, self.store, _relation_or_none(rel))

    def page_facts(
        self, rel: str | None = None, after: Link | str | None = None, limit: int = 1000
    ) -> tuple[list[tuple[Link, Fact]], Link | None]:
        """One page of visible facts in CID order, starting after CID ``after``; returns
        (page, cursor for the next page or None when this was the last). Reads forward
        from the cursor in index order, so a page costs O(limit) block reads whatever the
        home holds besides (see :mod:`.factpages`). ``after`` may be a CID string; a
        ``limit`` of any size is taken (one past every fact reads them all)."""
        self._require_open()
        if isinstance(after, str):
            after = Link.parse(after)
        elif after is not None and not isinstance(after, Link):
            raise NodeInputError(f"after: expected a CID, got {type(after).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise NodeInputError(f"limit: expected a positive integer, got {limit!r}")
        # A limit past what SQLite's 64-bit LIMIT holds asks for every fact: it raised a raw
        # OverflowError ("Python int too large to convert to SQLite INTEGER").
        limit = min(limit, 2**62)
        return factpages.page_facts(self.replica, self.store, _relation_or_none(rel), after, limit)

    def export_blocks(self) -> tuple[list[Link], Iterable[tuple[Link, bytes]]]:
        """(roots = heads, blocks = genesis then every delta with its facts, in clock order)."""
        self._require_open()
        return carfiles.export_blocks(self.store, self.replica, self.dataset)

    def export_car(self, path: str | Path, progress: Callable[[int], None] | None = None) -> int:
        """Write the replica to a CAR file (atomically); returns the number of blocks."""
        self._require_open()
        _check_path(path, "path")
        return carfiles.export_car(self.store, self.replica, self.dataset, path, progress)

    def import_blocks(self, blocks: Iterable[tuple[Link, bytes]]) -> dict[str, int]:
        """Verify and apply blocks (all or nothing); the next epoch sees the new facts."""
        self._require_open()
        return carfiles.import_blocks(self, blocks)

    def import_stream(
        self, src: BinaryIO, progress: Callable[[int], None] | None = None
    ) -> dict[str, int]:
        """Verify and apply the CAR read from ``src`` (all or nothing, up to the heads its
        roots name: :func:`.carfiles.import_stream`), as ``POST /v1/import`` does."""
        self._require_open()
        return carfiles.import_stream(self, src, progress)

    def import_car(
        self, path: str | Path, progress: Callable[[int], None] | None = None
    ) -> dict[str, int]:
        """Verify and apply the blocks of a CAR file (see :meth:`import_blocks`)."""
        self._require_open()
        _check_path(path, "path")  # an int would be read as an open file descriptor
        return carfiles.import_car(self, path, progress)

    def grant(self, key_hex: str) -> str | None:
        """Let the Ed25519 public key ``key_hex`` write to this dataset (owner only)."""
        self._require_open()
        cid = grants.grant(self.replica, key_hex)
        if cid is not None:
            self.metrics.deltas.inc()
        self.wake()
        return cid

    def revoke(self, key_hex: str) -> str | None:
        """Stop the Ed25519 public key ``key_hex`` from writing (owner only). Deltas it
        signed before (in the causal past of the revoke) stay; later ones are refused by
        every replica that has seen the revoke."""
        self._require_open()
        cid = grants.revoke(self.replica, key_hex)
        if cid is not None:
            self.metrics.deltas.inc()
        self.wake()
        return cid

    def writers(self) -> list[dict[str, Any]]:
        """Every key that may write on top of the current heads, and every key revoked:
        ``{"key", "writer", "owner", "delta"}`` each, the owner first (see
        :func:`.grants.writers`)."""
        self._require_open()
        return grants.writers(self.replica)

    @property
    def served_replica(self) -> Any:
        """The replica as handed to sync (server routes and client): applying a batch of
        replicated deltas is one step for the epoch loop."""
        return dataset_mod.AtomicApply(self.replica, self.atomically, self.metrics.deltas.inc)

    def heads(self) -> list[Link]:
        self._require_open()
        return self.replica.heads()

    def status(self) -> dict[str, Any]:
        """Dataset, key, heads, epoch, fact counts, program, outbox and peers (see
        :mod:`.status`)."""
        self._require_open()
        return node_status(self)

    def peer_status(self) -> list[dict[str, Any]]:
        """Sync state of every configured peer (added at run time too) and of every URL
        synced ad hoc: last attempt, last success, last error, deltas behind."""
        self._require_open()
        return peersync.peer_status(self)


def _typed_or_many(items: tuple[Any, ...], call: str) -> list[FactLike]:
    """``("edge", 1, 2)`` (a relation name then values) → one fact; the older list form
    (Fact objects, ``(rel, args)`` pairs, Datalog texts such as ``"edge(1, 2)."``) as it
    is. A first argument that is a string is a relation name unless every argument is
    of that older form: ``("a b", 1)`` or ``("", 1)`` name a bad relation (they were
    parsed as Datalog text, or said ``1 is not a fact``), and ``()`` or ``("")`` are
    refused (they wrote nothing without a word)."""
    if not items:
        raise NodeInputError(f'{call}: give a relation name, then its values: {call}("edge", 1, 2)')
    first = items[0]
    if isinstance(first, str) and (first.isidentifier() or not all(map(_older_form, items))):
        return [(first, items[1:])]
    if not isinstance(first, str | Fact | tuple | list):  # make_fact names the bad name
        return [(first, items[1:])]
    return list(items)


def _older_form(item: Any) -> bool:
    """Whether ``item`` is a fact of the older forms: Fact, ``(rel, args)``, Datalog text."""
    if isinstance(item, str):
        return "(" in item or "." in item  # `edge(1, 2).`, `ok.`
    if isinstance(item, tuple | list):
        return len(item) == 2
    return isinstance(item, Fact)


def _check_path(path: Any, name: str) -> None:
    """Refuse (``merklog.Error``) a ``path`` argument that is not a text path: ``5``
    raised a raw TypeError, or opened file descriptor 5."""
    if not isinstance(path, str | PathLike) or not isinstance(os.fspath(path), str):
        raise NodeInputError(
            f"{name}: expected a path (str or os.PathLike), got {type(path).__name__}"
        )


def _relation_or_none(rel: Any) -> str | None:
    """``rel`` checked as a relation name any stored fact may have (the lenient check
    decoding keeps: ``Up`` from an older version stays readable), or None for all."""
    return None if rel is None else check_relation(rel)


def _fact_list(facts: Any, name: str) -> Any:
    """``facts`` if it can be a list of facts; a clear error for one fact or one text given
    where a list is expected (a bare string was read character by character)."""
    if isinstance(facts, str | bytes):
        raise NodeInputError(
            f"{name}: expected a list of facts, got one {type(facts).__name__}; write"
            f" {name}=[{facts[:40]!r}] (Datalog texts, Fact objects or (rel, args) pairs)"
        )
    if isinstance(facts, Fact):
        raise NodeInputError(f"{name}: expected a list of facts, got one Fact; write {name}=[fact]")
    if isinstance(facts, Mapping):  # its keys were read as Datalog texts ("edge" → a parse error)
        raise NodeInputError(
            f"{name}: expected a list of facts, got {type(facts).__name__}; write"
            f' {name}=[("edge", (1, 2))] (Datalog texts, Fact objects or (rel, args) pairs)'
        )
    if not isinstance(facts, Iterable):  # None, 5: a raw TypeError deep in the write
        raise NodeInputError(
            f"{name}: expected a list of facts (Datalog texts, Fact objects or (rel, args)"
            f" pairs), got {type(facts).__name__}"
        )
    pair = isinstance(facts, tuple) and len(facts) == 2
    if pair and isinstance(facts[0], str) and isinstance(facts[1], tuple | list):
        raise NodeInputError(
            f"{name}: expected a list of facts, got one (rel, args) pair; write {name}=[{facts!r}]"
        )
    return facts
