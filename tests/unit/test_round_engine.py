"""The round engine with in-process nodes: retries, failures, backups, quorum, cancel."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from tests.inprocess import LocalNode
from tests.waiting import wait_until
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.engine.nodes.errors import AnswerTooLarge, NodeUnavailable, NodeUnfit
from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.thrift_client import node_error
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import (
    EngineSettings,
    RoundEngine,
    RoundFailed,
    RunCancelledError,
)
from thrift_trainer.engine.round_state import Kept, RoundState
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.engine.update_filters import DEFAULT_FILTERS, NormLimit, Tensors, UpdateFilter
from thrift_trainer.engine.update_norms import NormGuard, update_norm
from thrift_trainer.training.algorithms.base import combine
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitSpec
from thrift_trainer.wire.chunks import MessageRefused, PeerRefusedMessage
from thrift_trainer.wire.rpc import ConnectionFailed

CONFIG = {"epochs": 2, "eta": 0.0001, "hidden": [8]}
ALGORITHM = DeltaAveraging("mlp", CONFIG, DEFAULT_DATA_ROOT / "letters")
WEIGHTS = ALGORITHM.initial_weights()


def build(unit: UnitSpec, attempt: int) -> Task:
    return Task(
        run_id="r1", round=1, unit_id=unit.unit_id,
        attempt=attempt, algorithm="delta_avg", model="mlp", dataset="letters",
        unit_path=unit.unit_path, config_json=json.dumps(ALGORITHM.config),
        weights=WEIGHTS, scheduling_policy=2)


def engine(nodes, **settings) -> tuple[RoundEngine, RunProgress, threading.Event]:
    progress = RunProgress("r1", 1, 11, lambda: [n.summary() for n in nodes])
    cancelled = threading.Event()
    eng = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(**settings), progress,
                      cancelled)
    return eng, progress, cancelled


def mean(outcome) -> dict[str, np.ndarray]:
    """The round's results combined as a run does by default: the weighted mean."""
    return combine(defaults(AggregationSettings), outcome.results)


def checked(check, norm: NormLimit | None = None) -> list[UpdateFilter]:
    """A round's filters: the sample count, ``check`` of the update, then the norm limit."""
    return [*DEFAULT_FILTERS, Tensors(check), *([norm] if norm is not None else [])]


def units(n: int = 11) -> list[UnitSpec]:
    return ALGORITHM.plan_round(1)[:n]


def sequential_average(specs: list[UnitSpec]) -> dict[str, np.ndarray]:
    node = LocalNode(0)
    deltas = [node.train(build(spec, 1)) for spec in specs]
    total = sum(d.num_samples for d in deltas)
    return {name: sum(d.update[name] * d.num_samples for d in deltas) / total
            for name in WEIGHTS}


def test_every_unit_completes_although_one_node_always_rejects():
    nodes = [LocalNode(0, load=1.0), LocalNode(1, load=0.0)]
    eng, progress, _ = engine(nodes)
    outcome = eng.run_round(1, units(), 11, build)
    assert outcome.completed == 11 and outcome.discarded == []
    assert nodes[0].stats.rejected > 0 and nodes[0].stats.accepted == 0
    assert progress.snapshot().units_done == 11
    expected = sequential_average(units())
    for name in WEIGHTS:
        np.testing.assert_allclose(mean(outcome)[name], expected[name], rtol=1e-10)


def test_deterministic_k_of_n_rounds_use_their_first_k_units():
    nodes = [LocalNode(0), LocalNode(1)]
    # no backups: on a busy machine a slow unit would get one, a call the count would see
    eng, progress, _ = engine(nodes, deterministic=True, speculation=False)
    outcome = eng.run_round(1, units(6), 3, build)
    assert [r.unit.unit_id for r in outcome.results] == [u.unit_id for u in units(3)]
    assert sum(node.calls for node in nodes) == 3  # the other units never start
    assert progress.snapshot().units_done == 3


