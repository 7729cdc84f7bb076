"""Log output of the CLI and the node: readable text, or one JSON object per line.

``merklog --log-format json`` (or ``MERKLOG_LOG_FORMAT=json``) writes each record
as a JSON line — ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``msg`` and, for
errors, ``exc`` (the formatted exception as one string) — so a log shipper can
parse every line; the default is one human line per record. A record logged with
``extra={FIELDS: {...}}`` (:func:`fields`) also carries those keys at the top level of
its JSON object (numbers stay numbers), so a shipper need not parse ``msg``; the text
format shows ``msg`` alone, which says the same in words.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

LEVELS = {0: logging.WARNING, 1: logging.INFO}
#: The record attribute holding a record's structured fields (see :func:`fields`).
FIELDS = "merklog_fields"
#: Keys a record's fields may not take: the JSON line's own.
_RESERVED = frozenset({"ts", "level", "logger", "msg", "exc"})


def fields(**values: object) -> dict[str, dict[str, object]]:
    """``extra=`` for a log call whose JSON line carries ``values`` as top-level keys
    (``log.info("synced …", extra=fields(peer=url, seconds=1.5))``)."""
    return {FIELDS: values}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; multi-line parts (tracebacks) stay inside strings."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, FIELDS, None)
        if isinstance(extra, dict):
            out.update((k, v) for k, v in extra.items() if k not in _RESERVED)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def announce(message: str, fmt: str = "text") -> None:
    """A line the operator always sees (listening URL, stopped), whatever the log level:
    plain text, or in JSON mode a JSON line like every log record."""
    if fmt == "json":
        record = logging.LogRecord("merklog.node", logging.INFO, "", 0, message, None, None)
        line = JsonFormatter().format(record)
    else:
        line = message
    print(line, file=sys.stderr, flush=True)


def interrupted(record: logging.LogRecord) -> bool:
    """Whether ``record`` reports an exception caused by Ctrl-C (a KeyboardInterrupt in
    its chain), as py4j logs, with a traceback, for the command it was sending when a
    Spark command is interrupted. The command's one error line says it was interrupted.

    While a Ctrl-C is being handled (:func:`merklog.node.interrupts.pending`), so are
    py4j's records (its ``py4j`` loggers, and the root logger it logs "Exception while
    sending command." to) and any record with a traceback: their chain holds no
    KeyboardInterrupt when pyspark's SIGINT handler meets the gateway mid-call. The same
    once a failed command ended its driver JVM (:func:`~.interrupts.driver_ended`)."""
    from .interrupts import driver_ended, pending

    if (pending() or driver_ended()) and (
        record.exc_info is not None
        or record.name == "root"
        or record.name == "py4j"
        or record.name.startswith("py4j.")
    ):
        return True
    exc = record.exc_info[1] if record.exc_info else None
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def json_logging() -> bool:
    """Whether the CLI's log handler writes JSON lines (``--log-format json``)."""
    return any(
        handler.get_name() == "merklog" and isinstance(handler.formatter, JsonFormatter)
        for handler in logging.getLogger().handlers
    )


def setup_logging(verbose: int, fmt: str = "text") -> None:
    """Log to stderr at WARNING (``-v`` INFO, ``-vv`` DEBUG) as text or JSON lines;
    below ``-vv``, without the tracebacks a Ctrl-C makes libraries log (:func:`interrupted`)."""
    handler = logging.StreamHandler(sys.stderr)
    if verbose < 2:
        handler.addFilter(lambda record: not interrupted(record))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.set_name("merklog")
    root = logging.getLogger()
    for old in list(root.handlers):  # ours from an earlier call only (tests call the CLI often)
        if old.get_name() == "merklog":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(verbose, logging.DEBUG))
