"""Asynchronous and buffered modes: versions, staleness, buffers, passes and rounds."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import closing

import numpy as np
import pytest

from tests.inprocess import LocalNode
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.engine.client_draws import ClientDraws
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.records import RoundMetrics
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine, RoundFailed
from thrift_trainer.engine.stream_records import RoundEnd, StreamPosition, TakenUp, VersionDue
from thrift_trainer.engine.stream_state import StreamState
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.engine.update_filters import DEFAULT_FILTERS
from thrift_trainer.training.aggregation import aggregate
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.schedule import (
    ScheduleSettings,
    check_usable,
    settings_from,
    staleness_warning,
    weighted,
)
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitResult, UnitSpec

NODE = LocalNode(0)


def plan(pass_index: int) -> list[UnitSpec]:
    return [UnitSpec(f"u{i}.p{pass_index}", f"u{i}") for i in range(3)]


class Recorder:
    """A version maker that adds the weighted mean of its results, and keeps what it got."""

    def __init__(self) -> None:
        self.calls: list[list[UnitResult]] = []

    def __call__(self, round_index, weights, results):
        self.calls.append(results)
        step = aggregate(defaults(AggregationSettings), [r.update for r in results],
                         [r.num_samples for r in results])
        return {name: weights[name] + step[name] for name in weights}


MakeVersion = Callable[[int, dict, list[UnitResult]], dict]


class Served(StreamState):
    """A stream whose due versions the test makes as the training loop makes them
    (coordinator/training_loop.py), with ``make``: (round, weights, results) -> weights."""

    def __init__(self, make: MakeVersion, **kwargs) -> None:
        self.make = make
        super().__init__(**kwargs)
        self.serve()  # the versions of the results it took up

    def serve(self) -> None:
        """Make every version that is due, as the loop does when the stream yields it."""
        while isinstance(due := self.pending(), VersionDue):
            self.applied(self.make(due.round, self.weights, due.results))


def drive(engine: RoundEngine, state: Served, build: Callable[[UnitSpec, int], Task],
          written: Callable[[RoundEnd], None] = lambda end: None) -> None:
    """The training loop over an engine's stream: each version made, each round end
    written."""
    with closing(engine.stream(state, build, DEFAULT_FILTERS)) as events:
        for event in events:
            if isinstance(event, VersionDue):
                state.applied(state.make(event.round, state.weights, event.results))
            else:
                written(event)


def stream(schedule: ScheduleSettings, *, rounds: int = 5, updates_per_round: int = 2,
           ledger: UnitLedger | None = None, position: StreamPosition | None = None,
           recorder: Recorder | None = None, max_in_flight: int = 10,
           taken_up: list[TakenUp] | None = None) -> Served:
    state = Served(
        recorder or Recorder(), weights={"w": np.zeros(2)}, first_round=1,
        last_round=rounds, updates_per_round=updates_per_round, schedule=schedule,
        plan_pass=plan, scalable=lambda name: name != "bn",
        ledger=ledger or UnitLedger(None, "r1"), max_attempts=4, position=position,
        taken_up=taken_up)
    state.max_in_flight = max_in_flight
    return state


def result(version: int, value: float = 1.0, samples: int = 10) -> TaskResult:
    return TaskResult(TaskStatus.COMPLETED, {"w": np.full(2, value)}, samples, version)


def take(state: StreamState):
    unit = state.next_unit(None)
    assert unit is not None
    return unit


def finish(state: Served, unit, res: TaskResult, **hooks) -> bool:
    attempt = state.start_attempt(unit, NODE)
    state.end_attempt(unit, attempt)
    kept = state.complete(unit, res.update, res, "n0", **hooks)
    state.serve()
    state.release(unit)
    return kept


def test_async_mode_makes_one_version_per_result():
    recorder = Recorder()
    state = stream(ScheduleSettings(mode="async"), recorder=recorder)
    assert finish(state, take(state), result(0))
    assert state.version == 1 and len(recorder.calls) == 1
    np.testing.assert_array_equal(state.weights["w"], [1.0, 1.0])


def test_a_result_beyond_max_staleness_is_refused_and_its_unit_issued_first():
    state = stream(ScheduleSettings(mode="async", max_staleness=1), updates_per_round=10)
    late, other = take(state), take(state)
    for _ in range(2):  # two versions pass while `late` computes
        finish(state, take(state), result(state.version))
    reasons: list[str] = []
    assert not finish(state, late, result(0), on_stale=reasons.append)
    assert state.version == 2
    assert "2 behind (max_staleness 1)" in reasons[0]
    assert take(state) is late  # computed again, before anything else
    assert other is not late


def test_a_result_within_max_staleness_is_kept():
    state = stream(ScheduleSettings(mode="async", max_staleness=2), updates_per_round=10)
    late = take(state)
    for _ in range(2):
        finish(state, take(state), result(state.version))
    assert finish(state, late, result(0))
    assert state.version == 3


def test_polynomial_weighting_scales_a_result_by_its_staleness():
    recorder = Recorder()
    schedule = ScheduleSettings(mode="async", staleness_weighting="polynomial",
                                staleness_exponent=0.5)
    state = stream(schedule, updates_per_round=10, recorder=recorder)
    late = take(state)
    for _ in range(3):
        finish(state, take(state), result(state.version))
    finish(state, late, result(0, value=2.0))
    np.testing.assert_allclose(recorder.calls[-1][0].update["w"], 2.0 * (1 + 3) ** -0.5)
    np.testing.assert_array_equal(recorder.calls[0][0].update["w"], 1.0)  # fresh: as sent


def test_weighting_leaves_states_alone():
    kept = UnitResult(UnitSpec("u", "u"), {"g": np.ones(2), "bn": np.ones(2)}, 5)
    scaled = weighted([kept], [0.25], lambda name: name != "bn")[0]
    np.testing.assert_array_equal(scaled.update["g"], 0.25)
    np.testing.assert_array_equal(scaled.update["bn"], 1.0)
    assert weighted([kept], [1.0], lambda name: True)[0] is kept


def test_buffered_mode_applies_the_rule_over_each_full_buffer():
    recorder = Recorder()
    state = stream(ScheduleSettings(mode="buffered", buffer_size=3), recorder=recorder,
                   updates_per_round=10)
    values = [(1.0, 10), (4.0, 30), (-2.0, 20)]
    for value, samples in values[:2]:
        finish(state, take(state), result(0, value, samples))
        assert state.version == 0 and not recorder.calls  # the buffer is not full yet
    finish(state, take(state), result(0, *values[2]))
    assert state.version == 1 and len(recorder.calls[0]) == 3
    expected = sum(v * n for v, n in values) / sum(n for _, n in values)
    np.testing.assert_allclose(state.weights["w"], expected)


def test_a_new_pass_starts_when_todo_is_empty_and_failures_are_counted_per_pass():
    state = stream(ScheduleSettings(mode="async"), updates_per_round=100)
    first = [take(state) for _ in range(3)]
    assert [u.spec.unit_id for u in first] == ["u0.p1", "u1.p1", "u2.p1"]
    assert state.counts()["todo"] == 0 and state.pass_index == 1
    state.start_attempt(first[0], NODE)
    state.end_attempt(first[0], 1)
    state.record_failure(first[0], "boom", max_failures=3)
    state.release(first[0])
    assert first[0].failures == 1
    assert take(state) is first[0]  # a failed unit goes back to the front of todo
    nxt = take(state)  # todo empty: pass 2 begins, its units fresh
    assert (nxt.spec.unit_id, nxt.failures, state.pass_index) == ("u0.p2", 0, 2)
    assert state.counts() == {"version": 0, "pass": 2, "todo": 2, "pending": 4, "done": 0}


def test_a_unit_is_discarded_for_its_pass_after_its_failures():
    state = stream(ScheduleSettings(mode="async"), updates_per_round=100)
    unit = take(state)
    for attempt in range(1, 3):
        state.start_attempt(unit, NODE)
        state.end_attempt(unit, attempt)
        assert state.record_failure(unit, "boom", max_failures=2) == (attempt == 2)
    assert unit not in state.units and unit.discarded


def discard(state: StreamState, unit, why: str = "refused: update norm 10.85 is 84x") -> None:
    attempt = state.start_attempt(unit, NODE)
    state.end_attempt(unit, attempt)
    assert state.record_failure(unit, why, max_failures=1)
    state.release(unit)


def test_a_pass_worth_of_units_discarded_in_a_row_fails_the_stream_saying_why():
    """Every result refused (a model that diverged, say): the run ends with a reason
    instead of passing over the data for ever."""
    state = stream(ScheduleSettings(mode="async"), updates_per_round=100)
    for _ in range(2):
        discard(state, take(state))
    assert state.fatal is None
    finish(state, take(state), result(0))  # a result kept: the count starts again
    discard(state, take(state))  # pass 2's first unit
    discard(state, take(state))
    assert state.fatal is None
    discard(state, take(state))  # three in a row: a pass's worth
    assert isinstance(state.fatal, RoundFailed)
    assert str(state.fatal) == ("the last 3 units (a pass over the data) all failed and no "
                                "result was kept; last error: refused: update norm 10.85 is "
                                "84x")


def test_a_resumed_stream_counts_a_whole_pass_not_what_was_left_of_it():
    position = StreamPosition(2, {2: ("u2.p2",)})  # one unit of pass 2 left to do
    state = stream(ScheduleSettings(mode="async"), position=position, updates_per_round=100)
    discard(state, take(state))
    discard(state, take(state))
    assert state.fatal is None  # two failures: not yet a pass's worth (three)
    discard(state, take(state))
    assert isinstance(state.fatal, RoundFailed)


def test_a_resumed_stream_keeps_the_taken_up_results_again_in_their_order():
    """The results a stream had kept before a takeover, kept again by the new leader's
    stream: the same versions and buffer, and their units (a later pass's too) not issued
    again."""
    schedule = ScheduleSettings(mode="buffered", buffer_size=2)
    first = stream(schedule, updates_per_round=10)
    kept = []

    def keep(unit, res: TaskResult) -> None:
        attempt = state_attempt(first, unit)
        assert first.complete(unit, res.update, res, "n0")
        first.serve()
        kept.append(first.kept(unit, attempt, "n0", res))

    keep(take(first), result(0, 1.0))
    keep(take(first), result(0, 3.0, samples=30))  # a version: the buffer was full
    out, ahead = take(first), take(first)  # u2.p1 stays out; u0.p2 is of pass 2
    keep(ahead, result(1, 2.0))
    assert [(k.round, k.sequence, k.staleness) for k in kept] == [(1, 0, 0), (1, 1, 0),
                                                                  (1, 2, 0)]
    resumed = stream(schedule, updates_per_round=10, position=StreamPosition(
        1, {1: ("u0.p1", "u1.p1", "u2.p1")}), taken_up=[TakenUp(
            k.unit.unit_id, int(k.unit.unit_id[-1]), k.staleness, k.result.update,
            k.result.num_samples, k.result.loss, k.node) for k in kept])
    assert (resumed.version, resumed.counts()["done"]) == (first.version, 2)  # of pass 1
    np.testing.assert_array_equal(resumed.weights["w"], first.weights["w"])
    assert [take(resumed).spec.unit_id for _ in range(3)] == ["u2.p1", "u1.p2", "u2.p2"]
    assert resumed.counts()["done"] == 1  # pass 2's, which it started with u0.p2 done
    for state in (first, resumed):  # the buffer holds u0.p2's result in both
        unit = out if state is first else next(u for u in state.units
                                               if u.spec.unit_id == "u2.p1")
        assert finish(state, unit, result(1, -1.0))
    assert resumed.version == first.version == 2
    np.testing.assert_array_equal(resumed.weights["w"], first.weights["w"])


def state_attempt(state: StreamState, unit) -> int:
    attempt = state.start_attempt(unit, NODE)
    state.end_attempt(unit, attempt)
    return attempt


def test_a_settled_units_leftover_attempt_stays_in_sight_until_it_ends():
    """A unit kept from one attempt while another is still out (its node hung, or its
    answer lost): the engine's reclaim must still see that attempt, or it would hold its
    worker for good and, all workers held so, stall the stream."""
    state = stream(ScheduleSettings(mode="async"))
    unit = take(state)
    leftover = state.start_attempt(unit, NODE)  # out, and never answers
    assert finish(state, unit, result(0))  # another attempt's result is kept
    assert unit not in state.units  # settled ...
    assert [(u, a) for u, a, _, _ in state.live_attempts()] == [(unit, leftover)]  # ... seen
    assert state.has_live_attempts()
    assert state.record_failure(unit, "reclaimed", max_failures=1) is False  # kept: stays
    assert not unit.discarded
    state.end_attempt(unit, leftover)
    assert state.live_attempts() == [] and not state.has_live_attempts()


def test_no_more_units_go_out_than_max_in_flight():
    state = stream(ScheduleSettings(mode="async"), max_in_flight=2)
    take(state), take(state)
    got: list = []
    worker = threading.Thread(target=lambda: got.append(state.next_unit(None)))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and not got  # waits for a unit to come back
    state.finish()
    worker.join(5)
    assert got == [None]


def test_a_due_version_holds_results_and_tasks_back_until_the_loop_makes_it():
    """The stream hands a full buffer to the training loop and waits for its answer:
    meanwhile no task is built and no result kept, so each result's staleness counts
    every version made before it."""
    recorder = Recorder()
    state = stream(ScheduleSettings(mode="async", max_staleness=5), recorder=recorder,
                   updates_per_round=10)
    units = [take(state) for _ in range(3)]

    def held_until_made(call) -> list:
        got: list = []
        thread = threading.Thread(target=lambda: got.append(call()))
        thread.start()
        thread.join(0.3)
        assert thread.is_alive() and not got  # waits for the loop
        due = state.pending()
        state.applied(recorder(due.round, state.weights, due.results))
        thread.join(5)
        return got

    assert state.complete(units[0], {"w": np.ones(2)}, result(0), "n0")
    due = state.pending()
    assert isinstance(due, VersionDue) and (due.round, len(due.results)) == (1, 1)
    assert state.version == 0 and not recorder.calls  # made by the loop, not the stream
    assert held_until_made(state.newest)[0][1] == 1  # built from the version made
    attempt = state_attempt(state, units[1])
    assert state.complete(units[1], {"w": np.ones(2)}, result(0), "n0")
    later = state_attempt(state, units[2])
    assert held_until_made(lambda: state.complete(units[2], {"w": np.ones(2)}, result(0),
                                                  "n0")) == [True]
    assert state.kept(units[1], attempt, "n0", result(0)).staleness == 1
    assert state.kept(units[2], later, "n0", result(0)).staleness == 2  # counts version 2
    state.serve()
    assert state.version == 3 and len(recorder.calls) == 3
    with pytest.raises(ValueError, match="no version is due"):
        state.applied(state.weights)


def test_a_round_ends_after_its_versions_and_holds_the_next_until_written(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    store.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=3,
                     config={}, policy=1)
    ledger = UnitLedger(store, "r1", strict=True)
    state = stream(ScheduleSettings(mode="async"), rounds=3, updates_per_round=2, ledger=ledger)
    out = take(state)
    state.start_attempt(out, NODE, lambda n: ledger.started(1, out.spec.unit_id, n, NODE.name))
    for _ in range(2):
        unit = take(state)
        attempt = state.start_attempt(unit, NODE, lambda n, u=unit: ledger.started(
            state.ledger_round(u), u.spec.unit_id, n, NODE.name))
        state.end_attempt(unit, attempt)
        state.complete(unit, {"w": np.ones(2)}, result(state.version), "n0",
                       on_kept=lambda u=unit, a=attempt: ledger.finished(
                           state.ledger_round(u), u.spec.unit_id, a, NODE.name, "completed"))
        state.serve()
    end = state.round_end
    assert (end.round, end.version, end.results) == (1, 2, 2)
    assert end.position.open_units == {1: ("u0.p1",)}  # still out: not in the weights
    # the unit still out moved on into round 2, where its result will count
    assert store.ledger_counts("r1", 1) == {**store.ledger_counts("r1", 1), "completed": 2,
                                            "in_progress": 0}
    assert store.ledger_counts("r1", 2)["in_progress"] == 1 and out.ledger_round == 2
    third = take(state)  # pass 2
    blocked = threading.Thread(target=lambda: finish(state, third, result(2)))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive() and state.version == 2  # held until round 1 is written
    state.round_written()
    blocked.join(5)
    assert state.version == 3


def private_stream(rounds: int, clients: int = 6, draws: bool = False) -> Served:
    """A private buffered stream: buffers of 2, one version a round, a version handed out
    only once its round is written; with ``draws``, over ``clients`` federated clients."""
    units = [UnitSpec(f"c{k}", "", client=f"c{k}") for k in range(clients)]
    state = Served(Recorder(), weights={"w": np.zeros(2)}, first_round=1, last_round=rounds,
                   updates_per_round=1, schedule=ScheduleSettings(mode="buffered",
                                                                  buffer_size=2),
                   plan_pass=plan, scalable=lambda name: True,
                   ledger=UnitLedger(None, "r1"), max_attempts=4,
                   draws=ClientDraws(3, lambda: list(units), lambda client: True,
                                     lambda capacity: capacity) if draws else None,
                   private=True)
    state.max_in_flight = 4
    return state


def fill_buffer(state: Served) -> None:
    for _ in range(2):
        assert finish(state, take(state), result(state.version))


def test_a_private_stream_hands_out_a_version_once_its_round_is_written():
    """A private run's version leaves the coordinator only after its checkpoint: tasks
    built while its round is being written wait, then get it."""
    state = private_stream(rounds=3)
    assert state.newest()[:2] == (1, 0)  # the starting weights go out at once
    fill_buffer(state)
    assert state.version == 1 and state.round_end is not None  # made, not yet written
    got: list = []
    builder = threading.Thread(target=lambda: got.append(state.newest()))
    builder.start()
    builder.join(0.3)
    assert builder.is_alive() and not got  # held while round 1 is written
    state.round_written()
    builder.join(5)
    round_index, version, weights = got[0]
    assert (round_index, version) == (2, 1) and weights is state.weights


def test_a_private_stream_that_ends_hands_out_the_last_written_version():
    """The last round's version is never handed out before it is written, even once the
    stream is over: a task built then gets the version written before it."""
    state = private_stream(rounds=1)
    first = state.weights
    fill_buffer(state)
    assert state.version == 1 and state.round_end is not None
    round_index, version, weights = state.newest()  # over: does not wait
    assert (round_index, version) == (1, 0) and weights is first


def test_a_client_whose_result_waits_in_the_buffer_is_not_drawn_again():
    """A client counts at most once in a buffer: with two clients, the first one's result
    waits in the buffer until the other's fills it."""
    state = private_stream(rounds=2, clients=2, draws=True)
    first = take(state)
    assert finish(state, first, result(0)) and state.version == 0
    second = take(state)
    assert second.spec.client != first.spec.client
    # neither may be drawn now: one is out, the other's result waits in the buffer
    assert state._busy_clients() == {first.spec.client, second.spec.client}
    assert finish(state, second, result(0)) and state.version == 1


def test_a_position_reopens_the_units_a_checkpoint_does_not_hold():
    position = StreamPosition(2, {1: ("u2.p1",), 2: ("u1.p2", "u2.p2")})
    state = stream(ScheduleSettings(mode="async"), position=position)
    assert [take(state).spec.unit_id for _ in range(4)] == ["u2.p1", "u1.p2", "u2.p2", "u0.p3"]
    assert StreamPosition.from_dict(position.to_dict()) == position


@pytest.mark.parametrize("raw, key", [
    ({"mode": "eventual"}, "schedule.mode"),
    ({"buffer_size": 0}, "schedule.buffer_size"),
    ({"max_staleness": -1}, "schedule.max_staleness"),
    ({"staleness_weighting": "exp"}, "schedule.staleness_weighting"),
    ({"staleness_exponent": float("nan")}, "schedule.staleness_exponent"),
    ({"updates_per_round": -2}, "schedule.updates_per_round"),
    ({"buffer": 3}, "schedule.buffer"),
    ({"mode": "async", "prefetch": 9}, "schedule.prefetch"),
    ({"mode": "sync", "prefetch": 1}, "schedule.prefetch is for the async and buffered"),
])
def test_bad_schedule_settings_are_refused_naming_the_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        settings_from(raw)


@pytest.mark.parametrize("algorithm", ["md_gan", "fl_gan"])
def test_asynchronous_modes_are_refused_for_algorithms_that_need_rounds(algorithm):
    with pytest.raises(ConfigError, match="schedule.mode: .*cannot train in 'async'"):
        check_usable(settings_from({"mode": "async"}), get_algorithm(algorithm),
                     deterministic=False)
    check_usable(settings_from({"mode": "sync"}), get_algorithm(algorithm), deterministic=False)


def test_asynchronous_modes_are_never_deterministic():
    with pytest.raises(ConfigError, match="schedule.mode: 'buffered' cannot be deterministic"):
        check_usable(settings_from({"mode": "buffered"}), DeltaAveraging, deterministic=True)


def async_stream(algorithm: DeltaAveraging, rounds: int, ledger: UnitLedger, policy: int,
                 prefetch: int = 0) -> tuple[Served, Callable[[UnitSpec, int], Task]]:
    """An async delta_avg stream of 11 versions a round, and the task builder of its run."""
    state = Served(
        lambda r, w, results: algorithm.aggregate(r, w, results, []),
        weights=algorithm.initial_weights(), first_round=1, last_round=rounds,
        updates_per_round=11, schedule=ScheduleSettings(mode="async", prefetch=prefetch),
        plan_pass=algorithm.plan_pass, scalable=algorithm.staleness_scaled, ledger=ledger,
        max_attempts=6)

    def build(unit: UnitSpec, attempt: int) -> Task:
        round_index, version, weights = state.newest()
        return Task(run_id="r1", round=round_index, unit_id=unit.unit_id, attempt=attempt,
                    algorithm="delta_avg", model="mlp", dataset="letters",
                    unit_path=unit.unit_path, config_json=json.dumps(algorithm.config),
                    weights=weights, scheduling_policy=policy, model_version=version)

    return state, build


def test_the_engine_streams_units_over_in_process_nodes_and_the_ledger_adds_up(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    store.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=3,
                     config={}, policy=2)
    ledger = UnitLedger(store, "r1", strict=True)
    algorithm = DeltaAveraging("mlp", {"epochs": 1, "hidden": [16], "scale_features": True,
                                       "local_optimizer": "adam", "eta": 0.005,
                                       "server_optimizer": "momentum", "server_lr": 0.1},
                               DEFAULT_DATA_ROOT / "letters")
    nodes = [LocalNode(i) for i in range(3)]
    progress = RunProgress("r1", 3, 11, lambda: [n.summary() for n in nodes])
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(), progress,
                         threading.Event(), ledger)
    state, build = async_stream(algorithm, rounds=3, ledger=ledger, policy=2)
    ends = []

    def written(end) -> None:
        ends.append((end.round, end.version, end.results))
        ledger.round_ended(RoundMetrics(end.round, 0.5, 1.0, end.train_loss, 0.1), end.results,
                           len(end.discarded))

    drive(engine, state, build, written)
    assert ends == [(1, 11, 11), (2, 22, 11), (3, 33, 11)]
    for round_index in (1, 2, 3):  # each round holds exactly the results its versions took
        assert store.ledger_counts("r1", round_index)["completed"] == 11
    assert progress.units_done == 33
    before = algorithm.evaluate(algorithm.initial_weights()).validation_error
    assert algorithm.evaluate(state.weights).validation_error < before - 0.1  # it learned


