"""A durable event queue in SQLite (WAL): accepted ticket events survive a crash or restart.

An event is committed before the sender is told it was accepted. The worker claims one event at
a time, hands it to a handler and records the outcome: done, a retry after an exponential backoff,
or dead-lettered after ``max_attempts``. A claimed event whose process died is claimed again after
a restart (``recover``); handlers must therefore be idempotent (write-back updates its own comment).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("pmkb.queue")

STATUSES = ("queued", "claimed", "done", "dead")

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
    UNIQUE (source, delivery)
);
CREATE INDEX IF NOT EXISTS events_ready ON events (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS events_ticket ON events (ticket, status);
"""


class PermanentError(Exception):
    """A failure that retrying cannot fix (bad token, unknown ticket): the event is dead-lettered at once."""


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


def _event(row: sqlite3.Row) -> Event:
    return Event(id=row["id"], source=row["source"], delivery=row["delivery"], ticket=row["ticket"],
                 payload=json.loads(row["payload"]), content_hash=row["content_hash"], status=row["status"],
                 attempts=row["attempts"], created_at=row["created_at"], last_error=row["last_error"],
                 result=json.loads(row["result"]) if row["result"] else None, finished_at=row["finished_at"])


class EventQueue:
    """The SQLite-backed queue; safe to use from several threads (one connection per thread)."""

    def __init__(self, path: Path, max_attempts: int = 5, backoff: float = 2.0, max_backoff: float = 600.0,
                 clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.clock = clock
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connect().db.executescript(_SCHEMA)

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
        return _Transaction(db)

    def enqueue(self, source: str, delivery: str, ticket: str, payload: dict,
                content_hash: str = "") -> tuple[int, bool]:
        """Store an event; returns (event id, True) or (the existing id, False) for a redelivery."""
        now = self.clock()
        with self._connect() as db:
            cur = db.execute(
                "INSERT INTO events (source, delivery, ticket, payload, content_hash, next_attempt_at, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source, delivery) DO NOTHING",
                (source, delivery, ticket, json.dumps(payload, ensure_ascii=False), content_hash, now, now))
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
        """Record that the event was handled."""
        with self._connect() as db:
            db.execute("UPDATE events SET status = 'done', finished_at = ?, result = ?, last_error = NULL "
                       "WHERE id = ?", (self.clock(), json.dumps(result, ensure_ascii=False), event_id))

    def fail(self, event_id: int, error: str, permanent: bool = False) -> str:
        """Record a failed attempt: back to the queue after a backoff, or dead; returns the new status."""
        now = self.clock()
        with self._connect() as db:
            row = db.execute("SELECT attempts FROM events WHERE id = ?", (event_id,)).fetchone()
            if row is None:
                raise KeyError(f"no event {event_id} in {self.path}")
            if permanent or row["attempts"] >= self.max_attempts:
                db.execute("UPDATE events SET status = 'dead', finished_at = ?, last_error = ? WHERE id = ?",
                           (now, error, event_id))
                return "dead"
            delay = min(self.backoff * 2 ** (row["attempts"] - 1), self.max_backoff)
            db.execute("UPDATE events SET status = 'queued', next_attempt_at = ?, last_error = ? WHERE id = ?",
                       (now + delay, error, event_id))
            return "queued"

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

    def retry_dead(self) -> int:
        """Give dead-lettered events a fresh set of attempts (after fixing the cause)."""
        with self._connect() as db:
            return db.execute("UPDATE events SET status = 'queued', attempts = 0, next_attempt_at = ? "
                              "WHERE status = 'dead'", (self.clock(),)).rowcount

    def get(self, event_id: int) -> Event | None:
        """One event by id."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM events WHERE id = ?", (event_id,)).fetchone()
        return _event(row) if row else None

    def events(self, status: str | None = None) -> list[Event]:
        """All events, or those in one status, oldest first."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM events" + (" WHERE status = ?" if status else "") + " ORDER BY id",
                              (status,) if status else ()).fetchall()
        return [_event(r) for r in rows]

    def last_done_hash(self, ticket: str) -> str | None:
        """Content hash of the ticket's most recently handled event, to skip unchanged re-sends."""
        with self._connect() as db:
            row = db.execute("SELECT content_hash FROM events WHERE ticket = ? AND status = 'done' "
                             "ORDER BY finished_at DESC, id DESC LIMIT 1", (ticket,)).fetchone()
        return row["content_hash"] if row else None

    def superseded(self, event: Event) -> bool:
        """True when a newer event for the same ticket is queued, in hand or done (this one is stale)."""
        with self._connect() as db:
            row = db.execute("SELECT 1 FROM events WHERE ticket = ? AND id > ? AND status IN "
                             "('queued', 'claimed', 'done') LIMIT 1", (event.ticket, event.id)).fetchone()
        return row is not None

    def counts(self) -> dict[str, int]:
        """Number of events in each status."""
        with self._connect() as db:
            rows = db.execute("SELECT status, COUNT(*) AS n FROM events GROUP BY status").fetchall()
        out = dict.fromkeys(STATUSES, 0)
        out.update({r["status"]: r["n"] for r in rows})
        return out

    def next_due_in(self) -> float | None:
        """Seconds until the next queued event is due (0 when one is due now), None when none is queued."""
        with self._connect() as db:
            row = db.execute("SELECT MIN(next_attempt_at) AS t FROM events WHERE status = 'queued'").fetchone()
        return None if row["t"] is None else max(0.0, row["t"] - self.clock())


