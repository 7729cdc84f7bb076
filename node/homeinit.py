"""The home directory: creating it (keys, tokens, config, dataset), all or nothing, and
joining a dataset from a peer.

``init_home`` creates what is missing in a home. ``initialise`` wraps it: whatever it created is
removed again if any step fails (an unknown ``store.backend``, a full disk, a
peer that vanished, an IPFS daemon that is down), so a failed ``merklog init``,
``node run --init`` or first ``merklog.open`` never leaves a half-made home that
later commands call "not a merklog home". ``fetch_join`` asks a peer for
its dataset (genesis block, verified against the id) and its key, so the joined
home knows where to sync once before its first write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merklog.replication.errors import (
    PLAIN_HTTP_HINT,
    PeerUntrusted,
    cannot_reach,
    handshake_failed,
    unreachable_reason,
)
from merklog.replication.identity import Identity
from merklog.store import Link
from merklog.store.errors import one_line, what_was_sent

from . import dataset as dataset_mod
from . import storage
from .config import DEFAULTS, ORIGIN, Config, new_token, require_dataset
from .failures import ExitCode, Failure
from .files import IDENTITY_FILE as IDENTITY_FILE  # re-exported: callers look here
from .files import private_dir
from .runtime import LOCK_FILE
from .storecheck import check_store_file, load_key


def init_home(
    home: Path, overrides: dict[str, Any] | None = None, join: tuple[Link, bytes] | None = None
) -> tuple[Config, bool]:
    """Create keys, config and dataset in ``home`` if missing; return (config, created).

    The one place a node key is made (``init``, a first ``merklog.open``): opening a home
    whose key went missing is refused instead (:func:`.storecheck.load_key`).

    ``join=(dataset, genesis_block)`` follows an existing dataset instead of creating one.
    """
    refuse_store_switch(home, overrides)  # before anything is written
    private_dir(home)
    created = not (home / "config.toml").exists()
    cfg = Config.load(home, overrides)
    if created:
        refuse_unusable_store(cfg)
        refuse_hidden_dataset(cfg, join[0] if join is not None else None)
    else:
        refuse_damaged_home(cfg)
    identity = (
        load_key(home)  # a damaged one is refused (exit 5), not used or replaced
        if (home / IDENTITY_FILE).exists() or (home / IDENTITY_FILE).is_symlink()
        else Identity.load_or_create(home / IDENTITY_FILE)
    )
    for key in ("token", "read_token"):
        if not cfg.get(f"api.{key}"):
            cfg.data["api"][key] = new_token()
    if join is not None or not cfg.get("dataset.id"):
        store = storage.open_store(cfg)
        try:
            if join is not None:
                dataset = dataset_mod.join_dataset(store, identity, *join)
            else:
                dataset = dataset_mod.create_dataset(store, identity, home.name)
            cfg.data["dataset"]["id"] = str(dataset)
        finally:
            store.close()
    cfg.save()
    return cfg, created


def refuse_damaged_home(cfg: Config) -> None:
    """Refuse (nothing written) to complete a home whose store or config lost what it
    had, as every other command on it does: ``init`` said "already initialised" (exit
    0) over a deleted store.sqlite, and over a config.toml emptied or cut short it made
    a new dataset in the old store, hiding every fact the home had. A new empty store
    would lose the dataset's history: the message says how to restore it."""
    if cfg.get("dataset.id"):
        check_store_file(cfg)  # missing, empty or not SQLite: exit 5, as `status`
        if cfg.get("store.backend") == "sqlite":
            # Opened as every command opens it: a damaged header ("file is not a
            # database") was "already initialised" (exit 0) here and exit 5 everywhere else.
            storage.open_store(cfg).close()
        return
    store = cfg.path("store.path") if cfg.get("store.backend") == "sqlite" else None
    if store is not None and store.exists():
        require_dataset(cfg)  # the store holds a dataset the config no longer names