class CountingNode(LocalNode):
    """A node that records how many of its units it held at once."""

    def __init__(self, index: int, **kwargs) -> None:
        super().__init__(index, **kwargs)
        self.holding = self.most = 0
        self._held = threading.Lock()

    def train(self, task: Task) -> TaskResult:
        with self._held:
            self.holding += 1
            self.most = max(self.most, self.holding)
        try:
            return super().train(task)
        finally:
            with self._held:
                self.holding -= 1


def test_a_stream_sends_units_to_idle_nodes_not_behind_a_slow_one():
    algorithm = DeltaAveraging("mlp", {"epochs": 1, "hidden": [4], "server_lr": 0.1},
                               DEFAULT_DATA_ROOT / "letters")
    # node 0 delays every unit (policy 1: never rejects, waits), node 1 is quick
    slow, quick = CountingNode(0, load=1.0, delay=0.2), CountingNode(1)
    nodes = [slow, quick]
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                         RunProgress("r1", 2, 11, lambda: []), threading.Event())
    state, build = async_stream(algorithm, rounds=2, ledger=UnitLedger(None, "r1"), policy=1)
    drive(engine, state, build)
    assert state.version == 22
    assert slow.most == 1 and quick.most == 1  # one unit per node at a time
    assert quick.calls > 2 * slow.calls  # the quick node was not kept waiting its turn


