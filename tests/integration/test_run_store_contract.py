"""The run store's contract (coordinator/store_protocol.py), one suite for both backends:
every ledger test of tests/unit/test_run_store.py that reaches the store only through its
`store` or `new_store` fixtures, run on SQLite and on PostgreSQL (a throwaway server:
devtools/postgres_cluster.py). What only one backend does is tested beside it
(tests/unit/test_run_store.py, tests/integration/test_postgres_store.py)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit import test_run_store as ledger_tests
from tests.unit.test_run_store import A, B, FakeClock, clock, store  # noqa: F401 - fixtures
from thrift_trainer.coordinator.postgres_store import PostgresRunStore
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.coordinator.store_protocol import ResultKeeper, RunFiles, Store


def _contract_tests() -> dict[str, Callable]:
    """The ledger tests that reach the store only through the `store` or `new_store`
    fixtures, which this module points at each backend in turn."""
    tests = {}
    for name, test in vars(ledger_tests).items():
        if name.startswith("test_") and callable(test):
            wanted = set(inspect.signature(test).parameters)
            if wanted & {"store", "new_store"} and "tmp_path" not in wanted:
                tests[name] = test
    return tests


globals().update(_contract_tests())


@pytest.fixture(params=["sqlite", "postgresql"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Store]:
    """Opens a store of the backend under test."""
    if request.param == "sqlite":
        return lambda clock_=time.time: RunStore(tmp_path / "runs.db", clock=clock_)
    url = request.getfixturevalue("postgres_url")
    return lambda clock_=time.time: PostgresRunStore(url, clock=clock_, defer_writes=False)


def test_the_contract_tests_are_all_here() -> None:
    assert len(_contract_tests()) >= 18


def test_each_backend_declares_its_capabilities(new_store: Callable[..., Store]) -> None:
    with new_store() as opened:
        keeps = isinstance(opened, PostgresRunStore)  # a shared server keeps what a file can't
        assert isinstance(opened, RunFiles) is keeps
        assert isinstance(opened, ResultKeeper) is keeps
        assert opened.unreachable_since is None
