"""Spark and snapshot commands.

- ``merklog parquet export DIR``: the replica's log and visible facts as Parquet;
- ``merklog compact EXPORT... --out DIR [--prune]``: Spark job → signed snapshot;
- ``merklog analyze PROGRAM.dl --input EXPORT [--input EXPORT...] --out DIR``: program over
  merged replicas;
- ``merklog import-snapshot DIR``: bootstrap this (fresh) node from a snapshot;
- ``merklog prune DIR``: drop the delta blocks a snapshot covers.

Spark commands take ``--master`` (default ``local[*]``, or ``spark://host:7077``),
``--remote sc://host:15002`` (Spark Connect) and ``--conf key=value``. Local paths
are made absolute before Spark sees them: executors and a Connect server resolve a
relative path in *their* working directory, not the user's. The JVM's own output
goes to a log file unless ``-v``; running Spark stages show as a progress bar.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import GivenPath
from merklog.node.files import owner_only_files

IDENTITY_FILE = "identity.pem"


def _spark_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--conf",
        "confs",
        multiple=True,
        metavar="KEY=VALUE",
        help="Extra Spark configuration (repeatable).",
    )(fn)
    fn = click.option(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="Spark Connect server (instead of --master).",
    )(fn)
    fn = click.option(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master: local[*] (default), spark://host:7077, …",
    )(fn)
    return fn


def _absolute(item: str | Path) -> str:
    """A local path made absolute (URLs such as ``hdfs://…`` or ``file:/…`` pass unchanged)."""
    text = str(item)
    if "://" in text or text.startswith("file:"):
        return text
    return str(Path(text).expanduser().resolve())


def _input_rows(inputs: list[str], hint: str) -> int | None:
    """Op rows of local inputs from their Parquet footers, which size the JVM's flags
    (None when unknown: a URL); an input that is not a merklog export is a usage error
    naming it (:func:`merklog.node.spark.inputs.input_rows`)."""
    from merklog.node.spark.inputs import NotAnExport, input_rows

    try:
        return input_rows(inputs)
    except NotAnExport as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _conf(confs: tuple[str, ...]) -> dict[str, str]:
    """The ``--conf KEY=VALUE`` options as a dict (a usage error names a malformed one)."""
    conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        conf[key.strip()] = value.strip()
    return conf


def _prelaunch(
    master: str | None,
    remote: str | None,
    confs: tuple[str, ...],
    verbose: int = 0,
    input_rows: int | None = None,
) -> Any:
    """Start the session's driver JVM now (ADR 0158): the command imports the Spark code
    and reads its inputs while the JVM boots. None for Connect, or options
    :func:`_session` refuses."""
    from merklog.node.spark.session import check_master_reachable, prelaunch

    conf = _conf(confs)
    if master and remote:
        return None  # _session says why
    if master:  # before a JVM starts for it
        check_master_reachable(master)
    return prelaunch(master, remote, conf, quiet=not verbose, input_rows=input_rows)


def _session(
    master: str | None,
    remote: str | None,
    confs: tuple[str, ...],
    verbose: int = 0,
    input_rows: int | None = None,
    prelaunched: Any = None,
) -> Any:
    from merklog.node.interrupts import mark_on_sigint
    from merklog.node.spark.session import build_session

    conf = _conf(confs)
    try:
        session = build_session(
            master=master,
            remote=remote,
            conf=conf,
            quiet=not verbose,
            input_rows=input_rows,
            prelaunched=prelaunched,
        )
        mark_on_sigint()  # after pyspark's SIGINT handler, which it wraps
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:
        # pyspark's PySparkRuntimeError (not imported here): the JVM exited before its
        # gateway answered, which a --master Spark cannot parse does, among others.
        if conf and _refused_conf(exc):
            raise click.UsageError(f"Spark refused a --conf: {_refused_conf(exc)}") from None
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        where = f" with --master {master}" if master else ""
        confs_too = " and the --conf options" if conf else ""
        raise click.ClickException(
            f"the Spark JVM exited before it started{where}: check --master (local[N],"
            f" spark://HOST:PORT){confs_too} and the Java install; -v shows the JVM's own"
            " output"
        ) from None
    _check_confs(session, conf)
    return session


def _refused_conf(exc: BaseException) -> str | None:
    """The first line of a Spark error that refuses a configuration value (an invalid
    ``--conf``), else None."""
    import re

    text = str(exc)
    found = re.search(r"\[INVALID_CONF_VALUE[A-Z_.]*\] ?([^\n]*)", text)
    if found is not None:
        return re.sub(r"\s*SQLSTATE: \w+\s*$", "", found[1])
    for marker in ("IllegalArgumentException: ", "NumberFormatException: "):
        at = text.find(marker)
        if at >= 0:
            return text[at + len(marker) :].splitlines()[0]
    return None


def _check_confs(session: Any, conf: dict[str, str]) -> None:
    """Set each ``--conf`` that Spark lets a session change once more, so that a value it
    refuses (``spark.sql.shuffle.partitions=0``) is one usage error now, naming it, not
    an internal error with a Java stack trace when a job reads it."""
    try:
        runtime = session.conf  # builds the session's state, which checks the SQL confs
    except Exception as exc:
        why = _refused_conf(exc)
        if why is None:
            raise
        raise click.UsageError(f"Spark refused a --conf: {why}") from None
    for key, value in conf.items():
        try:
            if runtime.isModifiable(key):
                runtime.set(key, value)
        except Exception as exc:
            why = _refused_conf(exc) or str(exc).splitlines()[0]
            raise click.UsageError(f"Spark refused --conf {key}={value}: {why}") from None


def _writable_out(target: Path) -> bool:
    """Make the output folder ``target`` (with its parents) and check that files can be
    made in it, before the JVM starts: an unwritable ``--out`` is one line naming it
    (exit 1; a full disk exit 6), not a Java stack trace after the job. True when this
    made the folder (removed again if the command fails before writing into it)."""
    import errno
    import tempfile

    from merklog.node.failures import DISK_FULL_ERRNOS, ExitCode, Failure

    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as exc:
        code = ExitCode.DISK_FULL if exc.errno in DISK_FULL_ERRNOS else ExitCode.FAILED
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise Failure(f"cannot write to --out {target}: {reason}", code) from None
    return created


def _refuse_inside_home(directory: Path, home: Path, advice: str) -> None:
    """Refuse (exit 1) an output folder that is the home or inside it (``parquet export
    DIR``, ``compact --out DIR``): a command's outputs never go among the home's store,
    key and settings. ``advice`` says where to write instead."""
    from merklog.node.failures import Failure

    target, home_dir = directory.resolve(), home.resolve()
    if target == home_dir or home_dir in target.parents:
        where = "the home" if target == home_dir else f"inside the home {home}"
        raise Failure(f"{directory} is {where}: {advice}")
    # Any other home too: `analyze --out` wrote relation folders beside another home's
    # store when --home named a different one (QA).
    for folder in (target, *target.parents):
        if _is_home(folder):
            where = "a merklog home" if folder == target else f"inside the merklog home {folder}"
            raise Failure(f"{directory} is {where}: {advice}")


def _is_home(folder: Path) -> bool:
    """Whether ``folder`` is a merklog home: its config.toml beside its node key or store."""
    from merklog.node.config import CONFIG_FILE
    from merklog.node.files import IDENTITY_FILE

    try:
        return (folder / CONFIG_FILE).is_file() and (
            (folder / IDENTITY_FILE).exists() or (folder / "store.sqlite").exists()
        )
    except OSError:  # a folder this user cannot look into is no home of theirs
        return False


#: What an earlier ``parquet export`` leaves in its folder (a new one replaces them).
_EXPORT_ENTRIES = {"export.json", "genesis.cbor", "ops", "facts"}


def _check_export_folder(directory: Path, home: Path) -> None:
    """Refuse (exit 1, nothing written) a ``parquet export`` folder that is the home or
    inside it, or that holds anything but an earlier export: the export replaces its
    ``ops/`` and ``facts/`` folders whole, and deleted a user's own folders of those
    names."""
    from merklog.node.failures import Failure

    _refuse_inside_home(directory, home, "export to a folder of its own")
    target = directory.resolve()
    if not target.is_dir():
        return
    entries = sorted(p.name for p in target.iterdir() if not p.name.startswith(".export-"))
    if not entries:
        return
    earlier = (target / "export.json").is_file() and _is_export_summary(target / "export.json")
    foreign = [name for name in entries if name not in _EXPORT_ENTRIES] if earlier else entries
    if foreign or not earlier:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise Failure(
            f"{directory} holds files that no merklog export wrote ({shown}), and an export"
            " replaces its ops/ and facts/ folders: export into a new or empty folder, or"
            " over an earlier export (nothing was written)"
        )


def _is_export_summary(path: Path) -> bool:
    """Whether ``path`` is the ``export.json`` a ``parquet export`` writes."""
    try:
        return json.loads(path.read_text()).get("format") == "merklog-parquet-export"
    except (OSError, ValueError, AttributeError):
        return False


def _raise_write_failure(exc: Exception, target: Path) -> None:
    """One line (exit 6 for a full disk, else 1) for a Spark job that failed because it
    could not write under ``target`` (the JVM's IOException, whose stack trace is no use
    to a user); returns for any other failure."""
    from merklog.node.failures import ExitCode, Failure

    text = str(exc)
    if "java.io.IOException" not in text and "Mkdirs failed" not in text:
        return
    if "No space left on device" in text or "Disk quota exceeded" in text:
        raise Failure(f"no space left to write under --out {target}", ExitCode.DISK_FULL) from None
    raise Failure(
        f"Spark could not write the outputs under --out {target} (see -v for the JVM's message)",
        ExitCode.FAILED,
    ) from None


def _input_datasets(sources: list[str]) -> list[str] | None:
    """The datasets the inputs' op rows belong to, read before the JVM starts; None when
    an input is only a cluster's to read (a URL). A damaged input is one line naming it
    (exit 2)."""
    from merklog.node.spark.damage import raise_damaged_input
    from merklog.node.spark.factargs import input_datasets, local_exports

    local = local_exports(sources)
    if local is None:
        return None
    try:
        return input_datasets(local)
    except Exception as exc:  # a damaged input: one line naming it (exit 2)
        raise_damaged_input(exc, sources)
        raise


def _refuse_several_datasets(sources: list[str]) -> None:
    """Refuse (exit 1, before the JVM starts) ``analyze`` inputs whose ops belong to more
    than one dataset: it evaluates one merged fact set, and it silently took the union of
    unrelated datasets. Inputs only a cluster reads (URLs) are not looked into."""
    datasets = _input_datasets(sources)
    if datasets is not None and len(datasets) > 1:
        shown = ", ".join(datasets[:3]) + (" and more" if len(datasets) > 3 else "")
        raise click.ClickException(
            f"the inputs hold {len(datasets)} datasets ({shown}): analyze evaluates the"
            " merged facts of one dataset; give it exports of that dataset only (compact"
            " keeps datasets apart, a snapshot each)"
        )


def _check_compact_out(out: Path, home: Path, sources: list[str]) -> None:
    """Refuse (exit 1, before the JVM starts, nothing written) a ``compact --out`` that is
    the home or inside it, or whose ``dataset=<cid>/`` folder for a dataset of the inputs
    holds what no compact wrote: a snapshot replaces its dataset's folder whole, and
    deleted a user's files there. The inputs' datasets are read only when ``--out``
    has such folders (all of them count when an input is a URL)."""
    from merklog.node.spark.compact import CompactError, refuse_foreign_snapshot_folders

    _refuse_inside_home(out, home, "give --out a folder of its own (nothing was written)")
    target = Path(_absolute(out))
    if not any(target.glob("dataset=*")):
        return
    try:
        refuse_foreign_snapshot_folders(target, _input_datasets(sources))
    except CompactError as exc:
        raise click.ClickException(str(exc)) from None


def _abandon(spark: Any, owned: bool) -> None:
    """End the driver JVM of a command that failed or was interrupted (see
    :func:`merklog.node.spark.session.stop_driver`), when this command started it: a
    session it found running (a script's, a test's) is not its to end."""
    if spark is not None and owned:
        from merklog.node.spark.session import stop_driver

        stop_driver(spark)


def _jvm_running() -> bool:
    """Whether this process already has a Spark driver JVM (a session built before)."""
    import sys

    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    spark_context = getattr(context, "SparkContext", None)
    return getattr(spark_context, "_active_spark_context", None) is not None


def _remove_made(target: Path) -> None:
    """Remove ``target``, the output folder a failed ``compact`` made (it did not exist
    before the command): what Spark left in it is no snapshot."""
    import shutil

    shutil.rmtree(target, ignore_errors=True)


def _nothing_to_compact(exc: Exception) -> None:
    """Inputs without a delta: bad input, one line, exit 2."""
    failure = click.ClickException(str(exc))
    failure.exit_code = 2
    raise failure from None


def _snapshot_dir(directory: Path) -> Path:
    """The snapshot folder ``DIR`` names: ``DIR`` itself when it holds ``manifest.cbor``,
    else the one ``dataset=<cid>/`` snapshot under it (the ``--out`` of ``compact``); a
    usage error says which folder to give otherwise."""
    if (directory / "manifest.cbor").exists():
        return directory
    found = sorted(p for p in directory.glob("dataset=*") if (p / "manifest.cbor").is_file())
    if len(found) == 1:
        return found[0]
    if found:
        raise click.BadParameter(
            f"{directory} holds {len(found)} snapshots ({', '.join(p.name for p in found)}):"
            " give one dataset=<cid>/ folder",
            param_hint="DIRECTORY",
        )
    raise click.BadParameter(
        f"{directory} is not a snapshot (no manifest.cbor): give the dataset=<cid>/ folder"
        " that `merklog compact` wrote under its --out (or that --out, when it holds one)",
        param_hint="DIRECTORY",
    )


def _identity(home: Path) -> Any:
    """``home``'s node key, which signs snapshots: exit 1 for a directory that is no
    home at all, and the CLI's exit 5 with its way out for an initialised home whose key
    is missing or damaged (as every other command says it)."""
    from merklog.node.config import CONFIG_FILE
    from merklog.node.storecheck import load_key
    from merklog.node.target import TargetError

    if not (home / CONFIG_FILE).exists() and not (home / IDENTITY_FILE).exists():
        raise TargetError(f"{home} is not a merklog home; run `merklog --home {home} init` first")
    return load_key(home)


def _local_node(state: State) -> Any:
    """Open the node in this process (Parquet export and snapshots read the store directly)."""
    from merklog.node.node import Node
    from merklog.node.runtime import HomeBusy
    from merklog.node.storecheck import precheck
    from merklog.node.target import load_config

    precheck(load_config(state.home, state.overrides))  # never creates a home by accident
    try:
        return Node.open(state.home)
    except HomeBusy as exc:
        raise click.ClickException(f"{exc} (stop the running node first)") from None


@contextmanager
def _local_replica(state: State) -> Iterator[Any]:
    """The home's replica alone, under the home lock: export needs the log, not a node,
    so the node's start-up (loading every visible fact into the engine) is skipped."""
    from merklog.node import storage
    from merklog.node.runtime import HomeBusy, HomeLock
    from merklog.node.storecheck import precheck
    from merklog.node.target import load_config
    from merklog.replication.replica import Replica
    from merklog.store import Link

    cfg = load_config(state.home, state.overrides)  # a home, its dataset, not in memory
    precheck(cfg)
    try:
        lock = HomeLock.acquire(state.home)
    except HomeBusy as exc:
        raise click.ClickException(f"{exc} (stop the running node first)") from None
    try:
        store = storage.open_store(cfg)
        try:
            dataset = Link.parse(cfg.get("dataset.id"))
            yield Replica.open(storage.store_conn(store), store, _identity(state.home), dataset)
        finally:
            store.close()
    finally:
        lock.release()


class _AnalyzeCommand(click.Command):
    """``analyze``, whose extra arguments are most likely more inputs given after one
    ``--input`` (``--input ex1 ex2``, as a command table once read): the usage error says
    to repeat ``--input`` instead of only that ``ex2`` was not expected."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.allow_extra_args = True  # to name them here, with the way out
        rest = super().parse_args(ctx, args)
        if rest and not ctx.resilient_parsing:
            s = "s" if len(rest) > 1 else ""
            ctx.fail(
                f"Got unexpected extra argument{s} ({' '.join(rest)}); give each input with"
                " its own --input"
            )
        return rest


def register(cli: click.Group) -> None:
    @cli.group("parquet")
    def parquet() -> None:
        """Parquet interchange for Spark, DuckDB and pandas."""

    @parquet.command("export")
    @click.argument("directory", type=GivenPath(file_okay=False, path_type=Path))
    @pass_state
    def parquet_export(state: State, directory: Path) -> None:
        """Write the log (one row per op) and the visible facts under DIRECTORY."""
        from rich.console import Console
        from rich.progress import MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from merklog.node.spark.bootstrap import export_replica
        from merklog.replication.bulk import fact_count, op_count

        _check_export_folder(directory, state.home)
        columns = (
            TextColumn("export {task.description}"),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
        )
        console = Console(stderr=True)
        with (
            _local_replica(state) as replica,
            Progress(
                *columns,
                TimeElapsedColumn(),
                console=console,
                transient=True,
                disable=not console.is_terminal,  # a pipe or a log file got a blank line
            ) as bar,
        ):
            # One line per stage, in real units, fed by every process of the export: the
            # deltas read once here, then each share's fact blocks read and ops written.
            ops = op_count(replica)
            tasks = {
                "deltas": bar.add_task("read deltas", total=ops, unit="ops"),
                "facts": bar.add_task("read facts", total=fact_count(replica), unit="blocks"),
                "ops": bar.add_task("write", total=ops, unit="ops"),
            }
            with owner_only_files():  # every fact of the dataset, as a CAR export is 0600
                summary = export_replica(
                    replica, directory, progress=lambda stage, n: bar.advance(tasks[stage], n)
                )
        click.echo(json.dumps(summary, sort_keys=True))
        if summary.get("missing_deltas"):
            click.echo(
                f"note: this home no longer holds {summary['missing_deltas']} of its deltas"
                " (pruned, or covered by the snapshot it was bootstrapped from): the ops do"
                " not account for every visible fact, and compact refuses this export",
                err=True,
            )

    @cli.command("compact")
    @click.argument("inputs", nargs=-1, required=True)
    @click.option(
        "--out",
        "out",
        required=True,
        type=GivenPath(file_okay=False, path_type=Path),
        help="Snapshot output directory (one dataset=<cid>/ folder per dataset).",
    )
    @click.option(
        "--prune",
        is_flag=True,
        help="Cover only the causally stable prefix, so history before it may be pruned.",
    )
    @click.option(
        "--args-in-spark",
        is_flag=True,
        help=(
            "Carry each fact's arguments through the Spark job instead of adding them in"
            " this process from the inputs' fact lists (slower; for snapshots whose facts"
            " do not fit in this process's memory). The snapshot is the same."
        ),
    )
    @_spark_options
    @pass_state
    def compact_cmd(
        state: State,
        inputs: tuple[str, ...],
        out: Path,
        prune: bool,
        args_in_spark: bool,
        master: str | None,
        remote: str | None,
        confs: tuple[str, ...],
    ) -> None:
        """Merge Parquet exports (duplicates allowed) into a signed snapshot per dataset."""
        for item in inputs:
            if not item.strip():  # Path("") is the working directory
                raise click.BadParameter("is empty: name an export directory", param_hint="INPUTS")
            if "://" not in item and not Path(item).exists():
                raise click.BadParameter(f"{item} does not exist", param_hint="INPUTS")
        sources = [_absolute(i) for i in inputs]
        from merklog.node.spark.compact import CompactError, refuse_partial_exports

        try:
            refuse_partial_exports(sources)
        except CompactError as exc:
            raise click.ClickException(str(exc)) from None
        rows = _input_rows(sources, "INPUTS")
        identity = _identity(state.home)  # before the JVM starts, as the inputs' checks
        if rows == 0:  # before the JVM starts
            from merklog.node.spark.compact import NothingToCompact

            _nothing_to_compact(NothingToCompact())
        _check_compact_out(out, state.home, sources)
        # The JVM boots while the Spark code is imported and the driver reads the inputs
        # (ADR 0122, ADR 0158).
        prelaunched = _prelaunch(master, remote, confs, state.verbose, rows)
        from merklog.node.spark.compact import CompactError, NothingToCompact, compact
        from merklog.node.spark.damage import raise_damaged_input
        from merklog.node.spark.factargs import read_inputs
        from merklog.node.spark.progress import spark_progress

        created = _writable_out(Path(_absolute(out)))
        done = False
        reader = None
        spark = None
        owned = not _jvm_running()
        try:
            reader = None if args_in_spark else read_inputs(sources)
            spark = _session(master, remote, confs, state.verbose, rows, prelaunched)
            with spark_progress(spark, "compact"):
                results = compact(
                    spark,
                    sources,
                    _absolute(out),
                    identity,
                    prune=prune,
                    gather=False if args_in_spark else None,
                    reader=reader,
                )
            done = True
        except NothingToCompact as exc:
            _nothing_to_compact(exc)
        except CompactError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            raise_damaged_input(exc, sources)
            raise
        finally:
            if prelaunched is not None:
                prelaunched.close()  # a JVM no session took over (an error before it)
            if reader is not None:
                reader.close()
            if not done:
                _abandon(spark, owned)  # no task of its jobs writes after the cleanup below
                from merklog.node.spark.compact import remove_abandoned_staging

                remove_abandoned_staging(Path(_absolute(out)))
            if created and not done:
                _remove_made(out)
        if not results:  # --prune and no delta is stable yet: no snapshot was written
            raise click.ClickException(
                "no delta is causally stable yet (every author's latest delta must have it in"
                " its past), so --prune has nothing to cover and no snapshot was written; sync"
                " with the other writers first, or compact without --prune"
            )
        from merklog.node.spark.export import GENESIS_FILE

        for res in results:
            m = res.manifest
            click.echo(
                json.dumps(
                    {
                        "dataset": res.dataset,
                        "manifest": str(res.manifest_cid),
                        "directory": str(res.directory),
                        "facts": m["facts"],
                        "deltas": m["deltas"],
                        "heads": [str(h) for h in m["heads"]],
                    },
                    sort_keys=True,
                )
            )
            if not (Path(res.directory) / GENESIS_FILE).is_file():  # QA: said nothing
                click.echo(
                    f"note: no input carried the genesis block of dataset {res.dataset}"
                    f" ({GENESIS_FILE}, in a whole export folder), so this snapshot has"
                    " none: a fresh home cannot be made from it (import-snapshot), only a"
                    " home that joined the dataset can take it",
                    err=True,
                )

    @cli.command("analyze", cls=_AnalyzeCommand)
    @click.argument("program", type=GivenPath(exists=True, dir_okay=False, path_type=Path))
    @click.option(
        "--input",
        "inputs",
        multiple=True,
        required=True,
        metavar="EXPORT",
        help="Parquet export directory; repeat --input for each one (replicas are merged).",
    )
    @click.option("--out", "out", required=True, type=GivenPath(file_okay=False, path_type=Path))
    @click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet")
    @_spark_options
    @pass_state
    def analyze_cmd(
        state: State,
        program: Path,
        inputs: tuple[str, ...],
        out: Path,
        fmt: str,
        master: str | None,
        remote: str | None,
        confs: tuple[str, ...],
    ) -> None:
        """Evaluate PROGRAM over the merged visible facts; write every output relation."""
        from merklog.engine.errors import EngineError
        from merklog.engine.program import parse_text
        from merklog.node.errors import NodeInputError
        from merklog.node.files import read_text_file
        from merklog.node.spark.analyze import (
            OutputFolderTaken,
            check_out_folders,
            output_relations,
            static_check,
        )

        try:  # an error in the program file is exit 1, as for eval (it was 2 here, QA)
            text = read_text_file(program)
        except NodeInputError as exc:
            raise click.ClickException(str(exc)) from None
        try:
            parsed = parse_text(text)
            static_check(parsed)  # every check of the program alone, before the JVM starts
        except EngineError as exc:
            raise click.ClickException(f"{program}:{exc}") from None
        for item in inputs:
            if not item.strip():  # Path("") is the working directory
                raise click.BadParameter("is empty: name an export directory", param_hint="--input")
            if "://" not in item and not Path(item).exists():
                raise click.BadParameter(f"{item} does not exist", param_hint="--input")
        sources = [_absolute(i) for i in inputs]
        from merklog.node.spark.compact import (
            PARTIAL_FOR_ANALYZE,
            CompactError,
            refuse_partial_exports,
        )

        try:  # the ops of a pruned home's export lack facts: analyze would miss them
            refuse_partial_exports(sources, PARTIAL_FOR_ANALYZE)
        except CompactError as exc:
            raise click.ClickException(str(exc)) from None
        rows = _input_rows(sources, "--input")  # first: a snapshot given is named, as compact does
        _refuse_several_datasets(sources)
        names = output_relations(parsed)
        target = Path(_absolute(out))

        # as compact and parquet export; analyze needs no home, so any home counts (QA)
        _refuse_inside_home(out, state.home, "give --out a folder of its own (nothing was written)")
        try:
            check_out_folders(target, names)
        except OutputFolderTaken as exc:
            raise click.ClickException(str(exc)) from None
        created = _writable_out(target)
        done = False
        spark = None
        owned = not _jvm_running()
        try:
            # The JVM boots while the Spark code is imported (ADR 0158).
            prelaunched = _prelaunch(master, remote, confs, state.verbose, rows)
            try:
                from merklog.node.spark.analyze import (
                    evaluate,
                    output_arities,
                    relations_from_snapshot,
                    used_relations,
                    write_outputs,
                )
                from merklog.node.spark.compact import read_ops, snapshot_frame
                from merklog.node.spark.progress import spark_progress

                spark = _session(master, remote, confs, state.verbose, rows, prelaunched)
            finally:
                if prelaunched is not None:
                    prelaunched.close()  # a JVM no session took over (an error before it)
            try:
                with spark_progress(spark, "analyze"):
                    ops = read_ops(spark, sources)
                    base = relations_from_snapshot(
                        snapshot_frame(ops), used_relations(parsed), parsed
                    )
                    result = evaluate(spark, parsed, base)
                    written = write_outputs(result, names, target, fmt, output_arities(parsed))
            except EngineError as exc:
                raise click.ClickException(f"{program}:{exc}") from None
            except Exception as exc:
                from merklog.node.spark.damage import raise_damaged_input

                raise_damaged_input(exc, sources)  # before the write check: an IOException too
                _raise_write_failure(exc, target)
                raise
            if not all(Path(p).is_dir() for p in written.values()):
                raise click.ClickException(
                    f"Spark wrote the outputs to {target} on its own machine, which this one"
                    " does not see: with --remote or a cluster, --out must be a directory both"
                    " share"
                )
            done = True
        finally:
            if not done:
                _abandon(spark, owned)  # no task of its jobs writes after the cleanup below
                from merklog.node.spark.analyze import remove_unfinished, staging_folder

                remove_unfinished(target, names)
                shutil.rmtree(staging_folder(target), ignore_errors=True)
            if created and not done:
                with contextlib.suppress(OSError):
                    target.rmdir()  # the folder this command made, if nothing is in it
        for rel, path in written.items():
            click.echo(f"{rel}\t{path}")

    @cli.command("import-snapshot")
    @click.argument("directory", type=GivenPath(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--trust",
        multiple=True,
        metavar="KEYHEX",
        help="Accept only snapshots signed by these node keys (repeatable).",
    )
    @click.option(
        "--port", type=int, default=None, help="HTTP port written to the new home's config."
    )
    @pass_state
    def import_snapshot(
        state: State, directory: Path, trust: tuple[str, ...], port: int | None
    ) -> None:
        """Bootstrap a fresh node from a snapshot; then 'merklog sync' fetches only newer deltas.
        The new home takes ``--port`` and the ``--set`` options, as ``init`` does."""
        from merklog.node.homeinit import undo_init
        from merklog.node.node import init_home
        from merklog.node.runtime import LOCK_FILE
        from merklog.node.spark.bootstrap import install_snapshot, load_snapshot
        from merklog.node.spark.manifest import ManifestError

        try:
            trusted = {bytes.fromhex(k) for k in trust} or None
        except ValueError:
            raise click.BadParameter("keys are hex", param_hint="--trust") from None
        if any(len(k) != 32 for k in trusted or ()):  # a typo trusted nobody, silently
            raise click.BadParameter(
                "a node key is 32 bytes (64 hex digits), as `merklog status` shows it",
                param_hint="--trust",
            )
        directory = _snapshot_dir(directory)
        # A home this command creates is removed again if the install fails: a joined,
        # empty home left behind would take no snapshot and sync the whole history.
        fresh = not (state.home / "config.toml").exists()
        overrides = dict(state.overrides)
        if port is not None:
            if not fresh:  # QA: the port of the new home could only be set by hand
                raise click.UsageError(
                    f"--port is for a new home; {state.home} has its config.toml already"
                    " (its node.port setting)"
                )
            overrides["node.port"] = port
        existed = state.home.exists()
        before = {p.name for p in state.home.iterdir()} if existed else set()
        try:
            snap = load_snapshot(directory, trusted)
            if fresh:
                genesis = snap.genesis_block()
                if genesis is None:
                    raise click.ClickException(
                        "snapshot carries no genesis block; run 'merklog init' "
                        "joining the dataset first"
                    )
                init_home(state.home, overrides, join=(snap.dataset, genesis))
            node = _local_node(state)
            try:
                if node.replica.dataset != snap.dataset:
                    raise click.ClickException(
                        f"this node follows dataset {node.replica.dataset}, the snapshot is of "
                        f"{snap.dataset}"
                    )
                n = install_snapshot(node.replica, snap)
                node.run_epoch()
            finally:
                node.close()
        except BaseException as exc:
            if fresh:  # the node is closed: its lock file goes too
                undo_init(state.home, existed, before)
                if LOCK_FILE not in before:
                    (state.home / LOCK_FILE).unlink(missing_ok=True)
            if isinstance(exc, ManifestError):
                raise click.ClickException(f"snapshot rejected: {exc}") from None
            raise
        click.echo(
            json.dumps(
                {
                    "dataset": str(snap.dataset),
                    "manifest": str(snap.manifest_cid),
                    "facts": n,
                    "heads": [str(h) for h in snap.heads],
                }
            )
        )

    @cli.command("prune")
    @click.argument("directory", type=GivenPath(exists=True, file_okay=False, path_type=Path))
    @pass_state
    def prune_cmd(state: State, directory: Path) -> None:
        """Delete the delta blocks a (causally stable) snapshot covers from this node's store."""
        from merklog.node.spark.bootstrap import load_snapshot, prune_replica
        from merklog.node.spark.manifest import ManifestError

        directory = _snapshot_dir(directory)
        node = _local_node(state)
        try:
            n = prune_replica(node.replica, load_snapshot(directory))
        except ManifestError as exc:
            raise click.ClickException(f"cannot prune: {exc}") from None
        finally:
            node.close()
        click.echo(f"pruned {n} delta blocks", file=sys.stdout)
