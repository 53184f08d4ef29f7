"""Which of the coordinators sharing a PostgreSQL run store leads: a lease with a fencing
epoch, in the store's one-row `leader` table.

Every coordinator started on the store runs a LeaseKeeper. One that does not lead tries,
every `lease/3` seconds, to take the lease in one transaction that succeeds only when
nobody holds it or its holder let it expire; taking it adds one to the epoch. The leader renews
it as often, in an UPDATE that succeeds only while the epoch is still its own. Expiry is
judged by the database's clock, so the coordinators' clocks need not agree.

The lease's expiry is a row of its own (table lease), apart from the epoch (table leader):
the leader's writes share-lock the leader row to check the epoch, and a renewal that had
to wait for them could starve behind a busy leader's back-to-back transactions.

The epoch fences the store (coordinator/postgres_store.py): a leader that missed its
renewals (paused, cut off) and was replaced can write nothing once the next one holds
the lease, and steps down at its next renewal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # psycopg loads only where a PostgreSQL store is used, not at start
    from thrift_trainer.coordinator.postgres_store import PostgresRunStore

log = logging.getLogger("coordinator.leadership")
LEASE_SECONDS = 6.0
LOCK_TIMEOUT_MS = 1000  # a takeover waits this long for the old leader's write in progress
# A statement is tried again at once on another connection when its own was ended: a new
# leader ends every session of the old one, idle ones in the pool included (up to its size).
TRIES = 5
# Reading who leads is made for an answer (status, train's end): while the database is
# away it must not hold the caller for the pool's whole connection timeout.
READ_WAIT_SECONDS = 1.0

# Taking the lease: the expired lease first (a second standby trying at once waits for
# this one, then finds it live), then the epoch, which waits for the write in progress of
# an old leader that still runs (its share lock on the leader row).
_TAKE_LEASE = """UPDATE lease SET expires = clock_timestamp() + make_interval(secs => %s)
    WHERE id = 1 AND (expires IS NULL OR expires < clock_timestamp()) RETURNING id"""
# The expired holder's sessions are ended first: one stopped in the middle of a pipeline of
# statements is not "idle in transaction" to the server, so no timeout would ever free the
# locks it holds. Every coordinator names its sessions by its holder (application_name).
_END_OLD_SESSIONS = """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
    AND application_name = (SELECT holder FROM leader WHERE id = 1)"""
_TAKE_EPOCH = """UPDATE leader SET epoch = epoch + 1, holder = %s, address = %s WHERE id = 1
    RETURNING epoch"""
_RENEW = """UPDATE lease SET expires = clock_timestamp() + make_interval(secs => %s)
    WHERE id = 1 AND EXISTS (SELECT 1 FROM leader WHERE id = 1 AND epoch = %s AND holder = %s)
    RETURNING id"""
_READ = """SELECT address, epoch, holder IS NOT NULL AND expires >= clock_timestamp()
    FROM leader, lease WHERE leader.id = 1 AND lease.id = 1"""
_RELEASE = """UPDATE lease SET expires = NULL WHERE id = 1 AND EXISTS (SELECT 1 FROM leader
    WHERE id = 1 AND epoch = %s) RETURNING id"""


@dataclass(frozen=True)
class Leader:
    """Who leads, as the store says: ``live`` is False when the lease has expired."""

    address: str | None
    epoch: int
    live: bool


class LeaseKeeper:
    """Takes, renews and gives up the lease for one coordinator; see the module docstring.
    ``on_lead(epoch)`` runs in the keeper's thread once the lease is taken (and the store
    fenced with it), before the next renewal; ``on_lose(leader)`` once a renewal finds
    another epoch."""

    def __init__(self, store: PostgresRunStore, address: str, on_lead: Callable[[int], None],
                 on_lose: Callable[[Leader], None], lease_seconds: float = LEASE_SECONDS) -> None:
        self.store = store
        self.address = address
        self.holder = store.application_name  # also the name of its database sessions
        self.lease_seconds = lease_seconds
        self.epoch: int | None = None  # set while leading
        self.confirmed = 0.0  # time.monotonic() before the last renewal that succeeded
        self._on_lead, self._on_lose = on_lead, on_lose
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="lease-keeper", daemon=True)
        self._unreachable = False  # said once per outage
        store.fence(None)  # until it leads, this coordinator writes nothing

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop keeping the lease; ``release`` hands it back at once (a clean shutdown), so
        a standby need not wait for it to expire."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(self.lease_seconds)
        if release and self.epoch is not None:
            self._run(_RELEASE, (self.epoch,))

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    @property
    def renewal_seconds(self) -> float:
        return self.lease_seconds / 3

    def confirmed_lately(self) -> bool:
        """Whether the lease was taken or renewed less than a renewal interval ago: then
        nobody else can hold it yet. A leader paused past that (SIGSTOP, a long GC) may
        have been replaced without knowing it."""
        return (self.epoch is not None
                and time.monotonic() - self.confirmed < self.renewal_seconds)

    def superseded(self) -> bool:
        """Whether this keeper does not lead, or the store names a newer epoch than its own
        (False when the store cannot be read: unknown, as for a renewal)."""
        own, leader = self.epoch, self.leader()
        return own is None or (leader is not None and leader.epoch != own)

    def leader(self) -> Leader | None:
        """The leader the store names, or None if it cannot be read."""
        row = self._run(_READ, (), wait_seconds=READ_WAIT_SECONDS)
        return None if row is None else Leader(*row)

    def step(self) -> None:
        """One try to take the lease, or one renewal (the keeper's thread calls it every
        lease/3 seconds; tests call it directly)."""
        began = time.monotonic()  # the lease runs from later than this
        if self.epoch is None:
            row = self._run(_TAKE_LEASE, (self.lease_seconds,), then=[
                (_END_OLD_SESSIONS, ()), (_TAKE_EPOCH, (self.holder, self.address))])
            if row is not None:
                self.epoch, self.confirmed = row[0], began
                self.store.fence(self.epoch)
                log.warning("leading the run store %s (epoch %d)", self.store.path, self.epoch)
                self._on_lead(self.epoch)
            return
        renewed = self._run(_RENEW, (self.lease_seconds, self.epoch, self.holder),
                            failed=False)
        if renewed:
            self.confirmed = began
        elif renewed is None:
            lost, self.epoch = self.epoch, None
            leader = self.leader() or Leader(None, lost + 1, False)
            log.warning("stepped down: the lease of epoch %d is lost, %s leads now (epoch %d)",
                        lost, leader.address or "another coordinator", leader.epoch)
            self._on_lose(leader)

    def _keep(self) -> None:
        while not self._stopped.wait(self.renewal_seconds):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the keeper must go on; the log says what
                log.exception("lease keeper")

    def _run(self, sql: str, parameters: tuple, failed: object = None,
             then: list[tuple[str, tuple]] = (), wait_seconds: float | None = None
             ) -> tuple | None:
        """One statement in a transaction of its own (followed by the statements of
        ``then`` when it matched a row); the last one's row, None when it matched none.
        When the database cannot be reached the answer is ``failed`` (None: as if no row
        matched; a renewal passes False, meaning: unknown, keep leading until fenced).
        ``wait_seconds``: the longest wait for a connection (None: the store's default)."""
        import psycopg

        try:
            row = self._try(sql, parameters, then, wait_seconds)
        except (psycopg.Error, OSError) as exc:
            if not self._unreachable:
                log.warning("lease: the run store %s cannot be reached: %s", self.store.path,
                            str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            self._unreachable = True
            return failed  # type: ignore[return-value]
        self._unreachable = False
        return row

    def _try(self, sql: str, parameters: tuple, then: list[tuple[str, tuple]],
             wait_seconds: float | None) -> tuple | None:
        """``_run``'s transaction, on another connection of the pool when the server had
        ended the one it got (the pool drops a broken connection)."""
        import psycopg

        for tries_left in range(TRIES - 1, -1, -1):
            with self.store.connection(wait_seconds) as db:
                try:
                    with db.transaction():
                        db.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                        row = db.execute(sql, parameters).fetchone()
                        for statement in then if row is not None else ():
                            row = db.execute(*statement).fetchone()
                    return row
                except psycopg.OperationalError:
                    if not db.broken or not tries_left:
                        raise
        return None
