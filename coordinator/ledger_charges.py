"""The privacy budget's durable record: each release of a private run's noised update,
charged before anyone can see it (docs/privacy.md, "What survives a crash").

A charge is a row of `privacy_charges`, numbered within its run. A resume never drops one
(it forgets the rounds after its checkpoint, not what the coordinator has already seen), so
a round computed twice after a crash stays charged twice where each computation was seen
(distributed DP: the coordinator is the party the noise protects against, and it learns
each computation's noised sum). Where a round's computations release at most one of them
(central DP: the weights leave only after the round's checkpoint, recomputed with the same
noise), a charge is made once per round (`once_per_round`).

The call is never made later in a batch (it is not one of write_behind.DEFERRED): it
returns once the row is committed, or raises, so a caller that goes on after it has the
charge on record. Shared by both stores, as the rest of the ledger (coordinator/
sql_ledger.py).
"""

from __future__ import annotations

from typing import Any

from thrift_trainer.coordinator.ledger_sql import LedgerSql
from thrift_trainer.coordinator.ledger_steps import null_if_nan, run_state
from thrift_trainer.coordinator.store_calls import reads_what_was_written, rides_out_outages
from thrift_trainer.coordinator.store_records import PrivacyCharge


class ChargeWrites:
    """`charge_release` and `privacy_charges` of an SQL store (coordinator/sql_ledger.py
    gives ``_tx``, ``_q`` and ``_clock``)."""

    _q: LedgerSql
    _tx: Any
    _clock: Any

    @rides_out_outages
    def charge_release(self, run_id: str, round_index: int, epsilon: float,
                       once_per_round: bool = False) -> int:
        """Charge a release of round ``round_index`` (``epsilon``: the run's after it),
        committed before this returns; ``once_per_round``: not again for a round already
        charged. Returns the run's charges."""
        q = self._q
        with self._tx() as db:
            run_state(db, q, run_id)  # UnknownRecord for a run the store lacks
            if not (once_per_round and db.execute(
                    q.round_charged, (run_id, round_index)).fetchone()):
                db.execute(q.charge_insert, (run_id, round_index, null_if_nan(epsilon),
                                             self._clock(), run_id))
            return int(db.execute(q.charge_count, (run_id,)).fetchone()[0])

    @reads_what_was_written
    def privacy_charges(self, run_id: str) -> list[PrivacyCharge]:
        """The run's charges, in order (none for a run without privacy)."""
        with self._tx(write=False) as db:
            rows = db.execute(self._q.list_charges, (run_id,)).fetchall()
        return [PrivacyCharge(int(c), int(r), e, t) for c, r, e, t in rows]
