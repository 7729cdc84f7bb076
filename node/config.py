"""The node's configuration: one TOML file, documented defaults, env and flag overrides.

Precedence, lowest first: built-in defaults (``DEFAULTS``) < ``HOME/config.toml`` <
environment variables ``MERKLOG_<SECTION>_<KEY>`` (e.g. ``MERKLOG_NODE_PORT=8000``) <
command-line flags (specific flags such as ``--port``, or the generic
``--set section.key=value``). Values from the environment and ``--set`` are parsed
as TOML literals when they look like one (numbers, booleans), else taken as strings.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import secrets
import string
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from .errors import NodeError, NodeInputError
from .files import decode_utf8, tighten_home, write_private
from .home import ENV_HOME as ENV_HOME  # re-exported: config is where callers look
from .home import default_home as default_home
from .peerurl import peer_url_problem

CONFIG_FILE = "config.toml"
#: Name of the peer entry ``init --join URL`` records for URL (``[peers] origin``).
ORIGIN = "origin"

#: Every option with its default and meaning. ``merklog init`` writes these to config.toml.
DEFAULTS: dict[str, dict[str, Any]] = {
    "node": {
        "host": "127.0.0.1",  # address the HTTP server binds
        "port": 7420,  # TCP port of the HTTP server (0 = pick a free one)
        "epoch_interval": 1.0,  # seconds between epochs when nothing is written
        "tick": False,  # feed a tick(N) clock fact every epoch
        "outbox_interval": 0.5,  # seconds between @async outbox delivery passes
        "outbox_give_up": 3600.0,  # seconds an @async message no peer takes is retried
        "async_keep": 604800.0,  # seconds delivered-to-us and dropped @async messages are kept
        "program": "",  # Datalog program file evaluated every epoch ("" = none)
        "max_body": 16 * 1024 * 1024,  # largest accepted request body, bytes
        # MiB this process may grow to while an epoch evaluates (0 = half the memory)
        "eval_memory_mb": 0,
        "static_dir": "",  # folder served at / (an app page), "" = none
        "max_live_queries": 256,  # live queries (/v1/subscribe) served at once
    },
    "store": {
        "backend": "sqlite",  # sqlite (default), ipfs (blocks on an IPFS daemon) or memory
        "path": "store.sqlite",  # SQLite file, relative to the home directory
        "ipfs_api": "/ip4/127.0.0.1/tcp/5001/http",  # IPFS daemon RPC API (ipfs backend)
        "ipfs_timeout": 30.0,  # seconds any one request to the IPFS daemon may take
    },
    "api": {
        "token": "",  # bearer token for writes (and reads); init generates one
        "read_token": "",  # bearer token for reads only; init generates one
        "anonymous_reads": False,  # true: GET endpoints answer without a token
        "cors_origins": "",  # pages of these origins may call the API (space-separated)
    },
    "sync": {
        "timeout": 30.0,  # seconds per sync request
        "interval": 0.0,  # seconds between automatic syncs with every peer (0 = off)
        "ipfs_interval": 2.0,  # ipfs backend: seconds between head announcements on pubsub (0 = off)
    },
    "dataset": {
        "id": "",  # CID of the dataset genesis this node replicates (init creates one)
    },
}

#: The largest per-request timeout of a sync (a day): one request that may hang longer is
#: a typo, and would hold the caller's sync that long. ``sync.timeout`` and the timeout
#: one sync asks for (``Node.sync``, ``POST /v1/sync``) alike.
MAX_SYNC_TIMEOUT = 86400.0

#: The smallest and largest value of numeric options (inclusive; None: no bound). Every
#: other number must be at least 0: no option means anything below it.
_RANGES: dict[str, tuple[float | None, float | None]] = {
    "node.port": (0, 65535),
    "node.max_body": (1024, None),
    "node.max_live_queries": (1, None),
    "node.epoch_interval": (0.001, None),
    "node.outbox_interval": (0.001, None),
    "store.ipfs_timeout": (0.001, None),
    "sync.timeout": (0.001, MAX_SYNC_TIMEOUT),
}

#: Options that take one of a few words. ``memory`` is for the Python API only (a store
#: that lives as long as one process); the CLI refuses it for a home (see
#: :func:`merklog.node.target.load_config`).
_CHOICES: dict[str, tuple[str, ...]] = {
    "store.backend": ("sqlite", "ipfs", "memory"),
}

#: The fields of a ``[peers.NAME]`` entry, as ``peers add`` and ``init --join`` write them.
PEER_FIELDS = ("url", "key")

#: The longest peer name, in characters. A name is a cell of ``status``'s peer table and
#: ``peers list``, and part of error lines: one of 100,000 characters was taken and made
#: ``status`` unreadable.
PEER_NAME_MAX = 64


def peer_name_problem(name: str) -> str | None:
    """Why ``name`` is too long to be a peer name (None: it is not). Only the length:
    the characters ``peers add`` allows (letters, digits, ``-``, ``_``) are its own
    rule, and a hand-written ``[peers."a.b"]`` keeps working."""
    if len(name) <= PEER_NAME_MAX:
        return None
    return (
        f"peer name {name[:16]!r}… is {len(name):,} characters long;"
        f" a peer name has at most {PEER_NAME_MAX}"
    )


#: Options whose value is a path relative to the home directory.
_PATHS = {("store", "path"), ("node", "program"), ("node", "static_dir")}

#: Path options whose relative value from the environment or ``--set`` names a place
#: from the working directory of the command that reads it, as ``node run --static-dir
#: DIR`` does (only one in config.toml is relative to the home). Resolved against the
#: home, ``--set node.static_dir=app`` named HOME/app, which every command refused as
#: publishing the home.
_FROM_WORKING_DIR = frozenset({"node.static_dir"})


def _from_working_dir(cfg: dict[str, dict[str, Any]], key: str) -> None:
    """Make option ``key`` of ``cfg``, just given by the environment or an override,
    absolute against the working directory if it is one of :data:`_FROM_WORKING_DIR`
    and relative (``init`` then saves it absolute in config.toml)."""
    if key not in _FROM_WORKING_DIR:
        return
    section, _, name = key.partition(".")
    value = cfg[section][name]
    if value and not Path(value).expanduser().is_absolute():
        cfg[section][name] = os.path.abspath(Path(value).expanduser())


class ConfigError(NodeError, ValueError):
    """A configuration file or override is invalid."""


#: How to get a home's config.toml back, said by every error about a damaged one.
RESTORE_CONFIG = (
    "put back the copy of config.toml kept with the home's backup (docs/operations.md,"
    ' "Backup and restore")'
)


def read_config_text(path: Path) -> str:
    """The text of the config file ``path``; ConfigError (exit 2, the file named) if it
    is a directory or not UTF-8, like any other damage to it. Python's own messages
    named no file ("'utf-8' codec can't decode byte 0xff …") or gave exit 1
    ("[Errno 21] Is a directory")."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise ConfigError(
            f"{path} is a directory, not a config file; move it away and {RESTORE_CONFIG}"
        ) from None
    try:
        return decode_utf8(data, path)
    except NodeInputError as exc:
        raise ConfigError(str(exc)) from None


