"""The warm starter the tests start the trainer's scripts with (devtools/warm_starts.py): a
forked child must look, to a test, like `python script args` started by subprocess.Popen."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.local_cluster import python_env
from devtools.warm_starts import WarmStarter, capture

SCRIPT = """
import os, signal, sys, threading, atexit
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("WARM_TEST"))
print("path0", sys.path[0], "name", __name__)
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "message":
    sys.exit("a message for the user")
if what == "raise":
    raise ValueError("boom")
if what == "thread":  # a thread that is no daemon is waited for, as at exit: it ends
    # only once the main thread has (the interpreter's shutdown), and before atexit runs
    threading.Thread(target=lambda: (threading.main_thread().join(),
                                     print("thread done"))).start()
if what == "wait":  # until a signal ends it
    print("waiting", flush=True)
    signal.pause()
"""


@pytest.fixture(scope="module")
def starter() -> Iterator[WarmStarter]:
    made = WarmStarter(python_env())
    yield made
    made.close()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "program.py"
    path.write_text(SCRIPT)
    return path


def run(starter: WarmStarter, script: Path, *args: str, env: dict | None = None
        ) -> tuple[str, str, int]:
    process = starter.start([sys.executable, str(script), *args], script.parent,
                            {**python_env(), **(env or {})}, stderr_apart=True)
    out, err, code = capture(process, timeout=60)
    return out.decode(), err.decode(), code


def test_a_child_gets_its_arguments_folder_environment_streams_and_exit_code(starter, script):
    out, err, code = run(starter, script, "exit", "3", env={"WARM_TEST": "seen"})
    assert code == 3
    assert f"argv ['exit', '3'] cwd {script.parent} env seen" in out
    assert f"path0 {script.parent} name __main__" in out
    assert "atexit ran" in out and err == "to stderr\n"


def test_exits_and_errors_end_a_child_as_they_end_an_interpreter(starter, script):
    out, err, code = run(starter, script, "message")
    assert code == 1 and err.endswith("a message for the user\n")
    out, err, code = run(starter, script, "raise")
    assert code == 1 and "ValueError: boom" in err and "Traceback" in err
    out, _, code = run(starter, script, "thread")
    assert code == 0 and out.index("thread done") < out.index("atexit ran")


def test_a_child_is_signalled_and_waited_for_as_a_popen(starter, script):
    process = starter.start([sys.executable, str(script), "wait"], script.parent, python_env())
    assert process.stdout.readline().startswith(b"argv")
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    assert process.poll() is None
    process.terminate()
    assert process.wait(30) == -signal.SIGTERM
    process.kill()  # after its end: nothing to signal, no error
    assert process.poll() == -signal.SIGTERM


def test_a_timeout_kills_the_child_as_subprocess_run_does(starter, script):
    process = starter.start([sys.executable, str(script), "wait"], script.parent, python_env(),
                            stderr_apart=True)
    with pytest.raises(subprocess.TimeoutExpired):
        capture(process, timeout=1.0)
    assert process.returncode == -signal.SIGKILL
