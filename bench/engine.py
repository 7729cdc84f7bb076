"""Engine benchmark: ``merklog eval`` vs DuckDB vs a plain-Python floor, as users run them.

    python bench/engine.py                 # every standard workload
    python bench/engine.py --only tc_chain --scale 0.5
    python bench/engine.py --node          # also: the node path over 1M stored facts

Workloads (generated deterministically, seed 42):
- tc_chain:   transitive closure of a chain of 2,000 nodes (~2M paths, 2,000 iterations)
- tc_random:  transitive closure of a random graph, n=2,000, m=4,000
- same_gen:   same-generation over a complete binary tree of depth 10 (2,047 nodes)
- negation:   nodes unreachable from node 0 in a random graph of 1M nodes, 1.5M edges
- aggregate:  count and sum per group over 1M facts in 1,000 groups

**Whole process (the primary table).** The inputs are written once as TSV fact
files (``<rel>.facts``); then each engine runs as a fresh process, as a user
runs it, reading those files and writing its result as a tab-separated file:
``merklog eval PROG --facts DIR --out DIR --output REL``; a Python process
running DuckDB (``SET threads=1``) that reads the same TSVs with ``read_csv`` and
writes with ``COPY ... TO``; and ``bench/floor.py``, a plain-Python semi-naive
loop. Wall time and CPU time (user+sys) cover the whole process (start-up,
imports, reading, evaluation, writing); peak RSS is the process's ``ru_maxrss``.
Best of ``--repeat`` runs, the engines taking turns within each repetition (so
a change of the machine's load falls on all of them alike). The result files are
read back and compared as (row count, order-independent checksum); the run fails
loudly on a mismatch.
Goals: merklog <= 1.0x DuckDB's wall time (milestone <= 1.5x), peak RSS <= 2x.

**In memory (secondary).** Each engine in its own process with the data
already in memory (numpy arrays, DuckDB tables, Python tuple lists) times only
the evaluation: the engine core without I/O or start-up.

**Typed output (``--typed``).** The five workloads are integers only; this one
writes strings and floats, sorted: ``label(Id, Name, Score)`` with 200k rows
(``--scale``) of random names and scores (a tenth of them whole floats such as
``3.0``), and ``hi(N, S) :- label(_, N, S), S > 500.0.`` written with
``merklog eval --sorted`` (strings in code point order, then by score), beside DuckDB
(``SELECT DISTINCT ... ORDER BY``, its default binary collation, 1 thread) and a plain-Python
script (read, filter, set, sort, write), each a fresh process, best of ``--repeat``.
Results are compared as (name, float score) rows in file order, so both the order and
that every float reads back as the same float are checked.

**Start-up (``--startup N``).** ``merklog eval`` of a one-fact program beside DuckDB
reading and writing the same one-row TSV, a ``python -c`` importing numpy (with one
BLAS thread, as eval does) and ``pyarrow.csv`` (the imports eval cannot avoid) and
``python -c pass``, each a fresh process, the
four interleaved ``N`` times; median CPU (user+sys from ``getrusage``, microsecond
resolution) and wall. This is the fixed cost every workload above pays.

**Node path (``--node``).** A home holding the aggregate workload's 1M
``sale`` facts (written once, untimed): ``merklog load`` of the program (a fresh
process: open the store, evaluate) and the first ``merklog query``, beside
``merklog eval`` over the same facts as TSV files; then ``merklog node run`` on
that home and the same two commands reaching it over HTTP (client wall time,
server CPU time read from /proc). ``--node-only`` skips the other workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout too

ENGINES = ("merklog", "duckdb", "python")

# ----------------------------------------------------------------------------- workloads

TC = """
path(X, Y) :- edge(X, Y).
path(X, Y) :- path(X, Z), edge(Z, Y).
"""
TC_SQL = """
CREATE TABLE result AS
WITH RECURSIVE path(x, y) AS (
    SELECT x, y FROM edge
    UNION
    SELECT path.x, edge.y FROM path JOIN edge ON path.y = edge.x
) SELECT x, y FROM path
"""

SG = """
sg(X, Y) :- parent(X, P), parent(Y, P), X != Y.
sg(X, Y) :- parent(X, A), sg(A, B), parent(Y, B).
"""
SG_SQL = """
CREATE TABLE result AS
WITH RECURSIVE sg(x, y) AS (
    SELECT a.c, b.c FROM parent a JOIN parent b ON a.p = b.p WHERE a.c <> b.c
    UNION
    SELECT a.c, b.c FROM parent a JOIN sg ON a.p = sg.x JOIN parent b ON b.p = sg.y
) SELECT x, y FROM sg
"""

NEG = """
reach(X) :- source(X).
reach(Y) :- reach(X), edge(X, Y).
unreachable(X) :- node(X), !reach(X).
"""
NEG_SQL = """
CREATE TABLE result AS
WITH RECURSIVE reach(x) AS (
    SELECT x FROM source
    UNION
    SELECT edge.y FROM reach JOIN edge ON reach.x = edge.x
) SELECT x FROM node WHERE x NOT IN (SELECT x FROM reach)
"""

AGG = """
stats(G, C, S) :- grp(G), C := count : sale(_, G, _), S := sum A : sale(_, G, A).
"""
AGG_SQL = """
CREATE TABLE result AS
SELECT grp.g, count(sale.id), coalesce(sum(sale.a), 0)
FROM grp LEFT JOIN sale ON sale.g = grp.g GROUP BY grp.g
"""

WORKLOADS = {
    "tc_chain": (TC, TC_SQL, "path"),
    "tc_random": (TC, TC_SQL, "path"),
    "same_gen": (SG, SG_SQL, "sg"),
    "negation": (NEG, NEG_SQL, "unreachable"),
    "aggregate": (AGG, AGG_SQL, "stats"),
}

COLUMNS = {
    "edge": ("x", "y"),
    "parent": ("c", "p"),
    "source": ("x",),
    "node": ("x",),
    "grp": ("g",),
    "sale": ("id", "g", "a"),
}


def generate(name: str, scale: float) -> dict[str, np.ndarray]:
    """The input relations of a workload as 2-D int64 arrays."""
    rng = np.random.default_rng(42)
    if name == "tc_chain":
        n = int(2000 * scale)
        return {"edge": np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)}
    if name == "tc_random":
        n, m = int(2000 * scale), int(4000 * scale)
        edges = np.unique(rng.integers(0, n, size=(m, 2)), axis=0)
        return {"edge": edges}
    if name == "same_gen":
        depth = 10
        nodes = np.arange(1, 2 ** (depth + 1) - 1)  # every non-root node of a heap-numbered tree
        return {"parent": np.stack([nodes, (nodes - 1) // 2], axis=1)}
    if name == "negation":
        n, m = int(1_000_000 * scale), int(1_500_000 * scale)
        edges = np.unique(rng.integers(0, n, size=(m, 2)), axis=0)
        return {
            "edge": edges,
            "node": np.arange(n).reshape(-1, 1),
            "source": np.array([[0]]),
        }
    if name == "aggregate":
        n, groups = int(1_000_000 * scale), 1000
        ids = np.arange(n)
        return {
            "sale": np.stack(
                [ids, rng.integers(0, groups, size=n), rng.integers(1, 1000, size=n)], axis=1
            ),
            "grp": np.arange(groups + 10).reshape(-1, 1),  # 10 empty groups: count/sum = 0
        }
    raise ValueError(name)


def summarise(cols: list[np.ndarray]) -> tuple[int, int]:
    """(row count, order-independent checksum) of a result given as int64 columns."""
    if not cols or len(cols[0]) == 0:
        return 0, 0
    h = np.zeros(len(cols[0]), dtype=np.uint64)
    for c in cols:
        h = (h * np.uint64(1_000_003)) ^ c.astype(np.uint64)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
    return len(cols[0]), int(np.bitwise_xor.reduce(h) ^ np.uint64(len(cols[0])))


# ----------------------------------------------------------------------------- engines


def run_merklog(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    from merklog.engine import Program, checks, columnar, parser  # noqa: F401  (imported, like duckdb)

    text, _sql, out = WORKLOADS[name]
    data = {rel: np.asfortranarray(arr) for rel, arr in data.items()}  # columnar load
    start = time.perf_counter()
    rels = Program.parse(text).evaluate(data)
    count = rels.count(out)
    elapsed = time.perf_counter() - start
    cols = rels.columns(out)
    if cols is None:
        rows = rels.sorted(out)
        cols = [np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)] if rows else []
    assert count == (len(cols[0]) if cols else 0)
    return elapsed, cols


def run_duckdb(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    import duckdb

    _text, sql, _out = WORKLOADS[name]
    con = duckdb.connect()
    con.execute("SET threads=1")
    import pyarrow as pa

    for rel, arr in data.items():
        names = COLUMNS[rel]
        table = pa.table({c: np.ascontiguousarray(arr[:, j]) for j, c in enumerate(names)})
        con.register("input_view", table)
        con.execute(f"CREATE TABLE {rel} AS SELECT * FROM input_view")
        con.unregister("input_view")
    start = time.perf_counter()
    con.execute(sql)
    con.execute("SELECT count(*) FROM result").fetchone()
    elapsed = time.perf_counter() - start
    table = con.execute("SELECT * FROM result").fetchnumpy()
    return elapsed, [np.asarray(v, dtype=np.int64) for v in table.values()]


def run_python(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    """The floor: plain-Python, tuple-at-a-time semi-naive evaluation with dict indexes."""
    rows = {rel: [tuple(r) for r in arr.tolist()] for rel, arr in data.items()}
    start = time.perf_counter()
    if name in ("tc_chain", "tc_random"):
        succ: dict[int, list[int]] = {}
        for x, y in rows["edge"]:
            succ.setdefault(x, []).append(y)
        result = set(rows["edge"])
        delta = set(result)
        while delta:
            new = set()
            for x, z in delta:
                for y in succ.get(z, ()):
                    t = (x, y)
                    if t not in result:
                        new.add(t)
            result |= new
            delta = new
    elif name == "same_gen":
        children: dict[int, list[int]] = {}
        for c, p in rows["parent"]:
            children.setdefault(p, []).append(c)
        result = {(x, y) for kids in children.values() for x in kids for y in kids if x != y}
        delta = set(result)
        while delta:
            new = set()
            for a, b in delta:
                for x in children.get(a, ()):
                    for y in children.get(b, ()):
                        t = (x, y)
                        if t not in result:
                            new.add(t)
            result |= new
            delta = new
    elif name == "negation":
        succ = {}
        for x, y in rows["edge"]:
            succ.setdefault(x, []).append(y)
        reach = {s for (s,) in rows["source"]}
        delta = set(reach)
        while delta:
            new = set()
            for x in delta:
                for y in succ.get(x, ()):
                    if y not in reach:
                        new.add(y)
            reach |= new
            delta = new
        result = {(x,) for (x,) in rows["node"] if x not in reach}
    elif name == "aggregate":
        count: dict[int, int] = {}
        total: dict[int, int] = {}
        for _id, g, a in set(rows["sale"]):
            count[g] = count.get(g, 0) + 1
            total[g] = total.get(g, 0) + a
        result = {(g, count.get(g, 0), total.get(g, 0)) for (g,) in rows["grp"]}
    else:
        raise ValueError(name)
    elapsed = time.perf_counter() - start
    arr = np.array(sorted(result), dtype=np.int64)
    return elapsed, [arr[:, j] for j in range(arr.shape[1])] if len(arr) else []


RUNNERS = {"merklog": run_merklog, "duckdb": run_duckdb, "python": run_python}


# ----------------------------------------------------------------------------- whole process

#: Relation each workload writes (merklog: ``--output``; DuckDB: the ``result`` table).
OUTPUT = {name: out for name, (_text, _sql, out) in WORKLOADS.items()}

DUCKDB_SCRIPT = """
import json, sys
import duckdb
spec = json.loads(sys.argv[1])
con = duckdb.connect()
con.execute("SET threads=1")
for rel, cols, path in spec["inputs"]:
    columns = ", ".join(f"'{c}': 'BIGINT'" for c in cols)
    con.execute(
        f"CREATE TABLE {rel} AS SELECT * FROM read_csv('{path}', delim='\\t', header=false, "
        f"auto_detect=false, columns={{{columns}}})"
    )
