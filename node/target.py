"""What a CLI command talks to: the running node (over HTTP) or the store itself.

See :mod:`merklog.node.runtime` for the rule: if a node holds the home lock, the
command goes through its HTTP API with the local token; otherwise it opens the
home directly (taking the lock for the command's duration).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from merklog.store import Fact, Link

from .client import NodeAPIError, NodeClient
from .config import CONFIG_FILE, Config, check_tokens, env_var, require_dataset
from .errors import NodeInputError
from .failures import ExitCode, Failure, exit_code_for_status
from .runtime import HomeLock, read_runfile, remove_runfile
from .storecheck import precheck

if TYPE_CHECKING:
    # Imported where a home is opened in this process: a command that reaches a running
    # node never loads the node's own modules (the engine, numpy, the replica).
    from .node import Node


class TargetError(Failure):
    """A command failed with a message meant for the user; nothing was changed. ``fact``:
    the fact of a write the node refused, when its answer named one."""

    fact: Fact | None = None


class Target(Protocol):
    def write(self, asserts: str, retracts: str, answer: str = "full") -> dict[str, Any]: ...
    def write_facts(
        self, asserts: list[Fact], retracts: list[Fact], answer: str = "full"
    ) -> dict[str, Any]: ...
    def query(self, q: str) -> dict[str, Any]: ...
    def facts(self, rel: str | None) -> list[dict[str, str]]: ...
    def block(self, cid: str) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...
    def load_program(self, text: str, source: str) -> dict[str, Any]: ...
    def sync(
        self,
        url: str,
        progress: Callable[[str, int, int], None] | None,
        timeout: float | None = None,
    ) -> dict[str, Any]: ...
    def grant(self, key: str) -> Any: ...
    def revoke(self, key: str) -> Any: ...
    def writers(self) -> list[dict[str, Any]]: ...
    def export_car(self, path: Path, progress: Callable[[int], None] | None = None) -> int: ...
    def import_car(
        self, path: Path, progress: Callable[[int], None] | None = None
    ) -> dict[str, Any]: ...


class LocalTarget:
    """A node opened in this process (no server)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def write(self, asserts: str, retracts: str, answer: str = "full") -> dict[str, Any]:
        add = self.node.coerce_facts([asserts]) if asserts.strip() else []
        rem = self.node.coerce_facts([retracts]) if retracts.strip() else []
        return self.write_facts(add, rem, answer)

    def write_facts(
        self, asserts: list[Fact], retracts: list[Fact], answer: str = "full"
    ) -> dict[str, Any]:
        # Node.write syncs a freshly joined home with its origin first (ADR 0037, 0076). A
        # one-shot command evaluates nothing: the node's next start does (no epoch per put).
        return self.node.write(asserts, retracts, evaluate=False).to_json(answer)

    def query(self, q: str) -> dict[str, Any]:
        return self.node.query(q).to_json()

    def facts(self, rel: str | None) -> list[dict[str, str]]:
        from .factpages import fact_refs

        return fact_refs(self.node.list_facts(rel))

    def block(self, cid: str) -> dict[str, Any]:
        from .handlers import describe_block

        return describe_block(self.node, Link.parse(cid))

    def status(self) -> dict[str, Any]:
        return {**self.node.status(), "running": False}

    def load_program(self, text: str, source: str) -> dict[str, Any]:
        self.node.load_program(text, source)
        self.node.run_epoch()
        return self.node.status()

    def sync(
        self,
        url: str,
        progress: Callable[[str, int, int], None] | None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        import asyncio  # a home opened here; a command through a node never needs it

        return asyncio.run(self.node.sync(url, progress, timeout))

    def grant(self, key: str) -> Any:
        return self.node.grant(key)

    def revoke(self, key: str) -> Any:
        return self.node.revoke(key)

    def writers(self) -> list[dict[str, Any]]:
        return self.node.writers()

    def export_car(self, path: Path, progress: Callable[[int], None] | None = None) -> int:
        return self.node.export_car(path, progress)

    def import_car(
        self, path: Path, progress: Callable[[int], None] | None = None
    ) -> dict[str, Any]:
        return self.node.import_car(path, progress)


class RemoteTarget:
    """The node running on this home, reached through its local API."""

    def __init__(self, client: NodeClient, config: Config) -> None:
        self.client = client
        self.config = config

    def _do(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NodeAPIError as exc:
            message = str(exc)
            if exc.status == 401:  # this home's own node: its token and ours differ
                message = (
                    f"the node running on this home ({self.client.url}) refused this"
                    " command's token: the token it runs with is not the one this command"
                    " read (api.token in config.toml, MERKLOG_API_TOKEN or --set"
                    " api.token); after changing config.toml, restart the node"
                )
            elif exc.error == "peer untrusted":  # the node's environment, not this command's
                message += (
                    f"; this sync ran in the node running on this home ({self.client.url}):"
                    " SSL_CERT_FILE must be set in that node's environment (restart it so)"
                )
            failure = TargetError(message, exit_code_for_status(exc.status, exc.error))
            failure.fact = exc.fact  # a refused fact of a write, named by the node
            raise failure from None

    def write(self, asserts: str, retracts: str, answer: str = "full") -> dict[str, Any]:
        # A joined home's first write: the node syncs once with its origin itself
        # (writeaccess.sync_before_first_write_async). QA: this command synced with the
        # origin again after every refusal, so a refused put pulled everything new.
        return self._do(self.client.write, asserts, retracts, answer)

    def write_facts(
        self, asserts: list[Fact], retracts: list[Fact], answer: str = "full"
    ) -> dict[str, Any]:
        """Parsed facts sent as Datalog text (``str(fact)`` is the one rendering and
        parses back to the same fact)."""
        return self.write(
            "".join(f"{f}.\n" for f in asserts), "".join(f"{f}.\n" for f in retracts), answer
        )

    def query(self, q: str) -> dict[str, Any]:
        return self._do(self.client.query, q)  # an unknown relation: 404, exit 3

    def facts(self, rel: str | None) -> list[dict[str, str]]:
        return self._do(self.client.facts, rel)["facts"]

    def block(self, cid: str) -> dict[str, Any]:
        return self._do(self.client.block, cid)

    def status(self) -> dict[str, Any]:
        return {**self._do(self.client.status), "running": True, "url": self.client.url}

    def load_program(self, text: str, source: str) -> dict[str, Any]:
        return self._do(self.client.load_program, text, source)

    def sync(
        self,
        url: str,
        progress: Callable[[str, int, int], None] | None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """The running node syncs; ``timeout`` (this command's ``sync.timeout``, when it
        set one) is sent along: the node's config does not hold this command's ``--set``.
        Without it the node uses its own, which the home's config gives as far as this
        process can tell, and the client waits for the node that long."""
        node_timeout = float(self.config.get("sync.timeout"))
        return self._do(self.client.sync, url, progress, timeout, node_timeout)

    def grant(self, key: str) -> Any:
        return self._do(self.client.grant, key)

    def revoke(self, key: str) -> Any:
        return self._do(self.client.revoke, key)

    def writers(self) -> list[dict[str, Any]]:
        return self._do(self.client.writers)

    def export_car(self, path: Path, progress: Callable[[int], None] | None = None) -> int:
        return self._do(self.client.export_car, path, progress)

    def import_car(
        self, path: Path, progress: Callable[[int], None] | None = None
    ) -> dict[str, Any]:
        from .carfiles import CAR_SUBJECT

        try:
            return self.client.import_car(path, progress)
        except NodeAPIError as exc:
            if exc.status == 400 and exc.detail.startswith(CAR_SUBJECT):
                # The CAR's fault: the line a stopped home's import gives, naming the file.
                raise TargetError(
                    f"{path} {exc.detail[len(CAR_SUBJECT) :]}", ExitCode.BAD_INPUT
                ) from None
            raise TargetError(str(exc), exit_code_for_status(exc.status, exc.error)) from None


def load_config(home: Path, overrides: dict[str, Any] | None = None) -> Config:
    """The config of the initialised home ``home`` as the CLI uses it: TargetError if
    there is none, :func:`refuse_memory_store` if it names the memory store,
    :func:`~.config.require_dataset` if it lost its ``dataset.id`` (emptied, cut short)."""
    if not (home / CONFIG_FILE).exists():
        # A store holding a dataset without its config.toml: `init` refuses there, so the
        # line says how to get the home back (ADR 0204), not to run `init`. Imported here:
        # a command through a running node loads no home-making module.
        from .homeinit import refuse_hidden_dataset

        refuse_hidden_dataset(Config.load(home, overrides), None)
        raise TargetError(f"{home} is not a merklog home; run `merklog --home {home} init` first")
    cfg = Config.load(home, overrides)
    refuse_memory_store(cfg, overrides)
    if _asks_another_store(overrides):  # --set or the environment, for this command only
        from .homeinit import refuse_store_switch

        refuse_store_switch(home, overrides, "a command")
    if _asks(overrides, ("dataset.id",)):
        from .homeinit import refuse_dataset_switch

        refuse_dataset_switch(home, overrides, "a command")
    require_dataset(cfg)
    check_tokens(cfg)
    return cfg


def _asks_another_store(overrides: dict[str, Any] | None) -> bool:
    """Whether this command's ``--set`` options or environment name the store's backend
    or IPFS daemon (then :func:`~.homeinit.refuse_store_switch` compares them with the
    home's own)."""
    return _asks(overrides, ("store.backend", "store.ipfs_api"))


def _asks(overrides: dict[str, Any] | None, keys: tuple[str, ...]) -> bool:
    """Whether this command's ``--set`` options or environment name any of ``keys``."""
    import os

    return any(k in (overrides or {}) for k in keys) or any(env_var(k) in os.environ for k in keys)


def refuse_memory_store(cfg: Config, overrides: dict[str, Any] | None = None) -> None:
    """Refuse (exit 2) ``store.backend = "memory"`` for a home used from the CLI.

    A memory store lives as long as one process: every command would start a new, empty
    dataset and keep nothing it was told (``put`` said it worked). It is for the Python
    API's throwaway nodes (``merklog.open(memory=True)``); the message names where the
    setting came from."""
    if cfg.get("store.backend") != "memory":
        return
    import os

    if "store.backend" in (overrides or {}):
        where = "--set store.backend=memory"
    elif "MERKLOG_STORE_BACKEND" in os.environ:
        where = "MERKLOG_STORE_BACKEND=memory"
    else:
        where = f'store.backend = "memory" in {cfg.home / CONFIG_FILE if cfg.home else "config"}'
    raise Failure(
        f"{where}: a memory store keeps nothing once a command ends, so each command would"
        " start a new, empty dataset; use store.backend sqlite (the default) or ipfs, or"
        " the Python API merklog.open(memory=True) for a throwaway node",
        ExitCode.BAD_INPUT,
    )


def _busy(home: Path) -> str:
    """What a command says of a home another process holds without serving it."""
    return (
        f"{home} is in use by another process that serves no HTTP API (another merklog"
        " command, or an app that opened it with merklog.open; an app that serves it with"
        " merklog.serve lets commands through); try again when it has ended"
    )


@contextmanager
def open_target(home: Path, overrides: dict[str, Any] | None = None) -> Iterator[Target]:
    """The running node if there is one, else the home opened in-process."""
    config = load_config(home, overrides)
    precheck(config)
    lock, info = _lock_or_node(home)
    if lock is None:
        if not info:
            raise TargetError(_busy(home))
        yield RemoteTarget(NodeClient(info["url"], config.get("api.token")), config)
        return
    remove_runfile(home)  # we hold the lock: a run file left by a killed node is stale
    try:
        from .node import Node

        node = Node(config, lock)
    except BaseException:
        lock.release()
        raise
    try:
        yield LocalTarget(node)
    finally:
        node.close()


def forget_sync_history(home: Path, config: Config, url: str) -> bool:
    """Forget the sync history of ``url`` in ``home`` (``merklog peers remove``): asked
    of the running node if there is one (it keeps the history in memory and saves it
    after every sync, so editing the file under it would be undone), else edited in
    ``peersync.json`` under the home's lock. Whether there was one."""
    from .peersync import forget_saved_history

    lock, info = _lock_or_node(home)
    if lock is None:
        if not info:
            raise TargetError(_busy(home))
        client = NodeClient(info["url"], config.get("api.token"))
        return bool(RemoteTarget(client, config)._do(client.forget_sync_history, url))
    try:
        return forget_saved_history(home, url)
    finally:
        lock.release()


#: Seconds a command waits for a home another process holds: its lock, or a run file.
LOCK_WAIT = 15.0


def _lock_or_node(home: Path, timeout: float | None = None) -> tuple[HomeLock | None, dict | None]:
    """The home's lock, or the running node's pid/URL: whichever comes first within
    ``timeout`` seconds. A node that holds the lock but is still starting (opening the
    store, first epoch) writes its run file when it listens; a one-shot command that
    holds it (a put, an export) frees it when it ends, and the lock is tried again
    meanwhile (it was not: a command waited the whole timeout for a run file that
    never came, then refused although the home had been free for seconds)."""
    import time

    deadline = time.monotonic() + (LOCK_WAIT if timeout is None else timeout)
    while True:
        lock = HomeLock.try_acquire(home)
        if lock is not None:
            return lock, None
        info = read_runfile(home)
        if info or time.monotonic() > deadline:
            return None, info
        time.sleep(0.05)


def input_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "your input is wrong" (reported, exit non-zero)."""
    from merklog.replication.errors import ReplicationError
    from merklog.store import InvalidValue, StoreError

    return (
        NodeInputError,
        InvalidValue,
        StoreError,
        TargetError,
        ValueError,
        ReplicationError,
    )
