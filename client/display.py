"""What the client prints: live progress on stderr, the final summary on stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from wire.generated import ttypes


class ProgressView:
    """A live progress bar fed with RunStatus snapshots; silent in quiet mode."""

    def __init__(self, quiet: bool) -> None:
        self._console = Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        if not quiet:
            self._progress = Progress(
                TextColumn("round {task.fields[round]}/{task.total:.0f}"),
                BarColumn(bar_width=16),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=False,
            )

    def __enter__(self) -> ProgressView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._progress.stop()

    def update(self, status: ttypes.RunStatus) -> None:
        if self._progress is None:
            return
        detail = "  ".join(part for part in _progress_parts(status) if part)
        if self._task is None:  # started on the first status, so early errors print alone
            self._progress.start()
            self._task = self._progress.add_task("train", total=status.rounds, round=0,
                                                 detail=detail)
        self._progress.update(self._task, completed=status.round, round=status.round,
                              detail=detail)

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)


def _progress_parts(s: ttypes.RunStatus) -> list[str]:
    """The live line: metrics when known, then unit counts (stale/cancelled when any)."""
    return [
        s.message if s.state == "running" and s.message else "",  # e.g. waiting for nodes
        f"epoch {s.epoch:.2f}" if s.epoch is not None else "",
        f"loss {s.train_loss:.4f}" if s.train_loss is not None else "",
        f"error {s.validation_error:.4f}" if s.validation_error >= 0 else "",
        f"units {s.units_done}/{s.units_total}",
        f"rejected {s.rejected}", f"failed {s.failed}", f"out {s.in_flight}",
        f"cancelled {s.cancelled}" if s.cancelled else "",
        f"stale {s.stale}" if s.stale else "",
    ]


def result_dict(result: ttypes.RunResult, model_path: str) -> dict[str, Any]:
    """The final result as plain data, for --json and for the summary."""
    return {
        "run_id": result.run_id,
        "validation_error": result.validation_error,
        "rounds": result.rounds,
        "wall_seconds": round(result.wall_seconds, 3),
        "model_path": model_path,
        "coordinator_run_dir": result.run_dir,
        "history": [{"round": m.round, "validation_error": m.validation_error,
                     "validation_loss": m.validation_loss, "train_loss": m.train_loss,
                     "seconds": round(m.seconds, 3),
                     "update_seconds": round(m.update_seconds or 0.0, 4),
                     **(m.scores or {})}
                    for m in result.history],
        "nodes": [node_dict(n) for n in result.nodes],
        "bytes_up": result.bytes_up or 0,
        "bytes_down": result.bytes_down or 0,
        "aggregation": result.aggregation or "mean",
        "compression": json.loads(result.compression_json or "{}") or NO_COMPRESSION,
    }


NO_COMPRESSION = {"up": "none", "down": "none"}


def transfer_line(data: dict[str, Any]) -> str:
    """Bytes moved and how: e.g. 'Bytes up: 1.2 MB  down: 8.4 MB  aggregation: mean
    compression: up topk 0.01, down none'."""
    comp = data["compression"]
    up = comp["up"]
    if up == "topk":
        warmup = comp.get("topk_warmup_rounds", 0)  # absent from runs recorded before it
        up += f" {comp['topk_fraction']:g}" + (f" (warm-up {warmup})" if warmup else "")
    return (f"Bytes up: {_size(data['bytes_up'])}  down: {_size(data['bytes_down'])}  "
            f"aggregation: {data['aggregation']}  compression: up {up}, down {comp['down']}")


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def node_dict(n: ttypes.NodeSummary) -> dict[str, Any]:
    return {"node": n.node, "accepted": n.accepted, "rejected": n.rejected,
            "delayed": n.delayed, "failed": n.failed, "cancelled": n.cancelled,
            "busy_seconds": round(n.busy_seconds, 3),
            "compute_seconds": round(n.compute_seconds or 0.0, 3),
            "delay_seconds": round(n.delay_seconds or 0.0, 3),
            "state": n.state or "alive", "pull": bool(n.pull)}


def print_result(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = Console(file=sys.stdout)
    console.print(f"Final validation error: {data['validation_error']:.4f}")
    console.print(f"Rounds: {data['rounds']}   Wall time: {data['wall_seconds']:.1f} s   "
                  f"Run: {data['run_id']}")
    console.print(transfer_line(data), soft_wrap=True)  # one line, however narrow
    console.print(f"Model saved to: {data['model_path']}")
    console.print(f"Run folder (on the coordinator): {data['coordinator_run_dir']}")
    console.print(node_table(data["nodes"]))


def node_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="Units per node")
    table.add_column("node")
    table.add_column("state")
    for column in ("accepted", "rejected", "delayed", "failed", "cancelled"):
        table.add_column(column, justify="right")
    for n in nodes:
        state = n.get("state", "alive") + (" (pull)" if n.get("pull") else "")
        table.add_row(n["node"], state, *(str(n[c]) for c in
                                          ("accepted", "rejected", "delayed", "failed",
                                           "cancelled")))
    return table


def status_dict(s: ttypes.RunStatus) -> dict[str, Any]:
    return {"run_id": s.run_id, "state": s.state, "round": s.round, "rounds": s.rounds,
            "validation_error": s.validation_error, "units_done": s.units_done,
            "units_total": s.units_total, "rejected": s.rejected, "failed": s.failed,
            "in_flight": s.in_flight, "elapsed_seconds": round(s.elapsed_seconds, 3),
            "stale": s.stale, "cancelled": s.cancelled, "epoch": s.epoch,
            "train_loss": s.train_loss,
            "message": s.message, "nodes": [node_dict(n) for n in s.nodes],
            "ledger": dict(s.ledger or {}),
            "unfinished": [{"round": u.round, "unit": u.unit_id, "status": u.status,
                            "node": u.node, "age_seconds": round(u.age_seconds, 1),
                            "attempts": u.attempts, "failures": u.failures,
                            "last_reason": u.last_reason} for u in s.unfinished or []]}


def print_status(s: ttypes.RunStatus, as_json: bool) -> None:
    data = status_dict(s)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = Console(file=sys.stdout)
    console.print(f"Run {s.run_id}: {s.state}, round {s.round}/{s.rounds}, "
                  f"{s.elapsed_seconds:.1f} s; " + ", ".join(p for p in _progress_parts(s) if p))
    if s.message and s.state != "running":  # a running run's message is in the line above
        console.print(f"  {s.message}")
    if data["ledger"]:
        counts = ", ".join(f"{k} {v}" for k, v in data["ledger"].items() if v)
        console.print(f"  units by status: {counts}")
    console.print(node_table(data["nodes"]))
    if data["unfinished"]:
        console.print(unfinished_table(data["unfinished"]))


def unfinished_table(units: list[dict[str, Any]]) -> Table:
    table = Table(title="Unfinished units")
    for column in ("round", "unit", "status", "node", "age s", "attempts", "failures",
                   "last reason"):
        table.add_column(column)
    for u in units:
        table.add_row(str(u["round"]), u["unit"], u["status"], u["node"] or "-",
                      f"{u['age_seconds']:.1f}", str(u["attempts"]), str(u["failures"]),
                      u["last_reason"] or "")
    return table
