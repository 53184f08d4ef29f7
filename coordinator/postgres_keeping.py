"""What the PostgreSQL store keeps besides the ledger, so that a coordinator on another
machine can carry a run on without the first one's disk:

- run_files: each run's request.json, metrics.jsonl and checkpoint.npz (weights, optimizer
  and policy state), in bytea parts of FILE_PART_BYTES, so a model of any size fits;
- kept_results: units' results until a checkpoint covers them, so that a new leader does
  not compute them again (coordinator/kept_results.py), written by a writer of their own
  on a connection of their own, so that no ledger write waits for them.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import psycopg

from thrift_trainer.coordinator import drills
from thrift_trainer.coordinator.kept_results import StoredResult
from thrift_trainer.coordinator.ledger_steps import null_if_nan
from thrift_trainer.coordinator.postgres_location import without_passwords
from thrift_trainer.coordinator.postgres_session import PostgresSession, first_line
from thrift_trainer.coordinator.store_calls import reads_what_was_written, rides_out_outages
from thrift_trainer.coordinator.store_records import RunStoreError
from thrift_trainer.coordinator.write_behind import Call, WriteBehind

log = logging.getLogger("coordinator.store")
FILE_PART_BYTES = 16 * 2**20
RESULTS_QUEUE_BYTES = 256 * 2**20  # kept results waiting for their writer; past it: dropped

# The kept results of a run's round (parameters: run, round) whose unit is completed by
# the very attempt that brought them: the ledger and the result agree.
_KEPT_FROM = ("FROM kept_results k JOIN units u ON u.run_id = k.run_id AND u.round = k.round "
              "AND u.unit_id = k.unit_id JOIN attempts a ON a.run_id = k.run_id AND "
              "a.round = k.round AND a.unit_id = k.unit_id AND a.attempt = k.attempt "
              "WHERE k.run_id = %s AND k.round = %s AND u.status = 'completed' AND "
              "a.status = 'completed'")


class KeepsFilesAndResults:
    """The PostgreSQL store's run files and kept results (the RunFiles and ResultKeeper
    protocols of coordinator/store_protocol.py)."""

    # given by the store, whose transactions (_tx), pool (connection) and epoch check
    # (_check_epoch) these use
    path: str
    url: str
    epoch: int | None

    def _start_keeping(self) -> None:
        self._results = WriteBehind(self._write_results, "result-writer", _result_bytes,
                                    RESULTS_QUEUE_BYTES)
        self._dropped_results = False  # said once

    # ------------------------------------------------------------- run files
    @rides_out_outages
    def store_file(self, run_id: str, name: str, path: Path,
                   round_index: int | None = None) -> None:
        """Keep the file at ``path`` as the run's ``name``, replacing what was there, in one
        transaction read part by part (a checkpoint never shows half old, half new).
        ``round_index``: a checkpoint's round: the results kept for the rounds it covers
        go in the same transaction (and drills may die there: coordinator/drills.py)."""
        with self._tx() as db, open(path, "rb") as f:
            db.execute("DELETE FROM run_files WHERE run_id = %s AND name = %s", (run_id, name))
            if round_index is not None:
                db.execute("DELETE FROM kept_results WHERE run_id = %s AND round <= %s",
                           (run_id, round_index))
            part = 0
            while chunk := f.read(FILE_PART_BYTES):
                db.execute("INSERT INTO run_files (run_id, name, part, data) VALUES "
                           "(%s, %s, %s, %s)", (run_id, name, part, chunk))
                part += 1
                if round_index is not None:  # (the kept results written first)
                    drills.point("checkpoint", round_index,
                                 ready=lambda: self._results.flush(quiet=True))
            if part == 0:
                db.execute("INSERT INTO run_files (run_id, name, part, data) VALUES "
                           "(%s, %s, 0, %s)", (run_id, name, b""))

    @reads_what_was_written
    def restore_files(self, run_id: str, folder: Path) -> list[str]:
        """Write the run's kept files into ``folder`` (created if needed), each atomically;
        returns their names."""
        with self._tx(write=False) as db:
            names = [n for (n,) in db.execute("SELECT DISTINCT name FROM run_files WHERE "
                                              "run_id = %s ORDER BY name", (run_id,))]
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            partial = folder / f".{name}.restoring"
            with self._tx(write=False) as db, open(partial, "wb") as f:
                for (data,) in db.execute("SELECT data FROM run_files WHERE run_id = %s AND "
                                          "name = %s ORDER BY part", (run_id, name)):
                    f.write(data)
            partial.replace(folder / name)
        return names

    # ---------------------------------------------------------- kept results
    @rides_out_outages
    def keep_result(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                    node: str, num_samples: int, loss: float, names: str, data: bytes,
                    sequence: int | None = None, staleness: int | None = None) -> None:
        """Keep the result attempt ``attempt`` brought to a unit (``names``: its tensors'
        names as JSON, ``data`` their arrays; a stream's ``sequence`` among its round's
        results and ``staleness``: coordinator/kept_results.py), under this leader's
        epoch. A unit's result is kept once: a second is refused (ValueError)."""
        with self._tx() as db:
            _insert_result(db, self.epoch, run_id, round_index, unit_id, attempt, node,
                           num_samples, loss, names, data, sequence, staleness)

    def _keep_later(self, call: Call) -> None:
        """Queue a kept result for the result writer; dropped (said once) when results
        wait for more than RESULTS_QUEUE_BYTES: the database is slower than the run."""
        if not self._results.put(call) and not self._dropped_results:
            self._dropped_results = True
            log.warning("run store %s: results come faster than it writes them: some are not "
                        "kept (a takeover computes those again)", self.path)

    def _write_results(self, calls: list[Call]) -> None:
        """Write kept results in one transaction on a connection of their own, so that the
        ledger's writes (a round's end among them) never wait for them. A batch that fails
        is dropped with a warning: a result not kept is computed again after a takeover,
        nothing worse; a leader that lost the lead writes none (its epoch is checked)."""
        try:
            with self.connection() as connection:
                db = PostgresSession(connection)
                db.execute("BEGIN")
                try:
                    self._check_epoch(db)
                    with connection.pipeline():
                        for _, args, kwargs in calls:
                            _insert_result(db, self.epoch, *args, **kwargs)
                    db.execute("COMMIT")
                except BaseException:
                    connection.rollback()
                    raise
        except (psycopg.Error, RunStoreError, ValueError) as exc:
            log.warning("run store %s: %d kept results not written: %s", self.path,
                        len(calls), without_passwords(first_line(exc), self.url))

    @reads_what_was_written
    def kept_results(self, run_id: str, round_index: int) -> list[StoredResult]:
        """The results kept for a round's completed units: a stream's in the order they
        were kept, a round's by unit id."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT k.unit_id, k.attempt, k.node, k.num_samples, k.loss, "
                              f"k.names, k.sequence, k.staleness, u.pass {_KEPT_FROM} "
                              "ORDER BY k.sequence, k.unit_id", (run_id, round_index)).fetchall()
            return [StoredResult(unit_id, attempt, node, samples,
                                 math.nan if loss is None else loss, names,
                                 _result_data(db, run_id, round_index, unit_id), *order)
                    for unit_id, attempt, node, samples, loss, names, *order in rows]

    def _results_kept(self, db: PostgresSession, run_id: str,
                      round_index: int) -> set[tuple[int, str]]:
        """A round's units with a kept result; a stream's, those of its results kept
        without a gap from the round's first (the versions they made are made again only
        in their order). The run's other kept results are forgotten (a resume)."""
        rows = db.execute(f"SELECT k.unit_id, k.sequence {_KEPT_FROM} ORDER BY k.sequence",
                          (run_id, round_index)).fetchall()
        if any(sequence is not None for _, sequence in rows):
            rows = _up_to_the_first_gap(rows)
        kept = {(round_index, unit_id) for unit_id, _ in rows}
        db.execute("DELETE FROM kept_results WHERE run_id = %s AND NOT (round = %s AND "
                   "unit_id = ANY(%s))", (run_id, round_index, [u for _, u in kept]))
        return kept

    def _run_ended(self, db: PostgresSession, run_id: str, state: str) -> None:
        if state == "completed":  # a failed or cancelled run may be resumed: they wait
            db.execute("DELETE FROM kept_results WHERE run_id = %s", (run_id,))