def test_a_resumed_round_takes_up_kept_results_and_computes_only_the_others():
    nodes = [LocalNode(0), LocalNode(1)]
    eng, _, _ = engine(nodes, speculation=False)
    kept: list[Kept] = []
    first = eng.run_round(1, units(4), 4, build, keep_result=kept.append)
    assert sorted(k.unit.unit_id for k in kept) == [u.unit_id for u in units(4)]  # each once
    assert {(k.round, k.attempt, k.sequence) for k in kept} == {(1, 1, None)}
    taken = {r.unit.unit_id: r for r in first.results[:2]}  # kept before a takeover
    calls = sum(node.calls for node in nodes)
    again = eng.run_round(1, units(4), 4, build, taken_up=taken)
    assert sum(node.calls for node in nodes) - calls == 2  # only the other two ran
    assert [r.unit.unit_id for r in again.results] == [u.unit_id for u in units(4)]
    assert all(again.results[i] is first.results[i] for i in (0, 1))
    assert all(np.array_equal(mean(again)[k], mean(first)[k]) for k in WEIGHTS)


def test_a_round_whose_quorum_was_taken_up_whole_ends_at_once():
    nodes = [LocalNode(0)]
    eng, _, _ = engine(nodes)
    first = eng.run_round(1, units(3), 3, build)
    again = eng.run_round(1, units(3), 2, build,
                          taken_up={r.unit.unit_id: r for r in first.results[:2]})
    assert nodes[0].calls == 3 and again.completed == 2


def test_a_dead_node_is_benched_and_its_units_go_elsewhere():
    dead = LocalNode(0, fail_with=ConnectionFailed("cannot connect to local:10000: refused"))
    nodes = [dead, LocalNode(1)]
    eng, _, _ = engine(nodes)
    outcome = eng.run_round(1, units(), 11, build)
    assert outcome.completed == 11
    assert dead.stats.failed >= 1
    assert dead.calls < 11  # benched after failing, not tried for every unit


def test_a_unit_failing_everywhere_is_discarded_and_the_round_goes_on(tmp_path):
    letters = tmp_path / "letters"
    letters.mkdir()
    for spec in units(3):
        (letters / spec.unit_path).write_text(
            (DEFAULT_DATA_ROOT / "letters" / spec.unit_path).read_text())
    (letters / units(3)[1].unit_path).write_text("1,2,3\n")  # a broken shard on every node
    nodes = [LocalNode(0, data_root=tmp_path), LocalNode(1, data_root=tmp_path)]
    eng, progress, _ = engine(nodes, max_unit_failures=3)
    outcome = eng.run_round(1, units(3), 3, build)
    assert outcome.completed == 2
    assert outcome.discarded == [units(3)[1].unit_id]
    assert progress.snapshot().failed == 3


def test_when_the_last_node_is_left_out_mid_round_the_round_fails_saying_why():
    """Its weights too big for the node: the round fails with the node's reason, not with
    an error of the engine's own while other units still look for a node."""
    refused = NodeUnfit("refused a message of 4.2 MiB: it takes messages of at most 2 MiB "
                        "(--max-message-mb 2): raise --max-message-mb there")
    eng, _, _ = engine([LocalNode(0, fail_with=refused)])
    with pytest.raises(RoundFailed, match=r"no node can serve this run: node local:10000 "
                                          r"refused a message of 4\.2 MiB"):
        eng.run_round(1, units(4), 4, build)


class AnswersAfter(LocalNode):
    """A node that answers only once ``other`` has been called (or 10 s have passed), so
    that on a busy machine it cannot take every unit before ``other`` is tried."""

    def __init__(self, index: int, other: LocalNode) -> None:
        super().__init__(index)
        self.other = other

    def train(self, task: Task) -> TaskResult:
        wait_until(lambda: self.other.calls >= 1, seconds=10.0)
        return super().train(task)


def test_an_answer_over_this_processs_own_limit_fails_the_attempt_without_benching():
    """The limit is the coordinator's, not the node's failure: its units go elsewhere but
    the node is not benched for it; a peer's refusal of our message leaves it out."""
    ours = MessageRefused("refused a message of 4.2 MiB from local:10000: this process "
                          "takes messages of at most 2 MiB (--max-message-mb 2)")
    too_big = LocalNode(0, fail_with=ours)
    eng, _, _ = engine([too_big, AnswersAfter(1, too_big)])
    outcome = eng.run_round(1, units(4), 4, build)
    assert outcome.completed == 4
    assert too_big.stats.failed >= 1
    assert too_big.benched_until() <= time.monotonic()
    assert node_error(ours).__class__ is AnswerTooLarge
    theirs = node_error(PeerRefusedMessage("h:1", 3 * 2**20, "it takes at most 2 MiB"))
    assert isinstance(theirs, NodeUnfit)
    assert str(theirs) == "refused a message of 3.0 MiB (3145728 bytes): it takes at most 2 MiB"


