"""A node's background tasks in an event loop: the epoch loop, ``@async`` delivery and
automatic sync. ``Node.start()`` / ``await Node.stop()`` (or ``async with``) drive them.

Stopping is prompt whatever runs: each loop checks a stop flag at every wake-up and
is cancelled as well (a cancellation racing a wake-up can be lost inside 3.11's
``asyncio.wait_for``; the flag ends the loop anyway), and an epoch already running
on its worker thread commits before ``stop`` returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from merklog.store.errors import Error as MerklogError

from .config import Config
from .failures import classify, local_failure
from .metrics import NodeMetrics

log = logging.getLogger("merklog.node.node")

#: Seconds between deletions of old consumed inbox and dropped outbox messages.
PURGE_EVERY = 600.0


class Owner(Protocol):
    """What the tasks need of their node (the node implements it; no import of it here)."""

    config: Config
    home: Path | None
    metrics: NodeMetrics
    epochs: Any
    inbox: Any
    outbox: Any
    url: str | None

    def run_epoch(self) -> int: ...
    def peer_urls(self) -> dict[str, str]: ...
    async def sync(self, url: str) -> dict: ...


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until ``event`` is set or ``timeout`` passes (None: no timeout; ``asyncio.timeout`` keeps a
    cancellation that arrives together with the event, unlike 3.11's ``wait_for``)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass


class BackgroundTasks:
    """The asyncio side of one node; wake-ups are safe from any thread."""

    def __init__(self, node: Owner) -> None:
        self.node = node
        self.loop: asyncio.AbstractEventLoop | None = None
        self.epoch_wake: asyncio.Event | None = None
        self.outbox_wake: asyncio.Event | None = None
        self.tasks: list[asyncio.Task] = []
        self.stopping = False
        self._epoch_future: asyncio.Future | None = None
        self._failed_at_start: str | None = None

    @property
    def running(self) -> bool:
        """Whether an epoch loop runs (else writers run epochs themselves)."""
        return bool(self.tasks)

    def start(self, failed: str | None = None) -> None:
        """Start the loops as tasks of the running event loop; ``failed``: why the
        program failed on the stored facts at start (only a change runs an epoch then)."""
        self._failed_at_start = failed
        config = self.node.config
        self.loop = asyncio.get_running_loop()
        self.stopping = False
        self.epoch_wake = asyncio.Event()
        self.outbox_wake = asyncio.Event()
        self.tasks = [
            self.loop.create_task(self._epoch_loop()),
            self.loop.create_task(self._delivery_loop()),
        ]
        if float(config.get("sync.interval")) > 0:
            self.tasks.append(self.loop.create_task(self._sync_loop()))

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop every loop; returns within about ``timeout`` seconds."""
        tasks, self.tasks = self.tasks, []
        self.stopping = True
        self.node.epochs.stopping.set()  # an epoch running ends at its next round
        for event in (self.epoch_wake, self.outbox_wake):
            if event is not None:
                event.set()
        for task in tasks:
            task.cancel()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                log.warning("background task %s did not stop within %.1f s", task, timeout)
        epoch = self._epoch_future
        if epoch is not None and not epoch.done():  # let the epoch's commit finish
            await asyncio.wait([epoch], timeout=timeout)
        # No epoch comes after this: a write request waiting for one answers now (its
        # write is durable) rather than when the server's shutdown timeout cancels it.
        self.node.epochs.release_waiters("the node is stopping: no epoch evaluated them")

    def cancel(self) -> None:
        """Cancel without waiting (closing a node whose loop is gone)."""
        tasks, self.tasks = self.tasks, []
        self.stopping = True
        for task in tasks:
            task.cancel()

    # ------------------------------------------------------------------ wake-ups
    def wake_epoch(self) -> None:
        """Ask for an epoch as soon as possible (thread-safe)."""
        self._set(self.epoch_wake)

    def wake_outbox(self) -> None:
        """Ask for a delivery pass as soon as possible (thread-safe)."""
        self._set(self.outbox_wake)

    def _set(self, event: asyncio.Event | None) -> None:
        """Set an event of the node's loop from that loop or from any other thread."""
        if event is None or self.loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            event.set()
        else:
            self.loop.call_soon_threadsafe(event.set)

    # ------------------------------------------------------------------ loops
    async def _epoch_loop(self) -> None:
        """Run an epoch when woken (a write, a sync, a message) or every epoch_interval.
        Epochs run on a worker thread: their commit (fsync) does not stall the HTTP server."""
        interval = float(self.node.config.get("node.epoch_interval"))
        assert self.epoch_wake is not None
        loop = asyncio.get_running_loop()
        from merklog.engine.errors import EngineError, EvaluationTooLarge

        failed: str | None = self._failed_at_start
        #: Why epochs fail on this node's disk or store (a full disk), logged once.
        disk_failed: str | None = None
        while True:
            # After a program failed (a recursion without fixpoint), only a change (a
            # write, a sync, a program) runs the next epoch: the same epoch every
            # interval would fail the same way, a second of CPU each time.
            await wait_event(self.epoch_wake, None if failed else interval)
            if self.stopping:
                return
            self.epoch_wake.clear()
            self.node.epochs.scheduled = True  # it takes every change handed over so far
            self._epoch_future = loop.run_in_executor(None, self.node.run_epoch)
            # Stopping cancels this loop while the epoch runs; the shield then drops the
            # epoch's outcome, and a failed epoch's error went to stderr as "Future
            # exception was never retrieved" (its settled() waiters have it already).
            self._epoch_future.add_done_callback(_outcome_taken)
            try:
                await asyncio.shield(self._epoch_future)
                failed = None
                if disk_failed is not None:
                    log.info("epochs work again")
                    disk_failed = None
            except asyncio.CancelledError:
                raise
            except EngineError as exc:  # the program's fault: one line, once per message
                # (once per budget overrun: its rounds and size differ each epoch)
                said = exc.code if isinstance(exc, EvaluationTooLarge) else str(exc)
                if said != failed:
                    log.error(
                        "epoch failed, the program's state is the last good epoch's: %s",
                        exc.message,
                    )
                failed = said
            except Exception as exc:
                if not local_failure(exc):
                    log.exception("epoch failed")
                    continue
                # The disk or the store (a full disk): every epoch fails the same way
                # until space is freed, so one line when it starts (or its cause
                # changes), as failing syncs are logged, not a traceback each interval.
                _code, message = classify(exc, self.node.home)
                if message != disk_failed:
                    log.warning("epochs fail, retried every %gs: %s", interval, message)
                disk_failed = message

    async def _delivery_loop(self) -> None:
        """Deliver queued ``@async`` messages (signed ``POST /v1/inbox``), retrying with
        backoff until each destination acknowledges: at-least-once; receivers dedup.

        Each destination's delivery is a task of its own, as each peer's sync is: a peer
        that accepts but never answers holds only its own messages, for ``sync.timeout``
        per attempt, and is not started again while an attempt runs. Each destination's
        outcome is counted and logged when it ends (ADR 0176)."""
        import aiohttp

        node = self.node
        interval = float(node.config.get("node.outbox_interval"))
        timeout = float(node.config.get("sync.timeout"))
        assert self.outbox_wake is not None
        running: dict[str, asyncio.Task] = {}
        told = DeliveryLog()
        purged = 0.0
        async with aiohttp.ClientSession() as session:
            try:
                while True:
                    await wait_event(self.outbox_wake, interval)
                    if self.stopping:
                        return
                    self.outbox_wake.clear()
                    now = time.time()
                    try:
                        by_url, unroutable = await asyncio.to_thread(
                            node.outbox.plan, now, set(running)
                        )
                    except Exception:
                        log.exception("@async delivery pass failed")
                        continue
                    for report in unroutable:
                        told.record(report, node.metrics)
                    for url, rows in by_url.items():
                        running[url] = task = asyncio.create_task(
                            self._deliver_one(session, url, rows, now, timeout, told)
                        )
                        task.add_done_callback(lambda _t, url=url: self._delivered(running, url))
                    try:
                        purged = await self._purge(purged, now)
                    except Exception as exc:  # the store (a full disk): try again later
                        purged = now
                        log.warning("@async: deleting old messages failed: %s", exc)
            finally:  # stopping: the deliveries in flight end with the loop
                await _cancel_all(running)

    async def _deliver_one(
        self,
        session: Any,
        url: str,
        rows: list,
        now: float,
        timeout: float,
        told: DeliveryLog,
    ) -> None:
        """One delivery attempt to ``url``; counted and logged as soon as it ends."""
        try:
            report = await self.node.outbox.deliver_to(session, url, rows, now, timeout)
        except Exception:  # the store, not the peer: say so, keep the loop alive
            log.exception("@async delivery to %s failed", url)
            return
        told.record(report, self.node.metrics)

    def _delivered(self, running: dict[str, asyncio.Task], url: str) -> None:
        """A destination's attempt ended: messages queued for it meanwhile go now."""
        running.pop(url, None)
        if not self.stopping:
            self.wake_outbox()

    async def _purge(self, last: float, now: float) -> float:
        """Delete consumed inbox and dropped outbox messages older than
        ``node.async_keep`` seconds, at most every ``PURGE_EVERY`` seconds (and never
        more often than that keep); returns when it last ran."""
        keep = float(self.node.config.get("node.async_keep"))
        if now - last < min(PURGE_EVERY, keep):
            return last
        node = self.node
        inbox = await asyncio.to_thread(node.inbox.purge, now - keep)
        outbox = await asyncio.to_thread(node.outbox.purge, now - keep)
        if inbox or outbox:
            log.debug("deleted %d consumed inbox and %d dropped outbox messages", inbox, outbox)
        return now

    async def _sync_loop(self) -> None:
        """Every ``sync.interval`` seconds, sync with each peer in ``[peers]`` (re-read, so
        ``merklog peers add`` takes effect); an unreachable peer is logged and retried.

        Each distinct URL once per round: ``init --join URL`` then ``peers add NAME URL``
        (the tutorial's steps) list the same node twice, which must not mean two syncs
        and two counted failures. Each peer's sync is a task of its own, bounded by its
        own ``sync.timeout``: a peer that accepts but never answers delays nobody else,
        and a peer still syncing is not started again until that sync ends."""
        node = self.node
        interval = float(node.config.get("sync.interval"))
        running: dict[str, asyncio.Task] = {}
        try:
            while not self.stopping:
                await asyncio.sleep(interval)
                if self.stopping:
                    return
                try:
                    urls = round_urls(node.peer_urls(), node.url)
                except Exception:  # a bug: said, and the loop lives on (it died silently)
                    log.exception("automatic sync round failed")
                    continue
                for url in urls:
                    if url not in running:
                        task = asyncio.create_task(self._sync_one(url))
                        running[url] = task
                        task.add_done_callback(lambda _t, url=url: running.pop(url, None))
        finally:  # stopping: the syncs in flight end with the loop
            await _cancel_all(running)

    async def _sync_one(self, url: str) -> None:
        """One automatic sync with ``url``; failures are logged and counted by ``sync``."""
        try:
            await self.node.sync(url)
        except MerklogError:  # logged and counted by sync(); retried next round
            pass
        except Exception:  # a bug, not an offline peer: say so, keep the loop alive
            log.exception("automatic sync with %s failed", url)


