"""Run one :class:`~tests.engine.clingo_fuzz.Case` through clingo and every merklog path."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from merklog.engine.columnar import Ineligible
from merklog.engine.errors import EngineError
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.program import Program
from merklog.engine.tsv import format_field, parse_field
from merklog.node.cli import cli

from .clingo_fuzz import EDB, Case, Generator, Rows, canon_rows, solve, tsv_safe


def _rel(rels: Any, rel: str) -> set[tuple]:
    return canon_rows(rels[rel]) if rel in rels else set()


def _diff(path: str, epoch: int, rel: str, want: set, got: set) -> str:
    return (
        f"{path} epoch {epoch} {rel}: missing {sorted(want - got, key=repr)}, "
        f"extra {sorted(got - want, key=repr)}"
    )


_WORKDIR: list[Path] = []


def _workdir() -> Path:
    """A fresh directory for one ``merklog eval`` run, under one temporary directory
    per process (removing directories one by one costs more than the evaluation),
    removed whole when the process exits."""
    if not _WORKDIR:
        _WORKDIR.append(Path(tempfile.mkdtemp(prefix="merklog-clingo-")))
        atexit.register(shutil.rmtree, _WORKDIR[0], True)
    _WORKDIR.append(_WORKDIR[0] / str(len(_WORKDIR)))
    _WORKDIR[-1].mkdir()
    return _WORKDIR[-1]


def _eval_cli(case: Case, facts: dict[str, Rows]) -> dict[str, list[tuple]]:
    """``merklog eval`` from fact files to CSV files, in process (the real command)."""
    root = _workdir()
    (root / "facts").mkdir()
    (root / "prog.dl").write_text(case.merklog, encoding="utf-8")
    for rel, rows in facts.items():
        text = "".join("\t".join(format_field(v) for v in row) + "\n" for row in rows)
        (root / "facts" / f"{rel}.facts").write_text(text, encoding="utf-8")
    args = ["eval", str(root / "prog.dl"), "--facts", str(root / "facts")]
    res = CliRunner().invoke(cli, [*args, "--out", str(root / "out")])
    assert res.exit_code == 0, res.output
    out: dict[str, list[tuple]] = {}
    for path in (root / "out").glob("*.csv"):
        rows = path.read_text(encoding="utf-8").splitlines()
        out[path.stem] = [tuple(parse_field(f) for f in line.split("\t")) for line in rows]
    return out


def check_case(case: Case, stats: dict[str, int]) -> str | None:
    """None when every path agrees with clingo; else a description of the first mismatch
    (an exception inside merklog is a mismatch too)."""
    try:
        return _check(case, stats)
    except (AssertionError, Ineligible):
        raise
    except Exception as exc:  # noqa: BLE001 - any crash is a finding, reported with its seed
        return f"merklog raised {exc!r}"


def _check(case: Case, stats: dict[str, int]) -> str | None:
    stats["cases"] += 1
    try:
        batch = Program.parse(case.merklog, dialect="merklog", backend="tuple")
    except EngineError:
        stats["rejected"] += 1
        return None
    columnar = Program(batch.ast, backend="columnar")
    engine = IncrementalEngine(batch.checked)
    facts: dict[str, Rows] = {rel: Rows() for rel in EDB}
    for epoch, (ins, dels) in enumerate(case.epochs):
        for rel, rows in dels.items():
            facts[rel] -= rows
        for rel, rows in ins.items():
            facts[rel] |= rows
        model = solve(case, facts)
        want = {rel: canon_rows(rows) for rel, rows in model.items()}
        got_batch = batch.evaluate({r: list(rows) for r, rows in facts.items()})
        try:
            got_col = columnar.evaluate({r: list(rows) for r, rows in facts.items()})
            if epoch == 0:
                stats["columnar"] += 1
        except Ineligible:
            got_col = None
        engine.step(
            inserts={r: list(rows) for r, rows in ins.items()},
            deletes={r: list(rows) for r, rows in dels.items()},
        )
        for rel in case.derived():
            if _rel(got_batch, rel) != want[rel]:
                return _diff("batch", epoch, rel, want[rel], _rel(got_batch, rel))
            if got_col is not None and _rel(got_col, rel) != want[rel]:
                return _diff("columnar", epoch, rel, want[rel], _rel(got_col, rel))
            inc = canon_rows(engine.relation(rel))
            if inc != want[rel]:
                return _diff("incremental", epoch, rel, want[rel], inc)
        if (
            epoch == 0
            and all(tsv_safe(v) for rows in model.values() for row in rows for v in row)
            and all(tsv_safe(v) for rows in facts.values() for row in rows for v in row)
        ):
            stats["eval"] += 1
            got_eval = _eval_cli(case, facts)
            for rel in case.derived():
                rows = canon_rows(got_eval.get(rel, []))
                if rows != want[rel]:
                    return _diff("merklog eval", epoch, rel, want[rel], rows)
    return None


def _variants(case: Case):
    """Smaller cases: one rule, one body literal or one epoch change fewer."""
    for i in range(len(case.rules)):
        yield Case(
            case.kinds,
            case.rules[:i] + case.rules[i + 1 :],
            case.clingo_rules[:i] + case.clingo_rules[i + 1 :],
            case.epochs,
        )
    for i in range(1, len(case.epochs)):
        yield Case(case.kinds, case.rules, case.clingo_rules, case.epochs[:i])
    for e, (ins, dels) in enumerate(case.epochs):
        for part, side in ((ins, 0), (dels, 1)):
            for rel, rows in part.items():
                for row in rows:
                    smaller = {r: v.copy() for r, v in part.items()}
                    smaller[rel].discard(row)
                    ep = list(case.epochs)
                    ep[e] = (smaller, dels) if side == 0 else (ins, smaller)
                    yield Case(case.kinds, case.rules, case.clingo_rules, ep)


def shrink(case: Case, failure: str, check: Callable[[Case], str | None] | None = None) -> Case:
    """Greedily drop rules, epochs and facts while some path still disagrees
    (``check``: a case's mismatch or None; by default every engine path)."""
    stats = {"cases": 0, "rejected": 0, "columnar": 0, "eval": 0}
    if check is None:
        check = lambda c: check_case(c, stats)  # noqa: E731
    improved = True
    while improved:
        improved = False
        for smaller in _variants(case):
            try:
                if check(smaller) is not None:
                    case, improved = smaller, True
                    break
            except Exception:  # a variant the oracle cannot take: not smaller
                continue
    return case


def run_seeds(
    label: str,
    seeds: range,
    check: Callable[[int, Case, dict[str, int]], str | None],
    stats: dict[str, int],
    *,
    mixed: bool = True,
    max_reported: int = 20,
    progress_every: int | None = None,
) -> list[str]:
    """Run ``check(seed, case, stats)`` over the generated case of every seed and
    return the failures, each shrunk (rules, epochs and facts dropped while
    ``check`` still fails) and printed as it is found, ready to paste into a
    regression test.

    Stops after ``max_reported`` failures; ``progress_every`` seeds it prints the
    running ``stats`` (long mode). The one seed loop of the engine and node fuzzers.
    """
    failures: list[str] = []
    for seed in seeds:
        case = Generator(seed, mixed).case()
        failure = check(seed, case, stats)
        if failure is not None:
            scratch = dict(stats)  # shrinking re-runs cases: keep them out of the counts
            small = shrink(case, failure, lambda c: check(seed, c, scratch))  # noqa: B023
            failures.append(f"seed {seed}: {failure}\nshrunk case:\n{small.describe()}")
            print(failures[-1], flush=True)
            if len(failures) >= max_reported:
                break
        if progress_every and (seed + 1 - seeds.start) % progress_every == 0:
            print(f"seed {seed}: {stats}, {len(failures)} failing", flush=True)
    print(f"{label}: seeds {seeds.start}..{seeds.stop - 1} step {seeds.step}: {stats}")
    return failures
