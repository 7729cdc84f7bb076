"""``merklog eval``: fact files in, TSV results out, exact field types, precise errors.

The TSV regression tests run the real command in a subprocess, as a user does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from merklog.node.cli import cli

TC = "path(X, Y) :- edge(X, Y).\npath(X, Y) :- path(X, Z), edge(Z, Y).\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, ["eval", *args])


def run_eval(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``merklog eval ARGS`` as its own process (stdout, stderr as text), in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "eval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_eval_writes_every_derived_relation_sorted(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC + "label(X, N) :- edge(X, _), name(X, N).\n")
    write(tmp_path / "facts" / "edge.facts", "3\t4\n1\t2\n2\t3\n")
    write(tmp_path / "facts" / "name.facts", "1\tone\n2\t2.5\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out), "--sorted")
    assert result.exit_code == 0, result.output
    assert (out / "path.csv").read_text() == "1\t2\n1\t3\n1\t4\n2\t3\n2\t4\n3\t4\n"
    # fields parse as int, else float, else string
    assert (out / "label.csv").read_text() == "1\tone\n2\t2.5\n"
    assert sorted(p.name for p in out.iterdir()) == ["label.csv", "path.csv"]


def test_eval_of_a_relation_with_no_facts_writes_an_empty_file(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC)
    (tmp_path / "facts").mkdir()
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "path.csv").read_text() == ""


def test_bad_program_reports_line_and_column_and_writes_nothing(tmp_path: Path) -> None:
    prog = write(tmp_path / "bad.dl", "ok(X) :- edge(X, _).\nbad(X, Y) :- edge(X, _).\n")
    write(tmp_path / "facts" / "edge.facts", "1\t2\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 1
    assert f"{prog}:2:" in result.output
    assert "Y" in result.output
    assert not out.exists()


def test_syntax_error_position(tmp_path: Path) -> None:
    prog = write(tmp_path / "bad.dl", "p(X) :- q(X)\n  r(X) :- q(X).\n")
    result = invoke(str(prog), "--facts", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert f"{prog}:2:3:" in result.output
    assert not (tmp_path / "out").exists()


def test_facts_with_wrong_arity_fail_cleanly(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC)
    write(tmp_path / "facts" / "edge.facts", "1\t2\t3\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 1
    assert "edge" in result.output
    assert not out.exists()


def test_a_stray_first_line_is_blamed_not_the_right_line_after_it(tmp_path: Path) -> None:
    """QA: a relation the program only reads takes its width from the file's first line,
    so a stray first line (a header ``a<TAB>b<TAB>c``) made eval blame line 2, which
    fits the program's ``edge/2``: ``2 fields, expected 3``. The first line is blamed."""
    prog = write(tmp_path / "tc.dl", TC)
    facts = tmp_path / "facts"
    out = tmp_path / "out"
    for first, width in (("a\tb\tc", 3), ("1", 1)):
        write(facts / "edge.facts", f"{first}\n1\t2\n2\t3\n")
        result = invoke(str(prog), "--facts", str(facts), "--out", str(out))
        assert result.exit_code == 1
        field = "field" if width == 1 else "fields"
        assert result.output.startswith(
            f"{facts / 'edge.facts'}:1:1: {width} {field}, but the program uses edge with 2"
            " arguments (as line 2 has)"
        ), result.output
        assert not out.exists()


SOUFFLE = """
.decl edge(x: symbol, y: symbol)
.input edge
.decl path(x: symbol, y: symbol)
.output path
.decl hops(x: symbol, n: number)
.output hops
.decl internal(x: symbol)
path(x, y) :- edge(x, y).
path(x, y) :- path(x, z), edge(z, y).
internal(x) :- path(x, _).
hops(x, n) :- internal(x), n = count : { path(x, _) }.
"""


