"""Shrinking a failing plan to a minimal one that fails the same way.

A plan drawn from a seed carries events that have nothing to do with its failure. `shrink`
tries smaller plans, keeping each one that still fails with the same kind of problem,
until no single step makes it smaller (a greedy delta debugging): drop a fault together
with its end (a crash and its restart), drop a lone event, run fewer rounds, move a fault
earlier, drop a node that nothing happens to, give a fault a smaller count. Every node
fault keeps its end, so a smaller plan is a run that can still finish: what fails it is
the bug, not the plan.

The seed stays (the scheduler's interleaving follows it), so the shrunk plan replays
exactly: save it (`Plan.to_json`) and `simulate` it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace

from devtools.simulation.plans import ENDS, Event, Plan

MAX_TRIES = 200  # plans run while shrinking, at most (each is a simulation)

# What kind of problem a check reported (its first words): a smaller plan must fail with
# the same kind, so that shrinking does not wander off to another bug.
Verdict = Callable[[Plan], str | None]


def problem_kind(problem: str) -> str:
    """The kind of a check's problem, without the details that differ between plans:
    "ledger: no attempt left open", "raised MemberError", "node counters", "the run hung",
    "the final weights # differ from"."""
    if problem.startswith("ledger: "):
        return ":".join(problem.split(":", 2)[:2])
    if problem.startswith("thread "):
        return "raised " + problem.split(" raised ", 1)[-1].split("(", 1)[0]
    if problem.startswith("node "):
        return "node counters"
    words = re.sub(r"\b[0-9a-f]*[0-9][0-9a-f.]*\b", "#", problem.split(":", 1)[0]).split()
    return " ".join(words[:6])


def shrink(plan: Plan, verdict: Verdict, max_tries: int = MAX_TRIES) -> tuple[Plan, int]:
    """The smallest plan found that fails as ``plan`` does (``verdict``: the kind of a
    plan's first problem, None when it passes), and how many plans were tried."""
    kind = verdict(plan)
    if kind is None:
        raise ValueError(f"the plan does not fail: {plan}")
    tries = 0
    improved = True
    while improved and tries < max_tries:
        improved = False
        for smaller in _smaller_plans(plan):
            if tries >= max_tries:
                break
            tries += 1
            if verdict(smaller) == kind:
                plan, improved = smaller, True
                break
    return plan, tries


def _smaller_plans(plan: Plan) -> Iterator[Plan]:
    """One step smaller in every way there is, the biggest steps first."""
    for group in _event_groups(plan.events):
        yield replace(plan, events=[e for i, e in enumerate(plan.events) if i not in group])
    if plan.rounds > 1:
        yield replace(plan, rounds=plan.rounds - 1)
    for group in _event_groups(plan.events):
        yield from _earlier(plan, group)
    for node in _idle_nodes(plan):
        yield _without_node(plan, node)
    for index, event in enumerate(plan.events):
        if event.kind in ("corrupt", "lose", "duplicate") and (event.value or 0) > 1:
            events = list(plan.events)
            events[index] = replace(event, value=float(event.value - 1))
            yield replace(plan, events=events)


def _earlier(plan: Plan, group: set[int]) -> Iterator[Plan]:
    """The plan with a group of events at the start, then half as late (a fault keeps
    its span): a fault that needed a later round may break the first one as well."""
    first = min(plan.events[i].at for i in group)
    for at in (0.0, round(first / 2, 1)):
        if at < first:
            moved = [replace(e, at=round(e.at - first + at, 1)) if i in group else e
                     for i, e in enumerate(plan.events)]
            yield replace(plan, events=sorted(moved, key=lambda e: e.at))


def _event_groups(events: list[Event]) -> list[set[int]]:
    """Indices of events that go together: a node's fault and the event that ends it (a
    crash and the next restart of that node; a slowdown and its reset), else one event."""
    groups: list[set[int]] = []
    taken: set[int] = set()
    for i in range(len(events)):
        if i in taken:
            continue
        group = {i}
        end = _end_of(events, i)
        if end is not None:
            group.add(end)
        taken |= group
        groups.append(group)
    return groups


def _end_of(events: list[Event], i: int) -> int | None:
    event = events[i]
    if event.node is None:
        return None
    for j in range(i + 1, len(events)):
        later = events[j]
        if later.node != event.node:
            continue
        if ENDS.get(event.kind) == later.kind:
            return j
        if event.kind == later.kind and event.kind in ("slow", "reject"):
            return j  # the reset to normal
    return None


def _idle_nodes(plan: Plan) -> list[int]:
    """Nodes no event names, while the plan keeps at least one node of each kind it has
    events for (a node fewer is a smaller world)."""
    named = {e.node for e in plan.events if e.node is not None}
    idle = [n for n in range(plan.nodes) if n not in named]
    return [n for n in idle if plan.nodes > 1 and _still_has_nodes(plan, n)]


def _still_has_nodes(plan: Plan, node: int) -> bool:
    pushed = plan.pushed - (node < plan.pushed)
    return pushed + plan.pulled - (node >= plan.pushed) >= 1


def _without_node(plan: Plan, node: int) -> Plan:
    """The plan with ``node`` gone: the others keep their events, renumbered."""
    pull = node >= plan.pushed
    events = [replace(e, node=e.node - 1 if e.node is not None and e.node > node else e.node)
              for e in plan.events]
    return replace(plan, pushed=plan.pushed - (not pull), pulled=plan.pulled - pull,
                   events=events)
