"""A node sets its maths' thread count itself: one unless --threads says otherwise."""

from __future__ import annotations

import pytest

from thrift_trainer.compute_node.threads import THREAD_VARIABLES, limit_threads, threads_from_argv


@pytest.mark.parametrize("argv, threads", [
    (["9091", "0.2"], None),
    (["9091", "0.2", "--threads", "4"], 4),
    (["--threads=2", "9091", "0.2"], 2),
    (["9091", "0.2", "--threads", "0"], None),  # argparse refuses it later
    (["--", "--threads", "3"], None),
])
def test_threads_are_read_from_the_command_line_before_argparse_runs(argv, threads):
    assert threads_from_argv(argv) == threads


def test_every_thread_variable_gets_one_value():
    env: dict[str, str] = {}
    assert limit_threads(None, env) == 1
    assert {env[name] for name in THREAD_VARIABLES} == {"1"}
    env = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "8"}
    assert limit_threads(None, env) == 3 and env["MKL_NUM_THREADS"] == "3"
    assert limit_threads(2, env) == 2 and env["OMP_NUM_THREADS"] == "2"

