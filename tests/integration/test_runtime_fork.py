"""The system runtime's thread cache (engine/runtime.py) in a forked child: the parent's
idle threads are not there, so the child makes threads of its own."""

from __future__ import annotations

import os
import threading

import pytest

from tests.waiting import wait_until
from thrift_trainer.engine import runtime


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_starts_threads_of_its_own() -> None:
    """The parent's idle threads are not in a forked child: its targets must still run."""
    done = threading.Event()
    runtime.start_thread(done.set, "before-fork")
    assert done.wait(10)
    # its thread, back in the cache, idle: the one a child would be handed if it inherited it
    assert wait_until(lambda: bool(runtime._THREADS._idle), 10)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its target ran
        ran = threading.Event()
        runtime.start_thread(ran.set, "in-child")
        os._exit(0 if ran.wait(10) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
