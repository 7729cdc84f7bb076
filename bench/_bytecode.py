"""Compile merklog's modules to bytecode before a benchmark times ``merklog`` processes.

An installed merklog has its bytecode: pip compiles a wheel's modules when it installs
them, and an editable install writes ``__pycache__`` on its first import. A machine
that sets ``PYTHONDONTWRITEBYTECODE`` (this project's sandbox does) never writes it, so
every timed process would compile several hundred of merklog's modules from source
first (~0.15 s for ``merklog query`` through a node, more for a node or a compaction),
which no user pays. ``compileall`` writes the bytecode whatever that variable says,
and Python still reads bytecode when it may not write it.
"""

from __future__ import annotations

import compileall
from pathlib import Path


def compile_merklog() -> None:
    """Write the bytecode of every module of the imported ``merklog`` package (quietly;
    an up-to-date file is left alone)."""
    import merklog.engine
    import merklog.node
    import merklog.replication
    import merklog.store

    for package in (merklog.engine, merklog.node, merklog.replication, merklog.store):
        compileall.compile_dir(str(Path(package.__file__).parent), quiet=1)