def _result_data(db: PostgresSession, run_id: str, round_index: int, unit_id: str) -> bytes:
    return b"".join(bytes(data) for (data,) in db.execute(
        "SELECT data FROM kept_result_parts WHERE run_id = %s AND round = %s AND "
        "unit_id = %s ORDER BY part", (run_id, round_index, unit_id)))


def _insert_result(db: PostgresSession, epoch: int | None, run_id: str, round_index: int,
                   unit_id: str, attempt: int, node: str, num_samples: int, loss: float,
                   names: str, data: bytes, sequence: int | None = None,
                   staleness: int | None = None) -> None:
    """The rows of one kept result (see keep_result), while its run is running: a result
    whose write comes after its run ended is not kept."""
    try:
        db.execute("INSERT INTO kept_results (run_id, round, unit_id, attempt, epoch, node, "
                   "num_samples, loss, names, sequence, staleness) SELECT %s, %s, %s, %s, %s, "
                   "%s, %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM runs WHERE id = %s AND "
                   "state = 'running')", (run_id, round_index, unit_id, attempt, epoch, node,
                                          num_samples, null_if_nan(loss), names, sequence,
                                          staleness, run_id))
        view = memoryview(data)
        for part, start in enumerate(range(0, max(len(view), 1), FILE_PART_BYTES)):
            db.execute("INSERT INTO kept_result_parts (run_id, round, unit_id, part, data) "
                       "SELECT %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM kept_results "
                       "WHERE run_id = %s AND round = %s AND unit_id = %s)",
                       (run_id, round_index, unit_id, part, view[start:start + FILE_PART_BYTES],
                        run_id, round_index, unit_id))
    except psycopg.IntegrityError as exc:
        raise ValueError(f"unit {unit_id} (run {run_id}, round {round_index}): its result "
                         f"cannot be kept: {first_line(exc)}") from None


def _result_bytes(call: Call) -> int:
    """The bytes a queued keep_result holds: its tensors'."""
    _, args, _ = call
    return len(args[8])


def _up_to_the_first_gap(rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (unit, sequence) rows, by sequence, whose sequences run 0, 1, 2, ... unbroken."""
    unbroken = []
    for place, row in enumerate(rows):
        if row[1] != place:
            break
        unbroken.append(row)
    return unbroken


