"""Resolving data-set names and unit files under a data root, without escaping it.

A name never climbs out (``..``, an absolute path). A symbolic link, to a file or to a
folder, is followed only where it stays under the data root, unless the operator started
the process with ``--follow-data-links`` (`follow_links`): a data set holding a link out is
refused whole, naming the link, before anything of it is read.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

_TOP = Path(__file__).resolve().parents[2]
# The repository's folder when the trainer runs from a checkout; None when it is installed
# (the folder above its packages is site-packages).
CHECKOUT = _TOP if (_TOP / "scripts" / "setup.sh").is_file() else None


def _default_data_root() -> Path:
    """$TRAINER_DATA_ROOT; else, in a checkout, its data folder (letters and MNIST ship
    there); else, for an installed trainer, ./data."""
    if os.environ.get("TRAINER_DATA_ROOT"):
        return Path(os.environ["TRAINER_DATA_ROOT"])
    return (CHECKOUT or Path.cwd()) / "data"


# The default data root of every process (--data-root changes it).
DEFAULT_DATA_ROOT = _default_data_root()


FOLLOW_FLAG = "--follow-data-links"
RECHECK_SECONDS = 10.0
MAX_CLEAN = 64  # data sets remembered as free of links out
_following = False  # set once at start from the command line (follow_links)
_clean: dict[tuple[Path, Path], float] = {}  # (data set, root): when last found clean
_lock = threading.Lock()


class DataPathError(ValueError):
    """A data set or unit file that is missing or lies outside the data root."""


def follow_links(on: bool) -> None:
    """Whether links out of the data root are read (the process's --follow-data-links)."""
    global _following
    with _lock:
        _following = on
        _clean.clear()


def add_argument(parser: Any) -> None:
    """The ``--follow-data-links`` option of the coordinator and the nodes."""
    parser.add_argument(FOLLOW_FLAG, action="store_true",
                        help="read symbolic links (to files or folders) in data sets that "
                             "lead out of the data root; by default a data set holding one "
                             "is refused, naming the link")


def _inside(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _real(path: Path) -> Path:
    """Every link in ``path`` resolved; a loop of links is left as it stands (it names no
    file, so reading it fails later with its own message) instead of raising."""
    return Path(os.path.realpath(path))


def resolve_under(root: str | os.PathLike, *parts: str) -> Path:
    """Join parts under root and refuse any result outside root: by name (.., absolute
    paths) always, through a link unless following links is on."""
    base = _real(Path(root))
    for part in parts:
        if not part or "\x00" in part:
            raise DataPathError(f"empty or invalid path component {part!r}")
    joined = "/".join(parts)
    named = Path(os.path.normpath(base.joinpath(*parts)))
    if not _inside(named, base):
        raise DataPathError(f"path {joined!r} escapes the data root {base}; use a name inside it")
    candidate = _real(named)
    if not _following and not _inside(candidate, base):
        raise DataPathError(f"path {joined!r} is a link out of the data root {base}; start "
                            f"the process with {FOLLOW_FLAG} to read it")
    return candidate


def dataset_dir(root: str | os.PathLike, dataset: str) -> Path:
    """The folder of a data set under the data root; it must exist and, unless following
    links is on, hold no link out of the data root."""
    path = resolve_under(root, dataset)
    if not path.is_dir():
        raise DataPathError(
            f"data set directory {path} does not exist; "
            f"pass a folder name under the data root {_real(Path(root))} or set --data-root"
        )
    if not _following:
        _check_links(path, _real(Path(root)), dataset)
    return path


def _check_links(folder: Path, base: Path, dataset: str) -> None:
    """`_refuse_links_out`, searched again only once RECHECK_SECONDS have passed since the
    data set was last found clean: a node asks for every unit, and searching a folder of
    200,000 images takes about 0.4 s."""
    now = time.monotonic()
    with _lock:
        if now - _clean.get((folder, base), -RECHECK_SECONDS) < RECHECK_SECONDS:
            return
    _refuse_links_out(folder, base, dataset)
    with _lock:
        if len(_clean) >= MAX_CLEAN:
            _clean.clear()
        _clean[(folder, base)] = now


def _refuse_links_out(folder: Path, base: Path, dataset: str) -> None:
    """DataPathError naming the first link under ``folder`` (to a file or a folder, at any
    depth) that leads out of ``base``. A linked folder that stays under ``base`` is
    searched where it leads, once, since the readers go there too."""
    pending, seen = [folder], {folder}
    while pending:
        for entry in _entries(pending.pop(), base, dataset):
            if entry.is_symlink():
                target = _real(Path(entry.path))
                if not _inside(target, base):
                    shown = Path(entry.path).relative_to(base).as_posix()
                    raise DataPathError(
                        f"data set {dataset}: {shown} is a link out of the data root "
                        f"{base}; start the process with {FOLLOW_FLAG} to read it")
                if target.is_dir() and target not in seen:
                    seen.add(target)
                    pending.append(target)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))


def _entries(folder: Path, base: Path, dataset: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as exc:
        raise DataPathError(f"data set {dataset}: cannot list "
                            f"{folder.relative_to(base).as_posix()}: "
                            f"{exc.strerror or exc}") from None


def data_location(root: str | os.PathLike, dataset: str) -> Path:
    """Where a run's data set is read from: its folder under the data root (which must
    exist), or the data root itself for a plug-in data set (``module:function``), which
    finds its own files there."""
    if ":" in dataset:
        return Path(root).resolve()
    return dataset_dir(root, dataset)


def folder_stamp(location: str | os.PathLike) -> tuple:
    """The names, sizes and modification times of a folder's entries: cheap to read, and
    different once its files are replaced, so a long-lived process (a node serves runs for
    days) reads them again instead of the copy it cached. A file rewritten in place inside
    a subfolder (an image folder's class) changes no entry here: restart the process."""
    try:
        with os.scandir(location) as entries:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                                for e in entries))
    except OSError:
        return ()


def files_stamp(*paths: str | os.PathLike) -> tuple:
    """The sizes and modification times of these files (None for one that is missing)."""
    stamps = []
    for path in paths:
        try:
            stat = os.stat(path)
            stamps.append((stat.st_size, stat.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return tuple(stamps)
