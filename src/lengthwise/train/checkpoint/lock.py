"""One writer per checkpoint folder: an advisory lock on ``writer.lock`` that names its holder.

A :class:`~lengthwise.train.checkpoint.Checkpointer` takes the lock on its first save
and releases it on ``close()``. A second writer (another process, or another
checkpointer in this one) meets :class:`CheckpointLockedError` naming the folder and the
holder (pid, host, since when), instead of both writing ``step_N.tmp/`` and pruning
each other's steps.

The lock is ``flock`` on the file, which the operating system drops when the holder
exits or crashes, so a killed run never blocks the next one. Where the file system has
no such locks, the holder written in the file decides: a holder on this host whose
process is gone (or is another process under a reused pid) is stale and taken over;
one on another host is trusted, and the message says to delete the file if that run
is over.

Example::

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> first, second = WriterLock(folder), WriterLock(folder)
    >>> first.acquire()
    >>> try:
    ...     second.acquire()
    ... except CheckpointLockedError as exc:
    ...     print(str(exc).split(" (")[0].endswith("is being written by another checkpointer"))
    True
    >>> first.release(); second.acquire(); second.release()
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from lengthwise.train.checkpoint.folder import CheckpointError, CheckpointLockedError

try:  # POSIX advisory locks; elsewhere the holder record alone decides
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "WriterLock"]

LOCK_FILE = "writer.lock"


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (Linux clock ticks), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_process() -> dict[str, Any]:
    """The holder record of the calling process."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid()),
            "since": time.time()}


def holder_alive(holder: dict[str, Any]) -> bool:
    """Whether the process of a holder record may still run (always ``True`` on another host)."""
    if holder.get("host") != socket.gethostname():
        return True  # no way to look at another host's processes
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    start = holder.get("start")
    return start is None or _start_time(pid) in (None, start)


def _read_holder(handle: IO[bytes]) -> dict[str, Any] | None:
    handle.seek(0)
    try:
        holder = json.loads(handle.read().decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    here = holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
    return (f"{'this process, ' if here else ''}pid {holder.get('pid')} on host "
            f"{holder.get('host')}, since {since}")


def _try_flock(handle: IO[bytes]) -> bool | None:
    """Take the advisory lock: ``True`` taken, ``False`` held elsewhere, ``None`` unsupported."""
    if fcntl is None:  # pragma: no cover - Windows
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without flock (some network mounts)
        return None
    return True


class WriterLock:
    """The writer lock of one checkpoint folder (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, kind: str = "checkpoint folder",
                 writer: str = "checkpointer") -> None:
        self.directory = Path(directory)
        self.kind, self.writer = kind, writer  # how the messages name the folder and a holder
        self.path = self.directory / LOCK_FILE
        self._handle: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._handle is not None

    def acquire(self) -> None:
        """Take the lock (a no-op if held), or raise :class:`CheckpointLockedError`."""
        if self._handle is not None:
            return
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(f"{self.kind} {self.directory} is a file, not a folder")
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(100):  # the file may be removed by its holder between open and lock
            handle = open(self.path, "a+b")  # noqa: SIM115 - kept open while the lock is held
            try:
                taken = self._lock_open_file(handle)
            except BaseException:
                handle.close()
                raise
            if taken:
                self._handle = handle
                return
            handle.close()
        raise CheckpointLockedError(  # pragma: no cover - the lock file kept being replaced
            f"{self.kind} {self.directory}: {self.path} kept being replaced while it "
            f"was locked; another {self.writer} is starting and stopping there")

    def _lock_open_file(self, handle: IO[bytes]) -> bool:
        """Lock ``handle`` and write this process in it; ``False`` if the path was replaced."""
        taken = _try_flock(handle)
        if taken:
            try:
                same = os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its holder removed it on release: lock the file now there
                return False
        holder = _read_holder(handle)
        if taken is False or (taken is None and holder and holder_alive(holder)
                              and holder.get("pid") != os.getpid()):
            hint = "close it or wait for it to finish, or give this run its own folder"
            if taken is None:
                hint += f"; if that run is over, delete {self.path}"
            raise CheckpointLockedError(
                f"{self.kind} {self.directory} is being written by another "
                f"{self.writer} ({_describe(holder)}): one writer per folder; {hint}")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(this_process()).encode("utf-8"))
        handle.flush()
        return True

    def release(self) -> None:
        """Give the lock up and remove the file (a no-op if not held)."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked: see acquire
            if fcntl is not None:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                except OSError:  # pragma: no cover - no flock on this file system
                    pass
        finally:
            handle.close()
