"""A durable event queue in SQLite (WAL): accepted ticket events survive a crash or restart.

An event is committed before the sender is told it was accepted. The worker claims one event at
a time, hands it to a handler and records the outcome: done, skipped (stale or unchanged), a retry
after an exponential backoff or the delay the ticket system asked for, or dead-lettered once the
retry budget is spent. A claimed event whose process died is claimed again after a restart
(``recover``); handlers must therefore be idempotent (write-back updates its own comment).

Per ticket, the queue remembers the newest version it applied (the ticket's own change time) and
the hash of that text, so an older event (a retry overtaken by an edit, a replayed delivery) is
never applied after a newer one. The database holds only what the service gives it (redacted
text), is readable by its owner alone, and finished events are purged after a retention period.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

STATUSES = ("queued", "claimed", "done", "skipped", "dead")
FINISHED = ("done", "skipped")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,             -- github | jira | ...
    delivery TEXT NOT NULL,           -- the sender's delivery id: a redelivery is not queued twice
    ticket TEXT NOT NULL,             -- the ticket system and key, e.g. "octo/repo#12" or "OPS-12"
    payload TEXT NOT NULL,            -- JSON the handler needs (ticket text, reference)
    content_hash TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    created_at REAL NOT NULL,
    claimed_at REAL,
    finished_at REAL,
    last_error TEXT,
    result TEXT,
    version REAL,                     -- when the ticket was changed (epoch s): orders a ticket's events
    UNIQUE (source, delivery)
);
CREATE INDEX IF NOT EXISTS events_ready ON events (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS events_ticket ON events (ticket, status);
CREATE TABLE IF NOT EXISTS tickets (  -- what was last applied to each ticket; holds no ticket text
    ticket TEXT PRIMARY KEY,
    version REAL,
    content_hash TEXT NOT NULL,
    applied_at REAL NOT NULL
);
"""


class PermanentError(Exception):
    """A failure that retrying cannot fix (bad token, unknown ticket): the event is dead-lettered at once."""


class Skipped(Exception):
    """The event is not applied (stale or unchanged); the reason is the message."""


