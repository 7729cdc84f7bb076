"""The ``merklog`` command line: one click group; each command lives in ``node/commands/``.

Every module in :mod:`merklog.node.commands` that defines ``register(cli)`` is
loaded, so areas (store, engine, sync, spark, …) add commands without editing
this file. Loading is lazy: a command whose module is named after it
(``eval`` in ``eval_cmd.py``, ``put`` in ``put.py``) loads only that module, so
``merklog eval`` does not pay for the node, store and network imports of the
other commands; anything else (``--help``, other names) loads them all.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import logging
import os
import pkgutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import click

from . import commands as _commands_pkg
from .errors import OUT_OF_MEMORY, NodeError
from .home import ENV_HOME, default_home
from .logs import setup_logging


class State:
    """What every command receives: the resolved home directory and output settings."""

    def __init__(self, home: Path, verbose: int, overrides: dict | None = None) -> None:
        self.home = home
        self.verbose = verbose
        #: ``text`` or ``json`` (``--log-format``): also the form of the node's announcements.
        self.log_format = "text"
        #: ``--set section.key=value`` options: the highest-precedence config layer.
        self.overrides: dict = dict(overrides or {})


pass_state = click.make_pass_decorator(State)


class Boundary(click.Group):
    """The CLI's one error boundary: any exception a command raises becomes one line on
    stderr and a documented exit status (:mod:`merklog.node.failures`), never a
    traceback. ``-vv`` also logs the traceback at debug level."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its module first if it is not loaded yet."""
        if cmd_name not in self.commands:
            for module in (f"{cmd_name}_cmd", cmd_name):
                _register(module)
                if cmd_name in self.commands:
                    break
            else:
                _load_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name (for ``--help``): loads every command module."""
        _load_commands()
        return super().list_commands(ctx)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Parse ``merklog``'s own options; a mistake in them (``--bogus``, a ``--home``
        that is a file) is one line too, as a command's are (:meth:`_invoke`)."""
        if parent is None:
            _check_utf8_arguments(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare ``merklog``: the help, as click shows it
        except click.UsageError as exc:
            raise _usage_line(exc) from None

    def invoke(self, ctx: click.Context) -> object:
        from .interrupts import reset

        reset()  # a Ctrl-C of an earlier invocation in this process is not this one's
        try:
            return self._invoke(ctx)
        except click.ClickException as exc:
            state = ctx.find_object(State)
            # ctx.params too: an unknown command is met before merklog's own options
            # reach the state, and was plain text under --log-format json (QA)
            if (state is not None and state.log_format == "json") or ctx.params.get(
                "log_format"
            ) == "json":
                raise JsonFailure(exc.format_message(), exc.exit_code) from None
            raise

    def _invoke(self, ctx: click.Context) -> object:
        try:
            result = super().invoke(ctx)
            # A closed pipe (``| head``) is met here, not by click's exit; a full disk
            # (``> /dev/full``) too, said below as the output that could not be written.
            sys.stdout.flush()
            return result
        except click.UsageError as exc:  # one line, not click's usage, hint and blank line
            raise _usage_line(exc) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort) as exc:
            from .interrupts import pending

            if pending() and isinstance(exc, click.ClickException):
                return _interrupted(ctx)  # a command's own line for what the Ctrl-C broke
            raise
        except BrokenPipeError:
            if not _stdout_closed():
                raise  # a socket, not the reader of the output: classified below
            # ``| head``: the reader wants no more. Quiet, and 128 + SIGPIPE as a Unix tool
            # that the signal ends (Python ignores SIGPIPE, so the write raised instead).
            _discard_stdout()
            raise click.exceptions.Exit(STDOUT_CLOSED) from None
        except SystemExit as exc:
            if exc.code == 128 + signal.SIGTERM:  # one line, as for any other end (exit 143)
                said = _STOPPED.get(ctx.invoked_subcommand or "", "")
                click.echo(f"Error: stopped (SIGTERM){said}", err=True)
            raise
        except KeyboardInterrupt:  # said as "Aborted!" before, with no word on what stays
            return _interrupted(ctx)
        except MemoryError as exc:
            # Nothing imported or classified here: with memory short, a lazy import failed
            # too ("can't allocate lock") and ~100 lines of chained tracebacks came out.
            # Dropping the traceback frees the frames of what ran out, and what they held.
            # The line goes straight to the descriptor: click's own error printing looks
            # its words up through gettext, which ran out of memory too, at times.
            exc.__traceback__ = None
            try:
                line = f"Error: out of memory ({exc}){OUT_OF_MEMORY}\n" if str(exc) else ""
                line = (line or _OUT_OF_MEMORY_LINE.decode()).encode()
            except MemoryError:
                line = _OUT_OF_MEMORY_LINE
            del exc
            with contextlib.suppress(OSError):
                os.write(2, line)
            raise SystemExit(1) from None
        except Exception as exc:
            from .failures import classify
            from .interrupts import pending

            if pending():  # what tearing down a Spark job after a Ctrl-C raised (py4j's)
                logging.getLogger("merklog.cli").debug("after Ctrl-C", exc_info=True)
                return _interrupted(ctx)
            state = ctx.find_object(State)
            code, message = classify(exc, state.home if state else None)
            logging.getLogger("merklog.cli").debug("command failed", exc_info=True)
            if isinstance(exc, OSError) and not exc.filename and not _settle_stdout():
                # The output is what failed (a full disk, ``> /dev/full``), not the home.
                message = f"cannot write the output: {exc.strerror or exc}"
            failure = click.ClickException(message)
            failure.exit_code = int(code)
            raise failure from None


