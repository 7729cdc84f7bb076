"""Map the four root folders onto the single ``merklog.*`` import namespace.

``engine/`` becomes ``merklog.engine`` (and so on), subpackages included, so the
repository keeps its fixed flat layout while never installing generic top-level
names such as ``engine``. The package root ``merklog`` itself (``merklog.open``,
``merklog.Error``) comes from ``node/public/``: a root ``__init__.py`` in the
repository would make pytest treat the checkout as a package.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = ("engine", "store", "replication", "node")
#: The folder installed as the package root ``merklog`` (not as ``merklog.node.public``).
ROOT_PACKAGE = Path("node") / "public"


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = ["merklog"]
    package_dir: dict[str, str] = {"merklog": str(ROOT_PACKAGE)}
    for folder in FOLDERS:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            if rel == ROOT_PACKAGE or any(
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
