"""Ingest benchmark: facts/s for encode+CID and for durable SQLite ingest, side by side.

    python bench/ingest.py            # 1M facts
    python bench/ingest.py --n 100000 # scaled down
    python bench/ingest.py --n 100000 --user-n 20000 --ipfs-api /ip4/127.0.0.1/tcp/5001/http

Measures in one run, on the same generated facts:
- reference encode+CID (dag-cbor + multiformats; on a sample, it is slow),
- fast encode+CID (libipld + hashlib, what the stores use),
- raw sha2-256 of the same block bytes (the upper limit of any encode+CID),
- durable ingest into SQLiteBlockStore (WAL, synchronous=FULL) in batch transactions,
- the user paths, each a whole process: ``merklog put -f FILE`` on a stopped home, the
  same command while ``merklog node run`` serves that home (chunks of Datalog text over
  its HTTP API), and ``POST /v1/facts`` with Datalog text bodies and with JSON fact
  bodies of 20,000 facts, each on a fresh running node, sent one at a time (an app
  posting as it goes) and three in flight (a bulk loader, as ``merklog put`` sends)
  (the CPU column of every running-node path adds the node's own CPU, read with psutil
  from its pid before and after),
- ``merklog put -f FILE`` on a stopped home whose blocks live on a js-ipfs daemon on
  loopback (``--ipfs-api``, else a private daemon from tests/ipfs; ``--no-ipfs`` skips
  it), beside that daemon's own floor: one raw ``dag/import`` of as many fact blocks of
  the same shape, no merklog, no pins (goal for the IPFS home: ≥ 5,000 facts/s),
- peers on the same facts: DuckDB loading the same rows into a table file, and the
  Python floor (reading the file and splitting lines, nothing else),
and prints each rate with its ratio to the others. Goals: ≥200k facts/s encode+CID,
≥100k facts/s durable ingest and on both user paths.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from merklog.node.commands.put import PUT_IN_FLIGHT  # noqa: E402
from merklog.store import Link, fact_block, fact_block_reference, make_fact  # noqa: E402
from merklog.store.codec import encode_facts  # noqa: E402
from merklog.store.sqlite import SQLiteBlockStore  # noqa: E402


def generate(n: int, start: int = 0) -> list:
    """Facts shaped like typical app data: a few relations, ints, strings, floats, bools."""
    facts = []
    for i in range(start, start + n):
        kind = i % 4
        if kind == 0:
            facts.append(make_fact("edge", [i, i + 1]))
        elif kind == 1:
            facts.append(make_fact("name", [i, f"user-{i}"]))
        elif kind == 2:
            facts.append(make_fact("score", [i, i * 0.25, i % 7 == 0]))
        else:
            facts.append(make_fact("event", [i, "click", f"/page/{i % 1000}", 1_700_000_000 + i]))
    return facts


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


class Timer:
    """Wall-clock and CPU seconds of a block (the machine may be shared: both matter).

    CPU is this process's, its finished children's (user paths run as subprocesses)
    and, with ``server`` (a running node's pid), that server's own CPU over the block:
    a write through a running node costs CPU in the node too, and leaving it out made
    the running-node CPU column meaningless."""

    def __init__(self, server: int | None = None) -> None:
        self.server = server
        self.server_cpu = 0.0

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def _server_cpu(self) -> float:
        if self.server is None:
            return 0.0
        import psutil

        t = psutil.Process(self.server).cpu_times()
        return t.user + t.system

    def __enter__(self) -> Timer:
        self.server_cpu = self._server_cpu()
        self.wall = time.perf_counter()
        self.cpu = self._cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = self._cpu() - self.cpu
        self.server_cpu = self._server_cpu() - self.server_cpu
        self.cpu += self.server_cpu


def bench_reference(facts: list) -> Timer:
    with Timer() as t:
        for fact in facts:
            Link.for_dag_cbor(fact_block_reference(fact))
    return t


def bench_fast(facts: list) -> Timer:
    with Timer() as t:
        encode_facts(facts)
    return t


def bench_sha256(blocks: list[bytes]) -> Timer:
    sha256 = hashlib.sha256
    with Timer() as t:
        for data in blocks:
            sha256(data).digest()
    return t


def bench_sqlite(facts: list, batch: int, directory: str) -> tuple[Timer, int]:
    store = SQLiteBlockStore(os.path.join(directory, "ingest.sqlite"))
    with Timer() as t:
        for i in range(0, len(facts), batch):
            store.put_facts(facts[i : i + batch])
    stored = store.count_facts()
    store.close()
    return t, stored


MERKLOG = [sys.executable, "-m", "merklog.node.cli"]


def write_datalog(facts: list, path: Path) -> None:
    with open(path, "w") as out:
        for fact in facts:
            out.write(f"{fact}.\n")


def bench_put_file(home: Path, path: Path, server: int | None = None) -> Timer:
    """``merklog put -f FILE``: the whole process, as a user runs it (plus the CPU of the
    node serving ``home``, if ``server`` is its pid)."""
    import subprocess

    with Timer(server) as t:
        subprocess.run(
            [*MERKLOG, "--home", str(home), "put", "-f", str(path)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return t


def start_node(home: Path) -> tuple[object, str]:
    from _node import start_node as start

    return start(MERKLOG, home)


def _poster(url: str, token: str):
    """``post(body) -> facts the node says it asserted`` (-1 on an HTTP error). A bulk
    writer has its facts: it asks for their CIDs alone (``?answer=cids``, ADR 0082)."""
    import json
    import urllib.error
    import urllib.request

    def post(body: dict) -> int:
        """How many facts the node says it asserted (-1 on an HTTP error)."""
        req = urllib.request.Request(
            url + "/v1/facts?answer=cids", data=json.dumps(body).encode(), method="POST"
        )
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return len(json.loads(resp.read()).get("asserted") or [])
        except urllib.error.HTTPError:
            return -1

    return post


def _post_chunks(post, facts: list, body, chunk: int, in_flight: int) -> None:
    """Post ``facts`` in bodies of ``chunk`` facts (``body(part)``), ``in_flight`` requests
    at a time (1: each sent once the one before was answered); raise unless the node
    says it asserted every fact of every body."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        part = facts[i : i + chunk]
        if post(body(part)) != len(part):
            raise RuntimeError("write failed")

    starts = range(0, len(facts), chunk)
    if in_flight == 1:
        for i in starts:
            one(i)
        return
    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(one, starts))