def require_dataset(cfg: Config) -> None:
    """ConfigError naming the file and the entry unless ``cfg`` (an initialised home's)
    names its dataset: a config.toml emptied or cut short lost ``dataset.id`` first (it
    is written last), and the node then failed on it as "not a CID: ''"."""
    if cfg.get("dataset.id"):
        return
    where = cfg.home / CONFIG_FILE if cfg.home is not None else "the configuration"
    raise ConfigError(
        f"{where}: dataset.id is missing (the file is empty or was cut short?); it names the"
        f" dataset this home follows, so nothing can be read or written without it:"
        f" {RESTORE_CONFIG}"
    )


def _parse_literal(text: str) -> Any:
    """``"8000"`` → 8000, ``"true"`` → True, ``"1.5"`` → 1.5; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _given_value(key: str, text: str) -> Any:
    """The value of option ``key`` given as ``text`` by the environment or ``--set``: a
    TOML literal when it looks like one, else the text. An API token is the text as
    given (only a quoted TOML string loses its quotes): ``--set 'api.token= x'`` lost its
    spaces, where the same token from the environment or config.toml is refused
    (:func:`check_tokens`), and a token such as ``1e3`` or ``true`` became ``1000.0`` or
    ``True``, which no client sends."""
    if key not in TOKENS:
        return _parse_literal(text)
    quoted = _parse_literal(text)
    return quoted if isinstance(quoted, str) and text.strip()[:1] in ("'", '"') else text


def _check_peer(name: str, value: Any, where: str) -> None:
    """Raise ConfigError unless ``value`` is a peer entry as ``peers add`` writes it: a
    table with an http(s) ``url`` and, optionally, the peer's ``key`` (64 hex digits).
    Checked when the config is read, so every command refuses a hand-edited entry of the
    wrong shape (exit 2) instead of one of them failing on it later as a bug."""
    problem = peer_name_problem(name)
    if problem is not None:  # said without the name itself: it is the problem
        raise ConfigError(f"{where}: [peers] {problem}: give it a shorter one")
    entry = f"[peers.{name}]"
    if not isinstance(value, dict):
        raise ConfigError(
            f'{where}: {entry} must be a table with url = "http://HOST:PORT" (and key ='
            f' "HEX"), got {value!r}; `merklog peers add NAME URL` writes one'
        )
    unknown = sorted(set(value) - set(PEER_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: {entry} has unknown field {unknown[0]!r} (known: url, key)")
    url = value.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: {entry} url must be an http:// or https:// URL, got {url!r}")
    problem = peer_url_problem(url)  # what `peers add` refuses, refused when hand-written
    if problem is not None:
        raise ConfigError(f"{where}: {entry} {problem}")
    key = value.get("key")
    if key is not None and (
        not isinstance(key, str) or len(key) != 64 or not set(key) <= set(string.hexdigits)
    ):
        raise ConfigError(
            f"{where}: {entry} key must be the peer's public key as 64 hex digits, got {key!r}"
        )


def _check_choice(key: str, value: Any, where: str) -> None:
    """Raise ConfigError if ``value`` is not one ``key`` takes: a word of ``_CHOICES``, or
    for ``dataset.id`` a CID (or "" before init). Checked here so a bad one is refused
    before a home is created, not after ``init_home`` wrote it (``Node.open``)."""
    if key in _CHOICES and value not in _CHOICES[key]:
        words = ", ".join(_CHOICES[key])
        if key == "store.backend":  # memory is never a home's store (the CLI refuses it)
            words = "sqlite or ipfs (memory: a Python API memory node only)"
        raise ConfigError(f"{where}: {key} must be one of {words}, got {value!r}")
    if key == "store.ipfs_api" and value != DEFAULTS["store"]["ipfs_api"]:
        # checked whatever the backend, as init saves it (the module costs ~0.2 s to import:
        # only for a value that is not the default)
        from merklog.store.ipfs import BadAPIAddress, api_multiaddr

        try:
            api_multiaddr(value)
        except BadAPIAddress as exc:
            raise ConfigError(f"{exc} ({where}: store.ipfs_api)") from None
    if key == "api.cors_origins":
        cors_origins(value, where)
    if key == "node.host" and not is_host(value):
        raise ConfigError(
            f"{where}: node.host {value!r} is not a host name or IP address (letters,"
            " digits, '-', '_' and '.' between labels; e.g. 127.0.0.1, ::1 or node.example)"
        )
    if key == "dataset.id" and value:
        from merklog.store import Error, Link

        try:
            Link.parse(value)
        except (ValueError, Error) as exc:
            raise ConfigError(f"{where}: dataset.id must be a dataset CID ({exc})") from None


_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def is_host(value: str) -> bool:
    """Whether ``value`` is, by its syntax alone (no DNS lookup), a host the node could
    bind: an IPv4 or IPv6 address, or a host name of dot-separated labels. ``init`` saved
    ``--host 'bad host'`` and ``node run`` then failed on it ("Name or service not
    known")."""
    import ipaddress

    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return True
    name = value.removesuffix(".")
    labels = name.split(".")
    if labels[-1].isdigit():  # 256.1.1.1, 1.2.3.4.5: no host name ends in a number (RFC 3696)
        return False
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(part) for part in labels)


