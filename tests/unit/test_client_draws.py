"""Federated clients in the async and buffered modes (FedBuff): which client a stream trains
next, how many train at once, and what a round's end says of them."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from tests.inprocess import LocalNode
from tests.unit.test_stream_state import NODE, Recorder, Served, drive, result, take
from thrift_trainer.engine.client_draws import ClientDraws
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.stream_records import RoundEnd, StreamPosition
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.training.clients.errors import ClientsError
from thrift_trainer.training.clients.sampling import stream_draw
from thrift_trainer.training.schedule import ScheduleSettings
from thrift_trainer.training.units import UnitSpec

NAMES = [f"client{k}" for k in range(20)]
UNITS = [UnitSpec(name, "", client=name) for name in NAMES]


def test_a_draw_is_a_pure_function_of_seed_version_and_draw_number():
    first = [stream_draw(7, version, k, NAMES) for version in range(3) for k in range(10)]
    assert first == [stream_draw(7, version, k, list(reversed(NAMES)))
                     for version in range(3) for k in range(10)]  # any listing order
    assert first != [stream_draw(8, version, k, NAMES) for version in range(3)
                     for k in range(10)]
    assert len(set(first)) > 5
    assert stream_draw(7, 0, 0, []) is None
    with pytest.raises(ClientsError):
        stream_draw(7, -1, 0, NAMES)


def test_a_draw_is_uniform_over_its_candidates():
    candidates = NAMES[:5]
    counts = Counter(stream_draw(1, 0, k, candidates) for k in range(5000))
    assert set(counts) == set(candidates)
    expected = 1000
    chi2 = sum((n - expected) ** 2 / expected for n in counts.values())
    assert chi2 < 18.5  # 4 degrees of freedom: p < 0.001


def draws(held=lambda name: True, at_once: int = 4, units=UNITS) -> ClientDraws:
    return ClientDraws(3, lambda: list(units), held, lambda capacity: at_once)


def test_only_held_clients_not_training_are_drawn():
    chooser = draws(held=lambda name: int(name[6:]) < 10)
    busy: set[str] = set()
    for k in range(10):
        unit = chooser.draw(0, k + 1, busy)
        assert unit is not None and unit.client not in busy and int(unit.client[6:]) < 10
        assert unit.unit_id == f"{unit.client}.d{k + 1}"
        busy.add(unit.client)
    assert chooser.draw(0, 11, busy) is None  # every held client trains: none to draw


def test_a_draws_id_rebuilds_its_unit_and_another_id_is_refused():
    chooser = draws()
    assert chooser.spec_of("client7.d12") == UnitSpec("client7.d12", "", client="client7")
    for bad in ("client7", "client99.d3", "client7.dx", "u0.p1"):
        with pytest.raises(ValueError):
            chooser.spec_of(bad)


def test_concurrency_is_capped_by_what_the_nodes_take():
    assert draws(at_once=4).concurrency(8) == 4
    assert draws(at_once=4).concurrency(2) == 2
    assert draws(at_once=0).concurrency(2) == 1


def client_stream(chooser: ClientDraws, *, rounds: int = 3, updates_per_round: int = 2,
                  buffer_size: int = 2, position: StreamPosition | None = None,
                  recorder: Recorder | None = None) -> Served:
    state = Served(recorder or Recorder(), weights={"w": np.zeros(2)}, first_round=1,
                   last_round=rounds, updates_per_round=updates_per_round,
                   schedule=ScheduleSettings(mode="buffered", buffer_size=buffer_size),
                   plan_pass=lambda p: pytest.fail("a client stream plans no pass"),
                   scalable=lambda name: True, ledger=UnitLedger(None, "r1"),
                   max_attempts=4, position=position, draws=chooser)
    state.max_in_flight = 10
    return state


def keep(state: Served, unit, samples: int = 10, loss: float = 0.5) -> None:
    attempt = state.start_attempt(unit, NODE)
    state.end_attempt(unit, attempt)
    res = result(state.version, samples=samples)
    res.loss = loss
    assert state.complete(unit, res.update, res, "n0")
    state.serve()
    state.release(unit)


def out_clients(state: Served) -> list[str]:
    return [u.spec.client for u in state.units if u.reserved or u.started]


def test_a_stream_keeps_its_concurrency_of_distinct_clients_training():
    state = client_stream(draws(at_once=4), updates_per_round=50)
    units = [take(state) for _ in range(4)]
    assert len({u.spec.client for u in units}) == 4
    assert not state._may_issue(backups_only=False)  # no fifth while four train
    for _ in range(30):  # one leaves, another comes: never a client twice at once
        keep(state, units.pop(0))
        units.append(take(state))
        clients = out_clients(state)
        assert len(clients) == 4 == len(set(clients)), clients
    assert state.pass_index == 34  # one draw per unit issued


def test_buffered_clients_are_averaged_by_their_examples_and_each_line_has_its_version():
    recorder = Recorder()
    state = client_stream(draws(at_once=2), recorder=recorder, updates_per_round=2)
    ends: list[RoundEnd] = []
    first, second = take(state), take(state)
    keep(state, first, samples=10)
    keep(state, second, samples=30)
    assert state.version == 1 and [r.num_samples for r in recorder.calls[0]] == [10, 30]
    third, drop = take(state), take(state)
    assert third.spec.client != drop.spec.client
    assert state.drop(drop, "no live node holds it")  # its holder is away
    state.release(drop)
    keep(state, third)
    fifth = take(state)
    assert fifth.spec.client != drop.spec.client  # out of the round once dropped
    keep(state, fifth)
    assert state.version == 2 and state.round_end is not None
    ends.append(state.round_end)
    lines = [(e.version, e.result.unit.client if e.result else e.failure.unit.client,
              e.dropped) for e in ends[0].clients]
    assert lines[:2] == [(1, first.spec.client, False), (1, second.spec.client, False)]
    assert (1, drop.spec.client, True) in lines
    assert sorted(lines[-2:]) == sorted([(2, third.spec.client, False),
                                         (2, fifth.spec.client, False)])
    assert all(e.result is None or e.result.update == {} for e in ends[0].clients)


def test_a_resumed_stream_reopens_its_open_draws_and_draws_after_them():
    position = StreamPosition(7, {6: ("client3.d6",), 7: ("client9.d7",)})
    state = client_stream(draws(), position=position)
    assert [take(state).spec.unit_id for _ in range(3)][:2] == ["client3.d6", "client9.d7"]
    assert state.pass_index == 8


# ------------------------------------------------------------ through the round engine
OVERLAP_SECONDS = 0.05  # the longest a unit waits for another to be out beside it


class Holder(LocalNode):
    """A node holding some clients, whose units answer at once with a delta of ones."""

    def __init__(self, index: int, held: range, alive: bool = True) -> None:
        super().__init__(index)
        self.clients = frozenset(f"client{k}" for k in held)
        self.clients_checked = True
        self.trained: list[str] = []
        self.training: set[str] = set()
        self.most = 0
        self._count = threading.Condition()
        if not alive:  # silent since it was created: suspect at once, never alive
            self.liveness = Liveness(suspect=0.0, dead=3600.0)

    def train(self, task: Task) -> TaskResult:
        with self._count:
            # a client twice at once fails the worker, and with it the stream
            assert task.client not in self.training, f"{task.client} twice at once"
            self.trained.append(task.client)
            self.training.add(task.client)
            self.most = max(self.most, len(self.training))
            self._count.notify_all()
            # hold it until another unit is out too (bounded), so several are out at once
            self._count.wait_for(lambda: len(self.training) > 1, timeout=OVERLAP_SECONDS)
            self.training.discard(task.client)
        return TaskResult(TaskStatus.COMPLETED, {"w": np.ones(2)}, 10, task.model_version or 0)


def test_the_engine_sends_each_draw_to_a_holder_and_drops_the_clients_of_a_silent_one():
    away, here = Holder(0, range(0, 5), alive=False), Holder(1, range(5, 10))
    engine = RoundEngine("r1", [away, here], RoundRobinPolicy(),
                         EngineSettings(speculation=False), RunProgress("r1", 3, 4, lambda: []),
                         threading.Event())
    chooser = ClientDraws(3, lambda: list(UNITS[:10]),
                          lambda name: any(n.holds(name) for n in engine.nodes),
                          lambda capacity: 3)
    state = client_stream(chooser, rounds=3, updates_per_round=2, buffer_size=2)
    state.max_in_flight = 8

    def build(unit: UnitSpec, attempt: int) -> Task:
        round_index, version, weights = state.newest()
        return Task(run_id="r1", round=round_index, unit_id=unit.unit_id, attempt=attempt,
                    algorithm="delta_avg", model="mlp_classifier", dataset="letters",
                    unit_path="", config_json="{}", weights=weights, scheduling_policy=2,
                    model_version=version, client=unit.client)

    ends: list[RoundEnd] = []
    drive(engine, state, build, ends.append)
    assert [end.version for end in ends] == [2, 4, 6]
    assert not away.trained and set(here.trained) <= {f"client{k}" for k in range(5, 10)}
    assert here.most <= 3  # the concurrency
    for end in ends:
        kept = [e for e in end.clients if e.result is not None]
        dropped = [e.failure.unit.client for e in end.clients if e.dropped]
        assert len(kept) == 4 and all(e.result.node == here.name for e in kept)
        assert len(dropped) == len(set(dropped))  # out of the round once dropped
        assert set(dropped) <= {f"client{k}" for k in range(5)}
    assert any(e.dropped for end in ends for e in end.clients)
