"""The coordinator's records (coordinator.records) as the Thrift structs its service returns."""

from __future__ import annotations

from dataclasses import asdict

from coordinator.records import NodeSummary, RoundMetrics, RunSnapshot
from wire.generated import ttypes


def node_summary(summary: NodeSummary) -> ttypes.NodeSummary:
    return ttypes.NodeSummary(**asdict(summary))


def round_metrics(metrics: RoundMetrics) -> ttypes.RoundMetrics:
    return ttypes.RoundMetrics(**asdict(metrics))


def run_status(snapshot: RunSnapshot) -> ttypes.RunStatus:
    fields = {**asdict(snapshot), "nodes": [node_summary(n) for n in snapshot.nodes]}
    return ttypes.RunStatus(**fields)
