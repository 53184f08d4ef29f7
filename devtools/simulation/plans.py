"""Fault plans: a run's shape and the faults that befall it, as a readable list of timed
events, drawn from a seed (`Plan.from_seed`) and written as JSON."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("sync", "async", "buffered")


@dataclass
class Event:
    """At virtual second ``at``, ``kind`` happens to node ``node`` (if it names one)."""

    at: float
    kind: str
    node: int | None = None
    value: float | None = None  # a slowdown's factor, a reject chance, a count


@dataclass
class Plan:
    seed: int
    mode: str = "sync"
    pushed: int = 3
    pulled: int = 0
    rounds: int = 3
    epochs: int = 1
    policy: int = 2
    deterministic: bool = True
    events: list[Event] = field(default_factory=list)

    def settings(self) -> list[str]:
        """The run's configuration as the client's --set overrides: the letters MLP under
        delta averaging, small rounds."""
        sets = ["run.algorithm=delta_avg", "run.model=mlp", "run.dataset=letters",
                f"run.rounds={self.rounds}", f"delta_avg.epochs={self.epochs}",
                "delta_avg.hidden=[20]", "delta_avg.eta=0.001",
                f"schedule.mode={self.mode}", "outputs.checkpoint_every=1"]
        if self.mode == "buffered":
            sets.append("schedule.buffer_size=2")
        return sets

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        raw["events"] = [Event(**event) for event in raw.get("events", [])]
        return cls(**raw)

    @classmethod
    def from_seed(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        mode = rng.choice(MODES)
        plan = cls(seed=seed, mode=mode, pushed=rng.randint(1, 3), pulled=rng.randint(0, 2),
                   deterministic=mode == "sync")
        return plan

    def describe(self) -> dict[str, Any]:
        return asdict(self)
