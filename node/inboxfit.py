"""Which received ``@async`` messages an epoch takes: those that fit the program.

A message is a tuple another node derived; it enters an epoch as an event, as a local
write enters as a fact. A local ``put`` of a fact that does not fit the loaded
program's ``.decl`` declarations is refused, so a message that does not fit is not
used either: the epoch marks it refused in the inbox (it is not offered again), logs
a warning naming it and counts it as ``merklog_async_messages_total{event="refused"}``.
A relation the program does not declare takes any message, as it takes any ``put``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from merklog.replication.messages import Message

log = logging.getLogger("merklog.node.node")


def split_fitting(engine: Any, messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """``(used, refused)``: the messages that fit the ``.decl`` declarations of the
    program ``engine`` runs, and those that do not (each refused one logged, at most a
    few lines per epoch)."""
    schema = engine.checked.schema
    if not schema or not messages:
        return list(messages), []
    used: list[Message] = []
    refused: list[Message] = []
    for msg in messages:
        why = schema.problem(msg.fact.rel, msg.fact.args)
        if why is None:
            used.append(msg)
            continue
        refused.append(msg)
        if len(refused) <= 3:
            log.warning(
                "@async message %s from %s… refused, not used: it does not fit: %s",
                msg.fact,
                msg.sender.hex()[:16],
                why,
            )
    if len(refused) > 3:
        log.warning("%d more @async messages refused this epoch", len(refused) - 3)
    return used, refused