class RetryLater(Exception):
    """A failure worth retrying; ``retry_after`` is the delay the other side asked for (seconds), if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Event:
    """One queued ticket event as the worker sees it."""

    id: int
    source: str
    delivery: str
    ticket: str
    payload: dict
    content_hash: str
    status: str
    attempts: int
    created_at: float
    last_error: str | None = None
    result: dict | None = None
    finished_at: float | None = None
    version: float | None = None


def _event(row: sqlite3.Row) -> Event:
    return Event(id=row["id"], source=row["source"], delivery=row["delivery"], ticket=row["ticket"],
                 payload=json.loads(row["payload"]), content_hash=row["content_hash"], status=row["status"],
                 attempts=row["attempts"], created_at=row["created_at"], last_error=row["last_error"],
                 result=json.loads(row["result"]) if row["result"] else None, finished_at=row["finished_at"],
                 version=row["version"])


class EventQueue:
    """The SQLite-backed queue; safe to use from several threads (one connection per thread).

    A failed event is retried after ``backoff`` seconds, doubling up to ``max_backoff``, or after
    the delay the ticket system asked for when that is longer; it is dead-lettered when the next
    try would fall more than ``retry_budget`` seconds after the event arrived, or after
    ``max_attempts`` tries.
    """

    def __init__(self, path: Path, max_attempts: int = 50, backoff: float = 2.0, max_backoff: float = 600.0,
                 retry_budget: float = 6 * 3600.0, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_budget = retry_budget
        self.clock = clock
        self._local = threading.local()
        self._writer = _writer_lock(self.path)
        create_private_file(self.path)
        db = self._connect().db
        db.executescript(_SCHEMA)
        if "version" not in {row["name"] for row in db.execute("PRAGMA table_info(events)")}:
            db.execute("ALTER TABLE events ADD COLUMN version REAL")  # a queue from an older release

    def _connect(self) -> "_Transaction":
        """This thread's connection, wrapped so that ``with`` runs one IMMEDIATE transaction."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk before the 202 goes out, even if the machine loses power.
            db.execute("PRAGMA synchronous=FULL")
            self._local.db = db
        return _Transaction(db, self._writer)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for reading: one snapshot, without the write lock.

        In WAL mode readers never block the writer, so the worker's checks do not hold up the
        commit of an incoming webhook.
        """
        db = self._connect().db
        db.execute("BEGIN DEFERRED")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    def enqueue(self, source: str, delivery: str, ticket: str, payload: dict,
                content_hash: str = "", version: float | None = None) -> tuple[int, bool]:
        """Store an event; returns (event id, True) or (the existing id, False) for a redelivery.

        ``version`` is when the ticket was changed, as the sender says: it orders the ticket's events.
        """
        now = self.clock()
        with self._connect() as db:
            cur = db.execute(
                "INSERT INTO events (source, delivery, ticket, payload, content_hash, next_attempt_at, created_at,"
                " version) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source, delivery) DO NOTHING",
                (source, delivery, ticket, json.dumps(payload, ensure_ascii=False), content_hash, now, now,
                 version))
            if cur.rowcount:
                return cur.lastrowid, True
            row = db.execute("SELECT id FROM events WHERE source = ? AND delivery = ?",
                             (source, delivery)).fetchone()
            return row["id"], False

    def claim(self) -> Event | None:
        """Take the oldest event that is due, mark it claimed and count the attempt; None when idle."""
        now = self.clock()
        with self._connect() as db:
            row = db.execute("SELECT id FROM events WHERE status = 'queued' AND next_attempt_at <= ? "
                             "ORDER BY next_attempt_at, id LIMIT 1", (now,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE events SET status = 'claimed', claimed_at = ?, attempts = attempts + 1 "
                       "WHERE id = ?", (now, row["id"]))
            return _event(db.execute("SELECT * FROM events WHERE id = ?", (row["id"],)).fetchone())

    def complete(self, event_id: int, result: dict) -> None:
        """Record that the event was applied to its ticket (the ticket's last applied version and text)."""
        now = self.clock()
        with self._connect() as db:
            db.execute("UPDATE events SET status = 'done', finished_at = ?, result = ?, last_error = NULL "
                       "WHERE id = ?", (now, json.dumps(result, ensure_ascii=False), event_id))
            row = db.execute("SELECT ticket, version, content_hash FROM events WHERE id = ?", (event_id,)).fetchone()
            db.execute("INSERT INTO tickets (ticket, version, content_hash, applied_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (ticket) DO UPDATE SET version = MAX(COALESCE(version, excluded.version), "
                       "COALESCE(excluded.version, version)), content_hash = excluded.content_hash, "
                       "applied_at = excluded.applied_at",
                       (row["ticket"], row["version"], row["content_hash"], now))

    def skip(self, event_id: int, reason: str) -> None:
        """Record that the event was not applied (stale or unchanged); the ticket's state is untouched."""
        with self._connect() as db:
            db.execute("UPDATE events SET status = 'skipped', finished_at = ?, result = ?, last_error = NULL "
                       "WHERE id = ?", (self.clock(), json.dumps({"skipped": reason}), event_id))

    def fail(self, event_id: int, error: str, permanent: bool = False, retry_after: float | None = None) -> str:
        """Record a failed attempt: back to the queue after a delay, or dead; returns the new status."""
        now = self.clock()
        with self._connect() as db:
            row = db.execute("SELECT attempts, created_at FROM events WHERE id = ?", (event_id,)).fetchone()
            if row is None:
                raise KeyError(f"no event {event_id} in {self.path}")
            delay = max(min(self.backoff * 2 ** (row["attempts"] - 1), self.max_backoff), retry_after or 0.0)
            over_budget = now + delay > row["created_at"] + self.retry_budget
            if permanent or row["attempts"] >= self.max_attempts or over_budget:
                why = ("" if permanent else f" (retries stopped after {row['attempts']} attempts in "
                       f"{now - row['created_at']:.0f} s; `pmkb queue retry {event_id}` tries again)")
                db.execute("UPDATE events SET status = 'dead', finished_at = ?, last_error = ? WHERE id = ?",
                           (now, error + why, event_id))
                return "dead"
            db.execute("UPDATE events SET status = 'queued', next_attempt_at = ?, last_error = ? WHERE id = ?",
                       (now + delay, error, event_id))
            return "queued"

    def release(self, event_id: int) -> bool:
        """Put one claimed event back in the queue, due now (its outcome could not be recorded)."""
        with self._connect() as db:
            return db.execute("UPDATE events SET status = 'queued', next_attempt_at = ? "
                              "WHERE id = ? AND status = 'claimed'", (self.clock(), event_id)).rowcount == 1

    def recover(self) -> int:
        """Put events claimed by a process that died back in the queue; returns how many.

        An event whose last allowed attempt was in hand is dead-lettered instead, so an event that
        crashes the process cannot crash it forever.
        """
        with self._connect() as db:
            db.execute("UPDATE events SET status = 'dead', finished_at = ?, last_error = ? "
                       "WHERE status = 'claimed' AND attempts >= ?",
                       (self.clock(), "the process stopped during the last attempt", self.max_attempts))
            return db.execute("UPDATE events SET status = 'queued' WHERE status = 'claimed'").rowcount

    def retry_dead(self, ids: list[int] | None = None) -> int:
        """Give dead-lettered events (all, or those with these ids) a fresh set of attempts and budget."""
        now = self.clock()
        where, args = _ids_clause(ids)
        with self._connect() as db:
            return db.execute("UPDATE events SET status = 'queued', attempts = 0, next_attempt_at = ?, "
                              f"created_at = ? WHERE status = 'dead'{where}", (now, now, *args)).rowcount

    def drop(self, ids: list[int] | None = None, status: str = "dead") -> int:
        """Delete events in ``status`` (all, or those with these ids); returns how many."""
        where, args = _ids_clause(ids)
        with self._connect() as db:
            dropped = db.execute(f"DELETE FROM events WHERE status = ?{where}", (status, *args)).rowcount
        if dropped:
            self.checkpoint()
        return dropped

    def purge(self, older_than: float) -> int:
        """Delete done and skipped events that finished more than ``older_than`` seconds ago; their
        text leaves the write-ahead log too (``checkpoint``)."""
        with self._connect() as db:
            purged = db.execute(f"DELETE FROM events WHERE status IN {FINISHED} AND finished_at < ?",
                                (self.clock() - older_than,)).rowcount
        if purged:
            self.checkpoint()
        return purged

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the database and empty it, so deleted ticket text is no
        longer in the log file (a busy reader may delay it to the next checkpoint)."""
        self._connect().db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def get(self, event_id: int) -> Event | None:
        """One event by id."""
        with self._read() as db:
            row = db.execute("SELECT * FROM events WHERE id = ?", (event_id,)).fetchone()
        return _event(row) if row else None

    def events(self, status: str | None = None) -> list[Event]:
        """All events, or those in one status, oldest first."""
        with self._read() as db:
            rows = db.execute("SELECT * FROM events" + (" WHERE status = ?" if status else "") + " ORDER BY id",
                              (status,) if status else ()).fetchall()
        return [_event(r) for r in rows]

    def last_done_hash(self, ticket: str) -> str | None:
        """Content hash of the text last applied to the ticket, to skip unchanged re-sends."""
        with self._read() as db:
            row = db.execute("SELECT content_hash FROM tickets WHERE ticket = ?", (ticket,)).fetchone()
        return row["content_hash"] if row else None

    def stale(self, event: Event) -> bool:
        """True when a newer version of the ticket than this event's was already applied."""
        if event.version is None:
            return False
        with self._read() as db:
            row = db.execute("SELECT version FROM tickets WHERE ticket = ?", (event.ticket,)).fetchone()
        return row is not None and row["version"] is not None and row["version"] > event.version

    def superseded(self, event: Event) -> bool:
        """True when a newer event for the same ticket is queued, in hand or done (this one is stale).

        Newer means a later ticket version when both events carry one, else a later arrival.
        """
        version = event.version if event.version is not None else float("-inf")
        with self._read() as db:
            row = db.execute(
                "SELECT 1 FROM events WHERE ticket = ? AND id != ? AND status IN ('queued', 'claimed', 'done') "
                "AND (CASE WHEN version IS NULL OR ? IS NULL THEN id > ? "
                "ELSE version > ? OR (version = ? AND id > ?) END) LIMIT 1",
                (event.ticket, event.id, event.version, event.id, version, version, event.id)).fetchone()
        return row is not None

    def counts(self) -> dict[str, int]:
        """Number of events in each status."""
        with self._read() as db:
            rows = db.execute("SELECT status, COUNT(*) AS n FROM events GROUP BY status").fetchall()
        out = dict.fromkeys(STATUSES, 0)
        out.update({r["status"]: r["n"] for r in rows})
        return out

    def next_due_in(self) -> float | None:
        """Seconds until the next queued event is due (0 when one is due now), None when none is queued."""
        with self._read() as db:
            row = db.execute("SELECT MIN(next_attempt_at) AS t FROM events WHERE status = 'queued'").fetchone()
        return None if row["t"] is None else max(0.0, row["t"] - self.clock())


def _ids_clause(ids: list[int] | None) -> tuple[str, list[int]]:
    if ids is None:
        return "", []
    return f" AND id IN ({', '.join('?' * len(ids))})", [int(i) for i in ids]


def create_private_file(path: Path) -> None:
    """Create ``path`` (and its folder) readable and writable by the owner only, or tighten it if it exists.

    SQLite gives its -wal and -shm files the database file's permissions, so they follow.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(path, 0o600)


_WRITER_LOCKS: dict[Path, threading.Lock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _writer_lock(path: Path) -> threading.Lock:
    """The lock the threads of this process take to write the queue at ``path``.

    SQLite lets one writer in at a time and makes the others sleep and retry (its busy handler
    sleeps up to 100 ms a try); waiting on a lock instead hands the write lock over as soon as it
    is free, so an incoming webhook is not held up by the worker's commit for longer than that
    commit takes. Other processes still wait on SQLite's own lock.
    """
    key = path.resolve()
    with _WRITER_LOCKS_GUARD:
        return _WRITER_LOCKS.setdefault(key, threading.Lock())


class _Transaction:
    """``with`` block that runs its statements in one IMMEDIATE transaction on a thread's connection."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock):
        self.db = db
        self.lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()