def _interrupted(ctx: click.Context) -> NoReturn:
    """The one line (exit 1) of a command interrupted by Ctrl-C."""
    from .interrupts import mark

    mark()  # what is logged from here on (a JVM's teardown) follows the interrupt
    command = ctx.invoked_subcommand
    if command in ("put", "retract"):
        line = (
            "interrupted (Ctrl-C): what was written before it stays written (writes a"
            " running node had received included); the same put or retract run again"
            " adds nothing twice"
        )
    elif command == "sync":
        # A pull applies each response of the peer as it arrives, all or nothing, and a
        # push each request: what was applied stays, and a delta already held is a
        # duplicate the next sync skips (replication/client.py, acceptance.py).
        line = (
            "interrupted (Ctrl-C): the deltas already applied stay (a running node stops"
            " this sync too); the same sync run again finishes it and applies nothing twice"
        )
    else:
        line = "interrupted (Ctrl-C)"
    raise click.ClickException(line) from None


#: Exit status when standard output is closed before the command is done (``| head``).
STDOUT_CLOSED = 141


#: Commands whose arguments are facts: they name a bad byte by LINE:COL of the facts
#: (``cliutil.facts_text``), which says more than the argument's number.
_FACT_COMMANDS = frozenset({"put", "retract"})


def _check_utf8_arguments(args: list[str]) -> None:
    """Refuse an argument holding bytes that are not UTF-8 (Python keeps them as lone
    surrogates) with one line naming it, before any command turns it into a codec's
    message or a ``'\\udcff'`` (``ls``, ``query``, ``get``, ``sync``…). The arguments
    of ``put`` and ``retract`` are left to them (they name LINE:COL of their facts)."""
    from .files import first_non_utf8

    command = _command_index(args)
    if command < len(args) and args[command] in _FACT_COMMANDS:
        args = args[:command]  # merklog's own options only
    for arg in args:
        found = first_non_utf8(arg)
        if found is None:
            continue
        at, byte = found
        try:  # the bytes as given (a shell's argument), undecodable ones as \xff
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a lone surrogate no byte decodes to
            shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")
        failure = click.ClickException(
            f"argument '{shown}': not UTF-8 text ({byte} at column {at + 1});"
            " give arguments as UTF-8"
        )
        from .failures import ExitCode  # only now: it imports the store's errors

        failure.exit_code = int(ExitCode.BAD_INPUT)
        raise failure


def _command_index(args: list[str]) -> int:
    """The index of the command's name in ``merklog``'s ``args``: the first that is
    neither an option of merklog itself nor the value of one (``--home put ls``: the
    command is ``ls``); ``len(args)`` when there is none."""
    valued = {
        name
        for param in cli.params
        if isinstance(param, click.Option) and not (param.is_flag or param.count)
        for name in param.opts
    }
    at = 0
    while at < len(args):
        arg = args[at]
        if arg == "--":
            return at + 1
        if not arg.startswith("-") or arg == "-":
            return at
        at += 2 if arg in valued else 1  # --home=put and flags (-v, -vv) are one
    return at


