"""Starting the trainer's scripts from a warmed-up parent process, for the tests.

Why: a node, coordinator or client process imports torch, numpy, matplotlib and Thrift
when it starts, about 2 CPU seconds, and the suite starts well over a thousand of them on a
2-core machine. A warm starter imports those libraries once and forks a child for each
script to start; the child then runs the script as ``python script args`` would, with its
own arguments, working directory, environment, standard streams and exit status, and is
ended by its PID like any other process. The trainer's own modules are not imported by the
starter: each child imports them after its environment is set, so what they read from the
environment is the child's, and a script that fails to import fails as it would.

What differs from a fresh interpreter (so tests that depend on it start fresh ones; see
tests/conftest.py's `fresh_processes` marker): the child's resident memory starts at the
starter's, and the libraries above read their import-time environment once, in the starter
(OMP_NUM_THREADS=1, as for every process the tests start).

Run as a script, this module is the starter: ``python devtools/warm_starts.py SOCKET``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOADED = ("numpy", "torch", "thrift.protocol.fastbinary", "thrift.transport.TSocket",
             "yaml", "PIL.Image", "rich.console", "matplotlib.figure",
             "matplotlib.backends.backend_agg", "matplotlib.pyplot")
READY = b"ready\n"
MAX_REQUEST_BYTES = 1 << 20  # argv and environment of one start
STARTER_SECONDS = 60.0  # for the starter to import its libraries on a busy machine


# --- the starter -------------------------------------------------------------------------

def serve(socket_path: str) -> None:
    """Preload, then fork a child per request until the process that started us is gone."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOADED:
        importlib.import_module(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the fd
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}  # child PID -> the connection told its status
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                _start_child(listener, selector, waiting, (wake_read, wake_write))
            else:
                _drain(wake_read)
        _report_exits(waiting)


def _drain(wake: socket.socket) -> None:
    try:
        while wake.recv(4096):
            pass
    except BlockingIOError:
        pass


def _report_exits(waiting: dict[int, socket.socket]) -> None:
    """Reap every child that ended and send its wait status to whoever started it."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # whoever asked is gone: nothing to tell
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()


def _start_child(listener: socket.socket, selector: selectors.BaseSelector,
                 waiting: dict[int, socket.socket], wake: tuple[socket.socket, ...]) -> None:
    conn, _ = listener.accept()
    try:
        request, fds = _receive_request(conn)
    except (OSError, ValueError) as exc:
        print(f"warm starter: bad request: {exc}", file=sys.stderr)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        selector.close()
        for inherited in (listener, *wake, *waiting.values()):
            inherited.close()
        _run_child(conn, request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        socket.send_fds(conn, [json.dumps({"pid": pid}).encode() + b"\n"], [pidfd])
    finally:
        os.close(pidfd)
    waiting[pid] = conn


def _receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: a JSON line (argv, cwd, env) with the child's stdin, stdout, stderr."""
    data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST_BYTES, 3)
    try:
        while not data.endswith(b"\n"):
            more = conn.recv(MAX_REQUEST_BYTES)
            if not more or len(data) > MAX_REQUEST_BYTES:
                raise ValueError("request cut short or too long")
            data += more
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} file descriptors, not 3")
        return json.loads(data), fds
    except (OSError, ValueError):
        for fd in fds:  # a bad request leaves none of its descriptors open here
            os.close(fd)
        raise


def _run_child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python script args`` and exit as it would."""
    conn.close()
    _end_with_starter()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import numpy

    numpy.random.seed()  # a fresh interpreter's global generator is seeded anew
    script = request["argv"][1]
    sys.argv = request["argv"][1:]
    sys.path[0] = str(Path(script).resolve().parent)
    os._exit(_run_script(script))


def _end_with_starter() -> None:
    """Be sent SIGTERM when the starter ends (it ends with the test process that made it),
    so that a test process killed before it could end its processes leaves none behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() == 1:  # the starter ended before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def _run_script(script: str) -> int:
    """Run ``script`` as __main__, then shut down as the interpreter does; its exit code."""
    import runpy
    import traceback

    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught error
        traceback.print_exc()
        code = 1
    threading._shutdown()  # joins the threads that are not daemons, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