def test_souffle_program_reads_inputs_and_writes_only_outputs(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", SOUFFLE)
    # typed per .decl: "10" stays the symbol "10", not a number
    write(tmp_path / "facts" / "edge.facts", "a\tb\nb\t10\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["hops.csv", "path.csv"]
    # Without --sorted the rows come in some order (which depends on the hash seed).
    assert sorted(lines(out / "path.csv")) == ["a\t10", "a\tb", "b\t10"]
    assert sorted(lines(out / "hops.csv")) == ["a\t2", "b\t1"]


def test_a_missing_souffle_input_file_is_an_error_and_an_empty_one_is_not(
    tmp_path: Path,
) -> None:
    """An ``.input`` relation without its ``.facts`` file read as empty, so a misspelt
    file name quietly derived less; Soufflé refuses it ("Cannot open fact file"). Now
    eval says which file is missing (exit 1, one line, nothing written); an empty file
    is still an empty relation."""
    prog = write(tmp_path / "p.dl", SOUFFLE)
    facts = tmp_path / "facts"
    facts.mkdir()
    write(facts / "Edge.facts", "a\tb\n")  # the wrong name
    out = tmp_path / "out"
    done = run_eval(str(prog), "--facts", str(facts), "--out", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"Error: {facts / 'edge.facts'}: no such file, for the program's .input edge"
        " (an empty file gives an empty relation)"
    ), done.stderr
    assert not out.exists()
    write(facts / "edge.facts", "")
    done = run_eval(str(prog), "--facts", str(facts), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert lines(out / "path.csv") == []


def test_souffle_dialect_forced_and_unsupported_construct(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", ".decl a(x: number)\n.output a\na(1).\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--out", str(out), "--facts", str(tmp_path), "--dialect", "souffle")
    assert result.exit_code == 0, result.output
    assert (out / "a.csv").read_text() == "1\n"
    bad = write(tmp_path / "bad.dl", ".decl a(x: number)\n.output a\na(x) :- x = @f(1).\n")
    result = invoke(str(bad), "--out", str(tmp_path / "o2"), "--facts", str(tmp_path))
    assert result.exit_code == 1
    assert f"{bad}:3:" in result.output
    assert not (tmp_path / "o2").exists()


# ----------------------------------------------------------------------------- exact TSV I/O


def test_without_sorted_the_rows_are_the_same_in_some_order(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC)
    write(tmp_path / "facts" / "edge.facts", "".join(f"{i}\t{i + 1}\n" for i in range(60, 0, -1)))
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "a"))
    assert run.returncode == 0, run.stderr
    run = run_eval(
        str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "b"), "--sorted"
    )
    assert run.returncode == 0, run.stderr
    unsorted, ordered = lines(tmp_path / "a" / "path.csv"), lines(tmp_path / "b" / "path.csv")
    assert len(ordered) == 61 * 60 // 2
    assert sorted(unsorted) == sorted(ordered)
    key = [tuple(int(f) for f in line.split("\t")) for line in ordered]
    assert key == sorted(key)


# Every field of one column: which are ints, floats, strings (merklog dialect).
FIELDS = [
    "5",
    "-7",
    "007",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",  # one past int64: a string
    "-9223372036854775809",
    "1_000",
    "\u0661\u0662",  # Arabic-Indic digits
    " 5 ",
    "5 ",
    "+5",
    "0x10",
    "1.0",
    "1",
    "-0.0",
    "2.5e3",
    "1e400",  # not a finite float: a string
    "inf",
    ".5",
    "",
]


def test_field_types_follow_the_ascii_int64_grammar(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", "all(X) :- p(X).\nnum(X + 0) :- p(X).\n")
    write(tmp_path / "facts" / "p.facts", "".join(f"{f}\tx\n" for f in FIELDS).replace("\tx", ""))
    # a one-column file: the empty field's line is an empty line, skipped
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 0, run.stderr
    # strings come back as written (untrimmed); numbers in their canonical form
    canonical = {"-0.0": "0.0", "007": "7", "2.5e3": "2500.0"}
    expected_all = {canonical.get(f, f) for f in FIELDS if f}
    assert set(lines(tmp_path / "o" / "all.csv")) == expected_all
    assert len(lines(tmp_path / "o" / "all.csv")) == len(expected_all)
    # arithmetic has a value only on numbers: exactly these fields are numbers
    assert set(lines(tmp_path / "o" / "num.csv")) == {
        "5",
        "-7",
        "7",
        "9223372036854775807",
        "-9223372036854775808",
        "1.0",
        "1",
        "0.0",
        "2500.0",
    }


def test_one_and_one_point_zero_stay_two_rows_and_floats_read_back(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", "q(X, Y) :- p(X, Y).\nd(X * 2) :- p(X, _).\n")
    write(tmp_path / "facts" / "p.facts", "1\ta\n1.0\ta\n2.5\tb\n1e16\tc\n")
    run = run_eval(
        str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"), "--sorted"
    )
    assert run.returncode == 0, run.stderr
    q = lines(tmp_path / "o" / "q.csv")
    assert sorted(q) == sorted(["1\ta", "1.0\ta", "2.5\tb", "1e+16\tc"])
    assert set(lines(tmp_path / "o" / "d.csv")) == {"2", "2.0", "5.0", "2e+16"}
    # the written file, read again, gives the same values back (no 1.0 -> 1 collapse)
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "p.facts").write_text((tmp_path / "o" / "q.csv").read_text())
    run = run_eval(
        str(prog), "--facts", str(tmp_path / "again"), "--out", str(tmp_path / "o2"), "--sorted"
    )
    assert run.returncode == 0, run.stderr
    assert lines(tmp_path / "o2" / "q.csv") == q
    assert set(lines(tmp_path / "o2" / "d.csv")) == {"2", "2.0", "5.0", "2e+16"}


def test_large_relations_take_the_columnar_path_with_the_same_types(tmp_path: Path) -> None:
    # 3,000 rows: above the columnar threshold; ints, floats and strings in separate files
    prog = write(
        tmp_path / "p.dl",
        "ints(X, Y) :- i(X, Y), Y > 5.\nfl(X, Y) :- f(X, Y).\nsym(X, Y) :- s(X, Y), s(Y, _).\n",
    )
    facts = tmp_path / "facts"
    write(facts / "i.facts", "".join(f"{n}\t{n % 10}\n" for n in range(3000)))
    write(facts / "f.facts", "".join(f"{n}\t{n}.0\n" for n in range(3000)))
    write(facts / "s.facts", "".join(f"n{n}\tn{n + 1}\n" for n in range(3000)))
    run = run_eval(str(prog), "--facts", str(facts), "--out", str(tmp_path / "o"), "--sorted")
    assert run.returncode == 0, run.stderr
    ints = lines(tmp_path / "o" / "ints.csv")
    assert len(ints) == 1200 and ints[0] == "6\t6"
    assert lines(tmp_path / "o" / "fl.csv")[:2] == ["0\t0.0", "1\t1.0"]
    sym = set(lines(tmp_path / "o" / "sym.csv"))
    assert len(sym) == 2999 and "n0\tn1" in sym and "n2999\tn3000" not in sym


def test_string_results_of_the_columnar_executor_are_written_decoded(tmp_path: Path) -> None:
    # 3,000 string edges (above the columnar threshold): a{i} -> b{i} -> c{i}
    prog = write(tmp_path / "tc.dl", TC)
    edges = "".join(f"a{i}\tb{i}\nb{i}\tc{i}\n" for i in range(1500))
    write(tmp_path / "facts" / "edge.facts", edges)
    for flag in ((), ("--sorted",)):
        out = tmp_path / f"o{len(flag)}"
        run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out), *flag)
        assert run.returncode == 0, run.stderr
        rows = lines(out / "path.csv")
        assert len(rows) == 3 * 1500
        assert {"a7\tb7", "b7\tc7", "a7\tc7"} <= set(rows) and "a7\tc8" not in rows
        if flag:
            assert rows == sorted(rows)  # strings in code point order