def _usage_line(exc: click.UsageError) -> click.ClickException:
    """A usage mistake as one ``Error:`` line with a pointer to the help, instead of
    click's usage block, hint and blank line."""
    where = exc.ctx.command_path if exc.ctx is not None else "merklog"
    hint = _global_option_hint(exc, where) or f"(see `{where} --help`)"
    message = exc.format_message()
    group = exc.ctx.command if exc.ctx is not None else None
    if isinstance(group, click.Group) and message.startswith("Usage:"):
        # a group given no command (click >= 8.2 raises its whole help as the message)
        names = ", ".join(group.list_commands(exc.ctx))
        message = f"missing command: `{where} COMMAND`, where COMMAND is one of {names}"
    failure = click.ClickException(f"{message} {hint}")
    failure.exit_code = exc.exit_code
    return failure


def _global_option_hint(exc: click.UsageError, where: str) -> str:
    """For an option of ``merklog`` itself given after the command (``merklog node run
    --log-format json``, a systemd ``ExecStart`` that then restarts forever): where it goes
    instead. Moving such options is not done for the user: after the command, ``-v`` or
    ``--home`` may be the value of the command's own option (a token, a path)."""
    if not isinstance(exc, click.NoSuchOption) or where == "merklog":
        return ""
    name = exc.option_name
    if not any(name in (*p.opts, *p.secondary_opts) for p in cli.params):
        return ""
    command = where.removeprefix("merklog ")
    return (
        f"({name} is an option of merklog itself: give it before the command,"
        f" `merklog {name} … {command}`)"
    )


