"""Reading .npz archives (model files, checkpoints, kept results, data) without trusting
their headers.

Each member's .npy header declares a shape and a dtype, and numpy allocates what they
claim before it reads a byte: a 1 KiB file claiming 2^40 float64 asks for 8 TiB. Here every
member's declared size is checked, before anything is allocated for it, against the most
the archive can hold of it (a stored member: its bytes in the file; a deflated one: 1032
times them, deflate's largest expansion) and, when the caller knows it, against what the
model can take; object arrays (pickles) are refused.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy

DEFLATE_RATIO = 1032  # the most one byte of a deflate stream expands to
_HEADER_READERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


class ArrayFileError(ValueError):
    """An archive whose arrays cannot be read safely; the message names it and says why."""


@dataclass(frozen=True)
class _Member:
    info: zipfile.ZipInfo
    key: str  # the array's name: the member's without ".npy"
    nbytes: int  # what its header declares


def read_npz(source: str | os.PathLike | bytes, name: str, *, max_bytes: int | None = None,
             keep: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the .npz ``source`` (a path or its bytes) that ``keep`` keeps (default
    all), each header checked first; ``name`` names it in every ArrayFileError, which a
    missing, truncated or altered archive also raises (FileNotFoundError as itself)."""
    try:
        with _opened(source) as (fp, size), zipfile.ZipFile(fp) as archive:
            members = [m for m in (_member(archive, info, size, name)
                                   for info in archive.infolist())
                       if keep is None or keep(m.key)]
            declared = sum(m.nbytes for m in members)
            if max_bytes is not None and declared > max_bytes:
                raise ArrayFileError(f"{name}: its arrays declare {declared} bytes, more than "
                                     f"the {max_bytes} bytes the model can take")
            return {m.key: _read(archive, m.info) for m in members}
    except (ArrayFileError, FileNotFoundError):
        raise
    # A truncated or altered archive fails in zipfile, zlib or numpy's header parser.
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ArrayFileError(f"{name} is damaged (truncated or altered): {exc}") from None


@contextlib.contextmanager
def _opened(source: str | os.PathLike | bytes) -> Iterator[tuple[BinaryIO, int]]:
    """A binary file object over ``source`` and its size in bytes."""
    with io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb") as fp:
        yield fp, fp.seek(0, os.SEEK_END)


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, name: str) -> _Member:
    """A member's declared size, refused where the archive cannot hold it."""
    if not info.filename.endswith(".npy"):
        raise ArrayFileError(f"{name}: member {info.filename!r} is not an array (.npy)")
    key = info.filename[: -len(".npy")]
    with archive.open(info) as f:
        version = npy.read_magic(f)
        if version not in _HEADER_READERS:
            raise ArrayFileError(f"{name}: array {key} is in .npy format {version}, which "
                                 "this reader does not take")
        shape, _, dtype = _HEADER_READERS[version](f)
        header = f.tell()
    if dtype.hasobject:
        raise ArrayFileError(f"{name}: array {key} holds Python objects, which are not read")
    if any(n < 0 for n in shape):
        raise ArrayFileError(f"{name}: array {key} declares a negative shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
    room = _room(info, size, name) - header
    if nbytes > room:
        raise ArrayFileError(f"{name} is damaged: array {key} declares {dtype} {shape} "
                             f"({nbytes} bytes), more than the {max(room, 0)} bytes the file "
                             "can hold of it")
    return _Member(info, key, nbytes)


def _room(info: zipfile.ZipInfo, size: int, name: str) -> int:
    """The most bytes the member can decompress to: the directory's own figures are only
    believed as far as the archive's size allows."""
    stored = min(info.compress_size, size)
    if info.compress_type == zipfile.ZIP_STORED:
        return min(info.file_size, stored)
    if info.compress_type == zipfile.ZIP_DEFLATED:
        return min(info.file_size, stored * DEFLATE_RATIO)
    raise ArrayFileError(f"{name}: member {info.filename!r} is compressed with method "
                         f"{info.compress_type}; arrays are read stored or deflated")


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    with archive.open(info) as f:
        return npy.read_array(f, allow_pickle=False)