def test_prefetch_sends_each_node_its_next_unit_while_it_computes():
    algorithm = DeltaAveraging("mlp", {"epochs": 1, "hidden": [4], "server_lr": 0.1},
                               DEFAULT_DATA_ROOT / "letters")
    nodes = [CountingNode(0, load=1.0, delay=0.05), CountingNode(1, load=1.0, delay=0.05)]
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                         RunProgress("r1", 2, 11, lambda: []), threading.Event())
    state, build = async_stream(algorithm, rounds=2, ledger=UnitLedger(None, "r1"), policy=1,
                                prefetch=1)
    drive(engine, state, build)
    assert state.version == 22
    assert [node.most for node in nodes] == [2, 2]  # a unit waiting behind each one computing
    assert abs(nodes[0].calls - nodes[1].calls) <= 2  # filled evenly


def test_a_staleness_bound_below_the_node_count_is_warned_of():
    async_mode = settings_from({"mode": "async"})
    assert staleness_warning(async_mode, 9) is None  # results about 8 versions old: fine
    assert "48 nodes, results are usually about 47 versions old" in staleness_warning(
        async_mode, 48)
    assert staleness_warning(settings_from({"mode": "buffered", "buffer_size": 6}), 48) is None
    assert staleness_warning(settings_from(None), 48) is None  # sync rounds are never stale
    ahead = settings_from({"mode": "async", "prefetch": 1})  # two units out per node
    assert "5 nodes, results are usually about 9 versions old" in staleness_warning(ahead, 5)