def cors_origins(value: str, where: str = "the configuration") -> frozenset[str]:
    """The origins of ``api.cors_origins`` (``scheme://host[:port]`` each, space- or
    comma-separated), or ConfigError for anything else. A wildcard is refused: any page
    a user opened could then call the node with the token the user gave another page, and
    read everything ``api.anonymous_reads`` opens."""
    out = set()
    for origin in value.replace(",", " ").split():
        if origin == "*":
            raise ConfigError(
                f"{where}: api.cors_origins takes the origins of the app's pages"
                ' ("http://localhost:5173"), not "*"'
            )
        scheme, sep, rest = origin.partition("://")
        if rest.startswith("["):  # an IPv6 literal: [::1]:8080
            host, _, tail = rest.partition("]")
            host, port = host + "]", tail.removeprefix(":")
            if tail and not tail.startswith(":"):
                port = "x"  # refused below
        else:
            host, _, port = rest.partition(":")
        if (
            scheme not in ("http", "https")
            or not sep
            or not host
            or any(c in rest for c in "/?#@ ")
            or (port and not (port.isdigit() and 0 < int(port) < 65536))
        ):
            raise ConfigError(
                f"{where}: api.cors_origins: {origin!r} is not an origin: scheme, host and"
                ' optional port, no path or trailing slash ("https://app.example:8443")'
            )
        default = {"http": "80", "https": "443"}[scheme]  # a browser's Origin omits it
        out.add(f"{scheme}://{host}{':' + port if port and port != default else ''}".lower())
    return frozenset(out)


