"""What a run with federated clients keeps of them in its folder.

* ``partition.json``: the partition (partitioner, seed, fingerprint, each client's size and
  label counts), written as the run starts, so that a split can be shown and reproduced;
  ``partition.png``, drawn with the run's curves at its end, pictures it (label counts per
  client, as FL papers picture a split).
* ``clients.jsonl``: one line per client and round it was asked in: ``round``,
  ``client``, ``examples``, ``loss_before`` (the received weights' loss on its training
  examples, before local training), ``train_loss`` (its local training's mean loss),
  ``node`` (its holder that computed it), or ``dropped``/``failed`` with the reason; and,
  on federated evaluation rounds, one line of ``"kind": "eval"`` per client scored:
  ``examples`` (its validation part), ``val_loss``, ``val_error`` (the run's metric),
  ``val_accuracy`` (1 - error, where the metric is the error rate) and ``node``. In the
  async and buffered modes, one line per client unit (a client may train several times a
  round), with ``version``: the global-model version its delta was applied in, or the
  newest version when it failed or dropped out.
* the summary's fairness figures over the clients' latest training losses: mean, worst
  10 % and spread (standard deviation), as FL papers report them; on evaluation rounds
  the size-weighted federated validation figures and the same fairness figures over the
  clients' validation accuracy (coordinator/client_eval.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.engine.stream_records import ClientEnd
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.units import UnitFailure, UnitResult

PARTITION_FILE = "partition.json"
PARTITION_PICTURE = "partition.png"
CLIENTS_FILE = "clients.jsonl"
EVAL_KIND = "eval"  # the "kind" of a federated evaluation's line in clients.jsonl
MOST_CLIENTS_DRAWN = 2_000  # clients drawn in partition.png: beyond, the first ones


def write_partition(run_dir: Path, record: PartitionRecord) -> None:
    (run_dir / PARTITION_FILE).write_text(record.to_json() + "\n", encoding="utf-8")


def client_rows(round_index: int, results: Sequence[UnitResult],
                failures: Sequence[UnitFailure],
                dropped: Sequence[UnitFailure]) -> list[dict[str, Any]]:
    """The lines of clients.jsonl for one round, in client order."""
    rows: list[dict[str, Any]] = [
        {"round": round_index, "client": r.unit.client, "examples": r.num_samples,
         "loss_before": _number(r.loss_before), "train_loss": _number(r.loss),
         "node": r.node}
        for r in results if r.unit.client is not None]
    for key, settled in (("failed", failures), ("dropped", dropped)):
        rows += [{"round": round_index, "client": f.unit.client, key: f.reason}
                 for f in settled if f.unit.client is not None]
    return sorted(rows, key=lambda row: client_order(row["client"]))


def _number(value: float | None) -> float | None:
    """A figure for JSON: None where it was not measured or is not finite."""
    return value if value is not None and math.isfinite(value) else None


def is_eval(row: dict[str, Any]) -> bool:
    """Whether a clients.jsonl line is a federated evaluation's (not a training unit's)."""
    return row.get("kind") == EVAL_KIND


def stream_client_rows(round_index: int, ends: Sequence[ClientEnd]) -> list[dict[str, Any]]:
    """The lines of clients.jsonl for one round of an asynchronous run: one per client
    unit, by version, then client."""
    rows: list[dict[str, Any]] = []
    for end in ends:
        if end.result is not None:
            r = end.result
            rows.append({"round": round_index, "version": end.version, "client": r.unit.client,
                         "examples": r.num_samples, "loss_before": _number(r.loss_before),
                         "train_loss": _number(r.loss), "node": r.node})
        elif end.failure is not None:
            rows.append({"round": round_index, "version": end.version,
                         "client": end.failure.unit.client,
                         "dropped" if end.dropped else "failed": end.failure.reason})
    return sorted(rows, key=lambda row: (row["version"], client_order(row["client"])))


def append_clients(run_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        with open(run_dir / CLIENTS_FILE, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


def read_clients(run_dir: Path, last_round: int | None = None) -> list[dict[str, Any]]:
    """clients.jsonl's complete lines (up to ``last_round``); none when there is no file.
    A line being written (no newline yet) or damaged is skipped: readers (the dashboard)
    read while the run writes."""
    path = run_dir / CLIENTS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("round"), int) and "client" in row:
            rows.append(row)
    return [row for row in rows if last_round is None or row["round"] <= last_round]


def keep_until(run_dir: Path, last_round: int) -> None:
    """Drop the lines of rounds after ``last_round`` (a resume's checkpoint)."""
    path = run_dir / CLIENTS_FILE
    if path.is_file():
        rows = read_clients(run_dir, last_round)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def per_client(rows: Sequence[dict[str, Any]], most: int = 1_000) -> list[dict[str, Any]]:
    """Each client's rounds as the dashboard's table shows them (the first ``most``
    clients): rounds trained, dropped and failed, its examples, its latest training loss
    (and its loss before that round's training) and the round of it, and its latest
    federated evaluation (validation loss and accuracy, the round of it)."""
    table: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = table.setdefault(row["client"], {
            "client": row["client"], "trained": 0, "dropped": 0, "failed": 0,
            "examples": None, "loss_before": None, "train_loss": None, "last_round": None,
            "evaluated": 0, "val_loss": None, "val_accuracy": None, "val_round": None})
        if is_eval(row):
            if "node" in row:
                entry["evaluated"] += 1
                entry.update(val_loss=row.get("val_loss"), val_round=row["round"],
                             val_accuracy=row.get("val_accuracy"))
        elif "node" in row:
            entry["trained"] += 1
            entry.update(examples=row.get("examples"), train_loss=row.get("train_loss"),
                         loss_before=row.get("loss_before"), last_round=row["round"],
                         node=row["node"])
        else:
            entry["dropped" if "dropped" in row else "failed"] += 1
    return sorted(table.values(), key=lambda e: client_order(e["client"]))[:most]


def fairness(rows: Sequence[dict[str, Any]]) -> dict[str, float | int]:
    """Over each client's latest training loss: how many clients took part, and the mean,
    the mean of the worst 10 % (at least one client) and the standard deviation."""
    latest: dict[str, float] = {}
    for row in rows:
        if row.get("train_loss") is not None and not is_eval(row):
            latest[row["client"]] = row["train_loss"]
    if not latest:
        return {}
    losses = np.sort(np.array(list(latest.values()), dtype=np.float64))[::-1]
    worst = losses[:max(1, math.ceil(0.1 * losses.size))]
    return {"clients_trained": int(losses.size), "client_loss_mean": float(losses.mean()),
            "client_loss_worst10": float(worst.mean()),
            "client_loss_std": float(losses.std())}


def draw_partition(record: PartitionRecord, path: Path) -> None:
    """Each client's label counts as one column of a heat map (label against client):
    one image, however many clients, where bars would cost a patch per client and label."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    shown = record.label_counts[:MOST_CLIENTS_DRAWN]
    labels = sorted({label for counts in shown for label in counts})
    grid = np.array([[counts.get(label, 0) for counts in shown] for label in labels],
                    dtype=float).reshape(len(labels), len(shown))
    fig, axis = plt.subplots(figsize=(min(14.0, 4 + 0.05 * len(shown)),
                                      min(8.0, 2 + 0.15 * len(labels))))
    image = axis.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=axis, label="examples")
    more = f" (first {MOST_CLIENTS_DRAWN} of {record.clients})" \
        if record.clients > MOST_CLIENTS_DRAWN else ""
    axis.set_title(f"{record.partitioner} partition, seed {record.seed}{more}")
    axis.set_xlabel("client")
    axis.set_ylabel("label")
    if len(labels) <= 30:
        axis.set_yticks(range(len(labels)), [str(label) for label in labels], fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def client_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else -1, name)