def bench_json_api(
    url: str, token: str, facts: list, server: int, chunk: int = 20_000, in_flight: int = 1
) -> Timer | None:
    """``POST /v1/facts`` with JSON fact bodies (``{"assert": [{"rel", "args"}]}``), if the
    node has them, ``in_flight`` requests at a time; CPU counts this client and the node
    (``server``)."""
    post = _poster(url, token)

    def plain(v: object) -> object:
        return v if not isinstance(v, bytes | Link) else None

    if any(plain(v) is None for f in facts[:100] for v in f.args):
        return None
    probe = {"assert": [{"rel": "probe", "args": [1]}]}
    if post(probe) != 1:  # this node has no JSON fact form (yet)
        return None
    with Timer(server) as t:
        _post_chunks(
            post,
            facts,
            lambda part: {"assert": [{"rel": f.rel, "args": list(f.args)} for f in part]},
            chunk,
            in_flight,
        )
    return t


def bench_datalog_api(
    url: str, token: str, facts: list, server: int, chunk: int = 20_000, in_flight: int = 1
) -> Timer:
    """``POST /v1/facts`` with Datalog text bodies (``{"assert": "edge(1, 2).\\n…"}``), the
    form ``merklog put`` sends, ``in_flight`` requests at a time; CPU counts this client
    and the node (``server``)."""
    post = _poster(url, token)
    with Timer(server) as t:
        _post_chunks(
            post, facts, lambda part: {"assert": "".join(f"{f}.\n" for f in part)}, chunk, in_flight
        )
    return t


def bench_duckdb(path: Path, directory: str) -> Timer | None:
    """DuckDB loading the same facts (one row per line: relation, arguments text) into a
    table file: a durable columnar insert of the same input, for scale."""
    try:
        import duckdb
    except ImportError:
        return None
    with Timer() as t:
        con = duckdb.connect(os.path.join(directory, "peer.duckdb"))
        con.execute(
            "CREATE TABLE facts AS SELECT split_part(line, '(', 1) AS rel, line AS fact"
            f" FROM read_csv('{path}', columns={{'line': 'VARCHAR'}}, header=false,"
            " delim=E'\\x01', quote='', escape='')"
        )
        con.execute("CHECKPOINT")
        con.close()
    return t


def bench_floor(path: Path) -> Timer:
    """The Python floor: read the file and split it into lines, nothing more."""
    with Timer() as t:
        with open(path) as f:
            sum(1 for _ in f)
    return t