def test_nullary_output_is_written_as_parentheses(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", "ok() :- a(_).\nnope() :- a(2).\nalso :- flag().\n")
    write(tmp_path / "facts" / "a.facts", "1\n")
    write(tmp_path / "facts" / "flag.facts", "()\n")  # a nullary fact that holds
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "o" / "ok.csv").read_text() == "()\n"
    assert (tmp_path / "o" / "also.csv").read_text() == "()\n"
    assert (tmp_path / "o" / "nope.csv").read_text() == ""


SOUFFLE_NULLARY = """
.decl a(x: number)
.input a
.decl ok()
.output ok
.decl none()
.output none
.decl flag()
.input flag
.decl both()
.output both
ok() :- a(_).
none() :- a(2).
both() :- flag(), a(1).
"""


def test_souffle_nullary_output_matches_souffle(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", SOUFFLE_NULLARY)
    write(tmp_path / "facts" / "a.facts", "1\n")
    write(tmp_path / "facts" / "flag.facts", "()\n")
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "o" / "ok.csv").read_text() == "()\n"
    assert (tmp_path / "o" / "none.csv").read_text() == ""
    assert (tmp_path / "o" / "both.csv").read_text() == "()\n"


SOUFFLE_TYPED = """
.decl n(x: number, s: symbol)
.input n
.decl out(x: number, s: symbol)
.output out
out(x, s) :- n(x, s).
"""


def test_souffle_number_columns_read_as_souffle_reads_them(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", SOUFFLE_TYPED)
    # Soufflé's stoll skips leading white space and takes a sign; symbols stay verbatim
    write(tmp_path / "facts" / "n.facts", " 5\t 5 \n+6\t1_000\n-2147483648\t-0.0\n")
    run = run_eval(
        str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"), "--sorted"
    )
    assert run.returncode == 0, run.stderr
    assert lines(tmp_path / "o" / "out.csv") == ["-2147483648\t-0.0", "5\t 5 ", "6\t1_000"]


def test_souffle_number_outside_its_range_is_an_error_with_position(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", SOUFFLE_TYPED)
    for bad in ("9223372036854775808", "2147483648", "5 ", "1_000", "\u0665", "1.0"):
        facts = tmp_path / f"f{abs(hash(bad))}"
        write(facts / "n.facts", f"1\ta\n\n{bad}\tb\n")
        out = tmp_path / "o"
        run = run_eval(str(prog), "--facts", str(facts), "--out", str(out))
        assert run.returncode == 1, (bad, run.stderr)
        assert run.stderr.startswith(f"{facts / 'n.facts'}:3:1: column 1: "), run.stderr
        assert "Traceback" not in run.stderr
        assert not out.exists()


def test_ragged_fact_file_names_the_line(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", "q(X) :- p(X, _).\n")
    write(tmp_path / "facts" / "p.facts", "1\t2\n3\t4\n5\t6\t7\n")
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 1
    assert run.stderr.startswith(f"{tmp_path / 'facts' / 'p.facts'}:3:1: 3 fields, expected 2")
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "o").exists()


def test_fact_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", "q(X) :- p(X).\n")
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "p.facts").write_bytes(b"ok\nbad\xff\n")
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 1
    # the byte, as for a program file or `put -f` (docs/operations.md, "Exit status")
    assert run.stderr.startswith(
        f"{tmp_path / 'facts' / 'p.facts'}:2:4: not UTF-8 text (byte 0xff)\n"
    ), run.stderr
    assert "Traceback" not in run.stderr


def test_a_bad_byte_in_a_fact_file_is_at_its_character_column(tmp_path: Path) -> None:
    """After a two-byte ``é`` the column of a bad byte was counted in bytes (4), where
    every other column of a fact file counts characters (3)."""
    prog = write(tmp_path / "p.dl", "q(X) :- p(X, _).\n")
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "p.facts").write_bytes("é\tok\né\t".encode() + b"\xff\n")
    run = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert run.returncode == 1
    assert run.stderr.startswith(
        f"{tmp_path / 'facts' / 'p.facts'}:2:3: not UTF-8 text (byte 0xff)\n"
    ), run.stderr


def test_output_option_writes_only_the_named_relations(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", TC + "lone(X) :- edge(X, _), !path(_, X).\n")
    write(tmp_path / "facts" / "edge.facts", "1\t2\n2\t3\n")
    out = tmp_path / "o"
    run = run_eval(
        str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out), "--output", "lone"
    )
    assert run.returncode == 0, run.stderr
    assert [p.name for p in out.iterdir()] == ["lone.csv"]
    assert lines(out / "lone.csv") == ["1"]
    run = run_eval(
        str(prog),
        "--facts",
        str(tmp_path / "facts"),
        "--out",
        str(tmp_path / "o2"),
        "--output",
        "nope",
    )
    assert run.returncode == 1
    assert run.stderr.strip() == "Error: --output nope: the program has no relation nope"
    assert not (tmp_path / "o2").exists()