class LowestIndexFirst(RoundRobinPolicy):
    """Always the lowest-numbered available node first: without a rule against it, every
    attempt of a unit would go to node 0."""

    ranks_by_views = False

    def order_available(self, indexes: list[int]) -> list[int]:
        return sorted(indexes)


def test_a_unit_is_retried_on_a_node_it_has_not_failed_on():
    """A node that fails every unit without being benched (its answers are over our limit)
    costs each unit one failure, not all of them: the retry goes to the other node."""
    too_big = LocalNode(0, fail_with=MessageRefused("refused a message of 4.2 MiB"))
    other = LocalNode(1)
    progress = RunProgress("r1", 1, 11, lambda: [])
    eng = RoundEngine("r1", [too_big, other], LowestIndexFirst(),
                      EngineSettings(max_unit_failures=2), progress, threading.Event())
    outcome = eng.run_round(1, units(4), 4, build)
    assert outcome.completed == 4
    assert too_big.stats.failed == 4  # each unit tried it first, once
    assert other.calls == 4


def always_delayed(index: int) -> LocalNode:
    """A node that accepts every unit and then waits 60 s before working on it."""
    node = LocalNode(index)
    node.handler.load = LoadSimulator(1.0, 60.0)
    return node


def build_random(unit: UnitSpec, attempt: int) -> Task:
    return replace(build(unit, attempt), scheduling_policy=1)  # never rejected; delayed


def test_backup_attempt_beats_a_unit_stuck_in_a_load_delay():
    stuck, fast = always_delayed(0), LocalNode(1)
    eng, _, _ = engine([stuck, fast], speculate_after=0.05)
    outcome = eng.run_round(1, units(4), 4, build_random)
    assert outcome.completed == 4
    assert stuck.stats.accepted == 0
    # Its waiting attempts are called off (cancels go out on threads of their own).
    assert wait_until(lambda: stuck.handler.counters.cancelled >= 1)


