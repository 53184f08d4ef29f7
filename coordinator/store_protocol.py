"""What a run store offers, by capability; callers type against these, not a backend.

Two backends implement them as peers: coordinator/run_store.py on SQLite (one
coordinator's file) and coordinator/postgres_store.py on PostgreSQL (shared by a leader
and its standbys). Every store is a RunLedger (the writes the engine and the coordinator
make, with the life cycle's checks) and LedgerQueries (what `status`, `runs` and the
dashboard read). A store that can serve a coordinator on another machine is also a
RunFiles (a run's request, metrics and checkpoint) and a ResultKeeper (units' results
until a checkpoint covers them, coordinator/kept_results.py): callers ask with
isinstance, once per run, never per call. The same tests run on both backends
(tests/integration/test_run_store_contract.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from thrift_trainer.engine.ledger import LedgerStore

if TYPE_CHECKING:
    from thrift_trainer.coordinator.kept_results import StoredResult
    from thrift_trainer.coordinator.store_records import (
        NodeRecord,
        PrivacyCharge,
        RoundRecord,
        RunRecord,
        UnfinishedUnit,
        UnitEvent,
    )


class Database(Protocol):
    """What the ledger's statements run on: an sqlite3 connection, or a psycopg session
    (coordinator/postgres_store.py); each takes its own placeholder."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


class RunLedger(LedgerStore, Protocol):
    """The writes: runs, rounds, units and their attempts, nodes' counts. A refusal
    raises RunStoreError or ValueError and changes nothing; a write the database could
    not make raises StoreUnavailable."""

    def create_run(self, run_id: str, *, algorithm: str, model: str, dataset: str,
                   rounds: int, config: Mapping[str, Any] | None = None,
                   policy: int | None = None) -> None: ...

    def fail_unfinished_runs(self, message: str = ...) -> list[str]: ...

    def resume_run(self, run_id: str, from_round: int, rounds: int | None = None) -> int: ...

    def move_unit(self, run_id: str, round_index: int, unit_id: str, status: str,
                  reason: str | None = None) -> None: ...

    def charge_release(self, run_id: str, round_index: int, epsilon: float,
                       once_per_round: bool = False) -> int: ...

    def batch(self) -> AbstractContextManager[None]: ...


class LedgerQueries(Protocol):
    """The reads, each from one snapshot of the store."""

    def get_run(self, run_id: str) -> RunRecord | None: ...

    def list_runs(self, limit: int = 20) -> list[RunRecord]: ...

    def list_rounds(self, run_id: str) -> list[RoundRecord]: ...

    def unfinished_units(self, run_id: str) -> list[UnfinishedUnit]: ...

    def unit_history(self, run_id: str, round_index: int, unit_id: str) -> list[UnitEvent]: ...

    def latest_discard(self, run_id: str) -> str | None: ...

    def ledger_counts(self, run_id: str, round_index: int | None = None) -> dict[str, int]: ...

    def pass_counts(self, run_id: str) -> dict[int, dict[str, int]]: ...

    def node_stats(self, run_id: str) -> list[NodeRecord]: ...

    def privacy_charges(self, run_id: str) -> list[PrivacyCharge]: ...


class Store(RunLedger, LedgerQueries, Protocol):
    """A whole store: the ledger, its queries, and its life as an open database.
    ``path``: what messages name it by (a PostgreSQL location without its password);
    ``unreachable_since``: since when (runtime.monotonic()) its database cannot be
    reached, None while it can (always None for a file)."""

    path: str

    @property
    def unreachable_since(self) -> float | None: ...

    def close(self) -> None: ...

    def abandon(self) -> None: ...

    def __enter__(self) -> Store: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class RunFiles(Protocol):
    """A run's files (request.json, metrics.jsonl, checkpoint.npz) kept in the store, for
    a coordinator that takes the run over on another machine."""

    def store_file(self, run_id: str, name: str, path: Path,
                   round_index: int | None = None) -> None: ...

    def restore_files(self, run_id: str, folder: Path) -> list[str]: ...


@runtime_checkable
class ResultKeeper(Protocol):
    """Units' results kept until a checkpoint covers them (coordinator/kept_results.py)."""

    def keep_result(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                    node: str, num_samples: int, loss: float, names: str, data: bytes,
                    sequence: int | None = None, staleness: int | None = None) -> None: ...

    def kept_results(self, run_id: str, round_index: int) -> list[StoredResult]: ...