def test_eval_loads_no_node_or_network_machinery(tmp_path: Path) -> None:
    """``merklog eval`` imports only its own command: not the node config, the other
    command modules, the HTTP stack or Spark (they cost start-up on every run)."""
    prog = write(tmp_path / "p.dl", "q(X) :- p(X).\n")
    write(tmp_path / "facts" / "p.facts", "1\n")
    script = (
        "import sys\n"
        "from merklog.node.cli import run\n"
        "assert run(['eval', sys.argv[1], '--facts', sys.argv[2], '--out', sys.argv[3]]) == 0\n"
        "heavy = ['merklog.node.config', 'merklog.node.commands.put', 'aiohttp', 'pyspark',\n"
        "         'merklog.node.commands.spark_cmds', 'cryptography', 'rich']\n"
        "print(' '.join(m for m in heavy if m in sys.modules) or 'none')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(prog), str(tmp_path / "facts"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "none"
    assert lines(tmp_path / "o" / "q.csv") == ["1"]


def test_eval_ends_without_interpreter_teardown_and_keeps_its_output(tmp_path: Path) -> None:
    """The console entry ends ``merklog eval`` with ``os._exit`` (ADR 0107): results and
    messages are complete, the exit status is kept, and exit-time handlers (the
    teardown it skips) run only for commands that did not ask for it."""
    prog = write(tmp_path / "p.dl", TC)
    write(tmp_path / "facts" / "edge.facts", "1\t2\n2\t3\n")
    script = (
        "import atexit, sys\n"
        "from merklog.node.cli import main\n"
        "atexit.register(lambda: print('teardown', flush=True))\n"
        "sys.argv = ['merklog', *sys.argv[1:]]\n"
        "main()\n"
    )

    def entry(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
        )

    ok = entry("eval", str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert ok.returncode == 0, ok.stderr
    assert "teardown" not in ok.stdout
    assert ok.stderr.strip() == f"wrote 1 relation to {tmp_path / 'o'}"
    assert sorted(lines(tmp_path / "o" / "path.csv")) == ["1\t2", "1\t3", "2\t3"]
    bad = write(tmp_path / "bad.dl", "p(X) :- .\n")
    failed = entry("eval", str(bad), "--facts", str(tmp_path / "facts"))
    assert failed.returncode == 1
    assert failed.stderr.startswith(f"{bad}:1:")
    assert "teardown" not in failed.stdout
    other = entry("--version")
    assert other.returncode == 0
    assert "teardown" in other.stdout


def test_commands_load_numpy_with_one_blas_thread_unless_told(tmp_path: Path) -> None:
    """The command line sets ``OPENBLAS_NUM_THREADS=1`` before any command loads numpy
    (ADR 0109): OpenBLAS's worker threads spin at start-up and no command uses a BLAS
    routine. A value the user set is kept."""
    import os

    prog = write(tmp_path / "p.dl", "q(X) :- p(X).\n")
    write(tmp_path / "facts" / "p.facts", "1\n")
    version = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from merklog.node.cli import run; run(['--version'])"
            "; print(os.environ.get('OPENBLAS_NUM_THREADS'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"},
    )
    assert version.stdout.split()[-1] == "1"  # every command, not only eval
    script = (
        "import os, sys\n"
        "from merklog.node.cli import run\n"
        "assert 'numpy' not in sys.modules\n"
        "assert run(['eval', sys.argv[1], '--facts', sys.argv[2], '--out', sys.argv[3]]) == 0\n"
        "assert 'numpy' in sys.modules\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    args = [sys.executable, "-c", script, str(prog), str(tmp_path / "facts"), str(tmp_path / "o")]
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["1"]
    told = subprocess.run(
        args, capture_output=True, text=True, check=True, env={**env, "OPENBLAS_NUM_THREADS": "2"}
    )
    assert told.stdout.split() == ["2"]
    assert lines(tmp_path / "o" / "q.csv") == ["1"]


def test_a_facts_directory_that_is_missing_or_a_file_is_one_usage_line(tmp_path: Path) -> None:
    """Both are a bad --facts value: exit 2 and click's line, as a missing PROGRAM is (a
    missing folder said ``error:`` and exited 1, one that is a file ``Error:`` and 2)."""
    program = tmp_path / "p.dl"
    program.write_text("q(X) :- p(X).\n")
    (tmp_path / "afile").write_text("")
    for given, why in (("nope", "does not exist"), ("afile", "is a file")):
        done = run_eval(
            str(program), "--facts", str(tmp_path / given), "--out", str(tmp_path / "o")
        )
        assert done.returncode == 2
        assert done.stderr.strip() == (
            f"Error: Invalid value for '--facts': Directory '{tmp_path / given}' {why}."
            " (see `merklog eval --help`)"
        )
    assert not (tmp_path / "o").exists()


def test_an_empty_path_is_refused_not_taken_for_the_current_directory(tmp_path: Path) -> None:
    """``Path("")`` is ``Path(".")``: ``--out ''`` wrote the results into the working
    directory, ``--facts ''`` read it."""
    program = tmp_path / "p.dl"
    program.write_text("q(1).\n")
    work = tmp_path / "work"
    work.mkdir()
    for option in ("--out", "--facts"):
        done = run_eval(str(program), option, "", cwd=work)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (
            f"Error: Invalid value for '{option}': is empty: name a file or directory"
            " (see `merklog eval --help`)"
        )
    assert list(work.iterdir()) == []


def test_a_fact_file_row_that_misfits_its_decl_is_named_by_file_and_line(tmp_path: Path) -> None:
    """The message had no place in the file (``error: f("abc") does not fit…``)."""
    program = tmp_path / "p.dl"
    program.write_text(".decl f(x: int, y: str).\ng(X) :- f(X, _).\n")
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "f.facts").write_text('1\ta\n\n2\tb\n3\t"c"\nabc\td\n')  # line 5 misfits
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f'{facts / "f.facts"}:5:1: f("abc", "d") does not fit'), (
        done.stderr
    )
    assert not (tmp_path / "o").exists()


def test_a_fact_file_of_another_arity_than_a_written_relation_is_refused(tmp_path: Path) -> None:
    """``path.facts`` of 3 fields for a derived path/2 (or ``edge.facts`` for an edge/2
    with inline facts) printed ``Error: zip() argument 2 is longer than argument 1`` and
    left an empty result file behind."""
    facts = tmp_path / "facts"
    write(facts / "edge.facts", "1\t2\n")
    write(facts / "path.facts", "1\t2\t3\n")
    program = write(tmp_path / "p.dl", "path(X, Y) :- edge(X, Y).\n")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        f"{facts / 'path.facts'}:1:1: 3 fields, but the program uses path with 2 arguments"
    ), done.stderr
    assert not (tmp_path / "o").exists()

    write(facts / "edge.facts", "7\t8\t9\n")
    program = write(tmp_path / "q.dl", "edge(1, 2).\npath(X, Y) :- edge(X, Y).\n")
    (facts / "path.facts").unlink()
    out = tmp_path / "o2"
    done = run_eval(str(program), "--facts", str(facts), "--out", str(out), "--output", "edge")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        f"{facts / 'edge.facts'}:1:1: 3 fields, but the program uses edge"
    )
    assert not out.exists()


