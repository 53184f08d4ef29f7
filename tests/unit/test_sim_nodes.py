"""The simulation's nodes (devtools/simulation/nodes.py): a pushed node computes in its
caller's thread, so a coordinator killed at any step of a call must leave the node free
for the callers of the coordinator that resumes the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.simulation.nodes import POLL_SECONDS, SimNode
from devtools.simulation.scheduler import SimRuntime
from thrift_trainer.engine import runtime


@pytest.mark.parametrize("seed", range(40))
def test_a_killed_callers_process_never_holds_the_node(seed: int) -> None:
    """The first caller computes a unit for a second, then ends its turn while its process
    is killed: with every switch point taken (preempt 1), the kill lands before, inside or
    after the end of the turn, as the seed draws. The resumed process's caller gets its
    turn within a poll either way (a kill inside the end of a turn guarded by a simulated
    lock once left that lock held for good: the run hung, seed 7174)."""
    sim = SimRuntime(seed, preempt=1.0)
    served: list[float] = []

    def main() -> None:
        node = SimNode("n0", 0, Path("."), sim)

        def first() -> None:
            node._take_turn()
            runtime.Event().wait(1.0)  # the unit's virtual time
            node._end_turn()

        def second(done: runtime.EventLike) -> None:
            node._take_turn()
            served.append(runtime.monotonic())
            node._end_turn()
            done.set()

        sim.start_thread(first, "worker", owner="coordinator1")
        runtime.sleep(1.0)
        sim.kill("coordinator1")
        done = runtime.Event()
        sim.start_thread(second, "worker", args=(done,), owner="coordinator2")
        assert done.wait(10 * POLL_SECONDS), "the killed process's call holds the node"

    with runtime.installed(sim):
        sim.run(main, max_time=60)
    assert served and served[0] <= 1.0 + POLL_SECONDS
