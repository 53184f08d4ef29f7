"""Letters through a hierarchy: 8 nodes flat, 2 relays x 4 nodes, and 2 relays x 4 with
local rounds (``hierarchy.relay_local_rounds``), with and without a slow top link.

delta_avg: the recommended configuration (configs/letters_recommended.yaml, 10 rounds of
11 units); sync_sgd (configs/letters_sync_sgd.yaml, 50 iterations of 1,280 examples): 8
units of 160 when flat, 2 units of 640 through the relays (each cut into one slice per
member), so that every layout trains on the same global batch. Policy 2, deterministic
mode, all processes on 127.0.0.1 and ended by their PIDs. The
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
from thrift_trainer.wire import stats as wire_stats

REPO = local_cluster.REPO
RECOMMENDED = REPO / "configs" / "letters_recommended.yaml"
SYNC_SGD = REPO / "configs" / "letters_sync_sgd.yaml"
TARGET = 0.10
CALL, REPLY = "train_with_weights call", "train_with_weights reply"


@dataclass(frozen=True)
class Layout:
    label: str
    relays: int  # 0: flat
    settings: tuple[str, ...]  # the client's --config and --set arguments
    rounds: int


def _delta_avg(local_rounds: int) -> tuple[str, ...]:
    return ("--config", str(RECOMMENDED), "--set",
            f"hierarchy.relay_local_rounds={local_rounds}")


def _sync_sgd(units: int) -> tuple[str, ...]:
    return ("--config", str(SYNC_SGD), "--set", f"sync_sgd.units_per_iteration={units}",
            "--set", f"sync_sgd.num_workunits_per_update={units}",
            "--set", f"sync_sgd.images_per_work_unit={1280 // units}")


LAYOUTS = (Layout("delta_avg, 8 nodes, flat", 0, _delta_avg(1), 10),
           Layout("delta_avg, 2 relays x 4 nodes", 2, _delta_avg(1), 10),
           Layout("delta_avg, 2 relays x 4 nodes, H = 3", 2, _delta_avg(3), 10),
           Layout("sync_sgd, 8 nodes, flat (8 units of 160)", 0, _sync_sgd(8), 50),
           Layout("sync_sgd, 2 relays x 4 nodes (2 units of 640)", 2, _sync_sgd(2), 50))


@dataclass
class Outcome:
    layout: str
    delay_ms: float
    rounds: int
    validation_error: float
    first_round_at_target: int | None
    wall_seconds: float
    top_updates_per_round: float  # results the coordinator took
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


def run_layout(layout: Layout, delay_ms: float, workdir: Path) -> Outcome:
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
        rounds = layout.rounds
        args = ["127.0.0.1", str(coordinator.port), *layout.settings, "--set",
                f"run.rounds={rounds}", "--json", "--quiet"]
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
    return Outcome(layout.label, delay_ms, rounds, result["validation_error"], at_target, wall,
                   result["units"]["done"] / rounds,
                   (result["bytes_up"] + result["bytes_down"]) / rounds, members / rounds,
                   errors)


def run_all(delays: list[float]) -> list[Outcome]:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="bench-hierarchy-letters-") as tmp:
        for delay_ms in delays:
            for i, layout in enumerate(LAYOUTS):
                outcome = run_layout(layout, delay_ms, Path(tmp) / f"{delay_ms}-{i}")
                print(f"{layout.label}, link delay {delay_ms:g} ms: error "
                      f"{outcome.validation_error:.4f}, {outcome.wall_seconds:.1f} s",
                      flush=True)
                outcomes.append(outcome)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    lines = [f"| layout | top-link delay | rounds | final validation error | first round <= "
             f"{TARGET} | wall s | updates up the coordinator's link / round | coordinator's "
             "link, MB / round | relays' links to members, MB / round |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for o in outcomes:
        first = o.first_round_at_target or f"> {o.rounds}"
        members = f"{o.member_bytes_per_round / 1e6:.2f}" if o.member_bytes_per_round else "-"
        lines.append(f"| {o.layout} | {o.delay_ms:g} ms | {o.rounds} | {o.validation_error:.4f} "
                     f"| {first} | {o.wall_seconds:.1f} | {o.top_updates_per_round:g} | "
                     f"{o.top_bytes_per_round / 1e6:.2f} | {members} |")
    return "\n".join(lines)


def as_json(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [vars(o) for o in outcomes]