#: Variables named like a setting's ``MERKLOG_<SECTION>_<KEY>`` that are not settings:
#: ``MERKLOG_NODE_HELPER=0`` turns the node's body worker off (:mod:`.helperproc`).
_NOT_SETTINGS = frozenset({"MERKLOG_NODE_HELPER"})


def _refuse_unknown_env(env: Mapping[str, str]) -> None:
    """A ``MERKLOG_<SECTION>_<KEY>`` variable of a config section that names no option
    is refused as an unknown ``--set`` key is: a misspelt ``MERKLOG_NODE_PROT=8000`` was
    ignored, and the node started on the default port."""
    for var in sorted(env):
        for section, values in DEFAULTS.items():
            prefix = f"MERKLOG_{section.upper()}_"
            if var.upper().startswith(prefix) and var != var.upper():  # MERKLOG_NODE_port
                raise ConfigError(
                    f"{var}: merklog's environment variables are upper case ({var.upper()})"
                )
            if not var.startswith(prefix) or var in _NOT_SETTINGS:
                continue
            name = var[len(prefix) :].lower()
            if name not in values:
                options = ", ".join(f"{prefix}{key.upper()}" for key in values)
                raise ConfigError(
                    f"{var}: unknown option '{section}.{name}' (the {section} options: {options})"
                )


