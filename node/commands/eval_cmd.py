"""``merklog eval PROGRAM --facts DIR --out DIR``: batch-evaluate a program over fact files.

Reads ``<rel>.facts`` (tab-separated, one tuple a line) and writes ``<rel>.csv``
(tab-separated, no header; sorted with ``--sorted``) for every derived relation —
for Soufflé programs, the ``.input`` and ``.output`` relations, typed per ``.decl``.
A merklog ``.decl``'s ``str`` columns are read as written, like Soufflé's ``symbol``;
its ``bool``, ``bytes`` and ``cid`` columns read what eval writes for those values.
Files are read and written as columns (:mod:`merklog.engine.tsv`). A bad program
or fact file prints ``FILE:line:col: message`` on stderr, exits 1 and writes nothing;
results are written all or nothing (temporary files renamed when every one is written).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from merklog.node.clipath import GivenPath


def register(cli: click.Group) -> None:
    @cli.command("eval")
    @click.argument("program", type=GivenPath(exists=True, dir_okay=False, path_type=Path))
    @click.option(
        "--facts",
        "facts_dir",
        type=GivenPath(exists=True, file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Directory of <rel>.facts input files: tab-separated, one tuple a line, no "
        "header, no quoting (a relation without a file has no facts; for a Soufflé "
        "program's .input relations a missing file is an error, as in Soufflé).",
    )
    @click.option(
        "--out",
        "out_dir",
        type=GivenPath(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Directory to write <rel>.csv results into (created if missing).",
    )
    @click.option(
        "--dialect",
        type=click.Choice(["auto", "merklog", "souffle"]),
        default="auto",
        show_default=True,
        help="Program syntax; auto picks souffle for Soufflé's directives (.type, .input,"
        " .output, or a .decl without a final period; a .decl ending in '.' is merklog's).",
    )
    @click.option(
        "--sorted",
        "sort",
        is_flag=True,
        help="Write each result file's rows sorted (bools, then ints and floats by value, "
        "then strings, bytes, CIDs); without it the row order is unspecified.",
    )
    @click.option(
        "--output",
        "only",
        multiple=True,
        metavar="REL",
        help="Write only this relation (repeatable; default: every derived relation, "
        "for Soufflé programs the .output ones).",
    )
    @click.option(
        "--memory-mb",
        type=click.IntRange(min=0),
        default=0,
        envvar="MERKLOG_EVAL_MEMORY_MB",
        show_envvar=True,
        metavar="MB",
        help="Stop the evaluation once this process uses more than MB MiB of memory"
        " (checked every fixpoint round; 0: half the machine's memory). A recursion that"
        " derives new values every round, such as a counter over a cycle, then fails with"
        " a clear error instead of exhausting the machine.",
    )
    def eval_(
        program: Path,
        facts_dir: Path,
        out_dir: Path,
        dialect: str,
        sort: bool,
        only: tuple[str, ...],
        memory_mb: int,
    ) -> None:
        """Evaluate PROGRAM over the fact files in --facts; write results to --out."""
        from merklog.engine.ast import body_atoms
        from merklog.engine.errors import EngineError, FactFileError
        from merklog.engine.interrupt import memory_budget
        from merklog.engine.program import Program
        from merklog.engine.tsv import fact_file_present, read_facts_dir, write_relation

        from ..cli import end_without_teardown

        # Every file this command writes is closed before it returns, and it starts no
        # thread or connection: the process may end without interpreter teardown.
        end_without_teardown()

        def fail(message: str) -> None:
            click.echo(message, err=True)
            sys.exit(1)

        from merklog.node.errors import NodeInputError
        from merklog.node.files import read_text_file

        try:
            text = read_text_file(program)
        except NodeInputError as exc:  # eval's own convention: FILE:LINE:COL, exit 1
            fail(str(exc))
            return
        try:
            prog = Program.parse(text, dialect=dialect)
        except EngineError as err:
            fail(f"{program}:{err}")
            return
        unknown = [rel for rel in only if rel not in prog.arities]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], sorted(prog.arities), n=1)
            fail(
                f"Error: --output {unknown[0]}: the program has no relation {unknown[0]}"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
        ast = prog.ast
        budget = memory_mb * 1024 * 1024 if memory_mb else None
        # Reading the facts counts too: a fact file that never ends (/dev/zero) grew the
        # process until the kernel killed it, whatever --memory-mb said (QA).
        with memory_budget(budget, "--memory-mb, MERKLOG_EVAL_MEMORY_MB"):
            try:
                if prog.dialect == "souffle":
                    missing = [
                        r for r in ast.inputs if not fact_file_present(facts_dir / f"{r}.facts")
                    ]
                    if missing:
                        # Soufflé refuses a missing input file too ("Cannot open fact file"):
                        # read as empty, a misspelt file name would quietly derive less.
                        fail(
                            f"Error: {facts_dir / (missing[0] + '.facts')}: no such file, for the"
                            f" program's .input {missing[0]} (an empty file gives an empty"
                            " relation)"
                        )
                    types = {d.rel: [t for _n, t in d.columns] for d in ast.declarations}
                    facts = read_facts_dir(facts_dir, ast.inputs, types, None, prog.int_bits)
                    outputs = list(ast.outputs)
                else:
                    # Only files of relations the program uses: others cannot change a result.
                    known = sorted(
                        r for r in prog.arities if fact_file_present(facts_dir / f"{r}.facts")
                    )
                    # A file's first line gives its arity; the program then checks it (a
                    # mismatch is reported at the atom). Nullary relations hold on any line.
                    rest = {
                        atom.rel
                        for rule in ast.rules
                        for lit in rule.body
                        for atom, _pol in body_atoms(lit)
                        if atom.rest
                    }
                    nullary = {r: 0 for r in known if prog.arities[r] == 0 and r not in rest}
                    # A relation the program defines (a rule head, an inline fact, a .decl) has
                    # the program's arity: a file of another one is refused at FILE:LINE:1
                    # (set aside, its facts would vanish or be written as mixed-width lines).
                    defined = _defined(prog)
                    sizes = {r: prog.arities[r] for r in known if r in defined} | nullary
                    uses = {r: prog.arities[r] for r in known if r not in sizes and r not in rest}
                    facts = read_facts_dir(
                        facts_dir, known, _field_kinds(prog), sizes, prog.int_bits, uses
                    )
                    outputs = sorted(prog.idb)
                if only:
                    outputs = list(dict.fromkeys(only))
                _check_declared(prog, facts_dir, facts, fail)
                relations = prog.evaluate(facts)
            except FactFileError as err:
                fail(f"{err.path}:{err}")
                return
            except EngineError as err:  # edge.facts has 2 columns but the program reads edge/1, …
                fail(
                    f"{program}:{_naming_fact_file(err, facts_dir)}"
                    if err.line
                    else f"Error: {err}"
                )
                return
            except OSError as err:  # a fact file that is a directory, unreadable, …
                raise _file_failure(err) from None
            except ValueError as err:
                fail(f"Error: {err}")
                return
        _write_all(out_dir, outputs, lambda rel, path: write_relation(path, relations, rel, sort))
        what = "1 relation" if len(outputs) == 1 else f"{len(outputs)} relations"
        click.echo(f"wrote {what} to {out_dir}", err=True)


def _defined(prog: Any) -> set[str]:
    """Relations whose arity the program itself fixes: rule heads, inline facts, .decl."""
    ast = prog.ast
    return set(prog.idb) | {rel for rel, _args in ast.facts} | {d.rel for d in ast.declarations}


#: How a merklog ``.decl`` column's fields are read (:mod:`merklog.engine.tsv` kinds).
_DECLARED_KINDS = {"str": "symbol", "bool": "bool", "bytes": "bytes", "cid": "cid"}


def _field_kinds(prog: Any) -> dict[str, list[str]]:
    """How eval reads the fields of a merklog ``.decl``'s relation: a ``str`` column takes
    the text as written (Soufflé's ``symbol``), so ``42`` there is the string "42";
    ``bool``, ``bytes`` and ``cid`` columns read what eval writes for them (``true``,
    hex, a CID's text). The untyped grammar would read ``42`` as an int and the others
    as strings, which the declaration refuses, so no file could give such a value.
    ``int``, ``float`` and ``any`` columns keep the grammar."""
    return {
        d.rel: [_DECLARED_KINDS.get(kind, "any") for _name, kind in d.columns]
        for d in prog.ast.declarations
        if any(kind in _DECLARED_KINDS for _name, kind in d.columns)
    }


def _naming_fact_file(err: Any, facts_dir: Path) -> str:
    """``LINE:COL: message`` and hint of a program error, where an atom reading another
    arity than its fact file's names that file ("e has arity 1 in facts/e.facts and 2
    here", not "in the facts") and the hint recalls that fields are separated by tabs:
    a comma-separated file is one field a line."""
    from merklog.engine.errors import ArityError

    rel = getattr(err, "relation", None)
    if not isinstance(err, ArityError) or rel is None or " in the facts " not in err.message:
        return str(err)
    message = err.message.replace(" in the facts ", f" in {facts_dir / f'{rel}.facts'} ", 1)
    hint = f"{err.hint}; a fact file's fields are separated by tabs"
    return f"{err.line}:{err.col}: {message}\n  hint: {hint}"


def _file_failure(err: OSError) -> Exception:
    """``FILE: reason`` for an OS error on one of eval's files (Python's own text,
    ``[Errno 21] Is a directory: 'out/b.csv'``, puts the file last or leaves it out),
    with the CLI's exit status for it (a full disk: 6)."""
    from merklog.node.failures import DISK_FULL_ERRNOS, ExitCode, Failure

    code = ExitCode.DISK_FULL if err.errno in DISK_FULL_ERRNOS else ExitCode.FAILED
    reason = err.strerror or str(err)
    return Failure(f"{err.filename}: {reason}" if err.filename else reason, code)


def _write_all(out_dir: Path, outputs: list[str], write: Callable[[str, Path], Any]) -> None:
    """Write ``OUT/<rel>.csv`` for every relation of ``outputs``, all or nothing.

    Each file is written under a temporary name in ``out_dir`` and renamed into place
    only when every one is written, so a failure (a full disk, a directory in the way,
    Ctrl-C, SIGTERM, running out of memory) leaves the output directory as it was, and
    no temporary file or folder this run made; an error names the file it was writing.
    Ctrl-C and SIGTERM wait while the files are renamed into place (QA: a Ctrl-C while
    writing left the partial temporaries behind)."""
    import errno
    import os
    import secrets
    import signal

    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # deepest first
    done: list[tuple[Path, Path]] = []
    placed = False
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for rel in outputs:
            final = out_dir / f"{rel}.csv"
            try:
                if final.is_dir():
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
                # Not named after the relation: a name of up to 256 characters leaves
                # no room for more in a file name (QA: ".<rel>.csv.<hex>.tmp" was too long)
                tmp = out_dir / f".merklog-{secrets.token_hex(8)}.csv.tmp"
                # 0o666 less the umask, as open() would give the file itself
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                done.append((tmp, final))
                write(rel, tmp)
            except OSError as err:  # name the file the user asked for, not the temporary
                err.filename = str(final)
                raise
        stop = {signal.SIGINT, signal.SIGTERM}
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        try:
            for tmp, final in done:
                os.replace(tmp, final)
            placed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal now: all placed
    except OSError as err:
        raise _file_failure(err) from None
    finally:
        if not placed:
            for tmp, _final in done:
                tmp.unlink(missing_ok=True)
            for folder in made:  # the folders this run made, if nothing else is in them
                try:
                    folder.rmdir()
                except OSError:
                    break


def _check_declared(prog: Any, facts_dir: Path, facts: dict, fail: Callable[[str], None]) -> None:
    """Refuse the first fact-file row that does not fit its relation's ``.decl``, named
    as ``FILE:LINE:COL`` of its first misfit field (the program's own check, run later,
    knows no file or line)."""
    from merklog.engine.errors import DeclarationError
    from merklog.engine.schema import value_fits
    from merklog.engine.tsv import row_line, row_text

    schema = prog.checked.schema
    for rel, rows in facts.items():
        if rel not in schema.declarations:
            continue
        if hasattr(rows, "ndim"):  # an int64 matrix: its first row stands for every row
            # (QA: a file of ints alone passed a float or str column, and rules matching
            # 1.0 found nothing)
            rows = [tuple(rows[0].tolist())] if len(rows) else []
        for i, row in enumerate(rows):
            try:
                schema.check_fact(rel, tuple(row))
            except DeclarationError as err:
                path = facts_dir / f"{rel}.facts"
                line = row_line(path, i)
                decl = schema.declarations[rel]
                misfit = next(  # 0 for a row of another arity (read_relation refuses it)
                    (
                        j
                        for j, (_name, kind) in enumerate(decl.columns)
                        if j < len(row) and not value_fits(row[j], kind)
                    ),
                    0,
                )
                fields = row_text(path, line).split("\t")
                col = sum(len(f) + 1 for f in fields[:misfit]) + 1
                fail(f"{path}:{line}:{col}: {err}")
                return