class DeliveryLog:
    """Counts and logs each destination's delivery outcome: a new reason a destination
    fails (a peer down, a refusal, no route) once at WARNING, where an operator sees it,
    and its retries at INFO; a destination that works again once at INFO; messages given
    up once at WARNING each time some are."""

    def __init__(self) -> None:
        #: target -> the failure last logged at WARNING for it.
        self.failing: dict[str, str] = {}

    def record(self, report: Any, metrics: NodeMetrics) -> None:
        """Count ``report`` (a :class:`~merklog.replication.messages.DestinationReport`)
        in the metrics and log it."""
        events = metrics.async_messages
        if report.delivered:
            events.labels("delivered").inc(report.delivered)
        if report.failed:
            events.labels("failed").inc(report.failed)
        if report.dropped:
            events.labels("dropped").inc(report.dropped)
            log.warning(
                "@async delivery: dropped %d message(s), not retried: %s",
                report.dropped,
                report.error,
            )
        if report.error is None:
            if self.failing.pop(report.target, None) is not None:
                log.info("@async delivery to %s works again", report.target)
            return
        if report.failed and self.failing.get(report.target) != report.error:
            if len(self.failing) < 1000:
                self.failing[report.target] = report.error
            log.warning("@async delivery failed, will retry: %s", report.error)
        elif report.failed:
            log.info("@async delivery: %s", report.error)


def round_urls(peers: dict[str, str], own_url: str | None) -> list[str]:
    """The URLs one automatic sync round contacts: each distinct peer URL once (several
    ``[peers]`` names may point at one node), never this node's own URL."""
    own = (own_url or "").rstrip("/")
    return sorted({url.rstrip("/") for url in peers.values()} - {own})


def _outcome_taken(future: asyncio.Future) -> None:
    """Mark a finished epoch's error as retrieved (see :meth:`BackgroundTasks._epoch_loop`)."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("an epoch failed while the node stopped: %s", future.exception())


async def _cancel_all(running: dict[str, asyncio.Task]) -> None:
    """Cancel the per-peer tasks in ``running`` and give them two seconds to end."""
    tasks = list(running.values())
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=2.0)
