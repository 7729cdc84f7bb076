"""Relation and arguments of snapshot facts, gathered by fact CID on the driver (ADR 0122).

The compaction's Spark job aggregates narrow rows only (fact CID, dataset, delta CIDs):
a fact's relation and typed arguments follow from its CID, so they need not travel
through the shuffle, the sort and Spark's Parquet writer with every assert row.

They are gathered here, with pyarrow, from the input exports themselves. Every export
writes its visible facts (``DIR/facts/relation=<rel>/``), and a fact visible in the
merged state is visible in at least one input: its unremoved assert comes from some
input, whose retracts are a subset of the union's, so that input sees it too. Facts
that no export lists (an input given as an ``ops/`` folder, an export without facts)
are looked up among the inputs' assert rows instead, which always carry them.

This needs the inputs on a file system the driver reads (:func:`local_exports`); when
it does not, compaction keeps the arguments in the Spark job.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .cidjoin import CidTable, first_of_each
from .cidkeys import KEY_COLUMNS, cid_keys, injective, keys_name_cids
from .schema import ARGS_TYPE

_COLUMNS = ("fact_cid", "relation", "args")


def local_exports(inputs: Sequence[str | Path]) -> list[Path] | None:
    """The inputs as local paths (export directories, ``ops/`` folders or files), or None
    when any input is a URI or is not there: then only the cluster can read it."""
    paths = []
    for item in inputs:
        text = str(item)
        if "://" in text or not Path(text).exists():
            return None
        paths.append(Path(text))
    return paths


def input_datasets(inputs: Sequence[Path]) -> list[str]:
    """The sorted dataset ids of the inputs' op rows (their ``dataset`` column, read as
    the dictionary it is stored as)."""
    names: set[str] = set()
    for path in inputs:
        for f in ops_files(path):
            column = pq.read_table(f, columns=["dataset"], read_dictionary=["dataset"])
            for chunk in column.column("dataset").chunks:
                names.update(chunk.dictionary.to_pylist())
    names.discard(None)
    return sorted(names)


def observed_tags(inputs: Sequence[Path]) -> int | None:
    """How many (fact, delta) tags the retract rows of the inputs observe in all: the
    lengths of their ``observed_keys`` lists (an assert's list is empty), read from that
    column alone. None when an ops file has no keys (the job then runs on the CIDs)."""
    total = 0
    for path in inputs:
        for f in ops_files(path):
            if not has_keys(f):
                return None
            column = pq.read_table(f, columns=["observed_keys"]).column("observed_keys")
            for chunk in column.chunks:
                total += int(pc.sum(pc.list_value_length(chunk)).as_py() or 0)
    return total


def _export_facts(path: Path) -> list[pa.Table]:
    """The visible facts an export directory lists, as ``fact_cid, relation, args`` tables.
    A list that cannot be read is left out: it only saves work, the inputs' assert rows
    (which the job reads anyway) hold the same facts."""
    out = []
    for rel_dir in sorted((path / "facts").glob("relation=*")):
        relation = rel_dir.name.split("=", 1)[1]
        for f in sorted(rel_dir.glob("*.parquet")):
            try:
                t = pq.read_table(f, columns=["fact_cid", "args"])
            except (OSError, pa.ArrowException):
                continue
            out.append(
                pa.table(
                    {
                        "fact_cid": t.column("fact_cid"),
                        "relation": pa.repeat(pa.scalar(relation, pa.string()), t.num_rows),
                        "args": t.column("args").cast(ARGS_TYPE),
                    }
                )
            )
    return out


def ops_files(path: Path) -> list[Path]:
    """The Parquet files of an input: a file, an export's ``ops/`` folder, or a folder."""
    if path.is_file():
        return [path]
    root = path / "ops" if (path / "ops").is_dir() else path
    return sorted(root.rglob("*.parquet"))


def _asserted_facts(paths: Sequence[Path]) -> pa.Table:
    """``fact_cid, relation, args`` of every assert row of the inputs (duplicates kept)."""
    tables = []
    for path in paths:
        for f in ops_files(path):
            t = pq.read_table(f, columns=["op", *_COLUMNS])
            t = t.filter(pc.equal(t.column("op"), "assert")).select(list(_COLUMNS))
            tables.append(t.cast(_schema()))
    return pa.concat_tables(tables) if tables else _schema().empty_table()


def _schema() -> pa.Schema:
    return pa.schema([("fact_cid", pa.binary()), ("relation", pa.string()), ("args", ARGS_TYPE)])


class FactArgs:
    """Distinct facts ``fact_cid → (relation, args)`` of some inputs, for :meth:`gather`."""

    def __init__(self, inputs: Sequence[Path]) -> None:
        self._inputs = list(inputs)
        tables = [t for path in self._inputs if path.is_dir() for t in _export_facts(path)]
        facts = pa.concat_tables(tables) if tables else _schema().empty_table()
        self._facts = _distinct(facts)
        # single arrays: a take of a chunked column concatenates its chunks on every call
        self._relation = self._facts.column("relation").combine_chunks()
        self._args = self._facts.column("args").combine_chunks()
        self._fact_cids = self._facts.column("fact_cid").combine_chunks()
        self._cids = CidTable(self._fact_cids)
        #: the facts, then the inputs' asserted facts (built on first need)
        self._asserted: pa.Table | None = None
        self._asserted_only: pa.Table | None = None
        self._asserted_cids: CidTable | None = None
        self._lock = threading.Lock()
        #: the facts' 64-bit keys and their sort order (built on first gather_keys)
        self._keys: np.ndarray | None = None
        self._sorted_keys: np.ndarray | None = None
        self._key_order: np.ndarray | None = None

    def gather(self, cids: pa.Array) -> tuple[pa.Array, pa.Array]:
        """``(relation, args)`` of each fact CID in ``cids`` (all of them facts the inputs
        assert), aligned with ``cids``."""
        where = self._cids.lookup(cids)
        if where.null_count:
            return self._gather_asserted(cids, where)
        return self._relation.take(where), self._args.take(where)

    def index_keys(self) -> None:
        """Sort the facts by their 64-bit keys for :meth:`gather_keys` (once; the input
        reader does it on its thread, before the staged files are placed)."""
        with self._lock:  # several files are placed at once
            if self._key_order is None:
                own = np.asarray(cid_keys(self._fact_cids).fill_null(0))
                order = np.argsort(own, kind="stable")
                self._keys, self._sorted_keys = own, own[order]
                self._key_order = order

    def gather_keys(self, keys: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
        """``(fact_cid, relation, args)`` of the fact of each 64-bit key (:mod:`.cidkeys`) in
        ``keys``, for keys that are injective over the inputs' facts (:class:`KeyCheck`)."""
        self.index_keys()
        sorted_keys = self._sorted_keys
        at = np.searchsorted(sorted_keys, keys)
        found = at < len(sorted_keys)
        found[found] = sorted_keys[at[found]] == keys[found]
        rows = np.zeros(len(keys), np.int64)
        rows[found] = self._key_order[at[found]]
        if not found.all():  # not in any facts list: the inputs' assert rows hold them
            with self._lock:
                if self._asserted is None:
                    self._load_asserted()
            more_keys = np.asarray(cid_keys(self._asserted_only.column("fact_cid")).fill_null(0))
            order = np.argsort(more_keys, kind="stable")
            missing = np.nonzero(~found)[0]
            pos = np.searchsorted(more_keys[order], keys[missing])
            ok = pos < len(order)
            ok[ok] = more_keys[order][pos[ok]] == keys[missing][ok]
            if not ok.all():
                raise LookupError(
                    f"{int((~ok).sum())} visible facts have no assert row in the inputs"
                )
            rows[missing] = order[pos] + self._facts.num_rows
            both = self._asserted
            columns = [both.column(c).combine_chunks() for c in _COLUMNS]
        else:
            # single arrays: a take of the chunked args column costs ~3x (1.05 against 0.34 s
            # of CPU for the 3M facts of a 5M-op compaction)
            columns = [self._fact_cids, self._relation, self._args]
        at = pa.array(rows)
        cid, relation, args = (c.take(at) for c in columns)
        return cid, relation, args

    def _load_asserted(self) -> None:
        asserted = _distinct(_asserted_facts(self._inputs))
        self._asserted_only = asserted
        self._asserted = pa.concat_tables([self._facts, asserted])
        self._asserted_cids = CidTable(asserted.column("fact_cid").combine_chunks())

    def _gather_asserted(self, cids: pa.Array, where: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Complete a lookup from the inputs' assert rows (read once, on first need)."""
        with self._lock:
            if self._asserted is None:
                self._load_asserted()
        missing = np.nonzero(~np.asarray(where.is_valid()))[0]
        more = self._asserted_cids.lookup(cids.take(pa.array(missing)))
        if more.null_count:
            raise LookupError(f"{more.null_count} visible facts have no assert row in the inputs")
        at = np.asarray(where.fill_null(0)).copy()
        at[missing] = np.asarray(more) + self._facts.num_rows
        both = self._asserted
        return both.column("relation").take(pa.array(at)), both.column("args").take(pa.array(at))


class KeyCheck:
    """Whether the 64-bit keys of the inputs' CIDs (:mod:`.cidkeys`) are usable in place
    of the CIDs: every ops file carries them and they are injective over the inputs' fact
    CIDs and delta CIDs (asserting and observed); and the delta CID of each delta key."""

    def __init__(self, inputs: Sequence[Path]) -> None:
        self.usable = False
        self.delta_keys = np.zeros(0, np.int64)  # sorted
        self.delta_cids = pa.array([], pa.binary())  # aligned with delta_keys
        try:
            self._check([f for path in inputs for f in ops_files(path)])
        except (OSError, pa.ArrowException):  # the job reads the CIDs themselves
            self.usable = False

    def _check(self, files: list[Path]) -> None:
        if not files or not all(has_keys(f) for f in files):
            return
        deltas, facts = [], []
        for f in files:
            t = pq.read_table(
                f, columns=["fact_cid", "delta_cid", "observed"], read_dictionary=["delta_cid"]
            )
            facts.extend(t.column("fact_cid").chunks)
            for chunk in t.column("delta_cid").chunks:
                deltas.append(chunk.dictionary)
            for chunk in t.column("observed").chunks:
                deltas.append(pc.list_flatten(chunk))
        if facts and not keys_name_cids(pa.concat_arrays(facts)):
            return
        delta_cids = (
            pc.unique(pa.concat_arrays(deltas)).drop_null() if deltas else pa.array([], pa.binary())
        )
        keys = cid_keys(delta_cids)
        if not injective(delta_cids, keys):
            return
        order = np.argsort(np.asarray(keys), kind="stable")
        self.delta_keys = np.asarray(keys)[order]
        self.delta_cids = delta_cids.take(pa.array(order))
        self.usable = True

    def delta_cid(self, keys: pa.Array) -> pa.Array:
        """The delta CID of each key in ``keys`` (all of them keys of the inputs' deltas)."""
        at = np.searchsorted(self.delta_keys, np.asarray(keys))
        return self.delta_cids.take(pa.array(at))


def has_keys(path: Path) -> bool:
    """True when the ops file at ``path`` carries the key columns (:mod:`.cidkeys`)."""
    names = pq.read_schema(path).names
    return all(c in names for c in KEY_COLUMNS)


def keyed_inputs(inputs: Sequence[str | Path]) -> bool:
    """True when every input is local and every one of its ops files carries the key
    columns: the facts jobs then partition by ``fact_key`` (ADR 0131)."""
    local = local_exports(inputs)
    if local is None:
        return False
    files = [f for path in local for f in ops_files(path)]
    try:
        return bool(files) and all(has_keys(f) for f in files)
    except (OSError, pa.ArrowException):
        return False


class InputReader:
    """What the driver reads from local inputs - their dataset ids (:func:`input_datasets`)
    and visible facts (:class:`FactArgs`) - read on a thread from construction on. The CLI
    starts it before the Spark session, so the reading overlaps the JVM's start instead of
    competing with the job's tasks for the cores. :meth:`close` when done."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="merklog-inputs")
        self._datasets = self._pool.submit(input_datasets, self.paths)
        self._observed = self._pool.submit(observed_tags, self.paths)
        # the key check decides the job, the facts are needed only after it
        self._keys = self._pool.submit(KeyCheck, self.paths)
        self._facts = self._pool.submit(self._read_facts)

    def _read_facts(self) -> FactArgs:
        facts = FactArgs(self.paths)
        if self._keys.result().usable:  # the keyed job's tags are mapped back by key
            facts.index_keys()
        return facts

    def datasets(self) -> list[str]:
        return self._datasets.result()

    def observed(self) -> int | None:
        """How many tags the inputs' retracts observe (:func:`observed_tags`)."""
        return self._observed.result()

    def facts(self) -> FactArgs:
        return self._facts.result()

    def keys(self) -> KeyCheck:
        return self._keys.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def read_inputs(inputs: Sequence[str | Path]) -> InputReader | None:
    """An :class:`InputReader` of ``inputs``, or None when this process cannot read them."""
    local = local_exports(inputs)
    return InputReader(local) if local is not None else None


def _distinct(facts: pa.Table) -> pa.Table:
    """One row per fact CID (the same CID names the same relation and arguments)."""
    keep = first_of_each(facts.column("fact_cid").combine_chunks())
    if keep is None:
        return facts
    return facts.take(pa.array(keep))


__all__ = [
    "FactArgs",
    "InputReader",
    "KeyCheck",
    "has_keys",
    "input_datasets",
    "keyed_inputs",
    "local_exports",
    "observed_tags",
    "ops_files",
    "read_inputs",
]