def _file_size_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def test_a_failed_write_names_the_file_and_leaves_the_outputs_as_they_were(
    tmp_path: Path,
) -> None:
    """A write failure left the other relations' new files behind and printed
    ``error: [Errno 28] No space left on device`` (no file named)."""
    facts = tmp_path / "facts"
    write(facts / "e.facts", "".join(f"{n}\n" for n in range(300)))
    program = write(tmp_path / "p.dl", "a(X) :- e(X).\nb(X, Y) :- e(X), e(Y).\n")
    out = tmp_path / "out"
    write(out / "a.csv", "old\n")
    # b.csv (90,000 rows) outgrows the file size limit: the write fails with EFBIG
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "merklog.node.cli",
            "eval",
            str(program),
            "--facts",
            str(facts),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_file_size_limit,
    )
    assert done.returncode == 6, done.stderr  # the disk-full status
    assert done.stderr.strip() == f"Error: {out / 'b.csv'}: File too large"
    assert sorted(p.name for p in out.iterdir()) == ["a.csv"]
    assert (out / "a.csv").read_text() == "old\n"

    (out / "b.csv").mkdir()  # a directory in the way
    done = run_eval(str(program), "--facts", str(facts), "--out", str(out))
    assert done.returncode == 1
    assert done.stderr.strip() == f"Error: {out / 'b.csv'}: Is a directory"
    assert sorted(p.name for p in out.iterdir()) == ["a.csv", "b.csv"]
    assert (out / "a.csv").read_text() == "old\n"

    # QA: the folders a failed run made were left behind, empty
    fresh = tmp_path / "new" / "sub"
    done = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "eval", str(program), "--facts", str(facts),
         "--out", str(fresh)],
        capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit,
    )  # fmt: skip
    assert done.returncode == 6, done.stderr
    assert not (tmp_path / "new").exists()


def test_an_interrupt_while_the_outputs_are_written_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """QA: Ctrl-C (or SIGTERM, or running out of memory) while the results were written
    left the partial temporaries (``.j.csv.<hex>.tmp``, 9 MB) in OUT: only an OSError
    removed them. The interrupt itself cannot be timed from outside, so it is raised
    where the writing is."""
    from merklog.node.commands.eval_cmd import _write_all

    out = tmp_path / "made" / "out"

    def write_until(stop: type[BaseException]) -> Callable[[str, Path], None]:
        def write_partly(rel: str, path: Path) -> None:
            path.write_text("partial\n")
            if rel == "b":
                raise stop

        return write_partly

    with pytest.raises(KeyboardInterrupt):
        _write_all(out, ["a", "b", "c"], write_until(KeyboardInterrupt))
    assert not (tmp_path / "made").exists()
    kept = tmp_path / "kept"
    write(kept / "a.csv", "old\n")
    with pytest.raises(MemoryError):
        _write_all(kept, ["a", "b"], write_until(MemoryError))
    assert sorted(p.name for p in kept.iterdir()) == ["a.csv"]
    assert (kept / "a.csv").read_text() == "old\n"


def test_a_directory_named_like_a_fact_file_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "facts" / "e.facts").mkdir(parents=True)
    program = write(tmp_path / "p.dl", "a(X) :- e(X).\n")
    done = run_eval(str(program), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert done.returncode == 1
    assert done.stderr.strip() == f"Error: {tmp_path / 'facts' / 'e.facts'}: Is a directory"
    assert not (tmp_path / "o").exists()


def test_a_fact_file_link_that_loops_or_cannot_be_read_is_named(tmp_path: Path) -> None:
    """QA: a link ``e.facts -> e.facts`` was read as no facts (exit 0, nothing derived),
    and a fact file whose read fails (``/proc/self/mem``: EIO) said only ``Error:
    Input/output error``. A dangling link is still no facts, as documented."""
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "e.facts").symlink_to("e.facts")
    program = write(tmp_path / "p.dl", "a(X) :- e(X).\n")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"Error: {facts / 'e.facts'}: Too many levels of symbolic links"
    (facts / "e.facts").unlink()
    (facts / "e.facts").symlink_to("/proc/self/mem")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode != 0 and done.stderr.strip().startswith(
        f"Error: {facts / 'e.facts'}: "
    ), done.stderr
    (facts / "e.facts").unlink()
    (facts / "e.facts").symlink_to("nowhere.facts")  # dangling: no facts
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o" / "a.csv").read_text() == ""


def test_a_fact_file_holding_only_a_byte_order_mark_is_empty(tmp_path: Path) -> None:
    """It was read as one fact whose value is the BOM (``edge has arity 1`` for edge/2)."""
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "u.facts").write_bytes(b"\xef\xbb\xbf")
    (facts / "e.facts").write_bytes(b"\xef\xbb\xbf")
    (facts / "n.facts").write_bytes(b"\xef\xbb\xbf")
    program = write(tmp_path / "p.dl", "q(X) :- u(X).\nr(X) :- e(X, _).\ns() :- n().\n")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    for rel in ("q", "r", "s"):
        assert (tmp_path / "o" / f"{rel}.csv").read_bytes() == b""


def test_a_decl_misfit_in_a_fact_file_is_reported_at_its_field(tmp_path: Path) -> None:
    """It was reported at column 1 (``edge.facts:2:1:``) for a misfit in the second field."""
    facts = tmp_path / "facts"
    write(facts / "edge.facts", "1\t2\nábc\t4.0\n")
    program = write(tmp_path / "p.dl", ".decl edge(src: any, dst: int).\np(X, Y) :- edge(X, Y).\n")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 1
    assert done.stderr.startswith(f'{facts / "edge.facts"}:2:5: edge("ábc", 4.0) does not fit')
    assert not (tmp_path / "o").exists()