# --- the side that asks for processes -----------------------------------------------------

class WarmProcess:
    """A process a warm starter forked, used as the tests use a `subprocess.Popen`: `pid`,
    `stdout`, `stderr`, `poll`, `wait`, `send_signal`, `terminate`, `kill`, `returncode`."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, pidfd: int,
                 stdout: Any, stderr: Any = None) -> None:
        self.args = args
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._conn = conn
        self._pidfd = pidfd
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the process through its pidfd: never another process that reused its PID."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        os.close(self._pidfd)
        self._conn.close()

    def _status(self, timeout: float | None) -> int | None:
        """The exit code once the starter has told it, waiting up to ``timeout``."""
        if self.returncode is not None:
            return self.returncode
        try:
            told = select.select([self._conn], [], [], timeout)[0]
        except (ValueError, OSError):
            told = []  # another thread read it in between
        if told:
            with self._lock:
                if self.returncode is None:
                    self.returncode = os.waitstatus_to_exitcode(self._read_status())
        return self.returncode

    def _read_status(self) -> int:
        data = b""
        while not data.endswith(b"\n"):
            more = self._conn.recv(4096)
            if not more:
                raise RuntimeError(f"the warm starter of {self.args} ended before it did")
            data += more
        return json.loads(data)["status"]


class WarmStarter:
    """A starter process of our own and how to ask it for children."""

    def __init__(self, env: dict[str, str]) -> None:
        self._folder = tempfile.mkdtemp(prefix="warm-starts-")
        self.socket_path = os.path.join(self._folder, "starter.sock")
        self._process = subprocess.Popen(
            [sys.executable, __file__, self.socket_path], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        ready = threading.Timer(STARTER_SECONDS, self._process.kill)
        ready.start()
        try:
            line = self._process.stdout.readline()
        finally:
            ready.cancel()
        if line != READY:
            raise RuntimeError(f"the warm starter did not start (exit {self._process.poll()})")
        atexit.register(self.close)

    def start(self, argv: list[str], cwd: str | os.PathLike, env: dict[str, str],
              stderr_apart: bool = False) -> WarmProcess:
        """Fork ``argv`` (``[python, script, *args]``) with its output in a pipe, its
        errors in the same one or (``stderr_apart``) in a second; stdin is ours."""
        ends = [os.pipe() for _ in range(2 if stderr_apart else 1)]
        child_fds = [0, ends[0][1], ends[-1][1]]
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.socket_path)
            request = {"argv": list(argv), "cwd": str(cwd), "env": env}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], child_fds)
            reply, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        finally:
            for _, write_end in ends:
                os.close(write_end)
        if not reply or len(fds) != 1:
            for read_end, _ in ends:
                os.close(read_end)
            raise RuntimeError(f"the warm starter could not start {argv}")
        pipes = [os.fdopen(read_end, "rb") for read_end, _ in ends]
        return WarmProcess(list(argv), conn, json.loads(reply)["pid"], fds[0], pipes[0],
                           pipes[1] if stderr_apart else None)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        try:
            os.unlink(self.socket_path)
            os.rmdir(self._folder)
        except OSError:
            pass


def capture(process: WarmProcess, timeout: float | None) -> tuple[bytes, bytes, int]:
    """The process's whole output and errors and its exit code, as `subprocess.run` waits
    for them; on a timeout the process is killed and TimeoutExpired raised, as there."""
    read: dict[str, bytes] = {}

    def read_all(name: str, pipe: Any) -> None:
        read[name] = pipe.read()

    readers = [threading.Thread(target=read_all, args=(name, pipe), daemon=True)
               for name, pipe in (("out", process.stdout), ("err", process.stderr)) if pipe]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        raise
    finally:
        for reader in readers:
            reader.join(10)
    for pipe in (process.stdout, process.stderr):
        if pipe:
            pipe.close()
    return read.get("out", b""), read.get("err", b""), code


if __name__ == "__main__":
    serve(sys.argv[1])
