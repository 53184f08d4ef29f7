"""A data set of several clients: each folder under ``<data root>/sites`` is one client.

With node-resident clients (``clients.placement: nodes``) a node holds one client by
default, its data set; a data set plug-in that returns a mapping of names to data sets
makes the node hold several, as a hospital's node might hold one client per ward. Here
every subfolder of the node's ``<data root>/<folder>`` is a client named after it, its
rows read from its ``train_*`` files (and ``validate_*`` for the validation part): comma-
separated numbers, the label last, as the letters files are::

    <data root>/sites/ward-3/train_rows.txt     -> client ward-3
    <data root>/sites/ward-3/validate_rows.txt     its validation part
    <data root>/sites/ward-7/train_rows.txt     -> client ward-7

Use it: every process allows it (``--plugins sites --plugin-dir examples/plugins``) and
the run names it::

    run: {model: mlp_classifier, dataset: "sites:sites"}
    clients: {placement: nodes}

``data.args: {folder: other}`` reads ``<data root>/other`` instead. Client names must be
unique across the run's nodes: two nodes with a ``ward-3`` of different rows refuse the
run before round 1.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


class Rows:
    """The rows of some files as a map-style data set of (features, label) pairs."""

    def __init__(self, files: list[Path]) -> None:
        table = np.concatenate([np.loadtxt(path, delimiter=",", ndmin=2) for path in files])
        self.inputs = np.ascontiguousarray(table[:, :-1], dtype=np.float32)
        self.targets = table[:, -1].astype(np.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        return self.inputs[index], self.targets[index]

    def fingerprint(self) -> str:
        """Every row counts: two clients of one name must hold the same rows."""
        digest = hashlib.sha256(self.inputs.tobytes())
        digest.update(self.targets.tobytes())
        return digest.hexdigest()


def sites(root: Path, split: str, folder: str = "sites") -> dict[str, Rows]:
    """One client per subfolder of ``root/folder`` that has files of ``split``."""
    pattern = "train_*" if split == "train" else "validate_*"
    clients = {}
    for site in sorted(path for path in (Path(root) / folder).iterdir() if path.is_dir()):
        files = sorted(path for path in site.glob(pattern) if path.is_file())
        if files:
            clients[site.name] = Rows(files)
    return clients