def test_a_fact_file_of_ints_alone_is_checked_against_its_decl_too(tmp_path: Path) -> None:
    """QA: ``1\t2`` under ``.decl edge(a: float, b: int)`` was refused only when another
    row of the file was not all ints: a file of ints alone became an int64 matrix, which
    the check skipped, and rules matching ``1.0`` found nothing. The same in the API:
    an int matrix passed a ``str`` column."""
    import numpy as np

    from merklog.engine.errors import DeclarationError
    from merklog.engine.program import Program

    facts = tmp_path / "facts"
    write(facts / "edge.facts", "1\t2\n3\t4\n")
    program = write(tmp_path / "p.dl", ".decl edge(a: float, b: int).\np(X) :- edge(X, _).\n")
    done = run_eval(str(program), "--facts", str(facts), "--out", str(tmp_path / "o"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"{facts / 'edge.facts'}:1:1: edge(1, 2) does not fit")
    assert not (tmp_path / "o").exists()
    typed = Program.parse(".decl edge(a: str, b: int).\np(X) :- edge(X, _).")
    with pytest.raises(DeclarationError, match="column a of edge is str"):
        typed.evaluate({"edge": np.array([[1, 2]], dtype=np.int64)})
    loose = Program.parse(".decl edge(a: int, b: any).\np(X) :- edge(X, _).")
    assert sorted(loose.evaluate({"edge": np.array([[1, 2]], dtype=np.int64)})["p"]) == [(1,)]


def test_python_values_that_are_no_merklog_value_are_refused_by_evaluate() -> None:
    """QA: ``Program.evaluate`` took NaN (two NaN facts made two rows and ``count`` 2),
    infinities and ints outside int64 (a CID of one failed in the DAG-CBOR encoder with
    a raw ValueError), and a 1-D numpy array raised a bare IndexError."""
    import math

    import numpy as np

    from merklog.engine.errors import NotAValueError
    from merklog.engine.program import Program

    prog = Program.parse("w(X) :- v(X).\nc(N) :- N := count : v(_).")
    for rows, said in (
        ([(math.nan,), (math.nan,)], "float nan is not finite"),
        ([(1.0,), (-math.inf,)], "float -inf is not finite"),
        ([(2**63,)], "int 9223372036854775808 is outside int64"),
        ([(-(2**63) - 1,)], "int -9223372036854775809 is outside int64"),
        (np.array([1, 2]), "a numpy array of facts has 2 dimensions (one row per fact), not 1"),
        (np.array([[math.nan]]), "float nan is not finite"),
    ):
        with pytest.raises(NotAValueError, match=re.escape(f"facts for v: {said}")):
            prog.evaluate({"v": rows})
    fine = prog.evaluate({"v": [(2**63 - 1,), (-(2**63),), (1,), (1.0,), (True,)]})
    assert fine["c"] == {(5,)}
    assert sorted(prog.evaluate({"v": np.array([[1.5], [2.0]])})["w"]) == [(1.5,), (2.0,)]


def test_a_body_of_a_thousand_literals_is_a_program_error_not_an_internal_one(
    tmp_path: Path,
) -> None:
    """It raised RecursionError in the closure chain: exit 70, ``internal error``."""
    program = write(tmp_path / "p.dl", "p(1).\nq(X) :- p(X)" + ", p(X)" * 999 + ".\n")
    (tmp_path / "facts").mkdir()
    done = run_eval(str(program), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"{program}:2:1545: this body has more than 256 literals")
    assert not (tmp_path / "o").exists()


def test_souffle_string_constraints_are_named_as_unsupported(tmp_path: Path) -> None:
    """``match``/``contains`` are Soufflé keywords, not relations: eval names the
    construct instead of asking to declare a relation called ``match``."""
    write(tmp_path / "facts" / "e.facts", "1\tab\n")
    for name, literal, col in (
        ("match", 'match("a.*", y)', 18),
        ("contains", '!contains("a", y)', 19),
    ):
        prog = write(
            tmp_path / f"{name}.dl",
            ".decl e(x: number, y: symbol)\n.input e\n.decl p(x: number)\n.output p\n"
            f"p(x) :- e(x, y), {literal}.\n",
        )
        result = run_eval(
            str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o")
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith(
            f"{prog}:5:{col}: unsupported Soufflé construct: string constraint {name}(…)\n"
        ), result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "o").exists()


def test_a_str_column_of_a_merklog_decl_reads_its_field_as_written(tmp_path: Path) -> None:
    """``.decl label(n: int, text: str).`` reads ``42`` in the text column as the string
    "42", as Soufflé's ``symbol`` column does: by the untyped field grammar it would be
    the int 42, and the declaration would refuse a file that cannot be written any other
    way. The int column and undeclared relations keep the grammar."""
    prog = write(
        tmp_path / "p.dl",
        ".decl label(n: int, text: str).\n"
        "out(N, T) :- label(N, T).\n"
        'is42(N) :- label(N, "42").\n'
        "c(K) :- K := count : label(_, _).\n"
        "num(X) :- other(X).\n",
    )
    write(tmp_path / "facts" / "label.facts", "1\t42\n2\t007\n3\t1.5\n4\t 5 \n5\t1e999\n6\tx\n")
    write(tmp_path / "facts" / "other.facts", "42\n")
    out = tmp_path / "out"
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out), "--sorted")
    assert result.returncode == 0, result.stderr
    assert lines(out / "out.csv") == ["1\t42", "2\t007", "3\t1.5", "4\t 5 ", "5\t1e999", "6\tx"]
    assert lines(out / "is42.csv") == ["1"]
    assert lines(out / "c.csv") == ["6"]
    assert lines(out / "num.csv") == ["42"]
    # an int column still refuses text, at its field
    write(tmp_path / "facts" / "label.facts", "1\ta\nx\tb\n")
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{tmp_path / 'facts' / 'label.facts'}:2:1: "), result.stderr


