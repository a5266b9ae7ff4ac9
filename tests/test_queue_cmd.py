"""``pmkb queue``: list events, retry and drop dead letters, purge finished events, from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kb.tickets.queue import EventQueue
from tests.conftest import command_env

ROOT = Path(__file__).resolve().parent.parent


def pmkb(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = command_env() | {"PMKB_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "pmkb", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_list_retry_and_drop_dead_letters(tmp_path):
    queue = EventQueue(tmp_path / "queue.sqlite3")
    ids = [queue.enqueue("github", f"d-{n}", f"o/r#{n}", {})[0] for n in range(3)]
    for _ in ids:
        queue.claim()
    queue.fail(ids[0], "HTTP 401: bad credentials", permanent=True)
    queue.fail(ids[1], "HTTP 404: not found", permanent=True)
    queue.complete(ids[2], {"comment": "created"})

    listed = pmkb(tmp_path, "queue", "list", "--status", "dead")
    assert listed.returncode == 0 and "2 dead" in listed.stderr
    assert "HTTP 401: bad credentials" in listed.stdout and "o/r#2" not in listed.stdout
    as_json = [json.loads(line) for line in pmkb(tmp_path, "queue", "list", "--json").stdout.splitlines()]
    assert [(e["id"], e["status"]) for e in as_json] == [(ids[0], "dead"), (ids[1], "dead"), (ids[2], "done")]

    refused = pmkb(tmp_path, "queue", "retry")
    assert refused.returncode != 0 and "--all-dead" in refused.stderr
    assert "1 event(s) queued again" in pmkb(tmp_path, "queue", "retry", str(ids[0])).stdout
    assert "1 dead event(s) deleted" in pmkb(tmp_path, "queue", "drop", "--all-dead").stdout
    assert queue.get(ids[0]).status == "queued" and queue.get(ids[1]) is None
    assert "1 finished event(s)" in pmkb(tmp_path, "queue", "purge", "--older-than-days", "0").stdout
    assert pmkb(tmp_path, "queue", "list", "--status", "nope").returncode != 0


def test_a_missing_queue_says_where_it_looked(tmp_path):
    run = pmkb(tmp_path / "nowhere", "queue", "list")
    assert run.returncode != 0 and "pmkb serve" in run.stderr and "nowhere" in run.stderr


def test_retrying_or_dropping_an_id_that_is_not_dead_is_an_error_and_changes_nothing(tmp_path):
    queue = EventQueue(tmp_path / "queue.sqlite3")
    dead, done = (queue.enqueue("github", f"d-{n}", f"o/r#{n}", {})[0] for n in range(2))
    queue.claim(), queue.claim()
    queue.fail(dead, "HTTP 404", permanent=True)
    queue.complete(done, {})
    for command in ("retry", "drop"):
        unknown = pmkb(tmp_path, "queue", command, "999999", str(dead))
        assert unknown.returncode == 2 and "no event 999999" in unknown.stderr and "nothing was changed" in unknown.stderr
        finished = pmkb(tmp_path, "queue", command, str(done))
        assert finished.returncode == 2 and f"event {done} is done, not dead" in finished.stderr
    assert queue.get(dead).status == "dead" and queue.get(done).status == "done"
