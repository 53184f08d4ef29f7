"""One coordinator per run store: an exclusive lock held for the coordinator's life.

Why: a second coordinator opened on the same store marks the first one's live runs
failed at start-up (they look interrupted), after which the first one's writes are
refused while its clients still hear of success. The lock is `flock` on a sidecar file
`<store>.lock`, which the kernel releases when the process ends, even by kill -9, so a
crash never leaves a stale lock behind. The holder writes its pid into the file, so
the refusal can say who holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class StoreInUse(Exception):
    """Another process holds the store's lock; the message names the store and its pid."""


class StoreLock:
    """An exclusive, non-blocking lock on a run store; `release()` (or the end of the
    process) gives it up."""

    def __init__(self, store_path: str | os.PathLike[str]) -> None:
        self.store_path = Path(store_path)
        self.path = self.store_path.with_name(self.store_path.name + ".lock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StoreInUse(f"run store {self.store_path} is in use by another coordinator "
                             f"(pid {holder})") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the lock up. Idempotent. The file stays: removing it could let two
        processes lock two different files of the same name."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"