def test_a_misfit_in_an_unsigned_column_gets_a_grammatical_hint(tmp_path: Path) -> None:
    prog = write(
        tmp_path / "u.dl",
        ".decl e(x: unsigned)\n.input e\n.decl p(x: unsigned)\n.output p\np(x) :- e(x).\n",
    )
    write(tmp_path / "facts" / "e.facts", "1\nx\n")
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{tmp_path / 'facts' / 'e.facts'}:2:1: column 1: cannot read 'x' as an unsigned",
        "  hint: an unsigned column takes ASCII decimal digits with an optional sign",
    ]


def test_bool_bytes_and_cid_columns_of_a_merklog_decl_read_what_eval_writes(
    tmp_path: Path,
) -> None:
    """eval writes bools as ``true``/``false``, bytes as hex and CIDs as text; a merklog
    ``.decl`` column of that type reads the same text back as the value (by the untyped
    grammar each is a string, which the declaration refuses, so no file could give one).
    Each stays distinct from the string, int and float that print alike."""
    facts, out, back = tmp_path / "facts", tmp_path / "out", tmp_path / "back"
    make = write(
        tmp_path / "make.dl",
        'v(true, x"01", 1). v(false, x"ab", 2). v(true, x"", 3).\n'
        "w(B, X, C) :- v(B, X, N), C := v(B, X, N).\n",
    )
    facts.mkdir()
    result = run_eval(str(make), "--facts", str(facts), "--out", str(out), "--sorted")
    assert result.returncode == 0, result.stderr
    written = lines(out / "w.csv")
    assert [row.split("\t")[:2] for row in written] == [
        ["false", "ab"],
        ["true", ""],
        ["true", "01"],
    ]
    write(back / "w.facts", (out / "w.csv").read_text(encoding="utf-8"))
    write(back / "s.facts", "true\n1\n01\n")
    read = write(
        tmp_path / "read.dl",
        ".decl w(b: bool, x: bytes, c: cid).\n"
        "cnt(K) :- K := count : w(_, _, _).\n"
        "t(X) :- w(true, X, _).\n"
        'one(C) :- w(_, x"01", C).\n'
        "clash(V) :- w(V, _, _), s(V).\n"
        "clash(V) :- w(_, V, _), s(V).\n"
        "same(C) :- w(B, X, C), C := v(B, X, _).\n"
        'v(true, x"01", 1). v(false, x"ab", 2). v(true, x"", 3).\n',
    )
    result = run_eval(str(read), "--facts", str(back), "--out", str(tmp_path / "o2"), "--sorted")
    assert result.returncode == 0, result.stderr
    o2 = tmp_path / "o2"
    assert lines(o2 / "cnt.csv") == ["3"]
    assert lines(o2 / "t.csv") == ["", "01"]  # x"" and x"01"
    assert lines(o2 / "one.csv") == [written[2].split("\t")[2]]
    assert lines(o2 / "clash.csv") == []  # true is no "true", x"01" no 1
    assert sorted(lines(o2 / "same.csv")) == sorted(row.split("\t")[2] for row in written)
    # a field that is not one is refused at its line and column, naming the type
    write(back / "w.facts", written[0] + "\n" + "yes\t01\t" + written[0].split("\t")[2] + "\n")
    result = run_eval(str(read), "--facts", str(back), "--out", str(tmp_path / "o3"))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"{back / 'w.facts'}:2:1: column 1: cannot read 'yes' as a bool"
    )
    for bad, col, kind in (("0g", 6, "bytes"), ("abc", 6, "bytes")):
        write(back / "w.facts", f"true\t{bad}\t{written[0].split(chr(9))[2]}\n")
        result = run_eval(str(read), "--facts", str(back), "--out", str(tmp_path / "o3"))
        assert result.returncode == 1
        assert result.stderr.startswith(f"{back / 'w.facts'}:1:{col}: column 2: "), result.stderr
        assert kind in result.stderr
    write(back / "w.facts", "true\t01\tbafynotacid\n")
    result = run_eval(str(read), "--facts", str(back), "--out", str(tmp_path / "o3"))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{back / 'w.facts'}:1:9: column 3: "), result.stderr
    assert not (tmp_path / "o3").exists()


def test_a_read_relation_of_another_arity_names_its_fact_file(tmp_path: Path) -> None:
    """A comma-separated file is one field a line: the error at the atom names the file
    the arity came from and says fields are separated by tabs (and "1 argument", not
    "1 arguments", as every arity message)."""
    prog = write(tmp_path / "p.dl", "p(X, Y) :- e(X, Y).\n")
    write(tmp_path / "facts" / "e.facts", "1,2\n3,4\n")
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    first, hint = result.stderr.splitlines()
    assert first == f"{prog}:1:12: e has arity 1 in {tmp_path / 'facts' / 'e.facts'} and 2 here"
    assert hint == (
        "  hint: a relation is its name and arity: read e with 1 argument;"
        " a fact file's fields are separated by tabs"
    )
    assert not (tmp_path / "o").exists()
    # a relation the program defines with one argument, and a file of two fields
    prog = write(tmp_path / "q.dl", "q(X) :- e(X, _).\nq(7).\n")
    write(tmp_path / "facts" / "q.facts", "1\t2\n")
    write(tmp_path / "facts" / "e.facts", "1\t2\n")
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"{tmp_path / 'facts' / 'q.facts'}:1:1: 2 fields, but the program uses q with 1 argument\n"
    ), result.stderr
    # two uses of one name with different arities
    prog = write(tmp_path / "r.dl", "r(X) :- e(X, _).\nr(X, Y) :- e(X, Y).\n")
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert "use r with 1 argument everywhere" in result.stderr, result.stderr


