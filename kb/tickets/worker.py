"""The worker that drains the event queue: one event at a time, through a handler, in a background thread.

The handler's exception says what happened: ``Skipped`` (not applied), ``RetryLater`` (with the
delay the ticket system asked for), ``PermanentError`` (dead-lettered at once), anything else
(retried with backoff). The worker also purges finished events past the retention period.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from kb.tickets.queue import Event, EventQueue, PermanentError, RetryLater, Skipped

log = logging.getLogger("pmkb.queue")


Handler = Callable[[Event], dict]
"""Handles one event and returns what it did; raises PermanentError for failures not worth retrying."""


class Worker:
    """A background thread that drains the queue through a handler, with retries and dead-lettering."""

    def __init__(self, queue: EventQueue, handler: Handler, poll: float = 1.0,
                 on_outcome: Callable[[Event, str, float], None] | None = None,
                 retention: float | None = None, purge_every: float = 3600.0):
        self.queue = queue
        self.handler = handler
        self.poll = poll
        self.on_outcome = on_outcome  # called with (event, "done" | "skipped" | "retry" | "dead", seconds)
        self.retention = retention  # finished events older than this (seconds) are purged; None keeps them
        self.purge_every = purge_every
        self._purged_at = float("-inf")
        self._resumed = threading.Event()
        self._resumed.set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unreleased: int | None = None  # an event in hand whose outcome could not be recorded
        self.write_error: str | None = None  # why the queue cannot be written now (None: it can)

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

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold off claiming new events inside the block (the event in hand is finished first)."""
        self._resumed.clear()
        try:
            yield
        finally:
            self._resumed.set()
            self._wake.set()

    @property
    def alive(self) -> bool:
        """True while the worker thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def run_once(self) -> Event | None:
        """Claim and handle one due event; returns it, or None when nothing was due.

        When its outcome cannot be recorded (a full or failing disk), the event is released back to
        the queue as soon as the queue can be written again, and ``write_error`` says why until then.
        """
        if self._unreleased is not None:
            self.queue.release(self._unreleased)
            log.info("released the event whose outcome could not be recorded", extra={"event_id": self._unreleased})
            self._unreleased = self.write_error = None
        event = self.queue.claim()
        if event is None:
            return None
        self.write_error = None  # the claim was written
        try:
            return self._handle(event)
        except (sqlite3.Error, OSError) as exc:
            self._unreleased, self.write_error = event.id, f"the event queue cannot be written: {exc}"
            raise

    def _handle(self, event: Event) -> Event:
        started = time.perf_counter()
        try:
            result = self.handler(event)
        except Skipped as exc:
            self.queue.skip(event.id, str(exc))
            outcome = "skipped"
        except PermanentError as exc:
            outcome = self.queue.fail(event.id, str(exc), permanent=True)
        except RetryLater as exc:
            outcome = self.queue.fail(event.id, str(exc), retry_after=exc.retry_after)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            outcome = self.queue.fail(event.id, f"{type(exc).__name__}: {exc}")
        else:
            self.queue.complete(event.id, result)
            outcome = "done"
        outcome = "retry" if outcome == "queued" else outcome
        elapsed = time.perf_counter() - started
        failed = outcome in ("retry", "dead")
        log.log(logging.WARNING if failed else logging.INFO, "event %s", outcome,
                extra={"event_id": event.id, "source": event.source, "ticket": event.ticket,
                       "attempt": event.attempts, "seconds": round(elapsed, 3),
                       **({"error": self.queue.get(event.id).last_error} if failed else {})})
        if self.on_outcome:
            self.on_outcome(event, outcome, elapsed)
        return event

    def purge_if_due(self) -> int:
        """Purge finished events past the retention period, at most once per ``purge_every`` seconds."""
        now = time.monotonic()
        if self.retention is None or now - self._purged_at < self.purge_every:
            return 0
        self._purged_at = now
        purged = self.queue.purge(self.retention)
        if purged:
            log.info("purged finished events", extra={"purged": purged, "retention_s": self.retention})
        return purged

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._resumed.wait(self.poll):
                continue
            try:
                self.purge_if_due()
                if self.run_once() is not None:
                    continue
                due = self.queue.next_due_in()
            except (sqlite3.Error, OSError) as exc:  # a busy database or a full disk: wait and try again
                self.write_error = self.write_error or f"the event queue cannot be written: {exc}"
                log.error("queue error", extra={"error": str(exc)})
                due = None
            self._wake.wait(self.poll if due is None else min(due, self.poll))
            self._wake.clear()
