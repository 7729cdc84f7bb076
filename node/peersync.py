"""Syncing with peers: one sync run, who may sync with us, the peers' URLs by name from
``[peers]`` (re-read so peers added at run time count), and the per-peer sync state of
a running node (what ``status`` shows for each peer).

Kept by the node and saved after every attempt to ``peersync.json`` in the home
(written atomically, owner-only) so ``status`` on a stopped home and after a restart
still shows each peer's last attempt, success and error; ``deltas_behind`` comes from
the replica: how many of our deltas the peer lacked when last seen, plus everything
written since.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from merklog.replication.auth import AllowList
from merklog.replication.errors import PeerError, PeerUnreachable, ReplicationError
from merklog.store import Error as MerklogError

from .config import CONFIG_FILE, MAX_SYNC_TIMEOUT, Config, ConfigError
from .errors import NodeInputError
from .failures import Failure, local_failure
from .files import write_private
from .peerurl import peer_url_problem, with_lower_scheme

log = logging.getLogger(__name__)
#: A node's sync outcomes log under the node's name, as before they moved here.
node_log = logging.getLogger("merklog.node.node")

#: The file in a home holding the per-peer sync history.
STATE_FILE = "peersync.json"
#: ``last_error`` of a sync stopped before it ended (:meth:`PeerSync.interrupted`).
INTERRUPTED = "interrupted before it ended; the deltas applied until then stay"
#: ``last_error`` of a sync whose process ended during it (``kill -9``, a crash): its
#: start was saved, no outcome was.
ENDED_UNRECORDED = (
    "its process ended during the sync (killed?), before recording an outcome; the"
    " deltas applied until then stay"
)


@dataclass
class PeerSync:
    """Sync history with one peer URL."""

    url: str
    last_attempt: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    failures: int = 0  # consecutive failed attempts (0 after a success)
    #: When the peer last synced with us (a pull or push request signed by its key in
    #: ``[peers]`` was served); ``last_success`` is when we last synced with it.
    last_incoming: float | None = None
    #: The figures of the last good sync (:class:`~merklog.replication.client.SyncStats`
    #: fields), kept so that ``last_sync`` survives a restart.
    last_stats: dict[str, int] | None = None
    #: A sync started and has no outcome yet: saved at its start, so that one whose
    #: process was killed is shown as such, not as never attempted (QA).
    running: bool = False

    def attempt(self) -> None:
        self.last_attempt = time.time()
        self.running = True

    def succeeded(self, stats: dict[str, int] | None = None) -> None:
        self.last_success = time.time()
        self.last_error = None
        self.failures = 0
        self.last_stats = dict(stats) if stats is not None else None
        self.running = False

    def failed(self, error: str) -> bool:
        """Record a failure; True if it is news (first failure or a different error)."""
        news = self.failures == 0 or error != self.last_error
        self.last_error = error
        self.failures += 1
        self.running = False
        return news

    def interrupted(self) -> None:
        """Record a sync stopped before it ended (Ctrl-C, the caller of ``POST /v1/sync``
        went away, the node stopping) as ``last_error`` :data:`INTERRUPTED`, so
        ``status`` does not show the attempt as still without an outcome. Not counted in
        ``failures`` (nor by :func:`sync_node` in ``merklog_sync_failures_total`` or a
        WARNING): the peer did nothing wrong, and counting it would make a healthy peer
        look like it starts failing."""
        self.last_error = INTERRUPTED
        self.running = False

    def served(self) -> None:
        self.last_incoming = time.time()

    def to_json(self, name: str | None, deltas_behind: int | None) -> dict[str, Any]:
        fields = asdict(self)
        del fields["last_stats"]  # in the node's last_sync, not in every peer's row
        del fields["running"]  # the history's own bookkeeping
        return {"name": name, **fields, "deltas_behind": deltas_behind}


def last_sync(history: dict[str, PeerSync]) -> dict[str, Any] | None:
    """The node's last good sync from its saved history (``{"url", "at", **stats}``, as
    :func:`sync_node` records it), None if it never had one: what ``status`` shows as
    ``last_sync`` on a stopped home and after a restart (QA: it was null there although
    the peers' ``last_success`` was kept)."""
    done = [e for e in history.values() if e.last_success is not None]
    if not done:
        return None
    last = max(done, key=lambda e: e.last_success or 0.0)
    return {"url": last.url, "at": last.last_success, **(last.last_stats or {})}


def load_history(home: Path | None) -> dict[str, PeerSync]:
    """The per-peer sync history saved in ``home`` (empty without a home or a file; an
    unreadable file, or an entry whose values have the wrong types, is logged and
    ignored: it is a record, not data, and must never fail ``status``)."""
    if home is None or not (home / STATE_FILE).exists():
        return {}
    try:
        raw = json.loads((home / STATE_FILE).read_text())
        fields = {f.name for f in dataclasses.fields(PeerSync)}
        out = {}
        for url, rec in raw.items():
            entry = PeerSync(**{k: v for k, v in rec.items() if k in fields})
            wrong = _wrong_types(entry)
            if wrong:
                log.warning("ignoring the entry %r of %s: %s", url, home / STATE_FILE, wrong)
                continue
            if entry.running:  # read once the home is free: that sync's process is gone
                entry.running = False
                entry.last_error = ENDED_UNRECORDED
            out[str(url)] = entry
        return out
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable %s: %s", home / STATE_FILE, exc)
        return {}


def _wrong_types(entry: PeerSync) -> str | None:
    """What in a loaded entry has the wrong type (None: nothing): a URL string, times as
    numbers or null, the error as a string or null, failures a count."""

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    checks = {
        "url": isinstance(entry.url, str) and bool(entry.url),
        "last_attempt": entry.last_attempt is None or number(entry.last_attempt),
        "last_success": entry.last_success is None or number(entry.last_success),
        "last_incoming": entry.last_incoming is None or number(entry.last_incoming),
        "last_error": entry.last_error is None or isinstance(entry.last_error, str),
        "failures": number(entry.failures) and entry.failures == int(entry.failures) >= 0,
        "running": isinstance(entry.running, bool),
        "last_stats": entry.last_stats is None
        or (
            isinstance(entry.last_stats, dict)
            and all(isinstance(k, str) and number(v) for k, v in entry.last_stats.items())
        ),
    }
    wrong = [name for name, ok in checks.items() if not ok]
    return f"wrong type of {', '.join(wrong)}" if wrong else None


def save_history(
    home: Path | None, history: dict[str, PeerSync], level: int = logging.WARNING
) -> None:
    """Write the per-peer sync history to ``home`` atomically (owner-only); a failure to
    write it is logged at ``level`` (a status record must never fail a sync)."""
    if home is None:
        return
    data = {url: asdict(state) for url, state in history.items()}
    try:
        write_private(home / STATE_FILE, json.dumps(data, sort_keys=True).encode())
    except OSError as exc:
        log.log(level, "could not save %s: %s", home / STATE_FILE, exc)


def check_sync_timeout(
    value: Any, name: str = "timeout", show: Callable[[Any], str] = repr
) -> float | None:
    """``value`` as the seconds per peer request of one sync (None: ``sync.timeout``);
    NodeInputError naming ``name`` for anything but a number above 0 and at most
    :data:`MAX_SYNC_TIMEOUT` (``show`` renders the bad value: ``json.dumps`` for a JSON
    field). A string reached aiohttp and came back as "peer unreachable", and 0, a
    negative number or NaN asked for a sync without any timeout."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_SYNC_TIMEOUT
    ):
        raise NodeInputError(
            f"{name} must be a number of seconds above 0 and at most {MAX_SYNC_TIMEOUT:g},"
            f" got {show(value)[:40]}"
        )
    return float(value)


async def sync_with(
    replica: Any,
    url: str,
    cfg: Config,
    progress: Callable[[str, int, int], None] | None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Pull then push with the peer at ``url`` (signed with this node's key);
    ``progress(direction, body bytes, deltas)`` after each request. ``timeout`` (seconds
    per request) replaces ``sync.timeout`` when given."""
    from merklog.replication.client import SyncClient  # aiohttp: only when syncing

    seconds = float(cfg.get("sync.timeout")) if timeout is None else timeout
    async with SyncClient(replica.identity, timeout=seconds, progress=progress) as client:
        stats = await client.sync(url, replica)
    return dataclasses.asdict(stats)


class SyncTurns:
    """One sync at a time per peer URL. Syncs with the same peer at once (an automatic
    round and ``merklog sync``, or three ``sync`` commands through one node) each sent the
    same summary, so each downloaded the whole answer, and applied it again. Taken in
    turn, a later one asks only for what the earlier ones did not bring. A lock per URL,
    made again when the node is used from another event loop (each ``asyncio.run`` of a
    script has its own)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = {}

    def of(self, url: str) -> asyncio.Lock:
        """The lock of ``url`` in the running event loop."""
        loop = asyncio.get_running_loop()
        held = self._locks.get(url)
        if held is None or held[0] is not loop:
            held = self._locks[url] = (loop, asyncio.Lock())
        return held[1]


async def sync_node(
    node: Any,
    url: str,
    progress: Callable[[str, int, int], None] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """:func:`sync_now` once no other sync of ``node`` with ``url`` runs (:class:`SyncTurns`).
    A caller that has to wait for one is told ``progress("waiting", 0, 0)`` first (QA:
    ``merklog sync`` behind an automatic sync with a silent peer showed nothing for 56 s)."""
    turn = node.sync_turns.of(url.rstrip("/"))
    if turn.locked() and progress is not None:
        progress("waiting", 0, 0)
    async with turn:
        return await sync_now(node, url, progress, timeout)


async def sync_now(
    node: Any,
    url: str,
    progress: Callable[[str, int, int], None] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """``Node.sync``: one sync run of ``node`` with ``url``, recorded in its per-peer
    history (saved to the home), its metrics and ``last_sync``; then an epoch is asked
    for (run here when no epoch loop runs).

    A failure is counted in ``merklog_sync_failures_total`` and logged once when the
    peer starts failing (WARNING on a running node, DEBUG for a one-shot caller, who
    reports it itself); a :class:`merklog.Error` is raised as is, and so is a failure of
    this node's own store or disk (:func:`~merklog.node.failures.local_failure`: a full
    disk is exit 6 / HTTP 507, not the peer's fault); anything else as
    :class:`PeerUnreachable` naming the URL. A cancelled sync (Ctrl-C, a caller that
    went away) is recorded as :meth:`PeerSync.interrupted`, not as a failure."""
    url = url.rstrip("/")
    state = node.peer_sync.setdefault(url, PeerSync(url))
    state.attempt()
    save_history(node.home, node.peer_sync, logging.DEBUG)  # a kill -9 leaves the start
    started = time.monotonic()
    try:
        stats = await sync_with(node.served_replica, url, node.config, progress, timeout)
    except asyncio.CancelledError:
        # Stopped before it ended: what was applied stays (each sync response is applied
        # all or nothing), which the history says; not a failure of the peer.
        state.interrupted()
        save_history(node.home, node.peer_sync, logging.DEBUG)
        raise
    except NodeInputError:
        raise
    except Exception as exc:
        message = describe(exc)
        node.metrics.sync_failures.labels(url).inc()
        # A one-shot caller (the CLI on a stopped home) reports the failure itself, on
        # one line: nothing beside it (a full disk also fails the history's save).
        level = logging.WARNING if node.tasks.running else logging.DEBUG
        if state.failed(message):
            node_log.log(level, "sync with %s failed: %s", url, message)
        save_history(node.home, node.peer_sync, level)
        if isinstance(exc, ReplicationError) and not isinstance(exc, PeerError | Failure):
            # The peer answered with something this node refuses (a malformed CAR, a body
            # over the limit, a delta that fails its checks): the peer's fault, said as a
            # running node's POST /v1/sync says it (exit 1, 424 "peer error"), naming it.
            raise PeerError(f"{url}: {message}") from exc
        if isinstance(exc, MerklogError) or local_failure(exc):
            # Already says what happened (unreachable, refused, not a writer), or this
            # node's own disk or store failed (a full disk), which the peer did not cause.
            raise
        raise PeerUnreachable(f"sync with {url} failed: {message}") from exc
    if state.failures:
        node_log.info("sync with %s works again", url)
    state.succeeded(stats)
    save_history(node.home, node.peer_sync)
    node.metrics.sync_bytes.labels("in").inc(stats.get("bytes_received", 0))
    node.metrics.sync_bytes.labels("out").inc(stats.get("bytes_sent", 0))
    log_sync(url, stats, time.monotonic() - started)
    node.wake()
    if not node.tasks.running:
        node.run_epoch()
    return stats


def forget_history(node: Any, url: str) -> bool:
    """``Node.forget_peer_history``: drop the sync history of ``url`` (a URL synced ad
    hoc, or a removed peer's) so ``status`` no longer lists it; saved to the home. False
    if there was none. The replica's record of the peer's heads stays: it only sizes the
    next sync's summary, should that URL be synced again. A URL of a configured peer is
    refused (NodeInputError): its history would come back at its next sync, and the CLI
    refuses it the same way (remove the peer by name)."""
    url = url.rstrip("/")
    named = sorted(n for n, p in current_peers(node.config).items() if peer_entry_url(p) == url)
    if named:
        raise NodeInputError(
            f"{url} is peer {', '.join(named)}: remove it by name"
            f" (`merklog peers remove {named[0]}`), which forgets its sync history too"
        )
    if node.peer_sync.pop(url, None) is None:
        return False
    save_history(node.home, node.peer_sync)
    return True


def forget_saved_history(home: Path, url: str) -> bool:
    """:func:`forget_history` on a stopped home (its lock held by the caller): the entry
    of ``url`` removed from ``peersync.json`` as it is, the other entries untouched
    (even ones :func:`load_history` would ignore). False if there was none, or the file
    is unreadable (a record, never a failure)."""
    url = url.rstrip("/")
    path = home / STATE_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if path.exists():
            log.warning("ignoring unreadable %s: %s", path, exc)
        return False
    if not isinstance(raw, dict) or url not in raw:
        return False
    del raw[url]
    write_private(path, json.dumps(raw, sort_keys=True).encode())
    return True


def log_sync(url: str, stats: dict[str, Any], seconds: float) -> None:
    """One INFO record of a sync that worked (``-v``; the default WARNING level stays
    quiet): what moved and how long it took, in words and, with ``--log-format json``,
    as the fields ``peer``, ``deltas_received``, ``accepted``, ``deltas_pushed``,
    ``bytes_in``, ``bytes_out`` and ``seconds`` of its JSON line."""
    from .logs import fields

    values = {
        "peer": url,
        "deltas_received": int(stats.get("deltas_received", 0)),
        "accepted": int(stats.get("accepted", 0)),
        "deltas_pushed": int(stats.get("deltas_pushed", 0)),
        "bytes_in": int(stats.get("bytes_received", 0)),
        "bytes_out": int(stats.get("bytes_sent", 0)),
        "seconds": round(seconds, 3),
    }
    node_log.info(
        "synced with %(peer)s: pulled %(deltas_received)d deltas (%(accepted)d new), pushed"
        " %(deltas_pushed)d, %(bytes_in)d bytes in, %(bytes_out)d bytes out, %(seconds).3f s",
        values,
        extra=fields(**values),
    )


def record_incoming(node: Any, peer: bytes, kind: str, heads: list[Any] | None = None) -> None:
    """replication's ``on_served`` hook: the peer with key ``peer`` pulled from or pushed
    to this node (``kind``). Recorded as ``last_incoming`` of every ``[peers]`` entry with
    that key (saved to the home); a key no entry names is not recorded.

    ``heads`` (the peer's heads as the server saw them) are remembered as that URL's
    last known heads, so ``deltas_behind`` counts from them: a peer that pulled
    everything from us is no longer shown behind by what it took. Written by a worker
    thread (the replica's lock may be held by an apply for seconds; this runs on the
    event loop), its failure logged at DEBUG: a record, never the sync's failure."""
    key = peer.hex()
    urls = sorted(
        {
            str(p["url"]).rstrip("/")
            for p in current_peers(node.config).values()
            if isinstance(p, dict) and str(p.get("key", "")).lower() == key and p.get("url")
        }
    )
    for url in urls:
        node.peer_sync.setdefault(url, PeerSync(url)).served()
    if urls:
        save_history(node.home, node.peer_sync)
    if urls and heads:
        loop = asyncio.get_running_loop()
        for url in urls:
            done = loop.run_in_executor(None, node.replica.remember_peer_heads, url, list(heads))
            done.add_done_callback(_heads_recorded)


def _heads_recorded(future: asyncio.Future) -> None:
    """The outcome of remembering a peer's heads after an incoming sync: a failure (the
    node closing its store meanwhile) is logged at DEBUG, never left unretrieved."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("could not record a peer's heads: %s", future.exception())


def peer_status(node: Any) -> list[dict[str, Any]]:
    """``Node.peer_status``: sync state of every configured peer (added at run time too)
    and of every URL synced ad hoc: last attempt, last success, last error, deltas
    behind (``None`` when the replica cannot tell)."""
    names = {url: name for name, url in node.peer_urls().items()}
    keys = _peer_keys(current_peers(node.config))
    out = []
    for url in sorted(set(names) | set(node.peer_sync)):
        state = node.peer_sync.get(url) or PeerSync(url)
        try:
            behind = node.replica.unsynced_count(url, keys.get(url))
        except Exception:  # a status read must never fail on one peer's record
            behind = None
        out.append(state.to_json(names.get(url), behind))
    return out


def _peer_keys(peers: dict[str, Any]) -> dict[str, bytes]:
    """``{url: key}`` of the ``[peers]`` entries that give a valid key."""
    out = {}
    for peer in peers.values():
        if not isinstance(peer, dict) or not isinstance(peer.get("url"), str):
            continue
        try:
            key = bytes.fromhex(str(peer.get("key") or ""))
        except ValueError:
            continue
        if len(key) == 32:
            out[peer["url"].rstrip("/")] = key
    return out


def describe(exc: BaseException) -> str:
    """One line naming what went wrong with a peer (no traceback, no repr noise)."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, TimeoutError):
        text = "timed out"
    return text.splitlines()[0]


def current_peers(config: Config) -> dict[str, Any]:
    """``[peers]`` as config.toml says now (peers added while the node runs count); the
    node's own ``config.peers`` for a memory node, or while the file has an error (a
    hand edit the CLI refuses): logged, and a running node keeps syncing with the peers
    it had instead of its sync loop and status failing on the file."""
    if config.home is None:
        return config.peers
    try:
        if not (config.home / CONFIG_FILE).exists():  # read as defaults: no peers at all
            raise FileNotFoundError(errno.ENOENT, "it is gone", str(config.home / CONFIG_FILE))
        peers = Config.load(config.home).peers
    except (ConfigError, OSError) as exc:  # OSError: out of file descriptors, an I/O error
        why = "cannot be read" if isinstance(exc, OSError) else "is refused"
        said = f"{CONFIG_FILE} {why}: {exc}"
        if _config_unread.get(config.home) != said:  # once, not every sync round
            log.warning("using the peers read at start; %s", said)
            _config_unread[config.home] = said
        return config.peers
    if _config_unread.pop(config.home, None) is not None:
        log.info("%s is read again", CONFIG_FILE)
    return peers


#: Why each home's config.toml could not be read last (logged once until it reads again).
_config_unread: dict[Any, str] = {}


def peer_urls(config: Config) -> dict[str, str]:
    """``{name: url}`` of the peers in ``[peers]``, re-read from config.toml so peers
    added while the node runs (``merklog peers add``) count."""
    peers = current_peers(config)
    out: dict[str, str] = {}
    for name, peer in peers.items():
        url = peer.get("url") if isinstance(peer, dict) else peer
        if isinstance(url, str) and url:
            out[name] = url.rstrip("/")
    return out


def peer_entry_url(peer: object) -> str:
    """A ``[peers]`` entry's URL without a trailing slash ("" if it has none)."""
    url = peer.get("url") if isinstance(peer, dict) else peer
    return url.rstrip("/") if isinstance(url, str) else ""


def resolve_peer(config: Config, name_or_url: str) -> str:
    """A configured peer's URL by name, or the URL itself."""
    peer = config.peers.get(name_or_url)
    if (
        peer is None
        and config.home is not None
        and not name_or_url.startswith(("http://", "https://"))
    ):
        peer = current_peers(config).get(name_or_url)  # added since start
    if isinstance(peer, dict):
        return str(peer["url"])
    if isinstance(peer, str):
        return peer
    return with_lower_scheme(name_or_url)


def check_peer_url(url: str) -> str:
    """``url`` if it can name a peer (:func:`.peerurl.peer_url_problem`); else
    NodeInputError saying what is wrong (bad input: retrying cannot help, and nothing is
    recorded for it)."""
    problem = peer_url_problem(url)
    if problem is not None:
        raise NodeInputError(problem)
    return url


def async_destination(config: Config, dest: Any) -> str:
    """An ``@async`` head's first argument: a peer name from ``[peers]`` or a URL."""
    url = resolve_peer(config, str(dest)) if isinstance(dest, str) else ""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"@async destination {dest!r} is neither a peer name in [peers] nor a URL")
    return url.rstrip("/")


def async_address(config: Config, dest: Any) -> str:
    """The ``to`` of an ``@async`` message for ``dest``: the key of the peer ``dest``
    names (by name, or by its URL) when ``[peers]`` gives one, so the receiver can refuse
    a message meant for another node; else the destination as text."""
    text = str(dest)
    peer = config.peers.get(text) if isinstance(dest, str) else None
    if peer is None and isinstance(dest, str) and config.home is not None:
        peers = current_peers(config)
        peer = peers.get(text)
        if peer is None and text.startswith(("http://", "https://")):
            url = text.rstrip("/")
            peer = next(
                (
                    p
                    for p in peers.values()
                    if isinstance(p, dict) and str(p.get("url", "")).rstrip("/") == url
                ),
                None,
            )
    key = peer.get("key") if isinstance(peer, dict) else None
    return str(key).lower() if key else text


def config_allow_list(cfg: Config) -> Any:
    """The peers allowed to sync: keys in ``[peers]``, re-read when config.toml changes."""
    return _ConfigAllowList(cfg)


class _ConfigAllowList:
    """Peers allowed to sync: the keys in ``[peers]`` of config.toml, re-read when it changes
    (so ``merklog peers add`` takes effect on a running node)."""

    def __init__(self, cfg: Config) -> None:
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
            try:
                fresh = Config.load(self.cfg.home)
            except ConfigError as exc:  # a bad hand edit: keep who may sync until fixed
                log.warning("keeping the peers allowed to sync; %s is refused: %s", path, exc)
                self._mtime = mtime
                return self._allow
            allow = self._cls()
            for peer in fresh.peers.values():
                if isinstance(peer, dict) and peer.get("key"):
                    allow.allow(peer["key"], [fresh.get("dataset.id")])
            self._allow, self._mtime = allow, mtime
        return self._allow

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)