class FrozenNode(LocalNode):
    """A node stopped with SIGSTOP: its calls never answer, and a cancel takes the whole
    control timeout (here: until the test releases it)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.liveness = Liveness(suspect=600.0, dead=1200.0)  # not silent for long yet
        self.released = threading.Event()
        self.cancel_threads: list[str] = []

    def train(self, request: Task) -> TaskResult:
        self.released.wait(60)
        raise NodeUnavailable("frozen")

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        self.cancel_threads.append(threading.current_thread().name)
        self.released.wait(60)


def test_cancels_to_a_frozen_node_never_hold_up_the_round():
    frozen, healthy = FrozenNode(0), LocalNode(1)
    eng, _, _ = engine([frozen, healthy], speculation=False)
    round_thread = threading.current_thread().name
    try:
        began = time.monotonic()
        outcome = eng.run_round(1, units(4), 2, build)  # the quorum leaves frozen's units out
        seconds = time.monotonic() - began
        assert outcome.completed == 2
        assert wait_until(lambda: len(frozen.cancel_threads) >= 1)
    finally:
        frozen.released.set()
    assert seconds < 30.0  # a cancel on the round's path would take the whole 60 s
    assert round_thread not in frozen.cancel_threads
    assert all(name.startswith("cancel-") for name in frozen.cancel_threads)


def test_quorum_ends_the_round_early():
    eng, _, _ = engine([LocalNode(0), LocalNode(1)])
    outcome = eng.run_round(1, units(6), 3, build)
    assert outcome.completed == 3


def test_no_node_answering_fails_after_the_grace_period():
    nodes = [LocalNode(i, fail_with=ConnectionFailed(f"cannot connect to local:{i}"))
             for i in range(2)]
    eng, _, _ = engine(nodes, grace_seconds=0.3, max_unit_failures=10_000)
    with pytest.raises(RoundFailed, match="no compute node answered") as info:
        eng.run_round(1, units(2), 2, build)
    assert info.value.nodes_tried == ["local:10000", "local:10001"]


def test_cancel_stops_the_round():
    eng, _, cancelled = engine([always_delayed(0)], speculation=False)
    threading.Timer(0.2, cancelled.set).start()
    with pytest.raises(RunCancelledError):
        eng.run_round(1, units(2), 2, build_random)


class CorruptNode(LocalNode):
    """Answers every unit with a delta full of NaN, as a broken node might."""

    def train(self, request: Task) -> TaskResult:
        result = super().train(request)
        update = {name: np.full_like(value, np.nan) for name, value in
                  result.update.items()}
        result.update = update
        return result


def check_finite(update):
    ALGORITHM.check_update(update, WEIGHTS)


def test_invalid_updates_are_refused_and_the_unit_goes_elsewhere():
    corrupt, healthy = CorruptNode(0), LocalNode(1)
    eng, progress, _ = engine([corrupt, healthy])
    outcome = eng.run_round(1, units(4), 4, build, checked(check_finite))
    assert outcome.completed == 4
    assert all(np.isfinite(v).all() for v in mean(outcome).values())
    assert corrupt.stats.failed >= 1 and corrupt.stats.accepted == 0
    assert progress.snapshot().failed == corrupt.stats.failed


class CorruptOnce(CorruptNode):
    """Answers its first unit with a delta full of NaN, and every later one rightly."""

    def train(self, request: Task) -> TaskResult:
        if self.calls == 0:
            return super().train(request)
        return LocalNode.train(self, request)


def test_a_unit_goes_back_to_the_node_it_failed_on_once_the_others_are_silent():
    """A unit failed once on the one node still up; the other node is gone (a pull node
    that left stays among the round's nodes until the round ends). The retry must not
    wait for the silent node for ever: once it is no longer alive, the unit goes back to
    the node it failed on, and the round completes well within the grace period."""
    flaky = CorruptOnce(0)
    gone = LocalNode(1, fail_with=ConnectionFailed("cannot connect to local:10001: refused"))
    gone.liveness = Liveness(suspect=0.2, dead=1.0)  # silent from the start
    progress = RunProgress("r1", 1, 11, lambda: [])
    eng = RoundEngine("r1", [flaky, gone], LowestIndexFirst(),
                      EngineSettings(max_unit_failures=10, grace_seconds=3.0), progress,
                      threading.Event())
    outcome = eng.run_round(1, units(1), 1, build, checked(check_finite))
    assert outcome.completed == 1 and outcome.discarded == []
    assert flaky.calls == 2 and flaky.stats.failed == 1  # its NaN, then the result
    assert gone.calls >= 1  # the retry tried the other node first, while it was alive


def test_delta_check_names_the_wrong_tensor():
    bad = {name: value.copy() for name, value in WEIGHTS.items()}
    bad["V"] = bad["V"][:-1]
    with pytest.raises(ValueError, match="'V' has shape"):
        ALGORITHM.check_update(bad, WEIGHTS)
    bad = {name: value.astype(np.float32) for name, value in WEIGHTS.items()}
    with pytest.raises(ValueError, match="has dtype float32, expected float64"):
        ALGORITHM.check_update(bad, WEIGHTS)
    bad = {name: value.copy() for name, value in WEIGHTS.items() if name != "V"}
    with pytest.raises(ValueError, match=r"missing \['V'\]"):
        ALGORITHM.check_update(bad, WEIGHTS)
    bad = {name: np.full_like(value, np.inf) for name, value in WEIGHTS.items()}
    with pytest.raises(ValueError, match="NaN or infinite"):
        ALGORITHM.check_update(bad, WEIGHTS)


class InflatingNode(LocalNode):
    """Answers with finite deltas of the right shape, a thousand times too large."""

    def train(self, request: Task) -> TaskResult:
        result = super().train(request)
        update = {name: value * 1000.0 for name, value in result.update.items()}
        result.update = update
        return result


def test_an_update_far_beyond_the_usual_norm_is_refused_with_its_reason():
    healthy = LocalNode(0)
    eng, _, _ = engine([healthy])
    norm = NormLimit(10.0)
    eng.run_round(1, units(11), 11, build, checked(check_finite, norm))  # the usual scale
    inflating = InflatingNode(1)
    eng.set_nodes([inflating, LocalNode(2)])
    outcome = eng.run_round(1, units(4), 4, build, checked(check_finite, norm))
    assert outcome.completed == 4
    assert inflating.stats.failed >= 1 and inflating.stats.accepted == 0
    expected = sequential_average(units(4))
    for name, value in mean(outcome).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-12)


def test_norm_guard_waits_for_a_scale_and_names_the_ratio():
    guard = NormGuard(factor=10.0, warmup=3)
    ones = {"w": np.ones(4)}
    assert guard.check({"w": np.full(4, 100.0)}) == 200.0  # no scale yet: accepted
    for _ in range(3):
        guard.check(ones)
    with pytest.raises(ValueError, match=r"the limit is 10x"):
        guard.check({"w": np.full(4, 100.0)})
    assert NormGuard(factor=None, warmup=0).check({"w": np.full(4, 1e9)}) == 2e9


UNSTABLE = DeltaAveraging("mlp", {"epochs": 5, "eta": 0.001, "hidden": [64]},
                          DEFAULT_DATA_ROOT / "letters")  # as `letters 5 5 64 0.001`


def unstable_rounds(eng: RoundEngine, rounds: int) -> list:
    """Rounds of the unstable configuration through `eng`, each from the last's weights,
    with a norm limit of 10x."""
    weights, outcomes, norm = UNSTABLE.initial_weights(), [], NormLimit(10.0)
    for round_index in range(1, rounds + 1):
        def build_unstable(unit: UnitSpec, attempt: int, r=round_index, w=weights):
            return Task(
                run_id="r1", round=r, unit_id=unit.unit_id,
                attempt=attempt, algorithm="delta_avg", model="mlp", dataset="letters",
                unit_path=unit.unit_path, config_json=json.dumps(UNSTABLE.config), weights=w,
                scheduling_policy=2)

        specs = UNSTABLE.plan_round(round_index)
        outcome = eng.run_round(
            round_index, specs, len(specs), build_unstable,
            checked(lambda update, w=weights: UNSTABLE.check_update(update, w), norm))
        weights = UNSTABLE.aggregate(round_index, weights, outcome.results, outcome.failures)
        outcomes.append(outcome)
    return outcomes


def test_updates_that_grow_together_in_an_unstable_run_bench_no_node(caplog):
    # Round 2 of this configuration has updates 15-140x the norm of round 1's, on
    # every node: the run is unstable, no node is at fault.
    nodes = [LocalNode(0), LocalNode(1), LocalNode(2)]
    eng, _, _ = engine(nodes)
    outcomes = unstable_rounds(eng, 2)
    assert [o.completed for o in outcomes] == [11, 11]
    assert all(o.discarded == [] for o in outcomes)
    assert [n.stats.failed for n in nodes] == [0, 0, 0]
    assert sum("training looks unstable" in r.message for r in caplog.records) == 1


class InflatingFromRound2(InflatingNode):
    """Honest in round 1 (whose updates set the scale), inflating from round 2 on."""

    def train(self, request: Task) -> TaskResult:
        if request.round < 2:
            return LocalNode.train(self, request)
        return super().train(request)


def test_an_update_far_above_its_peers_is_refused_in_an_unstable_run():
    inflating = InflatingFromRound2(1)
    nodes = [LocalNode(0), inflating, LocalNode(2)]
    eng, _, _ = engine(nodes)
    outcomes = unstable_rounds(eng, 2)
    assert [o.completed for o in outcomes] == [11, 11]
    assert inflating.stats.failed >= 1
    assert update_norm(mean(outcomes[1])) < 500  # honest ones are 12-140; inflated 1000x
    assert nodes[0].stats.failed == 0 and nodes[2].stats.failed == 0


def test_norm_guard_judges_a_large_update_against_its_peers():
    guard = NormGuard(factor=10.0, warmup=3)
    for unit in "abc":
        guard.check({"w": np.ones(4)}, unit)  # recent scale: norm 2
    guard.start_round(4, nodes=4)
    accepted: dict[str, float] = {}

    def grown(unit: str, value: float) -> None:  # each waits until its peers are in
        accepted[unit] = guard.check({"w": np.full(4, value)}, unit, node=unit, wait_seconds=30)

    threads = [threading.Thread(target=grown, args=(unit, value))  # all 25-35x the scale
               for unit, value in zip("abc", (50.0, 60.0, 70.0), strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert accepted == {"a": 100.0, "b": 120.0, "c": 140.0}
    with pytest.raises(ValueError, match=r"x the largest of 3 other nodes' updates"):
        guard.check({"w": np.full(4, 1e6)}, "d", node="d")


def test_a_hard_batch_two_nodes_compute_alike_is_accepted_not_recomputed_forever(caplog):
    """A spike that is the data's, not a node's: the second node's result of the unit has
    the norm the first's was refused at, so the guard accepts it; a different norm from
    the other node, or the same node again, is still refused."""
    guard = NormGuard(factor=10.0, warmup=3)
    for unit in "abc":
        guard.check({"w": np.ones(4)}, unit)  # recent scale: norm 2
    guard.start_round(1, nodes=2)  # a round of one unit: no peers to vouch for a spike
    spike = {"w": np.full(4, 90.0)}  # 90x the scale
    with pytest.raises(ValueError, match="no other node's update"):
        guard.check(spike, "u7", node="node-a")
    with pytest.raises(ValueError):
        guard.check(spike, "u7", node="node-a")  # the same node again vouches for nothing
    with pytest.raises(ValueError):
        guard.check({"w": np.full(4, 95.0)}, "u7", node="node-b")  # not the same update
    with pytest.raises(ValueError):
        guard.check(spike, "u8", node="node-b")  # the same norm for another unit
    vindicated: list[str] = []
    with caplog.at_level(logging.WARNING, logger="coordinator.engine"):
        assert guard.check(spike, "u7", node="node-b", vindicate=vindicated.append) == 180.0
    assert "nodes node-a and node-b computed it alike: a hard batch" in caplog.text
    assert vindicated == ["node-a"]  # refused first, honest after all


class HardBatchNode(LocalNode):
    """Honest; once `spiking`, one unit's data gives a 1000x update, on every such node."""

    spiking = False

    def train(self, request: Task) -> TaskResult:
        result = super().train(request)
        if self.spiking and request.unit_id == units()[0].unit_id:
            result.update = {name: value * 1000.0 for name, value in result.update.items()}
        return result


def test_a_hard_batch_refused_on_one_node_and_computed_alike_on_another_benches_no_one():
    nodes = [HardBatchNode(0), HardBatchNode(1)]
    eng, _, _ = engine(nodes)
    norm = NormLimit(10.0)
    eng.run_round(1, units(11), 11, build, checked(check_finite, norm))  # the usual scale
    HardBatchNode.spiking = True
    try:
        outcome = eng.run_round(2, units(11), 11, build, checked(check_finite, norm))
    finally:
        HardBatchNode.spiking = False
    assert outcome.completed == 11 and outcome.discarded == []
    assert sum(node.stats.failed for node in nodes) == 1  # refused once, then vouched for
    assert all(node.view(time.monotonic()).available for node in nodes)
    assert [node.refused for node in nodes] == [None, None]


def test_a_node_vindicated_by_a_hard_batch_leaves_the_bench_at_once():
    node = LocalNode(0)
    node.started()
    node.refuse("update norm 90 is 45x the recent median")
    node.failed(0.1, bench=True)
    assert not node.view(time.monotonic()).available
    node.vindicate()
    assert node.view(time.monotonic()).available and node.refused is None


def test_a_unit_past_its_failure_limit_is_not_queued_beside_its_attempts_still_out():
    """With a backup attempt still out when a unit's last allowed failure comes in, the
    unit must wait for that attempt rather than be queued for yet another one: else a unit
    failing on every node is never without an attempt, never discarded, and its round
    spins (thousands of attempts a second)."""
    state = RoundState(1, units(1), 1, max_attempts=4)
    unit = state.units[0]
    assert state.next_unit(None) is unit  # a worker takes it from the queue
    first = state.start_attempt(unit, "node-a")
    second = state.start_attempt(unit, "node-b")  # a backup
    state.end_attempt(unit, first)
    unit.failures = 2  # two failures so far; this attempt's is the third
    assert not state.record_failure(unit, "bad shard", max_failures=3)
    assert unit not in state._queue and not unit.discarded  # its backup decides
    state.end_attempt(unit, second)
    assert state.record_failure(unit, "bad shard", max_failures=3)  # the last one decides
    assert unit.discarded


def test_a_round_of_no_unit_ends_at_once_with_no_result():
    """An empty Poisson draw of clients: nothing to run, nothing failed."""
    eng, _, _ = engine([LocalNode(0)])
    outcome = eng.run_round(1, [], 0, build)
    assert outcome.results == [] and outcome.failures == []


def test_a_rounds_workers_are_started_for_waiting_work_and_leave_when_there_is_none():
    """No worker of a round waits idle (each one waiting was woken by every change of
    the round): one is started per queued unit up to the queue's limit, a backup-only one
    per backup due beyond the free workers, and a worker that finds nothing leaves."""
    state = RoundState(1, units(3), 3, max_attempts=4)
    assert state.workers_wanted(None, 2, 2) == (2, 0)  # two of the three units: the limit
    assert state.workers_wanted(None, 2, 2) == (0, 0)  # counted as started already
    first, second = state.next_unit(None), state.next_unit(None)
    assert (first, second) == tuple(state.units[:2])
    first.done = True  # its result is in
    state.release(first)
    assert state.workers_wanted(None, 2, 2) == (0, 0)  # that worker takes the last itself
    assert state.next_unit(None) is state.units[2]
    second.done = True
    state.release(second)
    assert state.next_unit(None) is None and state.workers == 1  # nothing more: it left
    slow = state.units[2]
    state.start_attempt(slow, "node-a")
    due = -1.0  # every attempt out is past the backup threshold
    assert state.workers_wanted(due, 2, 2) == (0, 1)  # a backup-only worker for it
    assert state.workers_wanted(due, 2, 2) == (0, 0)  # started: it will take the backup
    assert state.next_unit(due, backups_only=True) is slow
    assert (state.workers, state.backup_workers) == (2, 1)
    assert state.workers_wanted(due, 2, 2) == (0, 0)
    state.release(slow)  # the backup-only worker let go of it; no backup is due now ...
    assert state.next_unit(None, backups_only=True) is None  # ... so it leaves
    assert (state.workers, state.backup_workers) == (1, 0)


def test_a_node_that_joins_mid_round_takes_the_rounds_queued_units():
    """The run's only node restarted and registered anew: its old handle refuses every unit
    (its mailbox closed), and the new one must be taken in during the round, not at the
    next one, or the round fails after the grace period."""
    old = LocalNode(0, fail_with=NodeUnavailable("the node registered again (it restarted)"))
    new = LocalNode(1)
    progress = RunProgress("r1", 1, 11, lambda: [])
    eng = RoundEngine("r1", [old], RoundRobinPolicy(), EngineSettings(grace_seconds=5.0),
                      progress, threading.Event(),
                      refresh_nodes=lambda: [new] if old.calls else None)
    outcome = eng.run_round(1, units(4), 4, build)
    assert outcome.completed == 4 and outcome.discarded == []
    assert new.calls >= 4 and eng.nodes == [new]


class CancelsFirstUnit(LocalNode):
    """A node that answers its first unit 'cancelled' without being asked to (as a node
    shutting down answers the units in its load delay)."""

    cancelled = False

    def train(self, task: Task) -> TaskResult:
        if not self.cancelled:
            self.cancelled = True
            return TaskResult(TaskStatus.CANCELLED, {}, 0, task.version,
                              message="cancelled: the node is stopping")
        return super().train(task)


def test_a_unit_its_node_cancelled_is_queued_again_by_its_worker(caplog):
    """Not left to the work queue's look for units held by nobody, which warns."""
    eng, _, _ = engine([CancelsFirstUnit(0)])
    with caplog.at_level(logging.WARNING, logger="coordinator.engine"):
        outcome = eng.run_round(1, units(3), 3, build)
    assert outcome.completed == 3
    assert "held by nobody" not in caplog.text


def test_a_unit_queued_again_by_a_failure_while_its_worker_holds_it_is_not_lost(caplog):
    """A failed attempt queues its unit again before its worker lets go of it; a second
    worker takes it and every node refuses it: that worker queues it again itself."""
    state = RoundState(1, units(1), 1, max_attempts=4)
    unit = state.units[0]
    assert state.next_unit(None) is unit  # the first worker
    state.end_attempt(unit, state.start_attempt(unit, "node-a"))
    assert not state.record_failure(unit, "node-a died", max_failures=3)  # queued again
    assert state.next_unit(None) is unit  # a second worker, the first still holding it
    state.requeue(unit, wait_seconds=0)  # every node refused it
    state.release(unit)
    state.release(unit)
    with caplog.at_level(logging.WARNING, logger="coordinator.engine"):
        assert state.next_unit(None) is unit
    assert "held by nobody" not in caplog.text
