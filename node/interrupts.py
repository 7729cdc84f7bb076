"""Whether this process is handling a Ctrl-C (SIGINT), for what follows it to be told apart.

A Spark command interrupted mid-job does not just raise KeyboardInterrupt: pyspark's own
SIGINT handler asks the JVM to cancel the jobs over the gateway connection the
interrupted call is still reading, so py4j logs "Exception while sending command." with
a traceback (through the root logger) and raises Py4JNetworkError or Py4JError, which
may reach the CLI's boundary instead of the KeyboardInterrupt. Once :func:`mark` has
been called, the boundary reports any failure as the interrupt (one line, exit 1) and
the log filter (:func:`merklog.node.logs.interrupted`) drops py4j's records.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_pending = threading.Event()


def mark() -> None:
    """Record that a Ctrl-C is being handled (by the SIGINT handler or the boundary)."""
    _pending.set()


def pending() -> bool:
    """Whether a Ctrl-C has been received since the last :func:`reset`."""
    return _pending.is_set()


def reset() -> None:
    """Forget an earlier Ctrl-C (each CLI invocation starts without one: tests run many
    in one process)."""
    _pending.clear()
    _driver_ended.clear()


_driver_ended = threading.Event()


def mark_driver_ended() -> None:
    """Record that a failed command ended its Spark driver JVM on purpose
    (:func:`merklog.node.spark.session.stop_driver`): what py4j then logs about the
    closed gateway (its objects let go at exit) is dropped as after a Ctrl-C."""
    _driver_ended.set()


def driver_ended() -> bool:
    """Whether :func:`mark_driver_ended` was called since the last :func:`reset`."""
    return _driver_ended.is_set()


def mark_on_sigint() -> None:
    """Wrap this process's SIGINT handler (pyspark's, once a SparkContext exists) so that
    a Ctrl-C is marked before that handler runs: whatever it logs or raises while the
    gateway is torn down is then known to follow the interrupt. Only from the main
    thread (where signal handlers live); a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "_merklog_marks", False):
        return

    def handler(signum: int, frame: Any) -> None:
        mark()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    handler._merklog_marks = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, handler)