class _Transaction:
    """``with`` block that runs its statements in one IMMEDIATE transaction on a thread's connection."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


Handler = Callable[[Event], dict]
"""Handles one event and returns what it did; raises PermanentError for failures not worth retrying."""


class Worker:
    """A background thread that drains the queue through a handler, with retries and dead-lettering."""

    def __init__(self, queue: EventQueue, handler: Handler, poll: float = 1.0,
                 on_outcome: Callable[[Event, str, float], None] | None = None):
        self.queue = queue
        self.handler = handler
        self.poll = poll
        self.on_outcome = on_outcome  # called with (event, "done" | "retry" | "dead", seconds spent)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Recover events left claimed by a previous process and start draining."""
        recovered = self.queue.recover()
        if recovered:
            log.info("recovered claimed events", extra={"recovered": recovered})
        self._thread = threading.Thread(target=self._run, name="pmkb-worker", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """Wake the worker: a new event was queued."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the event in hand and stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the worker thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def run_once(self) -> Event | None:
        """Claim and handle one due event; returns it, or None when nothing was due."""
        event = self.queue.claim()
        if event is None:
            return None
        started = time.perf_counter()
        try:
            result = self.handler(event)
        except PermanentError as exc:
            outcome = self.queue.fail(event.id, str(exc), permanent=True)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            outcome = self.queue.fail(event.id, f"{type(exc).__name__}: {exc}")
        else:
            self.queue.complete(event.id, result)
            outcome = "done"
        outcome = "retry" if outcome == "queued" else outcome
        elapsed = time.perf_counter() - started
        log.log(logging.INFO if outcome == "done" else logging.WARNING, "event %s", outcome,
                extra={"event_id": event.id, "source": event.source, "ticket": event.ticket,
                       "attempt": event.attempts, "seconds": round(elapsed, 3),
                       **({} if outcome == "done" else {"error": self.queue.get(event.id).last_error})})
        if self.on_outcome:
            self.on_outcome(event, outcome, elapsed)
        return event

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.run_once() is not None:
                    continue
                due = self.queue.next_due_in()
            except sqlite3.Error as exc:  # a locked or busy database: wait and try again
                log.error("queue error", extra={"error": str(exc)})
                due = None
            self._wake.wait(self.poll if due is None else min(due, self.poll))
            self._wake.clear()
