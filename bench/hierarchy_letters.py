"""Letters through a hierarchy: 8 nodes flat, 2 relays x 4 nodes, and 2 relays x 4 with
local rounds (``hierarchy.relay_local_rounds``), with and without a slow top link.

The recommended configuration (configs/letters_recommended.yaml, 10 rounds of 11 units,
policy 2, deterministic mode), all processes on 127.0.0.1 and ended by their PIDs. The
slow top link is ``--link-delay-ms`` on whatever answers the coordinator: the 8 nodes
when flat, the 2 relays otherwise (their members sit beside them). Per run: the final
validation error and the first round at or below 0.10, the wall time, and bytes per round
of ``train_with_weights`` calls on the coordinator's link (the client's ``bytes_up`` +
``bytes_down``) and on the relays' links to their members (each relay's wire counters:
the calls it sends and the replies it gets).

    python bench/hierarchy.py --letters                 # about 6 minutes
    python bench/hierarchy.py --letters --delay-ms 0    # without the slow-link runs
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import local_cluster
from wire import stats as wire_stats

REPO = local_cluster.REPO
RECOMMENDED = REPO / "configs" / "letters_recommended.yaml"
TARGET = 0.10
CALL, REPLY = "train_with_weights call", "train_with_weights reply"


@dataclass(frozen=True)
class Layout:
    label: str
    relays: int  # 0: flat
    local_rounds: int = 1


LAYOUTS = (Layout("8 nodes, flat", 0), Layout("2 relays x 4 nodes", 2),
           Layout("2 relays x 4 nodes, H = 3", 2, 3))


@dataclass
class Outcome:
    layout: str
    delay_ms: float
    validation_error: float
    first_round_at_target: int | None
    wall_seconds: float
    top_bytes_per_round: float
    member_bytes_per_round: float
    errors: list[float] = field(default_factory=list)


@contextlib.contextmanager
def wire_counters(path_template: str) -> Iterator[None]:
    """Processes started inside the block write their wire counters to the template."""
    os.environ[wire_stats.ENV_PATH] = path_template
    os.environ[wire_stats.ENV_EVERY] = "0.5"
    try:
        yield
    finally:
        os.environ.pop(wire_stats.ENV_PATH, None)
        os.environ.pop(wire_stats.ENV_EVERY, None)


def member_link_bytes(stats_dir: Path) -> int:
    """Bytes of the calls the relays sent down and of the replies they got back."""
    total = 0
    for path in stats_dir.glob("relay-*.json"):
        by_method = json.loads(path.read_text())["by_method"]
        total += by_method.get(CALL, {}).get("sent_bytes", 0)
        total += by_method.get(REPLY, {}).get("received_bytes", 0)
    return total


def run_layout(layout: Layout, delay_ms: float, rounds: int, workdir: Path) -> Outcome:
    workdir.mkdir(parents=True)
    delay = ["--link-delay-ms", f"{delay_ms:g}"] if delay_ms else []
    procs: list[local_cluster.Proc] = []
    try:
        nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0,
                                          *([] if layout.relays else delay))
                 for i in range(8)]
        procs += nodes
        top = nodes
        if layout.relays:
            stats = workdir / "wire"
            stats.mkdir()
            with wire_counters(str(stats / "relay-{pid}.json")):
                top = [local_cluster.start_node(
                    workdir, f"relay{g}", 0.0, "--relay", str(local_cluster.write_nodes_file(
                        workdir / f"group{g}.txt", nodes[4 * g:4 * g + 4])), *delay)
                    for g in range(layout.relays)]
            procs += top
        nodes_file = local_cluster.write_nodes_file(workdir / "top.txt", top)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 2, "--deterministic")
        procs.append(coordinator)
        args = ["127.0.0.1", str(coordinator.port), "--config", str(RECOMMENDED), "--set",
                f"run.rounds={rounds}", "--set",
                f"hierarchy.relay_local_rounds={layout.local_rounds}", "--json", "--quiet"]
        started = time.monotonic()
        done = local_cluster.run_client(args, workdir, timeout=1800)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"{layout.label} failed: {done.stderr}\n{coordinator.log()}")
        result = json.loads(done.stdout)
    finally:
        for proc in reversed(procs):
            proc.stop()  # relays write their final wire counters as they exit
    errors = [row["validation_error"] for row in result["history"]]
    at_target = next((i + 1 for i, e in enumerate(errors) if e <= TARGET), None)
    members = member_link_bytes(workdir / "wire") if layout.relays else 0
    return Outcome(layout.label, delay_ms, result["validation_error"], at_target, wall,
                   (result["bytes_up"] + result["bytes_down"]) / rounds, members / rounds,
                   errors)


def run_all(delays: list[float], rounds: int) -> list[Outcome]:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="bench-hierarchy-letters-") as tmp:
        for delay_ms in delays:
            for i, layout in enumerate(LAYOUTS):
                outcome = run_layout(layout, delay_ms, rounds, Path(tmp) / f"{delay_ms}-{i}")
                print(f"{layout.label}, link delay {delay_ms:g} ms: error "
                      f"{outcome.validation_error:.4f}, {outcome.wall_seconds:.1f} s",
                      flush=True)
                outcomes.append(outcome)
    return outcomes


def report(outcomes: list[Outcome], rounds: int) -> str:
    lines = [f"| layout | top-link delay | validation error after {rounds} rounds | first "
             f"round <= {TARGET} | wall s | coordinator's link, MB / round | relays' links "
             "to members, MB / round |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for o in outcomes:
        first = o.first_round_at_target or f"> {rounds}"
        members = f"{o.member_bytes_per_round / 1e6:.2f}" if o.member_bytes_per_round else "-"
        lines.append(f"| {o.layout} | {o.delay_ms:g} ms | {o.validation_error:.4f} | {first} | "
                     f"{o.wall_seconds:.1f} | {o.top_bytes_per_round / 1e6:.2f} | {members} |")
    return "\n".join(lines)


def as_json(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [vars(o) for o in outcomes]
