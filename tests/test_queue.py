"""The durable event queue: dedup, claim, retry with backoff, dead-letter, recovery, the worker."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from kb.tickets.queue import EventQueue, PermanentError
from kb.tickets.worker import Worker


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_queue(tmp_path, clock=None, **kw) -> EventQueue:
    return EventQueue(tmp_path / "queue.sqlite3", clock=clock or Clock(), **kw)


def add(queue: EventQueue, delivery: str, ticket: str = "o/r#1") -> int:
    event_id, created = queue.enqueue("github", delivery, ticket, {"ticket": {"title": delivery}}, "h-" + delivery)
    assert created
    return event_id


def test_database_is_wal_and_redelivery_is_not_queued_twice(tmp_path):
    queue = make_queue(tmp_path)
    first = add(queue, "d-1")
    again, created = queue.enqueue("github", "d-1", "o/r#1", {"ticket": {}})
    assert (again, created) == (first, False)
    other_source, created = queue.enqueue("jira", "d-1", "OPS-1", {"ticket": {}})
    assert created and other_source != first
    assert queue.counts() == {"queued": 2, "claimed": 0, "done": 0, "skipped": 0, "dead": 0}
    with sqlite3.connect(queue.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_claim_takes_the_oldest_due_event_once(tmp_path):
    queue = make_queue(tmp_path)
    ids = [add(queue, f"d-{n}") for n in range(3)]
    event = queue.claim()
    assert event.id == ids[0] and event.status == "claimed" and event.attempts == 1
    assert event.payload == {"ticket": {"title": "d-0"}} and event.content_hash == "h-d-0"
    assert [queue.claim().id, queue.claim().id, queue.claim()] == [ids[1], ids[2], None]
    queue.complete(ids[0], {"comment": "created"})
    done = queue.get(ids[0])
    assert done.status == "done" and done.result == {"comment": "created"}
    assert queue.last_done_hash("o/r#1") == "h-d-0" and queue.last_done_hash("o/r#2") is None


def test_failures_back_off_exponentially_then_dead_letter(tmp_path):
    clock = Clock()
    queue = make_queue(tmp_path, clock, max_attempts=3, backoff=10.0)
    event_id = add(queue, "d-1")
    assert queue.fail(queue.claim().id, "HTTP 502") == "queued"
    assert queue.claim() is None and queue.next_due_in() == pytest.approx(10.0)
    clock.now += 10
    assert queue.claim().attempts == 2
    assert queue.fail(event_id, "HTTP 502") == "queued"
    clock.now += 19.9
    assert queue.claim() is None  # the second delay is twice the first
    clock.now += 0.1
    assert queue.claim().attempts == 3
    assert queue.fail(event_id, "HTTP 502 again") == "dead"
    dead = queue.get(event_id)
    assert dead.status == "dead" and dead.last_error.startswith("HTTP 502 again (retries stopped after 3")
    assert queue.claim() is None and queue.next_due_in() is None
    assert queue.retry_dead() == 1 and queue.claim().attempts == 1


def test_permanent_failure_is_dead_at_once(tmp_path):
    queue = make_queue(tmp_path, max_attempts=5)
    event_id = add(queue, "d-1")
    queue.claim()
    assert queue.fail(event_id, "HTTP 404", permanent=True) == "dead"
    assert queue.counts()["dead"] == 1


def test_claimed_events_of_a_dead_process_are_claimed_again(tmp_path):
    clock = Clock()
    crashed = make_queue(tmp_path, clock, max_attempts=2)
    in_hand, last_try = add(crashed, "d-1"), add(crashed, "d-2")
    crashed.claim()
    crashed.fail(crashed.claim().id, "timeout")  # d-2: attempt 1 failed
    clock.now += 100
    assert crashed.claim().id == last_try  # d-2: attempt 2 (the last) in hand when the process dies
    waiting = add(crashed, "d-3")
    restarted = make_queue(tmp_path, clock, max_attempts=2)  # a new process on the same file
    assert restarted.recover() == 1
    assert restarted.get(last_try).status == "dead"
    again = restarted.claim()
    assert again.id == in_hand and again.attempts == 2
    assert restarted.claim().id == waiting


def test_an_older_event_of_a_ticket_is_superseded_by_a_newer_one(tmp_path):
    queue = make_queue(tmp_path)
    opened, other = add(queue, "d-1", "o/r#1"), add(queue, "d-2", "o/r#2")
    old = queue.claim()
    assert old.id == opened and not queue.superseded(old)
    edited = add(queue, "d-3", "o/r#1")
    assert queue.superseded(old) and not queue.superseded(queue.get(edited))
    assert not queue.superseded(queue.get(other))


def test_concurrent_claims_never_share_an_event(tmp_path):
    queue = EventQueue(tmp_path / "queue.sqlite3")
    for n in range(60):
        queue.enqueue("github", f"d-{n}", f"o/r#{n}", {})
    claimed, lock = [], threading.Lock()

    def drain():
        while (event := queue.claim()) is not None:
            with lock:
                claimed.append(event.id)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 60 and len(set(claimed)) == 60


def test_worker_handles_retries_and_dead_letters(tmp_path):
    queue = EventQueue(tmp_path / "queue.sqlite3", max_attempts=3, backoff=0.05)
    calls: dict[str, int] = {}
    outcomes = []

    def handler(event):
        name = event.payload["name"]
        calls[name] = calls.get(name, 0) + 1
        if name == "flaky" and calls[name] < 2:
            raise ConnectionError("connection reset")
        if name == "broken":
            raise RuntimeError("always fails")
        if name == "unknown":
            raise PermanentError("HTTP 404: no such issue")
        return {"handled": name}

    worker = Worker(queue, handler, poll=0.05, on_outcome=lambda e, outcome, s: outcomes.append(outcome))
    for name in ("ok", "flaky", "broken", "unknown"):
        queue.enqueue("github", name, f"o/r#{name}", {"name": name})
    worker.start()
    deadline = time.time() + 10
    while queue.counts()["done"] + queue.counts()["dead"] < 4 and time.time() < deadline:
        time.sleep(0.02)
    worker.stop()
    assert not worker.alive
    by_name = {e.payload["name"]: e for e in queue.events()}
    assert by_name["ok"].status == "done" and by_name["ok"].result == {"handled": "ok"}
    assert by_name["flaky"].status == "done" and by_name["flaky"].attempts == 2
    assert by_name["broken"].status == "dead" and calls["broken"] == 3
    assert "RuntimeError: always fails" in by_name["broken"].last_error
    assert by_name["unknown"].status == "dead" and calls["unknown"] == 1
    assert sorted(outcomes) == sorted(["done", "retry", "done", "retry", "retry", "dead", "dead"])


def test_worker_wakes_on_notify(tmp_path):
    queue = EventQueue(tmp_path / "queue.sqlite3")
    seen = threading.Event()
    worker = Worker(queue, lambda e: seen.set() or {}, poll=30)
    worker.start()
    time.sleep(0.1)  # the worker is now waiting with a long poll
    queue.enqueue("github", "d-1", "o/r#1", {})
    worker.notify()
    assert seen.wait(5)
    worker.stop()


def test_a_skipped_event_does_not_count_as_applied(tmp_path):
    queue = make_queue(tmp_path)
    opened = queue.enqueue("github", "d-1", "o/r#1", {}, "same-text", version=10.0)[0]
    reopened = queue.enqueue("github", "d-2", "o/r#1", {}, "same-text", version=20.0)[0]
    first = queue.claim()
    assert first.id == opened and queue.superseded(first)
    queue.skip(opened, "a newer event for the ticket supersedes this one")
    assert queue.get(opened).status == "skipped" and queue.last_done_hash("o/r#1") is None
    assert queue.claim().id == reopened  # same text, but nothing was applied yet: it is handled
    queue.complete(reopened, {"comment": "created"})
    assert queue.last_done_hash("o/r#1") == "same-text"


def test_an_older_version_is_never_applied_after_a_newer_one(tmp_path):
    queue = make_queue(tmp_path)
    edited = queue.enqueue("github", "d-1", "o/r#1", {}, "new-text", version=200.0)[0]
    replay = queue.enqueue("github", "d-replayed", "o/r#1", {}, "old-text", version=100.0)[0]
    # A later arrival with an older version does not supersede the newer event...
    assert not queue.superseded(queue.get(edited)) and queue.superseded(queue.get(replay))
    queue.claim()
    queue.complete(edited, {})
    # ...and once the newer version is applied, the older one is stale.
    assert queue.stale(queue.get(replay)) and not queue.stale(queue.get(edited))
    later = queue.enqueue("github", "d-3", "o/r#1", {}, "newest", version=300.0)[0]
    assert not queue.stale(queue.get(later))
    unversioned = queue.enqueue("github", "d-4", "o/r#1", {}, "x")[0]
    assert not queue.stale(queue.get(unversioned))


def test_the_ticket_systems_retry_hint_and_the_retry_budget(tmp_path):
    clock = Clock()
    queue = make_queue(tmp_path, clock, backoff=2.0, retry_budget=3 * 3600.0)
    event_id = add(queue, "d-1")
    queue.claim()
    assert queue.fail(event_id, "HTTP 403 rate limited", retry_after=1800.0) == "queued"
    assert queue.next_due_in() == pytest.approx(1800.0)  # the hint, not the 2 s backoff
    outage = 0.0
    while queue.get(event_id).status == "queued":  # an outage of hours: retried all along the budget
        clock.now += queue.next_due_in()
        outage = clock.now - 1000.0
        queue.claim()
        queue.fail(event_id, "HTTP 502")
    dead = queue.get(event_id)
    assert 2 * 3600 < outage <= 3 * 3600 and dead.status == "dead"
    assert "pmkb queue retry" in dead.last_error and dead.attempts > 10
    assert queue.retry_dead([event_id]) == 1 and queue.claim().attempts == 1


def test_a_hint_beyond_the_budget_dead_letters_at_once(tmp_path):
    queue = make_queue(tmp_path, retry_budget=600.0)
    event_id = add(queue, "d-1")
    queue.claim()
    assert queue.fail(event_id, "HTTP 429", retry_after=3600.0) == "dead"


def test_purge_drop_and_retry_by_id(tmp_path):
    clock = Clock()
    queue = make_queue(tmp_path, clock)
    done, skipped, dead, other_dead = (add(queue, f"d-{n}", f"o/r#{n}") for n in range(4))
    for _ in range(4):
        queue.claim()
    queue.complete(done, {})
    queue.skip(skipped, "unchanged")
    queue.fail(dead, "HTTP 404", permanent=True)
    queue.fail(other_dead, "HTTP 404", permanent=True)
    clock.now += 3600
    assert queue.purge(older_than=7200) == 0
    clock.now += 3601
    assert queue.purge(older_than=7200) == 2
    assert queue.counts() == {"queued": 0, "claimed": 0, "done": 0, "skipped": 0, "dead": 2}
    assert queue.last_done_hash("o/r#0") == "h-d-0"  # what was applied is remembered without the text
    assert queue.retry_dead([other_dead]) == 1 and queue.drop([dead]) == 1
    assert [e.id for e in queue.events()] == [other_dead] and queue.get(other_dead).status == "queued"


def test_the_database_is_private_to_its_owner(tmp_path):
    queue = make_queue(tmp_path)
    add(queue, "d-1")
    files = [p for p in tmp_path.iterdir() if p.name.startswith("queue.sqlite3")]
    assert {p.name for p in files} >= {"queue.sqlite3", "queue.sqlite3-wal"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}


def test_a_queue_from_an_older_release_is_upgraded(tmp_path):
    path = tmp_path / "queue.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, "
                   "delivery TEXT NOT NULL, ticket TEXT NOT NULL, payload TEXT NOT NULL, content_hash TEXT NOT NULL "
                   "DEFAULT '', status TEXT NOT NULL DEFAULT 'queued', attempts INTEGER NOT NULL DEFAULT 0, "
                   "next_attempt_at REAL NOT NULL, created_at REAL NOT NULL, claimed_at REAL, finished_at REAL, "
                   "last_error TEXT, result TEXT, UNIQUE (source, delivery))")
        db.execute("INSERT INTO events (source, delivery, ticket, payload, next_attempt_at, created_at) "
                   "VALUES ('github', 'old', 'o/r#1', '{}', 0, 0)")
    queue = EventQueue(path)
    assert queue.claim().version is None
    assert queue.enqueue("github", "new", "o/r#1", {}, version=5.0)[1]


def test_purged_and_dropped_text_leaves_the_write_ahead_log(tmp_path):
    clock = Clock()
    queue = make_queue(tmp_path, clock)
    secret = "ticket text 7f3a9c that must not linger"
    done = queue.enqueue("github", "d-1", "o/r#1", {"title": secret})[0]
    dead = queue.enqueue("github", "d-2", "o/r#2", {"title": secret + " too"})[0]
    queue.claim(), queue.claim()
    queue.complete(done, {})
    queue.fail(dead, "HTTP 404", permanent=True)
    wal = tmp_path / "queue.sqlite3-wal"
    assert wal.exists() and wal.stat().st_size > 0
    clock.now += 10
    assert queue.purge(older_than=1) == 1 and queue.drop([dead]) == 1
    assert not wal.exists() or wal.stat().st_size == 0  # folded into the database and emptied
    assert secret.encode() not in (wal.read_bytes() if wal.exists() else b"")


def test_an_outcome_that_cannot_be_recorded_releases_the_event_once_the_disk_has_room(tmp_path, monkeypatch):
    queue = make_queue(tmp_path)
    event_id = add(queue, "d-1")
    handled = []
    worker = Worker(queue, lambda event: handled.append(event.id) or {"comment": "created"})
    real_complete = queue.complete

    def disk_full(*args, **kw):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(queue, "complete", disk_full)
    with pytest.raises(sqlite3.OperationalError):
        worker.run_once()
    assert queue.get(event_id).status == "claimed" and "disk is full" in worker.write_error
    assert queue.enqueue("github", "d-1", "o/r#1", {"n": "d-1"})[1] is False  # a redelivery is not lost: still held
    monkeypatch.setattr(queue, "complete", real_complete)
    assert worker.run_once().id == event_id  # released, claimed again and handled
    assert queue.get(event_id).status == "done" and handled == [event_id, event_id] and worker.write_error is None
