"""Shutdown bench: how long a real ``merklog node run`` on a large home takes to exit
after SIGTERM, with and without a live-query subscriber (issue #11: "shutdown takes
≤ 2 s with subscribers").

Builds a throwaway home of --facts facts once (``merklog put -f``), then for each run
starts the node, waits until it is healthy, optionally opens ``GET /v1/subscribe`` and
reads its first event, sends SIGTERM and measures until the process is gone: wall time
and the CPU time the process spent after the signal (``/proc/PID/stat`` before, the
exit rusage after). Prints medians and the load average beside them.

    .venv/bin/python bench/shutdown.py --facts 200000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

from _node import start_node

CLI = [sys.executable, "-m", "merklog.node.cli"]


def build_home(home: Path, facts: int) -> None:
    subprocess.run([*CLI, "--home", str(home), "init"], check=True, stdout=subprocess.DEVNULL)
    source = home.parent / "facts.dl"
    with open(source, "w") as out:
        for i in range(facts):
            out.write(f'f({i}, "{i}", {i}.5, true).\n')
    subprocess.run(
        [*CLI, "--home", str(home), "put", "-f", str(source)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(home: Path, subscribe: bool) -> tuple[float, float]:
    """(wall seconds from SIGTERM to exit, CPU seconds the process spent in that time)."""
    proc, url = start_node(CLI, home)
    token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]
    if subscribe:
        req = urllib.request.Request(
            url + "/v1/subscribe?q=f(1,%20X,%20Y,%20Z)",
            headers={"Authorization": f"Bearer {token}"},
        )
        stream = urllib.request.urlopen(req, timeout=120)
        stream.readline()  # the first event has arrived: the subscription is live
        threading.Thread(target=lambda: stream.read(), daemon=True).start()
    before = _cpu_seconds(proc.pid)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _pid, _status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = 0
    return wall, usage.ru_utime + usage.ru_stime - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        build_home(home, args.facts)
        for subscribe in (False, True):
            results = [one_run(home, subscribe) for _ in range(args.runs)]
            wall = statistics.median(w for w, _c in results)
            cpu = statistics.median(c for _w, c in results)
            label = "with a subscriber" if subscribe else "no subscriber    "
            load = os.getloadavg()[0]
            print(
                f"{args.facts} facts, {label}: SIGTERM -> exit {wall:.2f} s wall,"
                f" {cpu:.2f} s CPU (median of {args.runs}; load {load:.1f})"
            )


if __name__ == "__main__":
    main()