def _set(
    cfg: dict[str, dict[str, Any]], key: str, value: Any, where: str, as_text: bool = False
) -> None:
    """Set option ``key`` of ``cfg`` to ``value`` once checked (ConfigError naming
    ``where`` otherwise). ``as_text``: the value was given as text (the environment,
    ``--set``) and read as a TOML literal where it looks like one, so a text option takes
    it as text again (``--set node.program=2024.dl``); from config.toml or the Python
    API's settings, a text option given a number or a bool is refused (``token = 5``
    became the token "5")."""
    section, _, name = key.partition(".")
    if section == "peers":
        _check_peer(name, value, where)
        cfg.setdefault("peers", {})[name] = value
        return
    if section not in DEFAULTS or name not in DEFAULTS[section]:
        raise ConfigError(f"{where}: unknown option {key!r}")
    default = DEFAULTS[section][name]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):  # NaN passes every range check: no epoch ever came
            raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    elif isinstance(value, os.PathLike) and (section, name) in _PATHS:
        value = os.fspath(value)  # the Python API's settings may give a Path
    elif not isinstance(value, str):
        if not as_text:
            raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
        value = str(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        low, high = _RANGES.get(key, (0, None))
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{where}: {key} must be {bounds}, got {value!r}")
    _check_choice(key, value, where)
    cfg[section][name] = value


def _placed(exc: tomllib.TOMLDecodeError, text: str) -> str:
    """The TOML error with its place as ``(at line L, column C)`` always: tomllib says
    only "(at end of document)" for an error there (``port = [`` as the last line)."""
    said = str(exc)
    if said.endswith("(at end of document)"):
        lines = text.rstrip("\n").split("\n")  # the last line written, past its end
        said = said.removesuffix("(at end of document)") + (
            f"(at end of document, line {len(lines)}, column {len(lines[-1]) + 1})"
        )
    return said


class Config:
    """Resolved configuration of one home directory."""

    def __init__(self, home: Path | None, data: dict[str, dict[str, Any]]) -> None:
        #: None for a memory node: nothing is read from or written to disk.
        self.home = home
        self.data = data

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        home: Path | None,
        overrides: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        overrides_from: str = "command line",
    ) -> Config:
        """Defaults < config.toml < env ``MERKLOG_SECTION_KEY`` < ``overrides`` ("section.key").

        ``home=None`` (a memory node) reads no file. ``overrides_from`` names where the
        overrides came from in errors ("command line": ``--set``; "settings": the Python
        API's ``merklog.open(settings=...)``). Reading a home's file first makes
        it and its secrets and store owner-only (:func:`~.files.tighten_home`): ``merklog token`` or
        ``peers list`` open nothing else of the home."""
        cfg = copy.deepcopy(DEFAULTS)
        cfg["peers"] = {}
        path = home / CONFIG_FILE if home is not None else None
        if path is not None and path.exists():
            tighten_home(path.parent)
            text = read_config_text(path)
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: {_placed(exc, text)}") from exc
            for section, values in data.items():
                if not isinstance(values, dict):
                    raise ConfigError(f"{path}: [{section}] must be a table")
                for name, value in values.items():
                    _set(cfg, f"{section}.{name}", value, str(path))
        env = os.environ if env is None else env
        _refuse_unknown_env(env)
        for section, values in DEFAULTS.items():
            for name in values:
                key = f"{section}.{name}"
                var = env_var(key)
                if var in env:
                    _set(cfg, key, _given_value(key, env[var]), var, as_text=True)
                    _from_working_dir(cfg, key)
        for key, value in (overrides or {}).items():
            if value is not None:
                _set(cfg, key, value, overrides_from, as_text=overrides_from == "command line")
                _from_working_dir(cfg, key)
        return cls(home, cfg)

    def get(self, key: str) -> Any:
        section, _, name = key.partition(".")
        return self.data[section][name]

    def path(self, key: str) -> Path | None:
        """An option holding a path, resolved against the home directory ("" → None).
        A relative ``node.static_dir`` from the environment or an override is already
        absolute here (:func:`_from_working_dir`)."""
        value = self.get(key)
        if not value:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.home or Path.cwd()) / p

    @property
    def peers(self) -> dict[str, Any]:
        return self.data.setdefault("peers", {})

    # -- writing ---------------------------------------------------------------------------
    def save(self) -> None:
        """Write the file atomically (rename), so a crash never leaves half a config.
        It holds the API tokens: created owner-only (0600)."""
        if self.home is None:
            raise ConfigError("a memory node has no config file to save")
        write_private(self.home / CONFIG_FILE, render(self.data).encode())


def static_dir(config: Config, must_exist: bool = False) -> Path | None:
    """``node.static_dir`` as an absolute path (None if unset or not a folder), refused
    (ConfigError) if serving it would publish the home: it is the home, lies inside it,
    or holds the home or its store. Everything in the folder is served without a token
    (``/`` and ``/static/``), and the home holds both API tokens and the node key.
    ``must_exist`` (a node about to serve): a setting that names no folder is refused
    too; a typo in the path served the API's JSON at ``/`` without a word."""
    path = config.path("node.static_dir")
    if path is not None and must_exist and not path.is_dir():
        what = "a file" if path.exists() else "not there"
        raise ConfigError(
            f"node.static_dir {path} is {what}: give the folder that holds the app's index.html"
        )
    if path is None or not path.is_dir():
        return None
    return _not_publishing_the_home(config, path)


