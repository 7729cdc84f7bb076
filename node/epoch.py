"""The epoch driver: the one place where a node's epochs are evaluated.

A node hands its sources to the driver — the replica's visible-state +1/−1
changes (local writes and replicated facts), then at each epoch the inbox
``@async`` tuples, the ``@next`` tuples carried from the previous epoch and the
optional ``tick`` clock — and :meth:`EpochDriver.run` feeds them to the
incremental engine, commits the epoch (number, carry-over, inbox acks, outbox)
in one transaction and hands the output deltas to the sinks: the ``@async``
outbox, live-query subscribers and user callbacks.

What runs epochs is elsewhere: the background epoch loop
(:mod:`.tasks`) when the node is started, or the writer itself
(``Node.run_epoch``) when it is not. Both call :meth:`EpochDriver.run`.

An epoch's save runs after the driver's ``mutex`` is released: it may wait for another
write's transaction (a write of an IPFS home waits for its daemon, up to
``store.ipfs_timeout``), and queries and status need that mutex meanwhile (ADR 0180).
Saves keep the epochs' order; a failed one is retried with the next.

Read-your-writes: every hand-over is numbered; :meth:`EpochDriver.settled`
waits until an epoch has taken every hand-over made before the call.

Reads do not wait for an epoch (ADR 0205): an epoch is evaluated, then published
under a lock of its own (``_view_lock``), which reads hold while they read
(:meth:`EpochDriver.reading`). Until it is published they answer the epoch before,
whole: its number, its program's state and its stored facts' arities and count
(:class:`~.epochview.EpochView`).

An epoch that changes nothing — no change of the stored facts, no event, no
``@async`` message in or out, no derived tuple, not a reload — is no new epoch
(ADR 0206): the number stays the last epoch's, live queries and sinks hear nothing,
and nothing is written to the store. An idle node writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

from merklog.engine.errors import EngineError, EvaluationInterrupted, EvaluationTooLarge
from merklog.engine.interrupt import interruptible
from merklog.engine.values import row_to_engine
from merklog.replication.bulk import visible_count
from merklog.replication.messages import REFUSED
from merklog.store import Fact
from merklog.store.gcpause import gc_paused

from . import epochstate, queries, storage
from .config import Config
from .edb import Edb
from .epochview import EpochView, FactShape
from .failures import ProgramFailing
from .inboxfit import split_fitting
from .metrics import NodeMetrics
from .subscriptions import Row, Subscription

log = logging.getLogger("merklog.node.node")

TICK_REL = "tick"
#: An epoch taking this many visible-set changes pauses the cyclic GC while it turns them
#: into engine rows and steps the engine (the engine's own threshold, ADR 0017).
GC_PAUSE_CHANGES = 20_000

#: ``sink(epoch, changes)``: called after every epoch that changed something.
Sink = Callable[[int, list[tuple[Fact, int]]], None]


@dataclass(frozen=True)
class _Save:
    """What one epoch leaves to store: its state, the inbox messages it consumed and
    those it set aside as not fitting the program (their CIDs), and the ``@async``
    messages it sends (destination, relation, arguments)."""

    state: epochstate.EpochState
    acks: list[Any]
    refused: list[Any]
    outbox: list[tuple[str, str, tuple]]


class Owner(Protocol):
    """What the driver needs of its node (the node implements it; no import of it here)."""

    config: Config
    metrics: NodeMetrics
    store: Any
    engine: Any
    inbox: Any
    outbox: Any
    tasks: Any

    def wake(self) -> None: ...


class EpochDriver:
    """Evaluates a node's epochs and owns what flows between them: the pending changes,
    the EDB as the engine saw it, the ``@next`` carry-over, the ``@async`` tuples
    already sent, the live queries and the sinks.

    ``mutex`` (re-entrant) guards the engine and the EDB: :meth:`run` holds it for the
    whole epoch, the node to swap programs and to start a live query. Reads (queries,
    status) do not take it: they read the last published epoch under ``_view_lock``
    (:meth:`reading`), which an epoch takes only to publish.
    """

    def __init__(self, node: Owner) -> None:
        self.node = node
        self.mutex = threading.RLock()
        #: Held by a read while it reads the published epoch (:meth:`reading`) and by an
        #: epoch while it publishes; re-entrant: a live query's callback may query.
        self._view_lock = threading.RLock()
        #: The last completed epoch as reads see it (None until one ran).
        self.view: EpochView | None = None
        # Guards _pending. Changes made by one write or one applied batch of deltas are
        # staged per thread and handed over together, so they reach the same epoch.
        self._intake = threading.Lock()
        self._staging = threading.local()
        self._pending: list[tuple[Fact, int]] = []
        #: Changes taken by epochs not published yet (one list per epoch; guarded by
        #: ``_intake``): a query knows their relations, as it knows pending ones.
        self._evaluating: list[list[tuple[Fact, int]]] = []
        #: Why the last epoch failed (the program's error), None after one that ran.
        self.last_error: str | None = None
        #: Why the program failed on the stored facts when the node started, until an
        #: epoch runs (:meth:`failed_start`): reads raise :class:`ProgramFailing` with it.
        self.start_failure: str | None = None
        #: Set once the node is stopping (:meth:`release_waiters`): why no epoch comes.
        self._no_more_epochs: str | None = None
        # Read-your-writes: _seq counts hand-overs to _pending, _done_seq the last one an
        # epoch has finished with; settled() waits until that covers the caller's write.
        self._seq = 0
        self._done_seq = 0
        #: The last hand-over an epoch has taken (it may still be evaluating it).
        self._taken_seq = 0
        #: Set by the epoch loop when it hands an epoch to its thread, cleared when that
        #: epoch takes the changes: a wait for changes due to be taken wakes nothing.
        self.scheduled = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        #: Stored facts as the engine has them, by relation (int64 arrays or engine-form rows).
        self.edb = Edb()
        #: Reads the stored facts into :attr:`edb` the first time an epoch needs them
        #: (None once read): see :meth:`restore`.
        self._load_facts: Callable[[], Edb] | None = None
        #: Whether an epoch has run since the node opened; reads run one first.
        self._evaluated = False
        #: Hand the stored facts to the incremental engine at the next epoch even if it
        #: changes nothing (set when the node starts running). Otherwise a reload's batch
        #: snapshot lasts until an epoch changes something: a one-shot command never
        #: builds incremental state, and a program load answers from the snapshot.
        self.warm_up = False
        #: The live queries. Replaced, never changed in place, under ``_subs_lock``: an
        #: epoch delivers to the list it read, and :meth:`unsubscribe` (on the event loop,
        #: when an SSE client goes) needs neither the mutex nor to wait for that epoch.
        self.subs: list[Subscription] = []
        self._subs_lock = threading.Lock()
        self.sinks: list[Sink] = []
        self._sent: set[epochstate.SentKey] = set()
        self._reload = True
        self.state = epochstate.EpochState()
        #: Number of the last committed epoch.
        self.epoch = 0
        #: Epochs evaluated but not saved yet, in order (guarded by ``_intake``), and the
        #: inbox messages they consumed (not handed to another epoch meanwhile).
        self._unsaved: list[_Save] = []
        self._taken: set[Any] = set()
        #: Held while saving: saves run one at a time, each taking every epoch not saved.
        self.saving = threading.Lock()
        #: Set when the node closes or stops: an evaluation running then ends at its
        #: next round (:mod:`merklog.engine.interrupt`) instead of holding the close up.
        self.stopping = threading.Event()

    # ------------------------------------------------------------------ restart
    def restore(self, load_facts: Callable[[], Edb]) -> None:
        """Resume from the store: the epoch number, ``@next`` tuples and sent ``@async``
        keys of the last committed epoch now; the whole visible set (``load_facts``, in bulk:
        :func:`.edb.read_visible`) as the EDB of the first epoch, a reload, read when that
        epoch runs. A command that only writes, syncs or reads blocks (``put``, ``sync``,
        ``get``, ``export``) on a stopped home then never reads the visible set: opening
        a home of a million facts costs no more than opening an empty one (ADR 0154).
        The first query, status or epoch reads it (:meth:`ready`)."""
        self.state = epochstate.load(storage.store_conn(self.node.store))
        self.epoch = self.state.epoch
        self._sent = set(self.state.sent)
        self._reload = True
        self._load_facts = load_facts
        self._evaluated = False

    def ready(self) -> None:
        """Run the first epoch now unless one has run since the node opened: reads
        (queries, live queries, status counts) answer from an evaluated state. If the
        program fails on the stored facts, raise :class:`ProgramFailing` (see
        :meth:`failed_start`), now and for every read until an epoch runs: a stopped
        home's reads said the program's own error (exit 2, bad input, for a valid
        query) and ran the failing evaluation again for each."""
        if self._evaluated:  # no lock: an epoch running meanwhile does not hold reads up
            return
        with self.mutex:
            if self._evaluated:
                return
            if self.start_failure is not None:  # not the same failing evaluation per read
                raise ProgramFailing(self.start_failure)
            try:
                self.run()
            except EvaluationInterrupted:  # closing meanwhile: not the program's failure
                raise
            except EngineError as exc:  # the program fails on the stored facts
                raise ProgramFailing(self.failed_start(exc)) from None

    def failed_start(self, exc: EngineError) -> str:
        """The first epoch failed on the stored facts (:meth:`ready` raised ``exc``): the
        node starts anyway, with nothing evaluated, so that the write that lets the
        program run again (retracting the fact that sets it off, a corrected program,
        a sync) can reach it. A home stuck there refused to start at all: ``node run``
        exited 2, every restart too. Reads raise :class:`ProgramFailing` until an epoch
        runs. Returns the message (a serving node logs it; a read only raises it)."""
        self.start_failure = (
            f"the loaded program fails on the stored facts, so nothing is evaluated: "
            f"{exc.message}; retract the fact that sets it off, or load a corrected program"
        )
        return self.start_failure

    def program_changed(self) -> None:
        """A program was installed, or put back after a refused load (call under
        ``mutex``): the next epoch re-derives from the whole EDB.

        Nothing of the epoch state is dropped (ADR 0175). That reload epoch takes the
        ``@next`` tuples of the last committed epoch, as every reload does (those of
        relations the program has: :meth:`~.programs.ProgramRunner.carried`), and the
        ``@async`` tuples already sent stay sent: loading the same program again, or a
        refused one, changes nothing a user can see, and a new program that still
        derives a sent tuple does not send it twice."""
        self._reload = True

    # ------------------------------------------------------------------ intake
    def on_visible_change(self, fact: Fact, weight: int) -> None:
        """The replica's visible-state callback: ``weight`` +1 (now visible) or −1."""
        staged = getattr(self._staging, "changes", None)
        if staged is not None:
            staged.append((fact, weight))
            return
        with self._intake:
            self._pending.append((fact, weight))
            self._seq += 1
        self.node.wake()  # replicated changes (sync push/pull) get an epoch promptly too

    def on_visible_new(self, facts: list[Fact]) -> None:
        """``on_visible_change(fact, +1)`` for each of ``facts`` (a bulk local write's new
        facts), as one extend instead of a call per fact (ADR 0138)."""
        changes = list(zip(facts, repeat(1)))
        staged = getattr(self._staging, "changes", None)
        if staged is not None:
            staged.extend(changes)
            return
        with self._intake:
            self._pending.extend(changes)
            self._seq += 1
        self.node.wake()

    def atomically(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` (a replica write or apply) so that every visible change it makes
        enters the same epoch."""
        if getattr(self._staging, "changes", None) is not None:
            return fn(*args)
        self._staging.changes = staged = []
        try:
            return fn(*args)
        finally:
            self._staging.changes = None
            if staged:
                with self._intake:
                    self._pending.extend(staged)
                    self._seq += 1
                self.node.wake()

    # ------------------------------------------------------------------ the epoch
    def run(self) -> int:
        """Evaluate one epoch now; returns the number of the epoch queries now answer
        (the last one's when this one changed nothing). Safe to call from any thread.

        Stored facts enter the engine as net inserts/deletes (the replica's visible-set
        +1/−1 changes since the last epoch); inbox ``@async`` messages, the ``tick`` clock
        and restored ``@next`` tuples enter as one-epoch events. The evaluated epoch is
        published at once (reads answer the epoch before until then, ADR 0205). The
        epoch's number, its ``@next`` tuples, the inbox acknowledgements and the outbox
        messages commit in one transaction, after subscribers are told and the writes
        the epoch took are answered (:meth:`settled`): that save may wait for another
        write's transaction, and the answers need not (ADR 0145). An epoch that changed
        nothing keeps the last number and saves nothing (ADR 0206).
        """
        node = self.node
        t0 = time.perf_counter()
        with self.mutex:
            # The heads the first epoch's facts were read at, when no delta landed during
            # the read: that epoch is then the program over exactly those heads.
            read_at: list[bytes] | None = None
            if self._load_facts is not None:
                before = self._heads()
                # Before the pending changes are taken: a change the read already shows
                # applies as a no-op (Edb.apply compares with what is there).
                self.edb = self._load_facts()
                self._load_facts = None
                after = self._heads()
                read_at = after if before == after else None
            with self._intake:
                changes, self._pending = self._pending, []
                if changes:
                    self._evaluating.append(changes)
                taken_seq = self._taken_seq = self._seq
                self.scheduled = False
            if changes:
                read_at = None
            epoch = self.epoch + 1
            # A bulk write's changes: no cyclic GC passes while they become engine rows and
            # go through the engine (nothing here is cyclic; ADR 0017, ADR 0110).
            with gc_paused() if len(changes) >= GC_PAUSE_CHANGES else nullcontext():
                inserts, deletes = self.edb.apply(changes)
                reload, self._reload = self._reload, False
                engine = node.engine
                # What reads will know of the stored facts once this epoch is published.
                view = self.view
                if reload or view is None:
                    facts = FactShape(self.edb.arity_counts())
                else:
                    facts = view.facts.updated(inserts, deletes)
                # The @next tuples of the last committed epoch hold now. A per-epoch engine
                # carries them itself; a reload (a restart, a program load, the epoch after
                # a failed one) starts from scratch and takes them from the saved state.
                events: dict[str, set[tuple]] = (
                    engine.carried(self.state.next, self.state.program) if reload else {}
                )
                if node.config.get("node.tick"):
                    events.setdefault(TICK_REL, set()).add((epoch,))
                # Messages that do not fit the program's declarations are set aside;
                # those an epoch not saved yet consumed are not handed out again.
                with self._intake:
                    taken = set(self._taken)
                pending = [m for m in node.inbox.pending() if m.cid not in taken]
                messages, refused = split_fitting(engine, pending)
                for msg in messages:
                    events.setdefault(msg.fact.rel, set()).add(row_to_engine(msg.fact.args))
                listened = bool(self.subs or self.sinks)
                # The epoch after a reload differs from it when the reload had events or
                # derived @next tuples; handing its state to the incremental engine alone
                # (warm-up) changes nothing.
                moves = not reload and engine.snapshot_moves
                try:
                    # a closing node stops a long evaluation at its next round
                    with interruptible(self.stopping):
                        if reload:  # a fresh program over the whole EDB: a batch evaluation
                            outbox = engine.evaluate_all(self.edb.base(), events)
                            deltas: dict = {}
                        else:
                            deltas, outbox = engine.step(
                                inserts,
                                deletes,
                                events,
                                base=self.edb.base,
                                keep_snapshot=not self.warm_up,
                                want_deltas=listened,
                            )
                except EvaluationInterrupted:
                    # Stopped by close: nothing of it counts, and the writes it took are
                    # durable; the next open (or start) evaluates them from the EDB.
                    self._reload = True
                    self._settle(taken_seq, "the node is stopping: no epoch evaluated them")
                    raise
                except (EngineError, MemoryError) as exc:
                    # The program failed (a recursion without fixpoint, or past the memory
                    # budget): nothing of the epoch was published, so reads keep the last
                    # good epoch; the engine may be half updated, so the next epoch
                    # re-derives from the EDB, which holds the changes taken; the writes
                    # taken are durable and answered.
                    failure = out_of_memory(exc) if isinstance(exc, MemoryError) else exc
                    del exc  # a MemoryError's frames hold what ran out
                    self._reload = True  # it takes the last good epoch's @next tuples again
                    self.last_error = f"the epoch that evaluates them failed: {failure}"
                    self._settle(taken_seq, self.last_error)
                    raise failure from None
                except BaseException:
                    self._reload = True  # whatever it left half done, the EDB has it all
                    raise
                # Publish: reads answer this epoch from here on.
                with self._view_lock:
                    engine.publish()
                    self.warm_up = self.warm_up and engine.snapshot
                    nxt = engine.next_tuples()
                    # Send each @async tuple once while its body keeps holding (also across
                    # restarts). Keyed by value identity: m(1), m(1.0) and m(true) are three.
                    outbox = [(d, f) for d, f in outbox if epochstate.sent_key(f) not in self._sent]
                    live = {epochstate.sent_key(f) for f in engine.async_live()}
                    # A start over the heads and program the saved epoch was evaluated
                    # over, with no events, is that epoch again (ADR 0209).
                    same_start = (
                        read_at is not None
                        and not events
                        and read_at == self.state.heads
                        and engine.digest == self.state.program
                    )
                    # Changed nothing: no new number, nothing told, nothing saved (ADR 0206).
                    idle = not (
                        (reload and not same_start)
                        or inserts
                        or deletes
                        or events
                        or refused
                        or deltas
                        or outbox
                        or live != self._sent
                        or moves
                    )
                    if not idle:
                        self.epoch = epoch
                        self.view = EpochView(epoch, engine, facts)
                    elif self.view is None:  # a start that is the saved epoch again
                        self.view = EpochView(self.epoch, engine, facts)
                    with self._intake:
                        self._evaluating = []
                    self._evaluated = True
            epoch = self.epoch
            # A callback's Ctrl-C (KeyboardInterrupt, SystemExit) is raised once the epoch is
            # whole: it left the live queries after it without this epoch's delta for good,
            # its writes unanswered and its state, @async messages and inbox acks unsaved.
            interrupted: BaseException | None = None
            for sub in () if idle else self.subs:
                if sub.closed:
                    continue
                try:
                    self._tell(sub, reload, deltas, epoch)
                except BaseException as exc:
                    interrupted = interrupted or exc
            sinks = list(self.sinks)
            with self._subs_lock:
                self.subs = [s for s in self.subs if not s.closed]
            self.last_error = self.start_failure = None
            # Queries and live queries now show this epoch: the writes it took are
            # answered before its state is saved, which waits for the store while
            # another write is in its transaction (ADR 0145). Those writes are durable
            # already; what the save makes durable is the epoch's own state.
            self._settle(taken_seq)
            if not idle:
                # Every epoch commits atomically: its number, carry-over, inbox acks,
                # outbox (saved below, once the mutex is released). One that changed
                # nothing has nothing to save (ADR 0206).
                state = epochstate.EpochState(
                    epoch, engine.digest, nxt, live, read_at if not events else None
                )
                acks = [m.cid for m in messages]
                refusals = [m.cid for m in refused]
                with self._intake:
                    self._unsaved.append(
                        _Save(state, acks, refusals, [(dest, f.rel, f.args) for dest, f in outbox])
                    )
                    self._taken.update(acks)
                    self._taken.update(refusals)
                self.state = state
                self._sent = live
                node.metrics.facts.set(facts.total)
                node.metrics.derived.set(_derived(engine))
            if sinks and reload:  # every tuple is new to a listener of the old program
                deltas = engine.all_new()
        self._save()  # also retries a save that failed before
        # Facts for the sinks only when there are sinks: a reload's deltas are every tuple.
        out = (
            [(Fact(rel, row), w) for rel, d in deltas.items() for row, w in d.items()]
            if sinks
            else []
        )
        if out:
            for sink in sinks:
                try:
                    sink(epoch, out)
                except Exception:
                    log.exception("user sink failed")
                except BaseException as exc:  # the sinks after it are still told
                    interrupted = interrupted or exc
        metrics = node.metrics
        metrics.subscribers.set(len(self.subs))
        metrics.epochs.inc()
        metrics.epoch_seconds.observe(time.perf_counter() - t0)
        if interrupted is not None:
            raise interrupted
        return epoch

    def _tell(self, sub: Subscription, reload: bool, deltas: dict, epoch: int) -> None:
        """Bring the live query ``sub`` up to ``epoch``: from the engine's deltas of its
        relation (one-atom queries), else by evaluating it again when one of its
        relations changed; after a reload, against the whole new answer."""
        if reload and sub.match is not None:
            (rel,) = sub.rels
            sub.start(self.node.engine.relation(rel), epoch, initial=False)
        elif sub.match is not None:
            (rel,) = sub.rels
            if rel in deltas:
                sub.apply(deltas[rel], epoch)
        elif reload or not sub.rels.isdisjoint(deltas):
            sub.deliver(set(self.evaluate(sub.query)[1]), epoch=epoch)

    def _save(self) -> None:
        """Store every evaluated epoch not stored yet, in one transaction: the last one's
        state, every one's inbox acks and outbox messages. On failure they stay queued
        (the next save retries them) and the error is raised."""
        node = self.node
        with self.saving:
            with self._intake:
                saves, self._unsaved = self._unsaved, []
            if not saves:
                return
            acks = [cid for save in saves for cid in save.acks]
            refused = [cid for save in saves for cid in save.refused]
            outbox = [message for save in saves for message in save.outbox]
            try:
                with storage.transaction(node.store):
                    epochstate.save(storage.store_conn(node.store), saves[-1].state)
                    if acks:
                        node.inbox.ack(acks)
                    if refused:
                        node.inbox.ack(refused, REFUSED)
                    queued = node.outbox.put_many(outbox) if outbox else []
            except BaseException:
                with self._intake:
                    self._unsaved[:0] = saves
                raise
            with self._intake:
                self._taken.difference_update(acks)
                self._taken.difference_update(refused)
        events_metric = node.metrics.async_messages
        if refused:
            events_metric.labels("refused").inc(len(refused))
        if len(queued) < len(outbox):  # over the size limit: logged, not queued
            events_metric.labels("dropped").inc(len(outbox) - len(queued))
        if queued:
            events_metric.labels("queued").inc(len(queued))
            node.tasks.wake_outbox()

    def _settle(self, seq: int, error: str | None = None) -> None:
        """Answer the :meth:`settled` waiters whose changes the epoch through ``seq`` took:
        with None, or with ``error`` when that epoch failed (the changes stay stored)."""
        with self._intake:
            self._done_seq = max(self._done_seq, seq)
            ready = [w for w in self._waiters if w[0] <= self._done_seq]
            self._waiters = [w for w in self._waiters if w[0] > self._done_seq]
        for _seq, loop, fut in ready:
            loop.call_soon_threadsafe(_resolve, fut, error)

    def release_waiters(self, reason: str) -> None:
        """Answer every :meth:`settled` waiter with ``reason``: no epoch will come (the
        node is stopping). Their writes are durable; a request waiting to answer one
        answers now instead of at the server's shutdown timeout."""
        with self._intake:
            ready, self._waiters = self._waiters, []
            self._no_more_epochs = reason
        for _seq, loop, fut in ready:
            with suppress(RuntimeError):  # that loop is closed already: nobody waits
                loop.call_soon_threadsafe(_resolve, fut, reason)

    async def settled(self, timeout: float = 10.0) -> str | None:
        """Wait until an epoch has taken every change handed over so far (a write
        acknowledged before this call is then visible to queries and live queries).

        Returns None when it evaluated them, else why not: the failed epoch's error (the
        changes stay stored; queries show the last good epoch) or that none came within
        ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        with self._intake:
            if self._done_seq >= self._seq:
                return self.last_error
            if self._no_more_epochs is not None:  # stopping: none would come
                return self._no_more_epochs
            fut: asyncio.Future = loop.create_future()
            self._waiters.append((self._seq, loop, fut))
            # Changes an epoch has taken, or is about to take, are answered by that epoch.
            # Waking the loop for them ran a failing epoch (a budget overrun, ~1 min) a
            # second time at once. (Every hand-over wakes the loop itself; this wake is for
            # changes handed over before the loop ran.)
            untaken = self._taken_seq < self._seq and not self.scheduled
        if untaken:
            self.node.wake()
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            log.warning("no epoch within %.1f s after a write", timeout)
            return f"no epoch evaluated the changes within {timeout:g} s"

    def pending_arities(self, rel: str) -> set[int]:
        """Arities of ``rel`` among the stored facts handed over but not yet evaluated, or
        taken by an epoch not published yet (a query between a write and its epoch finds
        the relation; its rows come with the epoch). Scans those changes: for the
        unknown-relation check only."""
        with self._intake:
            return {
                len(fact.args)
                for changes in (self._pending, *self._evaluating)
                for fact, weight in changes
                if weight > 0 and fact.rel == rel
            }

    def _heads(self) -> list[bytes]:
        """The replica's heads (binary CIDs, sorted): what a start's facts were read at."""
        return [head.raw for head in self.node.replica.heads()]

    # ------------------------------------------------------------------ reads and sinks
    @contextmanager
    def reading(self) -> Iterator[EpochView]:
        """The last completed epoch, held still while the caller reads it: an epoch
        evaluating meanwhile goes on, and publishes once the caller is done (ADR 0205).
        Runs the first epoch first if none has run since the node opened (:meth:`ready`,
        which raises :class:`ProgramFailing` when the program fails on the stored facts)."""
        self.ready()
        with self._view_lock:
            view = self.view
            assert view is not None  # ready() ran an epoch
            yield view

    def relation(self, rel: str) -> set[tuple]:
        """Current tuples of ``rel`` (stored, derived, or this epoch's events)."""
        with self.reading() as view:
            return view.engine.relation(rel)

    def relation_matching(self, rel: str, consts: dict[int, Any]) -> set[tuple]:
        """Current tuples of ``rel`` whose column ``c`` holds ``consts[c]`` (identity)."""
        with self.reading() as view:
            return view.engine.relation_matching(rel, consts)

    def evaluate(self, query: Any) -> tuple[list[str], list[Row]]:
        """Columns and engine-form rows of a parsed query over the last epoch's state.
        Only its inputs are read inside :meth:`reading` (copies); the evaluation runs
        after, so that the next epoch publishes meanwhile (ADR 0210)."""
        with self.reading() as view:
            engine = view.engine
            inputs = queries.query_inputs(query, engine.relation, engine.relation_matching)
        return queries.answer(query, inputs)

    def summary(self) -> tuple[int, int, int, Any]:
        """``(epoch, stored facts, derived tuples, program runner)`` of the last completed
        epoch, read together. Derived tuples are those of relations the program's rules
        define (rule heads). Before any epoch ran, a program with rules is evaluated
        first; without rules (or when the program fails on the stored facts) nothing is,
        and the stored facts are counted in the store's index (no block read), as the
        first epoch will see them: ``status`` of a home without a program evaluates
        nothing."""
        engine = self.node.engine
        if not self._evaluated and engine.heads and self.start_failure is None:
            with suppress(ProgramFailing):  # status shows why (``program_error``), not fails
                self.ready()
        if self._evaluated:
            with self._view_lock:
                view = self.view
                assert view is not None
                return view.epoch, view.facts.total, _derived(view.engine), view.engine
        return self.epoch, visible_count(self.node.replica), 0, engine

    def subscribe(self, sub: Subscription) -> None:
        """Deliver ``sub``'s current result now, then its changes after each epoch. Waits
        for an epoch that is running: the live query starts between two epochs."""
        with self.mutex:
            self.ready()
            view = self.view  # no epoch publishes while the mutex is held
            assert view is not None
            if sub.match is not None:
                (rel,) = sub.rels
                sub.start(view.engine.relation(rel), view.epoch)
            else:
                sub.deliver(set(self.evaluate(sub.query)[1]), initial=True, epoch=view.epoch)
            with self._subs_lock:
                self.subs = [*self.subs, sub]
                self.node.metrics.subscribers.set(len(self.subs))

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering to ``sub``, at once: an epoch evaluating meanwhile skips it
        (its delivery loop checks ``closed``) and is not waited for. It took the epoch
        mutex, so an SSE client that went away during a long epoch held the event loop,
        and every other request, until that epoch ended."""
        sub.closed = True
        with self._subs_lock:
            self.subs = [s for s in self.subs if s is not sub]
            self.node.metrics.subscribers.set(len(self.subs))

    def add_sink(self, sink: Sink) -> None:
        """``sink(epoch, changes)`` after every epoch that changed something."""
        self.sinks.append(sink)


def out_of_memory(exc: MemoryError) -> EvaluationTooLarge:
    """The error of an evaluation one of whose rounds asked for more memory than the
    process could get, before the per-round budget check saw it grow (ADR 0207): the
    program's failure, as an overrun budget is, said in one line (the node logged a
    MemoryError's traceback). Its traceback is dropped: its frames hold what ran out."""
    exc.__traceback__ = None
    detail = f" ({exc})" if str(exc) else ""
    return EvaluationTooLarge(
        f"the evaluation ran out of memory within one round{detail}: the process could"
        " not allocate what the round derived",
        hint="a rule whose join or recursion derives more than this machine's memory holds"
        " (a counter over a cycle, a join of two large relations on no common variable):"
        " bound it, or give the node more memory",
    )


def _derived(engine: Any) -> int:
    """Tuples in the relations ``engine``'s rules define (its published state)."""
    return sum(engine.count(rel) for rel in engine.heads)


def _resolve(fut: asyncio.Future, error: str | None = None) -> None:
    if not fut.done():
        fut.set_result(error)
