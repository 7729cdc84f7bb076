"""Whether an output entry of a Spark command may be replaced: one check for ``compact``'s
``dataset=<cid>/`` folders and ``analyze``'s relation folders.

Both commands replace a folder under ``--out`` whole. A folder the command wrote itself
(recognised by ``ours``, which knows that command's layout) may go; anything else there
(a user's folder, a file, a symbolic link) is refused, so that no user's file is deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def foreign(path: Path, ours: Callable[[Path], bool]) -> str | None:
    """``"folder"`` or ``"file"`` when ``path`` exists and is not a real folder ``ours``
    recognises as the command's own output; None when it is missing or may be replaced."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_dir() and not path.is_symlink() and ours(path):
        return None
    return "folder" if path.is_dir() else "file"


__all__ = ["foreign"]
