"""CSV and TSV tables: numeric feature columns and one label column, read strictly.

Each file of a table has the same columns. The first row is a header when ``header`` says
so, or (``auto``) when one of its cells is not a number. The label column is named by the
header, by a 0-based index, or as ``first`` / ``last``. Integer labels are class numbers;
other labels that are all numbers are regression targets; labels that are words become
class numbers in sorted order (the classes are returned, so every node agrees).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TableError(ValueError):
    """A table that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Table:
    features: np.ndarray  # (n, columns - 1) float32
    labels: np.ndarray  # (n,) int64 class numbers, or float32 targets
    classes: tuple[str, ...] | None  # label words in class order, when labels were words
    columns: tuple[str, ...] | None = None  # the feature columns' names, from a header
    label_index: int = -1  # the label's column in the file (0-based)


def read_tables(paths: Sequence[Path], delimiter: str, label: str, header: str,
                classes: tuple[str, ...] | None = None) -> Table:
    """The rows of every file in order, as one table. ``classes``: the label words of the
    training part, so a validation file numbers its classes the same way."""
    rows: list[list[str]] = []
    names: list[str] | None = None
    for path in paths:
        file_names, file_rows = _read_rows(path, delimiter, header)
        if names is None:
            names = file_names
        rows += file_rows
    if not rows:
        raise TableError(f"no data rows in {', '.join(str(p) for p in paths)}")
    width = len(rows[0])
    column = _label_column(label, names, width, paths[0])
    features = np.array([[_number(row, i, paths) for i in range(width) if i != column]
                         for row in rows], dtype=np.float32)
    labels, found = _labels([row[column] for row in rows], classes)
    columns = tuple(n for i, n in enumerate(names) if i != column) if names else None
    return Table(features, labels, found, columns, column)


def _read_rows(path: Path, delimiter: str, header: str) -> tuple[list[str] | None,
                                                                 list[list[str]]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [row for row in csv.reader(f, delimiter=delimiter) if any(c.strip()
                                                                              for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TableError(f"{path}: cannot read the table ({exc})") from None
    if not rows:
        raise TableError(f"{path}: the table is empty")
    has_header = header == "yes" or (header == "auto" and not all(_is_number(c)
                                                                  for c in rows[0]))
    names = [c.strip() for c in rows[0]] if has_header else None
    body = rows[1:] if has_header else rows
    width = len(rows[0])
    for number, row in enumerate(body, start=2 if has_header else 1):
        if len(row) != width:
            raise TableError(f"{path} line {number}: {len(row)} columns, the table has "
                             f"{width}")
    return names, body


def _label_column(label: str, names: list[str] | None, width: int, path: Path) -> int:
    if label == "first":
        return 0
    if label == "last":
        return width - 1
    if label.lstrip("-").isdigit():
        index = int(label)
        if not -width <= index < width:
            raise TableError(f"data.label: column {index} is outside the table's {width} "
                             f"columns ({path})")
        return index % width
    if names is None or label not in names:
        shown = ", ".join(names) if names else "no header"
        raise TableError(f"data.label: no column {label!r} in {path} ({shown})")
    return names.index(label)


def _number(row: list[str], index: int, paths: Sequence[Path]) -> float:
    try:
        return float(row[index])
    except ValueError:
        raise TableError(f"{paths[0].parent}: feature value {row[index]!r} in column "
                         f"{index} is not a number") from None


def _labels(values: list[str], classes: tuple[str, ...] | None
            ) -> tuple[np.ndarray, tuple[str, ...] | None]:
    stripped = [v.strip() for v in values]
    if classes is None and all(_is_int(v) for v in stripped):
        labels = np.array([int(v) for v in stripped], dtype=np.int64)
        if labels.min() < 0:
            raise TableError("class labels must be 0 or more")
        return labels, None
    if classes is None and all(_is_number(v) for v in stripped):
        return np.array([float(v) for v in stripped], dtype=np.float32), None
    order = classes or tuple(sorted(set(stripped)))
    index = {name: i for i, name in enumerate(order)}
    unknown = sorted(set(stripped) - set(index))
    if unknown:
        raise TableError(f"label {unknown[0]!r} is not a class of the training part")
    return np.array([index[v] for v in stripped], dtype=np.int64), order


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
