"""Each node's samples (rows, images) of the units it completed: counted by the engine as
answers come and shown in the node tables (tests/unit/test_node_counts.py follows them,
with the other counts, to the wire and the run store)."""

from __future__ import annotations

import io

from rich.console import Console

from tests.inprocess import LocalNode
from thrift_trainer.client import display
from thrift_trainer.engine.attempt_log import AttemptLog
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.tasks import TaskResult, TaskStatus


def answer(status: TaskStatus, samples: int) -> TaskResult:
    return TaskResult(status=status, update={}, num_samples=samples, model_version=1)


def test_a_node_counts_the_samples_of_the_units_it_completed() -> None:
    node = LocalNode(0)
    attempts = AttemptLog(UnitLedger(None, "r1"), RunProgress("r1", 1, 1, lambda: []))
    for status, samples in [(TaskStatus.COMPLETED, 1500), (TaskStatus.COMPLETED, 1499),
                            (TaskStatus.REJECTED, 0), (TaskStatus.CANCELLED, 0)]:
        node.started()
        attempts.answered(node, answer(status, samples), 0.1)
    assert node.summary().samples == 2999


def test_the_node_table_has_a_samples_column() -> None:
    node = {"node": "localhost:9091", "accepted": 3, "rejected": 1, "delayed": 0, "failed": 0,
            "cancelled": 0, "samples": 4500, "state": "alive", "pull": False}
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(display.node_table([node], ended=True))
    text = console.file.getvalue().replace("┃", "│")  # the header's bars are heavier
    header, row = [line for line in text.splitlines() if "│" in line][:2]
    cells = dict(zip(header.split("│"), row.split("│"), strict=True))
    assert {k.strip(): v.strip() for k, v in cells.items()}["samples"] == "4500"
