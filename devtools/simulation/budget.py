"""The privacy budget of a simulated private run, against the releases it made.

A private run (docs/privacy.md) spends one release per round: epsilon is derived from the
rounds the run store holds or the releases it charged (`privacy_charges`, each committed
before anyone can see its release, and never dropped by a resume), whichever is more, and
a resumed run goes on from them. So the budget the store records is the larger of its
counts of the run's `rounds` and `privacy_charges` rows, read here with plain SQL
(`charged_releases`), not from the coordinator's objects.

The releases made are counted from what became visible, never from the budget code
(`Releases`):

- the weights each node was sent: a unit's model version is the release its weights are
  (a sync round r's training units carry release r - 1, a federated evaluation after
  round r release r, a private buffered run's version v release v), each told apart by a
  digest of the weights, so a round computed twice from different results counts twice;
- the round of the checkpoint on disk, and the round the status shows (what
  `client.py status` reads), by their index alone.

`budget_problems` holds the store to them: its rounds are at least the highest release
index seen, and at least the distinct releases nodes were sent. The simulator checks it
at every crash point (a coordinator killed, or stopped by its failing store: what it
committed is what the next one resumes from) and at the end of the plan.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from thrift_trainer.training.outputs.model_file import ModelFileError, load_model
from thrift_trainer.wire.generated import ttypes

PREFIX = "privacy budget: "
CHECKPOINT_FILE = "checkpoint.npz"  # coordinator/checkpoint.py's, in the run's folder


@dataclass
class Releases:
    """The noised releases of one run that became visible, as the simulation saw them."""

    sent: set[tuple[int, str]] = field(default_factory=set)  # (release, weights digest)
    highest: int = 0  # the highest release seen anywhere
    seen_in: str = ""  # where it was first seen (for the report)

    def node_sent(self, request: ttypes.WorkRequest) -> None:
        """A node was sent ``request``: its weights are release ``model_version``."""
        release = request.model_version
        if release is None or release < 1:
            return  # the initial weights: no release
        if request.weights:  # (weights a node kept from an earlier unit come empty)
            self.sent.add((release, weights_digest(request.weights)))
        self.seen(release, f"sent to {request.kind or 'a training'} unit "
                           f"{request.unit_id} of round {request.round}")

    def seen(self, release: int, where: str) -> None:
        """Release ``release`` was visible in ``where``."""
        if release > self.highest:
            self.highest, self.seen_in = release, where

    def saw_checkpoint(self, run_dir: Path) -> None:
        """The checkpoint on disk, if any, holds its round's release."""
        path = run_dir / CHECKPOINT_FILE
        if not path.is_file():
            return
        try:  # the description alone: it holds the round
            _, description = load_model(path, keep=lambda name: False)
        except ModelFileError:
            return  # written atomically: a damaged one is the ledger's checks' to find
        round_index = description.get("round")
        if isinstance(round_index, int):
            self.seen(round_index, "the checkpoint")


def weights_digest(tensors: list[ttypes.Tensor]) -> str:
    """SHA-256 of the tensors as sent: names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for tensor in sorted(tensors, key=lambda t: t.name):
        digest.update(f"{tensor.name}:{tensor.dtype}:{list(tensor.shape)}\n".encode())
        digest.update(tensor.data)
    return digest.hexdigest()


def charged_releases(store: Path, run_id: str) -> int:
    """The releases the run store charges ``run_id``: its rounds rows or its charges,
    whichever are more (0 before any)."""
    if not store.is_file():
        return 0
    db = sqlite3.connect(store)
    try:
        return max(_rows(db, "rounds", run_id), _rows(db, "privacy_charges", run_id))
    finally:
        db.close()


def _rows(db: sqlite3.Connection, table: str, run_id: str) -> int:
    """The run's rows in ``table`` (0 where the store has no such table yet: never opened,
    or of a schema before it)."""
    try:
        return int(db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?",
                              (run_id,)).fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def budget_problems(charged: int, releases: Releases, when: str) -> list[str]:
    """What the budget the store records (``charged``) shows against the releases made,
    at ``when`` (nothing: an empty list)."""
    problems = []
    if charged < releases.highest:
        problems.append(f"{PREFIX}{when}, the store charges {charged} releases, and release "
                        f"{releases.highest} was visible ({releases.seen_in})")
    distinct = len(releases.sent)
    if charged < distinct:
        rounds = sorted(r for r, _ in releases.sent)
        twice = sorted({r for r in rounds if rounds.count(r) > 1})
        problems.append(f"{PREFIX}{when}, the store charges {charged} releases, and nodes "
                        f"were sent {distinct} different ones"
                        + (f" (rounds computed twice: {twice})" if twice else ""))
    return problems
