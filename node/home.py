"""Where a node keeps its state by default: ``$MERKLOG_HOME``, else ``~/.merklog``.

Apart from :mod:`merklog.node.config` so that the command line can resolve the
home without importing the config machinery (and through it the store), which
commands such as ``merklog eval`` never use.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "MERKLOG_HOME"


def default_home() -> Path:
    """``$MERKLOG_HOME`` if set, else ``~/.merklog``."""
    env = os.environ.get(ENV_HOME)
    return Path(env).expanduser() if env else Path.home() / ".merklog"
