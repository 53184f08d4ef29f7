"""The fast tier's promise: a test without the `processes` marker that starts a process or
uses a socket is caught (tests/conftest.py records the audit events, and fails the test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import conftest


def test_a_process_or_a_socket_in_an_unmarked_test_is_recorded() -> None:
    sys.audit("subprocess.Popen", "git", ["git", "status"], None, None)  # as Popen announces
    sys.audit("socket.connect", None, ("127.0.0.1", 9))
    sys.audit("open", "some-file", "r", 0)  # files are fine
    seen = conftest._unmarked_test_events
    assert seen == ["subprocess.Popen ('git', ['git', 'status'], None, None)",
                    "socket.connect ('127.0.0.1', 9)"]
    seen.clear()  # else the guard fails this test for them


class Collected:
    """What the marking hook needs of a collected test: its path, and its markers."""

    def __init__(self, path: Path) -> None:
        self.path, self.markers = path, []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)


def test_every_test_under_integration_and_e2e_is_marked_by_its_directory() -> None:
    items = [Collected(conftest.TESTS / folder / "test_x.py")
             for folder in ("integration", "e2e", "unit", "bench")]
    conftest.pytest_collection_modifyitems(items)
    assert [item.markers for item in items] == [["processes"], ["processes"], [], []]
