"""What the client prints: summaries, status and runs tables, progress lines."""

from __future__ import annotations

import io

from rich.console import Console

from client import display


def rendered(renderable: object, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


NODE = {"node": "localhost:9091", "accepted": 3, "rejected": 1, "delayed": 0, "failed": 0,
        "cancelled": 0, "state": "alive", "pull": False}


def test_the_node_table_of_an_ended_run_labels_the_state_as_at_its_end() -> None:
    assert "state at end" in rendered(display.node_table([NODE], ended=True))
    running = rendered(display.node_table([NODE], ended=False))
    assert "state at end" not in running and "state" in running