def check_static_dir(config: Config) -> None:
    """Refuse (ConfigError) a ``node.static_dir`` that would publish the home, whether
    or not it exists yet: ``init`` saved one that every ``node run`` then refused (that
    it exists is checked when a node starts to serve it, :func:`static_dir`)."""
    path = config.path("node.static_dir")
    if path is not None:
        _not_publishing_the_home(config, path)


def _not_publishing_the_home(config: Config, path: Path) -> Path:
    """``path`` resolved, or ConfigError if it is, lies in or holds the home or store."""
    root = path.resolve()
    secrets_at = [("the home", config.home)] if config.home is not None else []
    store = config.path("store.path") if config.get("store.backend") == "sqlite" else None
    if store is not None and config.home is not None:
        secrets_at.append(("the store", store))
    for what, where in secrets_at:
        where = where.resolve()
        if root == where or root in where.parents or where in root.parents:
            raise ConfigError(
                f"node.static_dir {path} would publish {what} ({where}): everything in it is"
                " served without a token; give a folder that holds only the app's files"
            )
    return root


#: The API tokens of a home, each named as the file and ``--set`` name it.
TOKENS = ("api.token", "api.read_token")


def env_var(key: str) -> str:
    """The environment variable of option ``key``: ``MERKLOG_SECTION_NAME``."""
    section, _, name = key.partition(".")
    return f"MERKLOG_{section.upper()}_{name.upper()}"


def generated_tokens(env: Mapping[str, str] | None = None) -> list[str]:
    """The tokens an init generates when they are empty: those the environment does not
    set. An empty ``MERKLOG_API_TOKEN=`` outlives the init and empties the token for
    every later command, so it is refused before anything is made (a first
    ``merklog.open`` made the whole home, then refused to open it)."""
    env = os.environ if env is None else env
    return [key for key in TOKENS if env_var(key) not in env]


def check_tokens(config: Config, generated: Collection[str] = ()) -> None:
    """ConfigError naming the option unless a home's API tokens can be used: neither is
    empty (nobody could authenticate: ``merklog token`` printed an empty line), neither
    has spaces around it (a bearer token is sent without them, so it never matched),
    and ``api.read_token`` is not ``api.token`` (the read token would grant writes).
    Any other length is the user's choice (``init`` makes 32 random characters).
    ``generated``: the tokens about to be generated if empty (by ``init``, or the first
    ``merklog.open`` of a home, for those its settings do not give)."""
    for key in TOKENS:
        value = config.get(key)
        if not value.strip() and not (key in generated and not value):
            var = env_var(key)
            if var in os.environ and not os.environ[var].strip():  # init cannot mend it
                raise ConfigError(
                    f"{var} is set and empty, so {key} is empty and no client could"
                    f" authenticate: unset {var}, or set it to a token"
                )
            raise ConfigError(
                f"{key} is empty, so no client could authenticate: set one, or run"
                " `merklog init`, which generates one in place of an empty one"
            )
        if value != value.strip():
            raise ConfigError(
                f"{key} begins or ends with a space, which no Authorization header carries:"
                " remove it"
            )
    if config.get("api.token") and config.get("api.token") == config.get("api.read_token"):
        raise ConfigError(
            "api.read_token is the same as api.token, so the read token would grant writes:"
            " give them different values"
        )


def render(data: dict[str, dict[str, Any]]) -> str:
    """The TOML text of a config, with a comment per section."""
    head = (
        "# merklog node configuration. Every option can also be set with an environment\n"
        "# variable MERKLOG_<SECTION>_<KEY> or on the command line (--set section.key=value).\n"
    )
    return head + tomli_w.dumps({k: v for k, v in data.items() if v or k != "peers"})


def parse_set(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("node.port=8000",)`` → ``{"node.port": 8000}``; ConfigError if malformed.
    Spaces around a value are dropped, but not around a token's (:func:`_given_value`):
    they are part of it, and refused as they are from the environment."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set expects section.key=value, got {pair!r}")
        key = key.strip()
        out[key] = _given_value(key, value if key in TOKENS else value.strip())
    return out


def new_token() -> str:
    """A fresh random API token."""
    return secrets.token_urlsafe(24)
