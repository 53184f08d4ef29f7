"""Per-run state a node keeps between units: MD-GAN's discriminators and their optimizers.

A session is named by (run id, session name), e.g. ("4e9e61e328e3", "d3"). Its ``state``
belongs to the algorithm that created it (this module only asks it for ``export()``), and
the store never holds more than ``max_sessions`` of them: past the bound, the least
recently used idle session is dropped (a run that needs it again starts it afresh, as a
node that takes a slot over after a crash does). The coordinator drops a run's sessions
when the run ends (``drop_sessions``).

Imports are two-phase. ``stage`` only files the tensors under their swap id; the
algorithm installs them (``take_staged``) when a unit that carries that swap id or a later
one arrives. A unit still running for an earlier iteration therefore never sees a half-done
swap, and ``export`` always reads the state as it was trained, never a staged import: a
node can send its own ``d3`` and receive another ``d3`` in the same swap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("compute_node.sessions")

DEFAULT_MAX_SESSIONS = 256
Tensors = dict[str, np.ndarray]


class SessionError(ValueError):
    """A session that does not exist or holds nothing to export; the message names it."""


class Exportable(Protocol):
    def export(self) -> Tensors:
        """The state as named arrays, as another node's ``load`` takes them."""


@dataclass
class Session:
    """One session: the algorithm's state, the latest iteration it trained, staged imports."""

    state: Any = None
    last_round: int = 0
    staged: dict[int, Tensors] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # callers inside `use` or waiting for it: such a session is never evicted

    def take_staged(self, swap_id: int) -> Tensors | None:
        """The newest import staged for ``swap_id`` or earlier (older ones are superseded);
        imports for later swaps stay staged."""
        due = sorted(i for i in self.staged if i <= swap_id)
        if not due:
            return None
        tensors = self.staged[due[-1]]
        for i in due:
            del self.staged[i]
        return tensors


class SessionStore:
    """Sessions under one lock for the index; each session has its own lock for its state."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    @contextlib.contextmanager
    def use(self, run_id: str, name: str) -> Iterator[Session]:
        """The session, created empty if new, held under its lock for the block."""
        session = self._get_or_create(run_id, name)
        try:
            with session.lock:
                yield session
        finally:
            with self._lock:
                session.users -= 1

    def stage(self, run_id: str, name: str, swap_id: int, tensors: Tensors) -> None:
        """File an import; it takes effect when a unit with swap id >= ``swap_id`` arrives."""
        with self.use(run_id, name) as session:
            session.staged[swap_id] = tensors

    def export(self, run_id: str, name: str) -> Tensors:
        """The session's trained state (staged imports left out)."""
        with self._lock:
            session = self._sessions.get((run_id, name))
        if session is None:
            raise SessionError(f"no session {name!r} of run {run_id!r} on this node")
        with session.lock:
            if session.state is None:
                raise SessionError(f"session {name!r} of run {run_id!r} has not trained yet")
            return session.state.export()

    def drop_run(self, run_id: str) -> int:
        """Forget every session of the run; returns how many there were."""
        with self._lock:
            keys = [key for key in self._sessions if key[0] == run_id]
            for key in keys:
                del self._sessions[key]
        return len(keys)

    def _get_or_create(self, run_id: str, name: str) -> Session:
        with self._lock:
            key = (run_id, name)
            session = self._sessions.get(key)
            if session is None:
                self._evict_for_one()
                session = self._sessions[key] = Session()
            self._sessions.move_to_end(key)
            session.users += 1
            return session

    def _evict_for_one(self) -> None:
        """Make room for a new session by dropping the least recently used idle ones."""
        for key in list(self._sessions):
            if len(self._sessions) < self.max_sessions:
                return
            if self._sessions[key].users == 0:
                log.warning("session store full (%d): dropping session %s of run %s",
                            self.max_sessions, key[1], key[0])
                del self._sessions[key]
