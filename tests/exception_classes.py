"""The exception classes a merklog package defines, found by importing every module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil


def exception_classes(*packages: str) -> dict[str, type[BaseException]]:
    """``{"module.Name": class}`` of every exception class defined (not imported) in the
    modules of ``packages``."""
    found: dict[str, type[BaseException]] = {}
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            module = importlib.import_module(info.name)
            for attr, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                ):
                    found[f"{module.__name__}.{attr}"] = obj
    return found
