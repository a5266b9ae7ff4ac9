"""One process at a time on an embedded store: an OS file lock in the store directory.

Chroma's embedded store (SQLite plus in-memory vector indexes) is not safe for several processes:
a second process reads stale indexes and fails with errors such as ``Error finding id``. So the
first process to open an embedded store takes an exclusive ``flock`` on ``pmkb.lock`` in its
directory and keeps it while any store of that process is open on the directory; another process
that tries gets ``StoreLocked``, which says who holds it and what to do instead.

Within one process the lock is shared: opening the same directory again (another knowledge base
object, the chat page's cache) reuses it. The kernel drops the lock when the process ends, however
it ends, so a lock file left behind (or copied with the directory) never blocks anyone.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "pmkb.lock"
"""The lock file, inside the embedded store's directory."""


class StoreLocked(RuntimeError):
    """Another process has the embedded store open."""


class _Held:
    """The lock of one directory in this process, with the number of stores using it."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self.users = 0


_held: dict[str, _Held] = {}
_guard = threading.Lock()


def _owner(lock_path: Path) -> str:
    """Who holds the lock, as written in the lock file by its holder."""
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8"))
        where = f" on {info['host']}" if info.get("host") != socket.gethostname() else ""
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"process {info['pid']}{where} (`{info['command']}`, since {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def locked_message(directory: Path, owner: str) -> str:
    """The error shown when the embedded store at ``directory`` is in use."""
    return (f"the knowledge base at {directory} is in use by {owner}. The embedded store allows one "
            f"process at a time (Chroma's embedded mode is not safe for several). Either stop that "
            f"process, or run a Chroma server on the store and point every pmkb process at it: "
            f"`chroma run --path {directory} --port 8000` (stop the other pmkb processes first), then "
            f"set PMKB_CHROMA_URL=http://127.0.0.1:8000 (or `chroma_url` in the config file).")


def _lock(directory: Path) -> int | None:
    directory.mkdir(parents=True, exist_ok=True)
    lock_path = directory / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only directory: Chroma will say what it can do there
        log.warning("could not create the store lock %s (%s); opening without it", lock_path, exc)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(locked_message(directory, _owner(lock_path))) from None
    except OSError as exc:  # a file system without locks: keep working, as before locks existed
        os.close(fd)
        log.warning("could not lock %s (%s); make sure one process at a time opens it", lock_path, exc)
        return None
    return _write_owner(fd)


def _write_owner(fd: int) -> int:
    """Record who holds the lock, for the error another process will show."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":  # python -m PACKAGE
        program = f"python -m {Path(sys.argv[0]).parent.name}"
    elif program in ("-c", "-"):  # python -c CODE, python < FILE
        program = f"python {program}"
    command = " ".join([program, *sys.argv[1:]])[:200]
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "since": round(time.time())})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode("utf-8") + b"\n", 0)
    return fd


def acquire(directory: str | os.PathLike) -> str:
    """Take (or share, within this process) the lock of an embedded store directory.

    Returns the key to ``release`` with; raises ``StoreLocked`` when another process holds it.
    """
    key = os.path.realpath(directory)
    with _guard:
        held = _held.get(key)
        if held is None:
            held = _held[key] = _Held(_lock(Path(key)))
        held.users += 1
    return key


def release(key: str) -> None:
    """Give back one use of a directory's lock; the last one unlocks it for other processes."""
    with _guard:
        held = _held.get(key)
        if held is None:
            return
        held.users -= 1
        if held.users > 0:
            return
        del _held[key]
        if held.fd is not None:
            fcntl.flock(held.fd, fcntl.LOCK_UN)
            os.close(held.fd)


def is_held(directory: str | os.PathLike) -> bool:
    """True when this process holds the lock of the directory."""
    return os.path.realpath(directory) in _held