def refuse_unusable_store(cfg: Config) -> None:
    """Refuse (exit 5, as every command refuses an unusable store) to make a new home
    (no config.toml yet) where its SQLite store path already holds something no store
    can be made in: a directory, or a file that is not SQLite. ``init`` said ``PATH: Is
    a directory`` (exit 1) or SQLite's "file is not a database", and left ``node.lock``
    behind; ``init`` runs this before it takes the lock, so nothing is made. A zero-length
    file is SQLite's empty database, with nothing in it to lose: the store is made in
    it, as where there is no file. An initialised home's store is
    :func:`refuse_damaged_home`'s."""
    if cfg.home is None or (cfg.home / "config.toml").exists():
        return
    store = cfg.path("store.path") if cfg.get("store.backend") == "sqlite" else None
    if store is None or not store.exists() or (store.is_file() and not store.stat().st_size):
        return
    check_store_file(cfg)


def refuse_hidden_dataset(cfg: Config, joining: Link | None) -> None:
    """Refuse (exit 1, nothing written) to make a new home (no config.toml) whose SQLite
    store already holds a replica of a dataset other than the one it will follow
    (``joining``, or ``--set dataset.id=CID``): a home whose config.toml was deleted
    was "not a merklog home", and ``init`` then made a new dataset in the old store,
    hiding every fact of the one it held. The message names the dataset and how to follow
    it again."""
    if cfg.home is None or cfg.get("store.backend") != "sqlite":
        return
    store = cfg.path("store.path")
    if store is None or not store.is_file() or not store.stat().st_size:
        return
    import sqlite3

    from merklog.replication.schema import stored_datasets

    try:
        with contextlib.closing(
            sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            held = [Link(raw) for raw in stored_datasets(db)]
    except sqlite3.DatabaseError:
        return  # not a store this check can read: opening it says what is wrong
    given = cfg.get("dataset.id")
    wanted = joining if joining is not None else (Link.parse(given) if given else None)
    if not held or wanted in held:
        return
    home = cfg.home
    raise Failure(
        f"{home / 'config.toml'} is missing, but the store {store} holds the dataset"
        f" {held[0]}{f' (and {len(held) - 1} more)' if len(held) > 1 else ''}:"
        " put back the copy of config.toml kept with the home's backup, or follow that"
        f" dataset again with `merklog --home {home} --set dataset.id={held[0]} init` (new"
        f" API tokens); to start another dataset here, move {store} away first",
        ExitCode.FAILED,
    )


def refuse_store_switch(home: Path, overrides: dict[str, Any] | None, doing: str = "init") -> None:
    """Refuse (bad input, nothing written) an init of an initialised home — or any
    command on it (``doing`` names it) — that would move where its blocks live: another
    ``store.backend``, or another IPFS daemon (``store.ipfs_api``), asked by ``--store``,
    ``--ipfs-api``, ``--set`` or the environment. Saving the config was all init did: the
    home then looked for its blocks where none of them are (its older facts not on the
    new daemon, or the SQLite cache read as a whole store). Any other command wrote its
    blocks around the home's store (QA: ``MERKLOG_STORE_BACKEND=sqlite put`` on an IPFS
    home put nothing on the daemon, and peers syncing over pubsub stalled). Two
    spellings of one daemon (a URL and its multiaddr) are no switch."""
    if not (home / "config.toml").exists():
        return
    now = Config.load(home, env={})  # the file's own values
    wanted = Config.load(home, overrides)
    have, want = now.get("store.backend"), wanted.get("store.backend")
    if have != want:
        api = " --set store.ipfs_api=URL" if want == "ipfs" else ""
        raise Failure(
            f"{home} already keeps its blocks in {have}; {doing} does not move them to {want}:"
            f" export it (`merklog --home {home} export FILE.car`) and restore that into a"
            f" new home (`merklog --home NEW --set store.backend={want}{api} restore"
            f" FILE.car --identity {home / IDENTITY_FILE}`)",
            ExitCode.BAD_INPUT,
        )
    if have != "ipfs":
        return
    old, new = now.get("store.ipfs_api"), wanted.get("store.ipfs_api")
    if _daemon(old) == _daemon(new) or _daemon(new) is None:
        return  # the same daemon, or an address the store check refuses as such
    raise Failure(
        f"{home} keeps its blocks on the IPFS daemon at {old}; {doing} does not re-point it"
        f" to {new}. If the daemon moved, set store.ipfs_api in {home / 'config.toml'};"
        " if the new daemon lacks the home's blocks, `merklog fsck --repair-from PEER`"
        " then imports them into it",
        ExitCode.BAD_INPUT,
    )


def refuse_dataset_switch(
    home: Path, overrides: dict[str, Any] | None, doing: str = "init"
) -> None:
    """Refuse (bad input, nothing written) ``--set dataset.id=…`` (or its environment
    variable) naming another dataset than an initialised home's, for ``init`` without
    ``--join`` or for any command (``doing``). Only the config line changed: the home
    then looked for a genesis its store does not hold, and every command called the
    store damaged (QA). Following another dataset is ``init --join … --force``."""
    if not (home / "config.toml").exists():
        return
    have = Config.load(home, env={}).get("dataset.id")
    want = Config.load(home, overrides).get("dataset.id")
    if not have or want == have:
        return
    raise Failure(
        f"{home} follows dataset {have}; {doing} does not switch it to {want} by a setting"
        f" (its store holds no such dataset). To follow another dataset, join it:"
        f" `merklog --home {home} init --join URL --force` (or use a new --home)",
        ExitCode.BAD_INPUT,
    )


#: Options whose change init does not list: the dataset (its own output line, "joined").
_UNLISTED = {"dataset.id"}
#: Options whose change init lists without their values, each with the command that
#: prints the value.
_SECRETS = {"api.token": "merklog token --write", "api.read_token": "merklog token"}


def changed_settings(before: Config, after: Config, given: Collection[str] = ()) -> list[str]:
    """What an init of an initialised home changed in its config.toml (``before`` and
    ``after`` read from the file alone): one ``KEY: OLD -> NEW`` per option, so the
    settings given to init (``--port``, ``--host``, ``--set``, the environment) are not
    saved silently under "already initialised". A token is listed without its value:
    as the one given, if ``given`` names it (``--set api.token=…``, ``MERKLOG_API_TOKEN``),
    else as generated (init said it "generated a new one" of a token it was given)."""
    lines = []
    for section, values in DEFAULTS.items():
        for name in values:
            key = f"{section}.{name}"
            old, new = before.get(key), after.get(key)
            if key in _UNLISTED or old == new:
                continue
            if key in _SECRETS:
                how = "set to the one given" if key in given else "generated a new one"
                lines.append(f"{key}: {how} (`{_SECRETS[key]}` prints it)")
            else:
                lines.append(f"{key}: {_toml(old)} -> {_toml(new)}")
    return lines


def _toml(value: Any) -> str:
    """``value`` as config.toml spells it ("127.0.0.1", true, 7420)."""
    return json.dumps(value) if isinstance(value, str | bool) else str(value)


def _daemon(addr: Any) -> str | None:
    """The API multiaddr ``addr`` names (None if it is no valid address)."""
    from merklog.store.errors import StoreError
    from merklog.store.ipfs import api_multiaddr

    try:
        return api_multiaddr(str(addr))
    except StoreError:
        return None


@dataclass(frozen=True)
class Join:
    """What ``init --join URL`` learnt from the peer at ``url``."""

    url: str
    dataset: Link
    genesis: bytes
    key: str | None


def fetch_join(url: str, timeout: float = 30.0, token: str = "") -> Join:
    """The dataset and key of the node at ``url`` (its ``/v1/genesis`` and ``/v1/status``,
    read with ``token``: the peer's read token, unless it allows anonymous reads)."""
    if not url.startswith(("http://", "https://")):
        raise Failure(f"--join expects http://HOST:PORT, got {url!r}", ExitCode.BAD_INPUT)
    return asyncio.run(_fetch_join(url.rstrip("/"), timeout, token))


async def _fetch_join(url: str, timeout: float, token: str) -> Join:
    import aiohttp

    limit = aiohttp.ClientTimeout(total=timeout)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession(timeout=limit, headers=headers) as session:
            async with session.get(url + "/v1/genesis") as resp:
                if resp.status == 401:  # a peer's refusal: exit 1, as for `peers add`
                    wants = "refused the token given" if token else "wants a token"
                    raise Failure(
                        f"cannot join {url}: it {wants}; pass --token with its"
                        " read token (`merklog token` on that node)"
                    )
                if resp.status != 200:
                    sent = what_was_sent(await resp.read())
                    raise Failure(
                        f"cannot join {url}: it did not give its genesis (HTTP {resp.status};"
                        f" {sent})"
                    )
                data = await resp.read()
                header = resp.headers.get("X-Dataset", "")
            key = None
            async with session.get(url + "/v1/status") as resp:
                if resp.status == 200:
                    key = _key_of(await resp.read())
    except aiohttp.ClientConnectorCertificateError as exc:  # configuration, not a retry
        raise PeerUntrusted.for_url(url, exc.certificate_error) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        why = unreachable_reason(exc)
        line = cannot_reach(url, why, "to join it")
        if handshake_failed(why):  # an https:// URL of a plain-HTTP peer: not worth a retry
            raise Failure(f"{line}; {PLAIN_HTTP_HINT}") from None
        raise Failure(line, ExitCode.PEER_UNREACHABLE) from None
    try:
        dataset = Link.parse(header)
    except ValueError:
        shown = f"X-Dataset: {one_line(header, 80)}" if header else "no X-Dataset header"
        raise Failure(
            f"cannot join {url}: it named no valid dataset id ({shown}; {what_was_sent(data)});"
            " is it a merklog node?"
        ) from None
    if not dataset.verifies(data):
        raise Failure(f"cannot join {url}: its genesis block does not hash to {dataset}")
    return Join(url, dataset, data, key)


def _key_of(body: bytes) -> str | None:
    try:
        key = json.loads(body).get("key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) and len(key) == 64 else None


def lock_is_new(home: Path) -> bool:
    """Whether taking the lock of ``home``, a directory that exists, makes its lock file
    ``node.lock``; asked before the lock is taken, and given to :func:`initialise`."""
    return home.is_dir() and not os.path.lexists(home / LOCK_FILE)


def initialise(
    home: Path,
    overrides: dict[str, Any],
    join: Join | None,
    existed: bool,
    lock_made: bool = False,
) -> tuple[Config, bool]:
    """``init_home`` all or nothing; records the joined peer as ``[peers] origin``.
    ``lock_made``: the caller's lock made ``node.lock`` in ``home``, which existed
    (:func:`lock_is_new`); a failed init removes it too, so the directory is left as it
    was (it left the empty lock file behind)."""
    before = {p.name for p in home.iterdir()} if existed else set()
    try:
        cfg, created = init_home(
            home, overrides, (join.dataset, join.genesis) if join is not None else None
        )
        if join is not None and join.url:
            cfg = Config.load(home)
            entry: dict[str, str] = {"url": join.url}
            if join.key:
                entry["key"] = join.key
            cfg.peers[ORIGIN] = entry
            cfg.save()
    except BaseException:
        undo_init(home, existed, before, lock_made)
        raise
    return cfg, created


def undo_init(home: Path, existed: bool, before: set[str], lock_made: bool = False) -> None:
    """Remove what a failed init created (the whole home if it did not exist). The lock
    file goes only if ``lock_made``, while the caller still holds the lock, as it goes
    with a home that did not exist."""
    if not existed:
        shutil.rmtree(home, ignore_errors=True)
        return
    if lock_made:
        (home / LOCK_FILE).unlink(missing_ok=True)
    for path in home.iterdir():
        if path.name not in before and path.name != LOCK_FILE:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