con.execute(spec["sql"])
con.execute(f"COPY result TO '{spec['out']}' (DELIMITER '\\t', HEADER false)")
"""


def merklog_command() -> list[str]:
    """The ``merklog`` console script of this interpreter's environment (else ``-m``)."""
    script = Path(sys.executable).with_name("merklog")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "merklog.node.cli"]


TIME = Path("/usr/bin/time")

#: The folders installed as ``merklog.*`` (see setup.py).
PACKAGES = ("engine", "store", "replication", "node")


def compile_sources() -> None:
    """Byte-compile merklog's sources (into their ``__pycache__``), as ``pip install`` does.

    An editable checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise
    compile every imported module again in each timed process (0.3-0.7 s of
    CPU), a cost no installed copy has and DuckDB's installed wheel never pays.
    """
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *(str(ROOT / p) for p in PACKAGES)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run_process(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` to completion: wall and CPU seconds, peak RSS (MB) of that process.

    Peak RSS comes from GNU time (``%M``) when present: Linux charges a child the
    high-water mark of the process it was forked from, so ``wait4`` from this
    (large) driver would report the driver's own RSS for small children.
    """
    with tempfile.NamedTemporaryFile() as err, tempfile.NamedTemporaryFile("r") as stats:
        wrapped = [str(TIME), "-f", "%M %U %S", "-o", stats.name, *cmd] if TIME.exists() else cmd
        start = time.perf_counter()
        proc = subprocess.Popen(
            wrapped,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,  # on timeout, end the command too, not only GNU time
        )
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"timed out: {' '.join(cmd)}") from None
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode(errors='replace')}")
        if TIME.exists():
            rss_kb, user, system = stats.read().split()[-3:]
            return {"time": wall, "cpu": float(user) + float(system), "rss_mb": int(rss_kb) / 1024}
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # an upper bound, see above
    return {"time": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def write_tsv(directory: Path, data: dict[str, np.ndarray]) -> None:
    """Each relation as ``<rel>.facts``: tab-separated ints, no header."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    directory.mkdir(parents=True, exist_ok=True)
    for rel, arr in data.items():
        table = pa.table({f"c{j}": np.ascontiguousarray(arr[:, j]) for j in range(arr.shape[1])})
        pacsv.write_csv(
            table,
            directory / f"{rel}.facts",
            pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"),
        )


def read_result(path: Path) -> tuple[int, int]:
    """(row count, checksum) of a tab-separated int result file."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if path.stat().st_size == 0:
        return 0, 0
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(autogenerate_column_names=True),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types={f"f{j}": pa.int64() for j in range(8)}),
    )
    return summarise([np.asarray(c.to_numpy(), dtype=np.int64) for c in table.columns])


def whole_process_command(engine: str, name: str, work: Path) -> tuple[list[str], Path, Path]:
    """(command, output directory, result file) of ``engine`` on workload ``name``."""
    text, sql, out = WORKLOADS[name]
    facts = work / "facts"
    target = work / f"out-{engine}"
    if engine == "merklog":
        prog = work / "prog.dl"
        prog.write_text(text, encoding="utf-8")
        cmd = [*merklog_command(), "eval", str(prog), "--facts", str(facts)]
        cmd += ["--out", str(target), "--output", out]
    elif engine == "duckdb":
        inputs = [
            (rel, COLUMNS[rel], str(facts / f"{rel}.facts"))
            for rel in sorted(p.stem for p in facts.glob("*.facts"))
        ]
        spec = json.dumps({"inputs": inputs, "sql": sql, "out": str(target / f"{out}.csv")})
        cmd = [sys.executable, "-c", DUCKDB_SCRIPT, spec]
    else:
        result = target / f"{out}.csv"
        cmd = [sys.executable, str(ROOT / "bench" / "floor.py"), name, str(facts), str(result)]
    return cmd, target, target / f"{out}.csv"


def whole_processes(
    engines: tuple[str, ...], name: str, work: Path, repeat: int, timeout: float
) -> dict[str, dict]:
    """Best of ``repeat`` fresh-process runs of each engine on workload ``name``.

    The engines take turns within each repetition (merklog, DuckDB, Python, then
    again), so a change in the machine's load during the run falls on all of them
    alike instead of on whichever engine's block it hits."""
    commands = {e: whole_process_command(e, name, work) for e in engines}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(repeat):
        for engine, (cmd, target, result_file) in commands.items():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            run = run_process(cmd, timeout)
            run["rows"], run["checksum"] = read_result(result_file)
            runs[engine].append(run)
    for engine, done in runs.items():
        if len({(r["rows"], r["checksum"]) for r in done}) != 1:
            raise RuntimeError(f"{engine}/{name}: runs disagree with each other")
    return {e: min(done, key=lambda r: r["time"]) for e, done in runs.items()}


def whole_process(engine: str, name: str, work: Path, repeat: int, timeout: float) -> dict:
    """Best of ``repeat`` fresh-process runs of ``engine`` on workload ``name``."""
    return whole_processes((engine,), name, work, repeat, timeout)[engine]


# ----------------------------------------------------------------------------- in memory


def child(engine: str, name: str, data_path: str) -> None:
    with np.load(data_path) as npz:
        data = {k: npz[k] for k in npz.files}
    elapsed, cols = RUNNERS[engine](name, data)
    count, checksum = summarise(cols)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"time": elapsed, "rows": count, "checksum": checksum, "rss_mb": peak_kb / 1024})
    )


def in_memory(engine: str, name: str, data_path: str, repeat: int, timeout: float) -> dict:
    runs = []
    for _ in range(repeat):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", engine, name, data_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{engine}/{name} failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if len({(r["rows"], r["checksum"]) for r in runs}) != 1:
        raise RuntimeError(f"{engine}/{name}: runs disagree with each other")
    return min(runs, key=lambda r: r["time"])


# ----------------------------------------------------------------------------- node path

NODE_QUERY = "stats(G, C, S)"

# ----------------------------------------------------------------------------- typed output

TYPED = "hi(N, S) :- label(_, N, S), S > 500.0.\n"
TYPED_SQL = """
import sys, duckdb
facts, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads=1")
con.execute(
    f"CREATE TABLE label AS SELECT * FROM read_csv('{facts}', delim='\\t', header=false, "
    "auto_detect=false, columns={'id': 'BIGINT', 'n': 'VARCHAR', 's': 'DOUBLE'}, quote='')"
)
con.execute(
    f"COPY (SELECT DISTINCT n, s FROM label WHERE s > 500.0 ORDER BY n, s) "
    f"TO '{out}' (DELIMITER '\\t', HEADER false, QUOTE '')"
)
"""
TYPED_FLOOR = """
import sys
facts, out = sys.argv[1], sys.argv[2]
rows = set()
with open(facts, encoding="utf-8") as fh:
    for line in fh:
        _id, name, score = line.rstrip("\\n").split("\\t")
        if float(score) > 500.0:
            rows.add((name, float(score)))
with open(out, "w", encoding="utf-8") as fh:
    fh.writelines(f"{n}\\t{s!r}\\n" for n, s in sorted(rows))
"""


def typed_facts(path: Path, scale: float) -> int:
    """``label.facts``: id, a name of 4-12 letters (some repeated), a score in
    [0, 1000) of which a tenth are whole floats written ``3.0``."""
    rng = np.random.default_rng(42)
    n = int(200_000 * scale)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéü"))
    lens = rng.integers(4, 13, size=n // 2)
    names = ["".join(rng.choice(letters, size=k)) for k in lens]
    scores = np.round(rng.random(n) * 1000, 3)
    scores[::10] = np.floor(scores[::10])
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(f"{i}\t{names[i % len(names)]}\t{float(scores[i])!r}\n")
    return n


def read_typed(path: Path) -> list[tuple[str, float]]:
    """(name, score) rows in file order; a score that is not a float literal fails."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, score = line.split("\t")
        if not any(c in score for c in ".eE"):
            raise RuntimeError(f"{path}: score {score!r} does not read back as a float")
        rows.append((name, float(score)))
    return rows


def typed_workload(scale: float, repeat: int, timeout: float, tmp: Path) -> bool:
    """``merklog eval --sorted`` on strings and floats vs DuckDB vs the Python floor."""
    work = tmp / "typed"
    facts = work / "facts"
    facts.mkdir(parents=True)
    n = typed_facts(facts / "label.facts", scale)
    prog = work / "typed.dl"
    prog.write_text(TYPED, encoding="utf-8")
    out = work / "out"
    cmds = {
        "merklog": [*merklog_command(), "eval", str(prog), "--facts", str(facts)]
        + ["--out", str(out), "--output", "hi", "--sorted"],
        "duckdb": [
            sys.executable,
            "-c",
            TYPED_SQL,
            str(facts / "label.facts"),
            str(out / "hi.csv"),
        ],
        "python": [
            sys.executable,
            "-c",
            TYPED_FLOOR,
            str(facts / "label.facts"),
            str(out / "hi.csv"),
        ],
    }
    results, rows = {}, {}
    for engine, cmd in cmds.items():
        runs = []
        for _ in range(repeat):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            runs.append(run_process(cmd, timeout))
        results[engine] = min(runs, key=lambda r: r["time"])
        rows[engine] = read_typed(out / "hi.csv")
    agree = rows["merklog"] == rows["duckdb"] == rows["python"]
    d = results["duckdb"]
    print(f"Typed output ({n:,} label facts; {len(rows['merklog']):,} sorted result rows):\n")
    print("| engine | wall s | CPU s | peak RSS MB | wall / DuckDB | CPU / DuckDB |")
    print("|---|---:|---:|---:|---:|---:|")
    for engine, r in results.items():
        print(
            f"| {engine} | {r['time']:.2f} | {r['cpu']:.2f} | {r['rss_mb']:.0f} "
            f"| {r['time'] / d['time']:.2f}x | {r['cpu'] / d['cpu']:.2f}x |"
        )
    print(f"\nsame rows in the same order: {'yes' if agree else 'NO'}")
    return agree


def _rows_csv(text: str) -> list[tuple[int, ...]]:
    """The rows of ``merklog query --csv`` output (header skipped), sorted."""
    return sorted(tuple(int(f) for f in line.split(",")) for line in text.splitlines()[1:])


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user+sys) a running process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_idle(pid: int, timeout: float, quiet: float = 1.0) -> float:
    """Wait until process ``pid`` used no CPU for ``quiet`` seconds; its CPU seconds then."""
    deadline = time.monotonic() + timeout
    last = _proc_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = _proc_cpu(pid)
        if now - last < 0.02:
            return now
        last = now
    raise RuntimeError("the node did not settle")


#: A write after the load, then its retraction: the first changing epoch builds the
#: incremental state from the stored facts (ADR 0070); the retraction is an ordinary epoch.
NODE_WRITE = "sale(-1, 0, 5)."


def running_node(home: Path, prog: Path, timeout: float) -> tuple[dict, list[dict], str]:
    """``merklog node run`` on ``home``; then, as fresh processes that reach it over HTTP,
    ``merklog load``, ``query``, ``put`` of one fact, ``retract`` of it and ``query`` again.
    Returns the start-up figures and one per step — wall of each client process, CPU of
    the server meanwhile — and the last query's output (the first query's answer again)."""
    from merklog.node.runtime import read_runfile

    merklog = merklog_command()
    start = time.perf_counter()
    server = subprocess.Popen(
        [*merklog, "--home", str(home), "node", "run", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + timeout
        while not read_runfile(home):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("merklog node run did not start")
            time.sleep(0.05)
        ready = time.perf_counter() - start
        cpu = _wait_idle(server.pid, timeout)  # the first loop epoch builds incremental state
        started = {"time": ready, "settled": time.perf_counter() - start, "cpu": cpu}
        steps = []
        for cmd in (
            ["load", str(prog)],
            ["query", NODE_QUERY, "--csv"],
            ["put", NODE_WRITE],
            ["retract", NODE_WRITE],
            ["query", NODE_QUERY, "--csv"],
        ):
            before = _proc_cpu(server.pid)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [*merklog, "--home", str(home), *cmd],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"merklog {cmd[0]} over HTTP failed:\n{proc.stderr}")
            _wait_idle(server.pid, timeout)  # the epoch a write wakes runs after the answer
            steps.append({"time": wall, "cpu": _proc_cpu(server.pid) - before, "out": proc.stdout})
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return started, steps, steps[-1]["out"]


def node_path(
    scale: float, repeat: int, timeout: float, tmp: Path, reuse: Path | None = None
) -> None:
    # ``repeat`` fresh processes each for load, query and eval (the node path is slow:
    # --node-repeat defaults to 1)
    """``merklog load`` + first ``merklog query`` over a home holding the aggregate facts,
    beside ``merklog eval`` on the same facts as TSV files; then the same two commands
    against ``merklog node run`` on that home (over HTTP)."""
    from merklog.node.node import Node

    data = generate("aggregate", scale)
    home = tmp / "home"
    work = tmp / "node-eval"
    write_tsv(work / "facts", data)
    prog = tmp / "stats.dl"
    prog.write_text(AGG, encoding="utf-8")
    start = time.perf_counter()
    stored = sum(len(a) for a in data.values())
    if reuse is not None:  # a home written by an earlier run at this scale: copied
        shutil.copytree(reuse, home)
        print(f"node path: a copy of {reuse} ({stored:,} facts expected; the answers are checked)")
    else:
        node = Node.open(home)
        try:
            for rel, arr in data.items():
                rows = [tuple(r) for r in arr.tolist()]
                for i in range(0, len(rows), 200_000):
                    node.write([(rel, r) for r in rows[i : i + 200_000]], evaluate=False)
        finally:
            node.close()
        print(
            f"node path: {stored:,} facts stored in {time.perf_counter() - start:.1f} s (untimed)"
        )
    merklog = merklog_command()
    load = min(
        (
            run_process([*merklog, "--home", str(home), "load", str(prog)], timeout)
            for _ in range(repeat)
        ),
        key=lambda r: r["time"],
    )
    query_cmd = [*merklog, "--home", str(home), "query", NODE_QUERY, "--csv"]
    query = min((run_process(query_cmd, timeout) for _ in range(repeat)), key=lambda r: r["time"])
    out = subprocess.run(query_cmd, capture_output=True, text=True, check=True).stdout
    node_rows = _rows_csv(out)
    evaluated = whole_process("merklog", "aggregate", work, repeat, timeout)
    eval_rows = sorted(
        tuple(int(f) for f in line.split("\t"))
        for line in (work / "out-merklog" / "stats.csv").read_text().splitlines()
    )
    agree = node_rows == eval_rows
    total = load["time"] + query["time"]
    total_cpu = load["cpu"] + query["cpu"]
    print(f"load average after the stopped-home steps: {load_avg()}")
    print()
    print("| path | wall s | CPU s | peak RSS MB |")
    print("|---|---:|---:|---:|")
    print(
        f"| `merklog load` (open home, evaluate) | {load['time']:.2f} | {load['cpu']:.2f} "
        f"| {load['rss_mb']:.0f} |"
    )
    print(
        f"| first `merklog query` (fresh process) | {query['time']:.2f} | {query['cpu']:.2f} "
        f"| {query['rss_mb']:.0f} |"
    )
    print(
        f"| `merklog eval` on the same facts as TSV | {evaluated['time']:.2f} "
        f"| {evaluated['cpu']:.2f} | {evaluated['rss_mb']:.0f} |"
    )
    print(
        f"\nnode load + first query / eval: {total / evaluated['time']:.1f}x wall, "
        f"{total_cpu / evaluated['cpu']:.1f}x CPU; results agree: {'yes' if agree else 'NO'}",
        flush=True,
    )
    try:
        started, steps, http_out = running_node(home, prog, timeout)
    except RuntimeError as exc:  # e.g. the CLI's HTTP timeout: reported, not fatal
        print(f"\nRunning node: {str(exc).strip()}")
    else:
        agree &= _rows_csv(steps[1]["out"]) == eval_rows and _rows_csv(http_out) == eval_rows
        names = (
            "`merklog load` over HTTP",
            "first `merklog query` over HTTP",
            f"first write after the load: `merklog put '{NODE_WRITE}'` and its epoch",
            "`merklog retract` of it and its epoch",
            "`merklog query` again",
        )
        rows = "".join(
            f"| {name} | {step['time']:.2f} | {step['cpu']:.2f} |\n"
            for name, step in zip(names, steps, strict=True)
        )
        print(
            "\nRunning node (`merklog node run`; client wall, server CPU until idle):\n\n"
            "| step | wall s | server CPU s |\n|---|---:|---:|\n"
            f"| start-up until listening | {started['time']:.2f} | - |\n"
            f"| start-up until idle | {started['settled']:.2f} | {started['cpu']:.2f} |\n"
            f"{rows}\nresults agree: {'yes' if agree else 'NO'}; load average: {load_avg()}"
        )
    if not agree:
        raise RuntimeError("node path and merklog eval disagree")


# ----------------------------------------------------------------------------- driver


def cpu_run(cmd: list[str], timeout: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``cmd`` (``getrusage`` of children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        cmd,
        check=True,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return cpu, wall


def startup(runs: int, timeout: float, tmp: Path) -> None:
    """The fixed cost of a process: ``merklog eval`` of one fact beside DuckDB on one row."""
    import statistics

    work = tmp / "startup"
    facts = work / "facts"
    facts.mkdir(parents=True)
    (facts / "edge.facts").write_text("1\t2\n", encoding="utf-8")
    prog = work / "prog.dl"
    prog.write_text("path(X, Y) :- edge(X, Y).\n", encoding="utf-8")
    spec = {
        "inputs": [("edge", COLUMNS["edge"], str(facts / "edge.facts"))],
        "sql": "CREATE TABLE result AS SELECT x, y FROM edge",
        "out": str(work / "duckdb.csv"),
    }
    cmds = {
        "`merklog eval` (1 fact)": [
            *merklog_command(),
            "eval",
            str(prog),
            "--facts",
            str(facts),
            "--out",
            str(work / "o"),
        ],
        "DuckDB (1 row, read_csv + COPY)": [sys.executable, "-c", DUCKDB_SCRIPT, json.dumps(spec)],
        "`python -c` importing numpy (one BLAS thread) and pyarrow.csv": [
            sys.executable,
            "-c",
            "import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'; import numpy, pyarrow.csv",
        ],
        "`python -c pass`": [sys.executable, "-c", "pass"],
    }
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            measured[name].append(cpu_run(cmd, timeout))
    duck = statistics.median(cpu for cpu, _wall in measured["DuckDB (1 row, read_csv + COPY)"])
    print(
        f"Start-up (fresh processes, {runs} interleaved runs each, medians; "
        f"load average after: {load_avg()}):\n"
    )
    print("| process | CPU s | wall s | CPU / DuckDB |")
    print("|---|---:|---:|---:|")
    for name, values in measured.items():
        cpu = statistics.median(c for c, _w in values)
        wall = statistics.median(w for _c, w in values)
        print(f"| {name} | {cpu:.3f} | {wall:.3f} | {cpu / duck:.2f}x |")


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=1.0, help="shrink/grow the inputs")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--repeat", type=int, default=3, help="fresh-process runs per engine; the fastest counts"
    )
    parser.add_argument("--skip-in-memory", action="store_true", help="whole-process table only")
    parser.add_argument("--node", action="store_true", help="also time the node path")
    parser.add_argument("--node-repeat", type=int, default=1, help="fresh-process runs per step")
    parser.add_argument("--node-only", action="store_true", help="the node path alone")
    parser.add_argument(
        "--node-home", type=Path, help="copy this home (written by an earlier run) for --node"
    )
    parser.add_argument("--typed", action="store_true", help="also time sorted string/float output")
    parser.add_argument(
        "--startup",
        type=int,
        metavar="N",
        default=0,
        help="also time start-up: eval of one fact vs DuckDB, N interleaved runs",
    )
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "WORKLOAD", "DATA"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    names = [] if args.node_only else args.only if args.only is not None else list(WORKLOADS)
    if (args.typed or args.startup) and args.only is None:
        names = []  # --typed / --startup alone: only those (add --only NAME for others)
    print(f"load average at start: {load_avg()} ({os.cpu_count()} CPUs)", flush=True)
    compile_sources()
    whole_rows, memory_rows = [], []
    ok = True
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for name in names:
            data = generate(name, args.scale)
            work = tmp / name
            write_tsv(work / "facts", data)
            res = whole_processes(ENGINES, name, work, args.repeat, args.timeout)
            agree = len({(r["rows"], r["checksum"]) for r in res.values()}) == 1
            ok &= agree
            whole_rows.append((name, res, agree))
            m, d, p = res["merklog"], res["duckdb"], res["python"]
            print(
                f"{name:10s} rows={m['rows']:>9,d} agree={'yes' if agree else 'NO'}  "
                f"merklog {m['time']:6.2f}s {m['rss_mb']:5.0f}MB | "
                f"duckdb {d['time']:6.2f}s {d['rss_mb']:5.0f}MB | "
                f"python {p['time']:6.2f}s {p['rss_mb']:5.0f}MB | "
                f"merklog/duckdb {m['time'] / d['time']:4.2f}x",
                flush=True,
            )
            if not args.skip_in_memory:
                path = str(tmp / f"{name}.npz")
                np.savez(path, **data)
                mem = {e: in_memory(e, name, path, args.repeat, args.timeout) for e in ENGINES}
                agree = len({(r["rows"], r["checksum"]) for r in mem.values()}) == 1
                ok &= agree
                memory_rows.append((name, mem, agree))
        print(f"\nload average at end: {load_avg()}\n")
        if whole_rows:
            print_tables(whole_rows, memory_rows, args.repeat)
        if args.typed:
            print()
            ok &= typed_workload(args.scale, args.repeat, args.timeout, tmp)
        if args.startup:
            print()
            startup(args.startup, args.timeout, tmp)
        if args.node or args.node_only:
            print()
            node_path(args.scale, args.node_repeat, args.timeout, tmp, args.node_home)
    if not ok:
        print("RESULTS DISAGREE", file=sys.stderr)
        return 1
    return 0


def print_tables(whole_rows: list, memory_rows: list, repeat: int) -> None:
    """The whole-process and in-memory tables (markdown)."""
    print(
        f"Whole process (TSV files in, result file out; wall = best of {repeat} fresh processes):\n"
    )
    print(
        "| workload | rows | merklog s | duckdb s | python s | merklog/duckdb "
        "| python/merklog | CPU s merklog/duckdb/python | peak RSS MB merklog/duckdb/python "
        "| RSS merklog/duckdb | agree |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|")
    for name, res, agree in whole_rows:
        m, d, p = res["merklog"], res["duckdb"], res["python"]
        print(
            f"| {name} | {m['rows']:,} | {m['time']:.2f} | {d['time']:.2f} | {p['time']:.2f} "
            f"| {m['time'] / d['time']:.2f}x | {p['time'] / m['time']:.1f}x "
            f"| {m['cpu']:.2f}/{d['cpu']:.2f}/{p['cpu']:.2f} "
            f"| {m['rss_mb']:.0f}/{d['rss_mb']:.0f}/{p['rss_mb']:.0f} "
            f"| {m['rss_mb'] / d['rss_mb']:.2f}x | {'yes' if agree else 'NO'} |"
        )
    if memory_rows:
        print("\nIn memory (evaluation only, data loaded before the clock starts):\n")
        print("| workload | merklog s | duckdb s | python s | merklog/duckdb | agree |")
        print("|---|---:|---:|---:|---:|---|")
        for name, res, agree in memory_rows:
            m, d, p = res["merklog"], res["duckdb"], res["python"]
            print(
                f"| {name} | {m['time']:.3f} | {d['time']:.3f} | {p['time']:.3f} "
                f"| {m['time'] / d['time']:.2f}x | {'yes' if agree else 'NO'} |"
            )


if __name__ == "__main__":
    sys.exit(main())