def _stdout_closed() -> bool:
    """Whether this process's standard output is a pipe whose reader has gone."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (CliRunner)
        return False


def _settle_stdout() -> bool:
    """Flush standard output now, or discard what it holds when it cannot take it (a
    full disk, ``> /dev/full``): the interpreter's own flush at exit failed again,
    printed "Exception ignored … OSError" after the command's one line and made the exit
    status 120 instead of the command's. Whether the output took it."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            _discard_stdout()
        return False
    return True


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's final flush of what is
    still buffered does not fail again (and print "Exception ignored…")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class JsonFailure(click.ClickException, NodeError):
    """A command's failure with ``--log-format json``: one JSON line on stderr, shaped
    like the log records around it (a plain ``Error:`` line broke a JSON log reader).
    A ``merklog.Error`` too, like every error merklog defines."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: object = None) -> None:
        from .logs import JsonFormatter

        record = logging.LogRecord("merklog.cli", logging.ERROR, "", 0, self.message, None, None)
        click.echo(JsonFormatter().format(record), err=True)


@click.group(cls=Boundary, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help=f"State directory (default: ${ENV_HOME}, else ~/.merklog).",
)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="MERKLOG_LOG_FORMAT",
    help="Log lines as text or one JSON object per line [$MERKLOG_LOG_FORMAT].",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a config option (e.g. --set node.port=8000); repeatable.",
)
@click.version_option(package_name="merklog")
@click.pass_context
def cli(
    ctx: click.Context,
    home: str | None,
    verbose: int,
    log_format: str,
    settings: tuple[str, ...],
) -> None:
    """merklog: a CRDT replica node with content-addressed storage and Datalog."""
    setup_logging(verbose, log_format)
    overrides: dict = {}
    if settings:  # the config machinery (and the store under it) only when asked
        from .config import ConfigError, parse_set

        try:
            overrides = parse_set(settings)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
    if home is not None and not home.strip():  # Path("") is ".": the current directory
        raise click.UsageError(
            "--home is empty: name a directory, or leave it out for $MERKLOG_HOME, else ~/.merklog"
        )
    ctx.obj = State(Path(home).expanduser() if home else default_home(), verbose, overrides)
    ctx.obj.log_format = log_format


_registered: set[str] = set()


def _register(name: str) -> None:
    """Import ``commands.<name>`` (if it exists) and let it add its commands, once."""
    if name in _registered:
        return
    _registered.add(name)
    if name.startswith("_") or not any(
        info.name == name for info in pkgutil.iter_modules(_commands_pkg.__path__)
    ):
        return
    module = importlib.import_module(f"{_commands_pkg.__name__}.{name}")
    register = getattr(module, "register", None)
    if callable(register):
        register(cli)


def _load_commands() -> None:
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda m: m.name):
        _register(info.name)


#: Set by :func:`end_without_teardown` when the running command has nothing left to
#: release at exit (ADR 0107).
_end_without_teardown = False


def end_without_teardown() -> None:
    """Let :func:`main` end the process with ``os._exit`` once this command returns.

    For one-shot commands whose every output is written and closed when they return
    and which hold no connection, thread or child process that needs an orderly
    shutdown (``merklog eval``): tearing down the interpreter (clearing every module,
    numpy's and pyarrow's included, and freeing every object one by one) costs
    ~0.03-0.05 s of CPU on each run and does nothing the exit does not. Only
    :func:`main` acts on it, so in-process callers (click's test runner) are unaffected.
    """
    global _end_without_teardown
    _end_without_teardown = True


def run(args: list[str] | None = None) -> int:
    """Run the command line (``args``, default ``sys.argv[1:]``); its exit status.

    Before any command loads numpy, OpenBLAS is held to one thread unless the user set
    ``OPENBLAS_NUM_THREADS``: its worker threads spin for 40-90 ms of CPU at import and
    no merklog command calls a BLAS routine (ADR 0109)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    global _end_without_teardown
    _end_without_teardown = False  # what this run's command asks, not an earlier one's
    try:
        cli.main(args=args, prog_name="merklog")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        raise  # sys.exit("message"): let Python print it
    return 0


#: What a command stopped by SIGTERM adds to ``Error: stopped (SIGTERM)``: what stays of
#: its work. Every other command changes nothing a stop could leave half-done (a write's
#: transaction rolls back, an output is written under a temporary name).
#: What a put or retract stopped by SIGTERM leaves. Through a running node, the node
#: goes on storing the chunks it had received, which this process no longer prints (QA:
#: 600,000 stored, 200,000 printed): "and printed" was not so.
_STOPPED_WRITE = (
    ": what was written before it stays written (through a running node, every chunk it"
    " had received, printed or not); the same put or retract run again adds nothing twice"
)
_STOPPED = {
    "put": _STOPPED_WRITE,
    "retract": _STOPPED_WRITE,
    "sync": ": the deltas received before it are kept; sync again to go on",
}


#: The out-of-memory line, made while memory is there (:meth:`Boundary._invoke`).
_OUT_OF_MEMORY_LINE = f"Error: out of memory{OUT_OF_MEMORY}\n".encode()


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM (``kill``, a service manager) ends a one-shot command the way an error
    does: cleanup runs (an export's temporary file is removed, an open transaction rolls
    back) and the exit status is 128 + 15. ``node run`` installs its own handler."""
    raise SystemExit(128 + signum)


#: True in the console-script process (``main``), which ends when its command does;
#: False when ``cli`` is invoked in-process (tests' CliRunner, embedding apps).
ONE_SHOT = False


def main() -> None:
    """Console-script entry point.

    When the command ends every live object is moved to the permanent generation
    (``gc.freeze``), so the interpreter's final collection does not walk a heap the
    process is about to drop: after ``put -f`` of 1M facts that walk was ~4% of the
    command's CPU (ADR 0110; ADR 0078 does the same for ``node run``). A command that
    asked for it (:func:`end_without_teardown`) then ends without interpreter teardown."""
    global ONE_SHOT
    ONE_SHOT = True
    _buffer_unbuffered_stdout()
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        code = run()
    finally:
        gc.freeze()
    code = _flush_output(code)
    if _end_without_teardown and threading.active_count() == 1:
        logging.shutdown()  # flush log handlers, as the normal exit would
        os._exit(code)
    sys.exit(code)


def _buffer_unbuffered_stdout() -> None:
    """Under ``PYTHONUNBUFFERED=1`` (``python -u``, many container images) standard output
    is a text layer straight on the file descriptor, which drops the rest of a write the
    kernel took only in part: ``merklog ls | head -1`` wrote its first 64 KiB, lost the
    rest without an error and exited 0, where a command whose reader went away exits 141.
    A buffered writer between them writes everything or raises; flushed at every line,
    the output still appears as it is written."""
    raw = getattr(sys.stdout, "buffer", None)
    if not isinstance(raw, io.FileIO):
        return
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=sys.stdout.encoding,
        errors=sys.stdout.errors,
        line_buffering=True,
    )


def _flush_output(code: int) -> int:
    """Flush what the command left buffered for standard output and error; the exit
    status. Output the command wrote whole in a few large writes can meet a reader that
    went away (``merklog ls | head -1``) only here, after the command returned: that
    exited 0 although most of the output never reached anyone, where a command that met
    it itself exits :data:`STDOUT_CLOSED` (141), as ``query`` did."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()  # the interpreter's own final flush must not fail again
        code = code or STDOUT_CLOSED
    except (OSError, ValueError):  # no stdout, or a closed one: nothing to keep
        pass
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    # Run through the package module so commands share this group's State class.
    from merklog.node.cli import main as _package_main

    _package_main()
