"""A throwaway PostgreSQL server for tests and benchmarks: `initdb` into a temporary
folder, `postgres` on a free port of 127.0.0.1, ended by its PID.

Never the system cluster: the data folder, the socket folder and the port are this
object's own. `initdb` and `postgres` refuse to run as root, so as root (CI) both run as
the unprivileged `postgres` account the Debian package creates (setpriv), which also owns
the folder; as anyone else they run as that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_ACCOUNT = "postgres"
START_SECONDS = 30.0
STOP_SECONDS = 15.0
DATABASE = "trainer"
USER = "trainer"


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server programs on this machine (scripts/setup.sh installs them)."""


def server_programs() -> Path:
    """The folder holding initdb and postgres (Debian's /usr/lib/postgresql/<v>/bin
    first, else whatever PATH finds)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).parent
    raise PostgresNotInstalled("PostgreSQL's server programs are not installed (Debian: "
                               "apt-get install postgresql; scripts/setup.sh does it as root)")


class PostgresCluster:
    """One server; `url` is what `coordinator_node.py --store` takes."""

    def __init__(self, parent: Path | None = None) -> None:
        self.bin = server_programs()
        self.folder = Path(tempfile.mkdtemp(prefix="pg-", dir=parent))
        self.data = self.folder / "data"
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log_path = self.folder / "postgres.log"
        self._as_server = _drop_to_account() if os.geteuid() == 0 else []
        if self._as_server:
            os.chmod(self.folder, 0o755)  # the account must reach its folder
            shutil.chown(self.folder, SERVER_ACCOUNT, SERVER_ACCOUNT)
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                   "-E", "UTF8", "--no-sync", "--no-instructions"])

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> PostgresCluster:
        """Start the server (on the port it had before, after a stop) and wait until it
        takes connections; the first start creates the database."""
        first = self.port == 0
        if first:
            self.port = _free_port()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*self._as_server, str(self.bin / "postgres"), "-D", str(self.data),
                 "-p", str(self.port), "-k", str(self.folder), "-c", "listen_addresses=127.0.0.1",
                 "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        if first:
            self._run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                       "-U", USER, DATABASE])
        return self

    def stop(self, fast: bool = True) -> None:
        """End the server by its PID: SIGINT (fast shutdown: sessions are cut) or SIGTERM
        (smart: waits for them), then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT if fast else signal.SIGTERM)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_SECONDS)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _run(self, command: list[str]) -> None:
        done = subprocess.run([*self._as_server, *command], capture_output=True, text=True,
                              timeout=120, cwd=self.folder)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.process.returncode}):\n{self.log()}")
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p",
                                    str(self.port), "-U", USER, "-q"], timeout=10)
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start within {START_SECONDS:g} s:\n{self.log()}")


def _drop_to_account() -> list[str]:
    if shutil.which("setpriv") is None:
        raise PostgresNotInstalled("running as root needs setpriv (util-linux) to start "
                                   f"PostgreSQL as {SERVER_ACCOUNT}")
    try:
        import pwd
        pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        raise PostgresNotInstalled(f"running as root needs the {SERVER_ACCOUNT} account "
                                   "(Debian's postgresql package creates it)") from None
    return ["setpriv", f"--reuid={SERVER_ACCOUNT}", f"--regid={SERVER_ACCOUNT}", "--init-groups"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
