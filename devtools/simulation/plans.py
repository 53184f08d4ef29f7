"""Fault plans: a run's shape and what befalls it, as a readable list of timed events.

`Plan.from_seed(seed)` draws one: the schedule (sync, async or buffered), pushed and pull
nodes, and up to `MAX_EVENTS` events at virtual seconds within the run's expected span.
Each event happens to one node, or to the coordinator or its store:

    crash / restart         a node's process dies (refuses connections) / comes back
    hang / release          it takes calls and answers nothing (SIGSTOP) / goes on
    slow                    its units take `value` times as long (1: normal again)
    reject                  it rejects units with chance `value` (simulated load)
    corrupt                 its next `value` results carry a NaN (the filters refuse them)
    lose                    its next `value` replies never arrive
    duplicate               a pull node submits its next `value` results twice
    partition / heal        the coordinator and the node cannot reach each other / can
    leave / join            a pull node says goodbye and stops / registers again (a pushed
                            node's process stops / starts again, as crash and restart)
    kill                    the coordinator is SIGKILLed, and restarted with --resume
    store_fail              the store's next write fails (a full disk); the run fails
                            loudly and is resumed once the disk has room again

A node that goes down comes back: every fault of a node ends by `span` (so a run can
always finish), and a plan is JSON both ways (`to_json`, `from_json`). A share of the
plans trains federated clients (`CLIENT_PLANS`), and half of those in sync or buffered
mode are private runs (`PRIVATE_PLANS`: docs/privacy.md), whose budget the simulator
checks against the releases they make (devtools/simulation/budget.py). A private plan
draws one more coordinator fault (a kill or a store failure) while its rounds run, so
that the check meets a crash point in each.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace

MODES = ("sync", "async", "buffered")
# The model's seed, the same in every plan: a deterministic run's weights then depend on
# its settings alone, so one run without faults is the reference of every such plan.
RUN_SEED = 1
MAX_EVENTS = 6
NODE_FAULTS = ("crash", "hang", "slow", "reject", "corrupt", "lose", "partition", "leave")
ENDS = {"crash": "restart", "hang": "release", "partition": "heal", "leave": "join"}
COORDINATOR_FAULTS = ("kill", "store_fail")
CLIENT_PLANS = 0.3  # the share of plans drawn with federated clients
PRIVATE_PLANS = 0.5  # the share of sync and buffered plans with clients made private
# A private run's settings (docs/privacy.md): a clip near the letters clients' update
# norms (about 0.008 at this learning rate), noise enough for a finite epsilon, a delta
# below 1 / clients, no target (a plan's run must not stop on its budget). A clip 100
# times the updates' norm drowns them in noise: every update the noised model then gets
# is many times the norms before, and the update-norm guard refuses them all.
PRIVACY = ("privacy.clip=0.01", "privacy.noise_multiplier=1.0", "privacy.delta=0.001")
# A private plan's own coordinator fault, within the virtual seconds its rounds take
# without faults: a crash point while releases are made, where the budget is checked
PRIVATE_CRASH_SPAN = 5.0


@dataclass
class Event:
    """At virtual second ``at``, ``kind`` happens (to node ``node``, if it names one)."""

    at: float
    kind: str
    node: int | None = None
    value: float | None = None  # a slowdown's factor, a chance, a count

    def __str__(self) -> str:
        who = "" if self.node is None else f" n{self.node}"
        what = "" if self.value is None else f" {self.value:g}"
        return f"{self.at:g}s {self.kind}{who}{what}"


@dataclass
class Plan:
    """One simulated run: its shape and its events (see the module docstring)."""

    seed: int
    mode: str = "sync"
    pushed: int = 3
    pulled: int = 0
    rounds: int = 3
    epochs: int = 1
    policy: int = 2
    events: list[Event] = field(default_factory=list)
    eta: float = 0.0001  # the learning rate: a stable one (a kept plan may raise it)
    # A unit is discarded after this many failures (the engine's default is 3). A plan's
    # faults can fail one unit three times by chance (its node dies mid-unit, then the
    # next, then a corrupt result): discarding it is then the policy, not a defect, but it
    # changes a sync run's weights. At 10, a discard means units failed far more often
    # than a plan's faults explain (a kept plan may set the default).
    max_unit_failures: int = 10
    # A kept plan whose run must fail: what the reason says (empty: it must complete)
    expect_failure: str = ""
    # Federated clients: the letters data dealt to this many clients, half of them asked
    # per round (async and buffered: training at once, FedBuff); each pushed node holds a
    # block of them (--clients), pull nodes every one. 0: no clients (the letters MLP's
    # file units).
    clients: int = 0
    # Client-level differential privacy (a plan with clients, sync or buffered): each
    # round is one noised release, which the run store must charge before it is seen
    private: bool = False

    def held_by(self, node: int) -> tuple[int, int] | None:
        """The clients (first, last) pushed node ``node`` holds; None: every one."""
        if not self.clients or node >= self.pushed:
            return None
        first = self.clients * node // self.pushed
        return first, self.clients * (node + 1) // self.pushed - 1

    @property
    def deterministic(self) -> bool:
        """A sync run is deterministic: its weights do not depend on the faults."""
        return self.mode == "sync"

    @property
    def nodes(self) -> int:
        return self.pushed + self.pulled

    def settings(self) -> list[str]:
        """The run's configuration as the client's --set overrides: the letters MLP under
        delta averaging, in small rounds (one epoch a unit)."""
        sets = ["run.algorithm=delta_avg", "run.model=mlp", "run.dataset=letters",
                f"run.rounds={self.rounds}", f"delta_avg.epochs={self.epochs}",
                "delta_avg.hidden=[20]", f"delta_avg.eta={self.eta:g}", f"run.seed={RUN_SEED}",
                f"schedule.mode={self.mode}", "outputs.checkpoint_every=1"]
        if self.mode == "buffered":
            sets.append("schedule.buffer_size=2")
        if self.clients:  # a torch model's clients (the letters MLP's units are its files)
            sets = [s for s in sets if not s.startswith(("run.model=", "delta_avg.hidden"))]
            sets += ["run.model=mlp_classifier", "data.format=letters",
                     "delta_avg.local_optimizer=sgd", "delta_avg.batch_size=100",
                     f"clients.count={self.clients}",
                     f"clients.per_round={max(1, self.clients // 2)}"]
        if self.private:  # (buffered: one release a round, as privacy asks)
            sets += [*PRIVACY, *(["schedule.updates_per_round=1"]
                                 if self.mode == "buffered" else [])]
        return sets

    def results_per_round(self, units: int) -> int:
        """Results an asynchronous round takes: whole buffers of 2 covering ``units``,
        one buffer in a private buffered run (one release a round)."""
        if self.mode != "buffered":
            return units
        return 2 if self.private else -(-units // 2) * 2

    def reference_key(self) -> tuple[str, ...]:
        """What a deterministic run's final weights depend on: its settings (not its nodes,
        policy, schedule of events or the seed of its scheduler)."""
        return tuple(self.settings())

    def without_events(self) -> Plan:
        """The same run with nothing going wrong (its weights are the reference)."""
        return replace(self, events=[])

    def to_json(self, found: str | None = None) -> str:
        """The plan as JSON; ``found``: what it made fail, kept with a regression plan."""
        raw = asdict(self)
        if found is not None:
            raw = {"found": found, **raw}
        return json.dumps(raw, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan from `to_json`'s text (what it once made fail, if kept, is ignored)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("a plan is a JSON object")
        raw.pop("found", None)
        raw["events"] = [Event(**event) for event in raw.get("events", [])]
        plan = cls(**raw)
        plan.check()
        return plan

    def check(self) -> None:
        """ValueError naming what a plan (a hand-written one, say) gets wrong."""
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.pushed < 0 or self.pulled < 0 or self.nodes < 1:
            raise ValueError("a plan needs at least one node (pushed + pulled)")
        if self.rounds < 1 or self.epochs < 1:
            raise ValueError("rounds and epochs must be at least 1")
        if self.clients and self.clients < self.pushed:
            raise ValueError("a plan with clients has at least one per pushed node")
        if self.private and (not self.clients or self.mode == "async"):
            raise ValueError("a private plan has clients, in sync or buffered mode")
        kinds = set(NODE_FAULTS) | set(ENDS.values()) | set(COORDINATOR_FAULTS) | {"duplicate"}
        for event in self.events:
            if event.kind not in kinds:
                raise ValueError(f"event {event}: no such kind; kinds: {', '.join(sorted(kinds))}")
            if (event.node is None) != (event.kind in COORDINATOR_FAULTS):
                raise ValueError(f"event {event}: node faults name a node, the coordinator's "
                                 "do not")
            if event.node is not None and not 0 <= event.node < self.nodes:
                raise ValueError(f"event {event}: the plan has nodes n0..n{self.nodes - 1}")

    def __str__(self) -> str:
        nodes = f"{self.pushed} pushed + {self.pulled} pull nodes"
        if self.clients:
            nodes += f", {self.clients} {'private ' if self.private else ''}clients"
        events = "; ".join(str(e) for e in self.events) or "no faults"
        return f"seed {self.seed}: {self.mode}, {nodes}, {self.rounds} rounds; {events}"

    @classmethod
    def from_seed(cls, seed: int, span: float = 30.0) -> Plan:
        """A plan drawn from ``seed``: faults within the first ``span`` virtual seconds,
        each node's ending by then."""
        rng = random.Random(seed)
        plan = cls(seed=seed, mode=rng.choice(MODES), pushed=rng.randint(1, 3),
                   pulled=rng.randint(0, 2), policy=rng.choice((1, 2, 3)))
        if plan.nodes < 2:
            plan.pushed += 1
        for _ in range(rng.randint(0, MAX_EVENTS)):
            at = round(rng.uniform(0.0, span * 0.7), 1)
            if rng.random() < 0.15:
                plan.events.append(Event(at, rng.choice(COORDINATOR_FAULTS)))
                continue
            node = rng.randrange(plan.nodes)
            kind = rng.choice(NODE_FAULTS)
            value = _value(kind, rng, pull=node >= plan.pushed)
            if kind == "lose" and rng.random() < 0.3 and node >= plan.pushed:
                kind = "duplicate"
            plan.events.append(Event(at, kind, node, value))
            if kind in ENDS:
                plan.events.append(Event(round(rng.uniform(at + 1.0, span), 1), ENDS[kind],
                                         node))
            elif kind in ("slow", "reject"):
                reset = 1.0 if kind == "slow" else 0.0
                plan.events.append(Event(round(rng.uniform(at + 1.0, span), 1), kind, node,
                                         reset))
        plan.events.sort(key=lambda e: e.at)
        if rng.random() < CLIENT_PLANS:  # (drawn last: a plan's other draws stay as they were)
            plan.clients = rng.choice((4, 8, 12))
            if plan.mode != "async" and rng.random() < PRIVATE_PLANS:
                plan.private = True
                plan.events.append(Event(round(rng.uniform(0.0, PRIVATE_CRASH_SPAN), 1),
                                         rng.choice(COORDINATOR_FAULTS)))
                plan.events.sort(key=lambda e: e.at)
        return plan


def _value(kind: str, rng: random.Random, pull: bool) -> float | None:
    if kind == "slow":
        return rng.choice((2.0, 5.0, 20.0))
    if kind == "reject":
        return rng.choice((0.3, 0.7, 1.0))
    if kind in ("corrupt", "lose"):
        return float(rng.randint(1, 3))
    return None
