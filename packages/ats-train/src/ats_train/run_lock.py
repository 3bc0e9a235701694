"""One ats-train per run dir: an exclusive flock on RUN_DIR/.ats-train.lock, held by the main rank
from before the run dir is read until the run ends.

Two runs on one dir removed each other's step-N.tmp and rewrote each other's metrics.jsonl (issue
22). The kernel drops a flock when its holder dies, so a crash leaves no stale lock: the file may
remain, naming the dead holder, and the next run takes it over. A refusal names the holder (pid,
host, start time) from the file; a holder on this host whose pid is gone is reported as such: the
lock is then held by a process it forked that is still alive. Released on close: the file is
removed while still locked, and a run that opened it just before checks after locking that the
path still names the file it locked (else it retries on the new one).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".ats-train.lock"


class RunDirInUse(RuntimeError):
    """Another ats-train holds this run dir."""


def _holder(fd: int) -> dict[str, object] | None:
    raw = os.pread(fd, 4096, 0)
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):  # being written, or not ours
        return None
    return holder if isinstance(holder, dict) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _describe(holder: dict[str, object] | None) -> str:
    if holder is None:
        return "another process (its lock file names none yet)"
    pid, host = holder.get("pid"), holder.get("host")
    since = holder.get("started", "?")
    text = f"ats-train pid {pid} on host {host} (started {since})"
    if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        text += ", which has exited: a process it started still holds the lock; end it"
    return text


class RunLock:
    """The held lock; release() (or the process's exit) gives it up."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """The run dir's lock, or RunDirInUse naming its holder. Never waits."""
        path = Path(run_dir) / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunDirInUse(
                    f"run dir {run_dir} is in use by {_describe(holder)}; wait for it to end or "
                    "choose another --run-dir"
                ) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:  # released and removed between our open and our flock
                same = False
            if same:
                break
            os.close(fd)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file while still holding it, then unlock; idempotent."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            os.unlink(self.path)
        finally:
            os.close(fd)
