"""The datalog-conformance corpus (plain-Datalog family) through the incremental engine.

Each runnable case is evaluated three ways: all facts in one epoch (must equal the
corpus' expected result), then a third of the facts deleted in one epoch (must
equal the batch evaluator on the remaining facts), then re-inserted (must equal
the expected result again) — real programs exercising retraction.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import yaml
from datalog_conformance import TestCase as CorpusCase
from datalog_conformance import get_tests_dir

from merklog.engine.batch import BatchEvaluator
from merklog.engine.conformance import check_case, program_from_case
from merklog.engine.errors import EngineError
from merklog.engine.incremental import IncrementalEngine

MAX_BYTES = 1_000_000  # the LUBM/HMMER files (50k-100k facts) belong to the benchmarks
MAX_FACTS = 20_000
MAX_FACTS_RETRACT = 3_000


def _load(path):
    """Cases of one corpus file, built as ``discover_yaml_tests`` does, parsed with libyaml."""
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", None))
    if raw is None:
        return []
    if not (isinstance(raw, dict) and "tests" in raw):
        return [CorpusCase.from_dict(raw)]
    out = []
    for entry in raw["tests"]:
        merged = dict(entry)
        for key in ("source", "verification"):
            if key not in merged and raw.get(key) is not None:
                merged[key] = raw[key]
        if raw.get("tags"):
            merged["tags"] = [*raw["tags"], *merged.get("tags", [])]
        out.append(CorpusCase.from_dict(merged))
    return out


def _discover():
    for family in ("basic", "negation", "recursion"):
        for path in sorted((get_tests_dir() / family).rglob("*.yaml")):
            if path.stat().st_size <= MAX_BYTES:
                for case in _load(path):
                    yield path, case


def _cases():
    out = []
    for path, case in _discover():
        if case.program is None or case.expect_error or case.skip or case.theory is not None:
            continue
        facts = sum(len(rows) for rows in case.program.facts.values())
        if facts > MAX_FACTS:
            continue
        try:  # the nemo_negation divergence is rejected statically (see test_conformance.py)
            check_case(program_from_case(case.program.facts, case.program.rules))
        except EngineError:
            continue
        out.append(pytest.param(case, id=f"{path.parent.name}/{case.name}"))
    return out


CASES = _cases()


def test_corpus_is_present() -> None:
    assert len(CASES) >= 50


@pytest.mark.parametrize("case", CASES)
def test_conformance_case_incrementally(case) -> None:
    prog = program_from_case(case.program.facts, case.program.rules)
    checked = check_case(prog)
    engine = IncrementalEngine(checked)
    engine.step()
    expected = {rel: {tuple(r) for r in rows} for rel, rows in (case.expect or {}).items()}
    for rel, rows in expected.items():
        assert engine.relation(rel) == rows, rel
    facts = list(dict.fromkeys((rel, tuple(args)) for rel, args in prog.facts))
    if not facts or len(facts) > MAX_FACTS_RETRACT:
        return
    rnd = random.Random(len(facts))
    gone = rnd.sample(facts, max(1, len(facts) // 3))
    deletes: dict[str, list] = {}
    for rel, row in gone:
        deletes.setdefault(rel, []).append(row)
    # The program's own facts hold at every epoch (docs/dataflow.md): deleting a stored
    # copy of one changes nothing.
    engine.step(deletes=deletes)
    for rel, rows in expected.items():
        assert engine.relation(rel) == rows, rel
    # Retraction, with the same facts given as base facts: an engine of the rules alone.
    rules_only = SimpleNamespace(
        strata=checked.strata,
        int_bits=checked.int_bits,
        program=dataclasses.replace(checked.program, facts=(), fact_positions=()),
    )
    engine = IncrementalEngine(rules_only)
    inserts: dict[str, list] = {}
    for rel, row in facts:
        inserts.setdefault(rel, []).append(row)
    engine.step(inserts=inserts)
    engine.step(deletes=deletes)
    remaining: dict[str, set] = {}
    for rel, row in set(facts) - set(gone):
        remaining.setdefault(rel, set()).add(row)
    strata = [list(s.rules) for s in checked.strata if not s.temporal]
    reference = BatchEvaluator(prog.rules, strata, checked.int_bits).evaluate(remaining)
    for rel in set(reference) | set(expected):
        assert engine.relation(rel) == set(reference.get(rel, set())), rel
    engine.step(inserts=deletes)
    for rel, rows in expected.items():
        assert engine.relation(rel) == rows, rel
