"""Strict reader for the letters data set (UCI Letter Recognition, the assignment's split).

Each non-blank line is ``f1,...,f16,label``: 16 features and a label 0..25 (A=0 .. Z=25).
A bad row raises :class:`DataFormatError` naming the file and the 1-based line, because a
compute node that silently skipped or mis-parsed rows would corrupt the averaged delta
without any visible symptom.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

N_FEATURES = 16
N_CLASSES = 26
N_COLUMNS = N_FEATURES + 1


class DataFormatError(ValueError):
    """A data file that does not follow the letters format; ``path`` and ``line`` locate it."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str) -> None:
        super().__init__(f"{os.fspath(path)}:{line}: {problem}")
        self.path = os.fspath(path)
        self.line = line
        self.problem = problem


def load_letters(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one letters file into ``X`` (n, 16) float64 and ``y`` (n,) int64.

    Blank lines are skipped and a last row without a newline is kept. Features may be any
    finite number (the shipped data holds integers 0..15, but nothing in the maths needs
    that); labels must be integers 0..25. A file read before and unchanged since (same
    size and modification time) is not parsed again: a node reads its units' files every
    round. The arrays are the caller's own.
    """
    stat = os.stat(path)
    features, labels = _parsed(os.fspath(path), stat.st_size, stat.st_mtime_ns)
    return features.copy(), labels.copy()


@functools.lru_cache(maxsize=64)
def _parsed(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """The parsed file (size and time are the cache's key: a changed file is read again)."""
    rows = _data_lines(path)
    if not rows:
        raise DataFormatError(path, 1, "no data rows")
    for line_no, fields in rows:
        if len(fields) != N_COLUMNS:
            raise DataFormatError(path, line_no, f"expected {N_COLUMNS} columns, got {len(fields)}")
    values = _parse_numbers(path, rows)
    _check_values(path, rows, values)
    return values[:, :N_FEATURES].copy(), values[:, N_FEATURES].astype(np.int64)


def _data_lines(path: str | os.PathLike) -> list[tuple[int, list[str]]]:
    """The non-blank lines as (1-based line number, comma-separated fields)."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, raw.count(b"\n", 0, exc.start) + 1, "non-ASCII byte") from exc
    # split("\n") rather than splitlines(): only "\n" (and "\r\n") end a row in this format.
    return [
        (number, line.split(","))
        for number, line in enumerate(text.split("\n"), start=1)
        if line.strip()
    ]


def _parse_numbers(path: str | os.PathLike, rows: list[tuple[int, list[str]]]) -> np.ndarray:
    """All fields as one float64 matrix; a token that is no number is reported by its line."""
    tokens = [token for _, fields in rows for token in fields]
    try:
        # One vectorised conversion is ~10x faster than float() per token; the slow search
        # below only runs when something is wrong.
        return np.array(tokens, dtype=np.float64).reshape(len(rows), N_COLUMNS)
    except ValueError:
        pass
    for line_no, fields in rows:
        for column, token in enumerate(fields, start=1):
            try:
                float(token)
            except ValueError:
                raise DataFormatError(
                    path, line_no, f"column {column}: {token.strip()!r} is not a number"
                ) from None
    raise AssertionError("numpy rejected a token that float() accepts")  # pragma: no cover


def _check_values(
    path: str | os.PathLike, rows: list[tuple[int, list[str]]], values: np.ndarray
) -> None:
    """Reject non-finite features and labels that are not integers in 0..N_CLASSES-1."""
    bad_feature = ~np.isfinite(values[:, :N_FEATURES]).all(axis=1)
    labels = values[:, N_FEATURES]
    bad_label = ~np.isfinite(labels) | (labels != np.round(labels))
    out_of_range = ~bad_label & ((labels < 0) | (labels >= N_CLASSES))
    checks = (
        (bad_feature, "a feature is not a finite number"),
        (bad_label, "label {label!r} is not an integer"),
        (out_of_range, f"label {{label!r}} is outside 0..{N_CLASSES - 1}"),
    )
    any_bad = bad_feature | bad_label | out_of_range
    if not any_bad.any():
        return
    index = int(np.argmax(any_bad))  # report the first bad line of the file
    problem = next(problem for mask, problem in checks if mask[index])
    label = rows[index][1][N_FEATURES].strip()
    raise DataFormatError(path, rows[index][0], problem.format(label=label))
