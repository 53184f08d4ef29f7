"""A node's runs, parsed and checked once: the spec, the algorithm and its checked config.

Every unit carries its run's whole config (``config_json``), and every unit of a run
carries the same one. Parsing it into a `RunSpec`, checking that the node can serve the
run and checking the algorithm's config costs a few hundred microseconds, all on the
unit's path; a node does it for a run's first unit and keeps the outcome here for the
units that follow.

Entries are keyed by the run id and a digest of the request fields the outcome depends
on (algorithm, model, data set and the config_json's bytes), so a unit of the same run with
another config is parsed and checked again. Memory is bounded whatever peers send: the
``max_runs`` entries used last, and no entry for a config_json over ``max_config_bytes``
(such a unit is parsed and checked every time, as any unit once was). Only what passed
its checks is kept: a refused unit is refused afresh every time.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.wire.generated import ttypes

DEFAULT_MAX_RUNS = 8
DEFAULT_MAX_CONFIG_BYTES = 64 * 1024  # recipes' configs are a few hundred bytes


@dataclass(frozen=True)
class CheckedRun:
    """What a node makes of a run's request fields, once they passed its checks; shared by
    the run's units, which only read it."""

    spec: RunSpec
    algorithm: type[Algorithm]
    given: dict[str, Any]  # the algorithm's config as the request gives it
    config: Mapping[str, Any]  # that config checked, defaults filled in
    location: Path  # the data set's folder on this node


class RunConfigs:
    """The checked runs of the units a node served last (thread-safe)."""

    def __init__(self, check: Callable[[ttypes.WorkRequest], CheckedRun],
                 max_runs: int = DEFAULT_MAX_RUNS,
                 max_config_bytes: int = DEFAULT_MAX_CONFIG_BYTES) -> None:
        self._check = check
        self._max_runs = max_runs
        self._max_config_bytes = max_config_bytes
        self._runs: OrderedDict[tuple[str, bytes], CheckedRun] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)

    def checked(self, request: ttypes.WorkRequest) -> CheckedRun:
        """The request's run, parsed and checked by ``check`` on its first unit (whose
        errors it raises), kept for the units after it."""
        config_json = (request.config_json or "").encode()
        if len(config_json) > self._max_config_bytes:
            return self._check(request)
        key = (request.run_id, _digest(request, config_json))
        with self._lock:
            run = self._runs.get(key)
            if run is not None:
                self._runs.move_to_end(key)
                return run
        run = self._check(request)  # outside the lock: units of other runs go on meanwhile
        with self._lock:
            self._runs[key] = run
            self._runs.move_to_end(key)
            while len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        return run


def _digest(request: ttypes.WorkRequest, config_json: bytes) -> bytes:
    """A digest of every request field a run's checks read, each one length-prefixed so
    that no two different requests run together into the same bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (request.algorithm, request.model, request.dataset):
        text = (part if isinstance(part, str) else repr(part)).encode()
        digest.update(len(text).to_bytes(8, "big") + text)
    digest.update(config_json)
    return digest.digest()