def bench_dag_import_floor(n: int, api: str) -> Timer:
    """The daemon alone: one ``dag/import`` (no pins) of ``n`` fact blocks shaped like the
    benchmark's but with other values (so the daemon has none of them yet)."""
    from merklog.store.ipfs import IPFSBlockStore

    blocks = encode_facts(generate(n, start=10**7))
    store = IPFSBlockStore(api, timeout=600, pin=False)
    try:
        with Timer() as t:
            store.import_blocks(blocks)
    finally:
        store.close()
    return t


def ipfs_paths(facts: list, path: Path, directory: str, api_arg: str | None) -> list:
    """``merklog put -f FILE`` into a stopped IPFS home, and the daemon's floor."""
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ipfs import ipfs_api

    with ipfs_api(api_arg) as api:
        floor = bench_dag_import_floor(len(facts), api)
        home = Path(directory) / "ipfs"
        subprocess.run(
            [*MERKLOG, "--home", str(home), "init", "--store", "ipfs", "--ipfs-api", api],
            check=True,
            capture_output=True,
        )
        put = bench_put_file(home, path)
    return [
        ("merklog put -f FILE, stopped IPFS home", len(facts), put),
        ("js-ipfs floor: raw dag/import, no pins", len(facts), floor),
    ]


def user_paths(
    facts: list, directory: str, ipfs: bool = False, ipfs_api: str | None = None
) -> list[tuple[str, int, Timer]]:
    """Rates of the paths users take, each a whole process, plus peers on the same file."""
    import subprocess
    import tomllib

    rows: list[tuple[str, int, Timer]] = []
    path = Path(directory) / "facts.dl"
    write_datalog(facts, path)
    rows.append(("Python floor: read + split lines", len(facts), bench_floor(path)))
    peer = bench_duckdb(path, directory)
    if peer is not None:
        rows.append(("DuckDB: load the same lines into a table file", len(facts), peer))
    stopped = Path(directory) / "stopped"
    subprocess.run([*MERKLOG, "--home", str(stopped), "init"], check=True, capture_output=True)
    rows.append(("merklog put -f FILE, stopped home", len(facts), bench_put_file(stopped, path)))
    if ipfs:
        rows.extend(ipfs_paths(facts, path, directory, ipfs_api))
    running = Path(directory) / "running"
    subprocess.run([*MERKLOG, "--home", str(running), "init"], check=True, capture_output=True)
    token = tomllib.loads((running / "config.toml").read_text())["api"]["token"]
    proc, url = start_node(running)
    pid = proc.pid  # type: ignore[attr-defined]
    try:
        put = bench_put_file(running, path, pid)
        rows.append(("merklog put -f FILE, running node (HTTP)", len(facts), put))
    finally:
        proc.terminate()  # type: ignore[attr-defined]
        proc.wait()  # type: ignore[attr-defined]
    # Each HTTP body form on a fresh node: the same facts again would be no-ops. One
    # request at a time (an app posting as it goes: each body waits for the answer to the
    # one before, so every write's commit and epoch are on the clock), then three in
    # flight (a bulk loader, as `merklog put` sends: concurrent writes share a commit).
    for form, bench in (("Datalog", bench_datalog_api), ("JSON", bench_json_api)):
        for in_flight in (1, PUT_IN_FLIGHT):
            ahead = "one at a time" if in_flight == 1 else f"{in_flight} in flight"
            name = f"POST /v1/facts {form} bodies, {ahead}"
            home = Path(directory) / f"{form.lower()}-{in_flight}"
            cmd = [*MERKLOG, "--home", str(home), "init"]
            subprocess.run(cmd, check=True, capture_output=True)
            token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]
            proc, url = start_node(home)
            try:
                timer = bench(url, token, facts, proc.pid, in_flight=in_flight)  # type: ignore[attr-defined]
            finally:
                proc.terminate()  # type: ignore[attr-defined]
                proc.wait()  # type: ignore[attr-defined]
            if timer is not None:
                rows.append((name, len(facts), timer))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="facts to ingest (default 1M)")
    parser.add_argument(
        "--batch",
        type=int,
        default=200_000,
        help="facts per SQLite transaction (fewer, larger commits rewrite fewer B-tree pages)",
    )
    parser.add_argument(
        "--reference-sample", type=int, default=50_000, help="facts for the slow reference codec"
    )
    parser.add_argument("--dir", default=None, help="directory for the SQLite file (default tmp)")
    parser.add_argument(
        "--user-n", type=int, default=None, help="facts for the user paths (default --n)"
    )
    parser.add_argument("--no-user", action="store_true", help="skip the whole-process paths")
    parser.add_argument("--no-ipfs", action="store_true", help="skip the IPFS home")
    parser.add_argument("--ipfs-api", default=None, help="IPFS daemon API (default: start one)")
    args = parser.parse_args(argv)
    from _bytecode import compile_merklog  # beside this script, first on sys.path

    compile_merklog()  # each timed process reads bytecode, as an installed merklog does

    print(f"generating {args.n:,} facts …", flush=True)
    facts = generate(args.n)
    sample = facts[: min(args.n, args.reference_sample)]
    blocks = [fact_block(f) for f in facts]
    mean_size = sum(map(len, blocks)) / len(blocks)
    print(f"mean block size {mean_size:.1f} bytes", flush=True)

    # The generated input is long-lived: keep the cyclic GC from re-walking it in every run.
    gc.collect()
    gc.freeze()
    reference = bench_reference(sample)
    fast = bench_fast(facts)
    sha = bench_sha256(blocks)
    del blocks
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="merklog-bench-") as tmp:
        durable, stored = bench_sqlite(facts, args.batch, tmp)
    user: list[tuple[str, int, Timer]] = []
    if not args.no_user:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="merklog-bench-") as tmp:
            user = user_paths(
                facts[: args.user_n or len(facts)], tmp, not args.no_ipfs, args.ipfs_api
            )
    if stored != len(set(facts)):
        print(f"error: stored {stored} facts, expected {len(set(facts))}", file=sys.stderr)
        return 1

    rows = [
        (f"encode+CID reference (dag-cbor, {len(sample):,} facts)", len(sample), reference),
        ("encode+CID fast (libipld + hashlib)", len(facts), fast),
        ("raw sha2-256 of the same bytes (limit)", len(facts), sha),
        (f"durable SQLite ingest, batches of {args.batch:,}", len(facts), durable),
        *user,
    ]
    fast_rate = rate(len(facts), fast.wall)
    sha_rate = rate(len(facts), sha.wall)
    print()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"{'measure':<50} {'facts/s wall':>13} {'facts/s CPU':>12} {'÷ fast':>7} {'÷ sha256':>9}"
        f" {'wall s':>7} {'CPU s':>7} {'node CPU s':>10}"
    )
    for name, count, t in rows:
        wall = rate(count, t.wall)
        print(
            f"{name:<50} {wall:>13,.0f} {rate(count, t.cpu):>12,.0f} "
            f"{wall / fast_rate:>7.2f} {wall / sha_rate:>9.3f}"
            f" {t.wall:>7.2f} {t.cpu:>7.2f} {t.server_cpu if t.server else 0.0:>10.2f}"
        )
    durable_rate = rate(len(facts), durable.wall)
    print()
    print(f"fast / reference encode+CID: {fast_rate / rate(len(sample), reference.wall):.1f}x")
    print(f"durable ingest / fast encode+CID: {durable_rate / fast_rate:.2f}")
    for name, count, t in user:
        print(f"{name} / durable store ingest: {rate(count, t.wall) / durable_rate:.3f}")
    by_name = {name: rate(count, t.wall) for name, count, t in user}
    if "merklog put -f FILE, stopped IPFS home" in by_name:
        ipfs_rate = by_name["merklog put -f FILE, stopped IPFS home"]
        print(
            f"IPFS home / SQLite home: {ipfs_rate / by_name['merklog put -f FILE, stopped home']:.3f};"
            f" IPFS home / js-ipfs floor: {ipfs_rate / by_name['js-ipfs floor: raw dag/import, no pins']:.2f}"
        )
    goals = [
        ("encode+CID >= 200k/s", fast_rate >= 200_000),
        ("durable ingest >= 100k/s", durable_rate >= 100_000),
        *(
            (f"{name} >= 100k/s", rate(count, t.wall) >= 100_000)
            for name, count, t in user
            if name.startswith(("merklog", "POST")) and "IPFS" not in name
        ),
        *(
            (f"{name} >= 5k/s", rate(count, t.wall) >= 5_000)
            for name, count, t in user
            if "IPFS home" in name
        ),
    ]
    print(
        "goals (wall clock): " + ", ".join(f"{g}: {'met' if ok else 'NOT met'}" for g, ok in goals)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
