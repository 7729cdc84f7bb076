"""Map the four root folders onto the single ``merklog.*`` import namespace.

``engine/`` becomes ``merklog.engine`` (and so on), subpackages included, so the
repository keeps its fixed flat layout while never installing generic top-level
names such as ``engine``.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = ("engine", "store", "replication", "node")


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for folder in FOLDERS:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            if any(
                part.startswith(".") or part in {"node_modules", "__pycache__"}
                for part in rel.parts
            ):
                continue
            name = "merklog." + ".".join(rel.parts)
            packages.append(name)
            package_dir[name] = str(rel)
    return packages, package_dir


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={name: ["*.html", "*.js", "*.css", "*.json", "*.toml"] for name in packages},
)
