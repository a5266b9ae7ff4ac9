"""The backfill's state file: per record id its content hash, status and output line.

A batch's rows commit before its lines are appended to the output, and every run starts by
rewriting the output from this table, so the output can be trusted after any crash.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator


class BackfillError(RuntimeError):
    """The run cannot start or had to stop; the message says why and what to do."""


class BackfillState:
    """The SQLite state file: per record id its content hash, status and output line.

    Held under an exclusive lock for the run, so two runs never write the same output.
    """

    SCHEMA = ("CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, content_hash TEXT NOT NULL, "
              "engine TEXT NOT NULL, status TEXT NOT NULL, output TEXT, written_back TEXT, error TEXT, "
              "updated_at TEXT NOT NULL)")
    """One row per input id (status done | failed); the columns are described in docs/backfill.md."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = open(path.with_name(path.name + ".lock"), "w")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise BackfillError(f"another backfill is running with state {path}: wait for it to "
                                "finish, or choose another --out") from None
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # a killed process loses nothing committed
        self.db.execute(self.SCHEMA)

    def lookup(self, ids: list[str]) -> dict[str, tuple]:
        """(content_hash, engine, status, written_back) of the given ids that have a row."""
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(f"SELECT id, content_hash, engine, status, written_back FROM records "
                               f"WHERE id IN ({marks})", ids)
        return {row[0]: row[1:] for row in rows}

    def commit(self, rows: list[tuple]) -> None:
        """Insert or update rows (id, hash, engine, status, output, written_back, error) at once."""
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self.db:
            self.db.executemany(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "content_hash=excluded.content_hash, engine=excluded.engine, status=excluded.status, "
                "output=excluded.output, written_back=excluded.written_back, error=excluded.error, "
                "updated_at=excluded.updated_at", [(*row, now) for row in rows])

    def outputs(self) -> Iterator[str]:
        """The output lines of every finished record, in the order they were first recorded."""
        yield from (row[0] for row in self.db.execute(
            "SELECT output FROM records WHERE status = 'done' ORDER BY rowid"))

    def count_done(self) -> int:
        """Number of finished records (lines of a repaired output)."""
        return self.db.execute("SELECT count(*) FROM records WHERE status = 'done'").fetchone()[0]

    def close(self) -> None:
        """Close the database and release the lock."""
        self.db.close()
        self._lock.close()


def rewrite_output(state: BackfillState, out: Path) -> None:
    """Write the output afresh from the state table, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as sink:
        sink.writelines(line + "\n" for line in state.outputs())
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, out)