def _eval_under_limit(
    address_space: int, prog: Path, tmp_path: Path
) -> subprocess.CompletedProcess:
    """``merklog eval PROG --facts TMP/facts --out TMP/o`` in a process whose address space
    is at most ``address_space`` bytes (``ulimit -v``), so running out of memory is certain."""
    limit = (
        "import resource, runpy, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
        "sys.argv = ['merklog', *sys.argv[1:]]\n"
        "runpy.run_module('merklog.node.cli', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", limit, "eval", str(prog), "--facts", str(tmp_path / "facts")]
        + ["--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_result_too_large_for_memory_is_no_internal_error(tmp_path: Path) -> None:
    """A program whose result does not fit in memory (2000⁴ rows here, under a 3 GiB
    address-space limit so the refusal is certain) is not a bug to report: eval says it
    ran out of memory, or that the join would take it past its memory budget before
    building its output (ADR 0210), and exits 1, the operation could not be done."""
    prog = write(tmp_path / "big.dl", "q(A, B, C, D) :- n(A), n(B), n(C), n(D).\n")
    write(tmp_path / "facts" / "n.facts", "".join(f"{i}\n" for i in range(2000)))
    result = _eval_under_limit(3 << 30, prog, tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(
        ("Error: out of memory (", "Error: the evaluation stopped before a join")
    ), result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("gib", [1.5, 2.0])
def test_running_out_of_memory_in_the_tuple_evaluator_is_one_line(tmp_path: Path, gib) -> None:
    """Arithmetic in a rule runs the per-tuple evaluator: out of memory there, the error
    boundary's own lazy import failed too ("can't allocate lock") and ~100 lines of
    chained tracebacks came out under ``ulimit -v`` of 1.5 and 2 GB (1.3 GB gave the one
    line). The boundary now handles a MemoryError without importing anything."""
    prog = write(tmp_path / "p.dl", "x(A, B + 1) :- e(A), e(B).\n")
    write(tmp_path / "facts" / "e.facts", "".join(f"{i}.5\n" for i in range(1, 4001)))
    result = _eval_under_limit(int(gib * 1e9), prog, tmp_path)
    assert result.returncode == 1, result.stderr
    said = result.stderr.splitlines()
    # Either the allocation failed (one line), or the join's own check stopped it first
    # (its line and hint): the rule's join checks the budget as it goes.
    if said[0].startswith("Error: the evaluation stopped in a join"):
        assert len(said) == 2 and said[1].startswith("  hint: a join of large"), said
    else:
        assert said[0].startswith("Error: out of memory") and len(said) == 1, said[:20]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_relation_negating_itself_is_said_so(tmp_path: Path) -> None:
    """The hint said "p depends negatively on p, which depends on p"."""
    prog = write(tmp_path / "p.dl", "p(X) :- e(X), !p(X).\n")
    (tmp_path / "facts").mkdir()
    result = run_eval(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{prog}:1:15: negation or aggregation through recursion: p -> p",
        "  hint: p depends negatively on itself; negate or aggregate only relations computed"
        " in an earlier stratum",
    ]


@pytest.mark.parametrize("length", [235, 250])
def test_relation_names_as_long_as_the_language_allows_are_evaluated(
    tmp_path: Path, length: int
) -> None:
    """QA: a 235-character relation name failed with "File name too long" (the temporary
    output ``.<rel>.csv.<hex>.tmp`` did not fit where ``<rel>.csv`` does), and a
    250-character one failed looking for its ``<rel>.facts`` (a name too long for the
    file system names no file: no facts)."""
    name = "a" + "b" * (length - 1)
    program = write(tmp_path / "prog.dl", f"p(1). p(2.0). {name}(X) :- p(X).\n")
    done = invoke(str(program), "--facts", str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.exit_code == 0, done.output
    assert sorted(lines(tmp_path / "o" / f"{name}.csv")) == ["1", "2.0"]
    assert [p.name for p in (tmp_path / "o").iterdir()] == [f"{name}.csv"]  # no leftovers


def test_a_fact_file_that_never_ends_stops_at_the_memory_budget(tmp_path: Path) -> None:
    """QA: ``edge.facts`` a link to /dev/zero grew eval to 22 GB within 20 s, until the
    kernel killed it, whatever ``--memory-mb`` said: the budget covered the evaluation
    only. A file that is no regular one is read in steps checked against the budget;
    one line, exit 1, nothing written. (The process runs under a 4 GB address-space
    limit, so a regression fails here instead of taking the machine.)"""
    import resource

    prog = write(tmp_path / "tc.dl", TC)
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "edge.facts").symlink_to("/dev/zero")
    out = tmp_path / "out"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "eval", str(prog), "--facts", str(facts),
         "--out", str(out), "--memory-mb", "300"],
        capture_output=True, text=True, timeout=120, preexec_fn=limited,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"Error: reading {facts / 'edge.facts'} grew this process")
    assert "Traceback" not in done.stderr and not out.exists()


def test_small_eval_messages_say_what_is_wrong(tmp_path: Path) -> None:
    """QA: ``.input e(IO=stdin)`` said "unsupported … I/O parameter IO" (IO is supported,
    stdin is not); ``--output pth`` gave no suggestion where the other unknown-relation
    errors do; and a program file starting with a byte order mark put every error of its
    first line one column right."""
    facts = tmp_path / "facts"
    facts.mkdir()
    souffle = write(
        tmp_path / "io.dl",
        ".decl e(x: number)\n.input e(IO=stdin)\n.decl p(x: number)\n.output p\np(x) :- e(x).\n",
    )
    result = invoke(str(souffle), "--facts", str(facts), "--out", str(tmp_path / "o1"))
    assert result.exit_code == 1
    assert result.output.startswith(
        f"{souffle}:2:13: unsupported Soufflé construct: I/O parameter IO=stdin"
    ), result.output
    prog = write(tmp_path / "tc.dl", TC)
    result = invoke(
        str(prog), "--facts", str(facts), "--out", str(tmp_path / "o2"), "--output", "pth"
    )
    assert result.exit_code == 1
    assert "no relation pth (did you mean path?)" in result.output
    bom = tmp_path / "bom.dl"
    bom.write_bytes("\ufeffpath(X, Y) :- edge(X, Y)\n".encode())
    result = invoke(str(bom), "--facts", str(facts), "--out", str(tmp_path / "o3"))
    assert result.exit_code == 1
    assert result.output.startswith(f"{bom}:1:25: "), result.output  # 24 characters, then
