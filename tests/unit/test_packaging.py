"""What `pip install .` puts in the wheel: every package of the trainer and every file its
packages read at run time (pyproject.toml lists them by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.local_cluster import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES = set(SETUPTOOLS["packages"])


def folder_of(package: str) -> Path:
    """Where a package lies in the repository: under the folder package-dir gives its
    nearest mapped ancestor (thrift_trainer.training -> training/), else by its name."""
    mapped = SETUPTOOLS.get("package-dir", {})
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in mapped:
            return (REPO / mapped[prefix]).joinpath(*parts[n:])
    return REPO.joinpath(*parts)


def test_the_distribution_adds_one_top_level_name() -> None:
    """A user's own `training` or `engine` folder never meets the trainer's modules."""
    assert {package.partition(".")[0] for package in PACKAGES} == {"thrift_trainer"}
    assert not SETUPTOOLS.get("py-modules")


def is_package(folder: Path) -> bool:
    return (folder / "__init__.py").is_file()


def test_every_subpackage_of_the_trainer_is_packaged() -> None:
    for package in PACKAGES:
        for init in folder_of(package).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            name = ".".join(init.parent.relative_to(folder_of(package)).parts)
            assert (f"{package}.{name}" if name else package) in PACKAGES, init


def test_every_data_file_of_a_package_is_packaged() -> None:
    """Files other than Python sources in a package's folder (and in its folders that are
    not packages) must match the package's package-data patterns."""
    patterns = SETUPTOOLS["package-data"]
    for package in PACKAGES:
        folder = folder_of(package)
        packaged = {path for pattern in patterns.get(package, [])
                    for path in folder.glob(pattern) if path.is_file()}
        for path in _data_files(folder):
            assert path in packaged, f"{path} is not in package-data of {package}"


def _data_files(folder: Path) -> list[Path]:
    found = []
    for path in folder.iterdir():
        if path.is_dir() and path.name != "__pycache__" and not is_package(path):
            found += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        elif path.is_file() and path.suffix not in (".py", ".pyc") \
                and not path.name.endswith("-remote"):  # Thrift's sample scripts
            found.append(path)
    return found
