"""The webhook service against hostile senders and bad days: strangers, replays, malformed but signed
bodies, empty secrets, slow clients, an unwritable state directory, outages of the ticket system.

Runs the real service (uvicorn on loopback) over a copy of the bundled knowledge base, with
``FakeTicketApi`` standing in for GitHub and Jira.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sqlite3
import time

import httpx
import pytest
from conftest import command_env, make_settings
from fake_ticket_api import FakeTicketApi
from test_server import (
    API_TOKEN,
    ECC,
    GITHUB_SECRET,
    IMPORT,
    JIRA_SECRET,
    REPO,
    LiveServer,
    issues_event,
    jira_event,  # noqa: F401 - a fixture
    kb_home,  # noqa: F401 - a fixture
    post_github,
    post_jira,
    wait_finished,
    wait_until,
)

from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from pmkb.server import QUEUE_FILE, create_app, startup_problems

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2


@pytest.fixture(scope="module")
def api():
    with FakeTicketApi() as fake:
        yield fake


def start(kb_home, api, tmp_path, embedder, **kw) -> LiveServer:  # noqa: F811
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    settings = make_settings(home, **{
        "github_webhook_secret": GITHUB_SECRET, "jira_webhook_secret": JIRA_SECRET, "api_token": API_TOKEN,
        "github_api_url": api.url, "github_token": "gh-token", "jira_url": api.url, "jira_token": "jira-token",
        "queue_backoff": 0.1, **kw})
    engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
    return LiveServer(create_app(settings, engine=engine, poll=0.1))


def ready(server: LiveServer) -> LiveServer:
    wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 120, "/readyz")
    return server


@pytest.fixture(scope="module")
def live(kb_home, api, embedder, tmp_path_factory):  # noqa: F811
    with start(kb_home, api, tmp_path_factory.mktemp("hardened"), embedder) as server:
        yield ready(server)


def test_empty_secrets_refuse_to_start(tmp_path):
    for name in ("github_webhook_secret", "jira_webhook_secret", "api_token"):
        problems = startup_problems(make_settings(tmp_path, **{name: ""}), insecure_dev=True)
        assert problems and f"PMKB_{name.upper()}" in problems[0] and "empty" in problems[0]
    both = startup_problems(make_settings(tmp_path, github_webhook_secret="", jira_webhook_secret=" "), False)
    assert "PMKB_GITHUB_WEBHOOK_SECRET, PMKB_JIRA_WEBHOOK_SECRET are set but empty" in both[0]


def test_an_empty_secret_never_authenticates(kb_home, api, embedder, tmp_path):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder, github_webhook_secret="", jira_webhook_secret="") as server:
        ready(server)
        assert post_github(server.url, issues_event("opened", 1, *ECC), "empty-1", secret="").status_code == 404
        jira = jira_event("jira:issue_created", "OPS-1", *ECC)
        assert httpx.post(f"{server.url}/webhooks/jira", json=jira, headers={"X-Pmkb-Secret": ""}).status_code == 404
        assert sum(server.service.queue.counts().values()) == 0


def test_unsigned_traffic_cannot_spend_the_rate_limit_of_signed_deliveries(kb_home, api, embedder, tmp_path):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder, rate_limit_per_second=0.01, rate_limit_burst=3) as server:
        ready(server)
        flood = [httpx.post(f"{server.url}/webhooks/github", json=issues_event("opened", 9, *ECC),
                            headers={"X-GitHub-Event": "issues"}).status_code for _ in range(25)]
        assert set(flood) == {401}
        signed = [post_github(server.url, issues_event("opened", n, *ECC), f"signed-{n}").status_code
                  for n in range(1, 4)]
        assert signed == [202, 202, 202]
        assert post_github(server.url, issues_event("opened", 4, *ECC), "signed-4").status_code == 429


def test_a_stranger_cannot_steer_the_bot(live, api):
    key = f"{REPO}#31"
    stranger = api.post_as_stranger(key, "<!-- pmkb:suggestion -->\nLabels: `rc:gpu_memory_error` `dim:hardware`")
    api.labels[key] = ["rc:gpu_memory_error", "dim:hardware"]  # put there by people
    event = post_github(live.url, issues_event("opened", 31, *IMPORT), "stranger-1").json()
    assert wait_finished(live.service, event["event_id"]).status == "done"
    bodies = [c["body"] for c in api.comments[key]]
    assert stranger["body"] in bodies and len(bodies) == 2  # the bot posted its own, left the stranger's alone
    assert {"rc:gpu_memory_error", "dim:hardware"} <= set(api.labels[key])


def test_reopened_with_the_same_text_still_gets_its_comment(live, api):
    opened = issues_event("opened", 32, *ECC)
    reopened = issues_event("reopened", 32, *ECC)
    reopened["issue"]["updated_at"] = "2024-05-01T11:00:00Z"
    with live.service.worker.paused():
        first = post_github(live.url, opened, "reopen-a").json()
        second = post_github(live.url, reopened, "reopen-b").json()
    assert wait_finished(live.service, first["event_id"]).status == "skipped"
    assert wait_finished(live.service, second["event_id"]).status == "done"
    assert len(api.comments[f"{REPO}#32"]) == 1


def test_a_replayed_old_body_never_rolls_the_labels_back(live, api):
    old = issues_event("opened", 33, *ECC)
    new = issues_event("edited", 33, *IMPORT)
    new["issue"]["updated_at"] = "2024-05-01T12:00:00Z"
    wait_finished(live.service, post_github(live.url, old, "replay-a").json()["event_id"])
    wait_finished(live.service, post_github(live.url, new, "replay-b").json()["event_id"])
    replay = post_github(live.url, old, "replay-with-a-fresh-delivery-id").json()
    assert replay["status"] == "queued"
    event = wait_finished(live.service, replay["event_id"])
    assert event.status == "skipped" and "newer version" in event.result["skipped"]
    assert "rc:environment_dependency" in api.labels[f"{REPO}#33"]
    assert "rc:gpu_memory_error" not in api.labels[f"{REPO}#33"]


def test_the_ticket_systems_retry_after_is_honoured(live, api):
    api.fail_with(1, 429, {"Retry-After": "3"})
    event_id = post_github(live.url, issues_event("opened", 34, *ECC), "retry-after-1").json()["event_id"]
    wait_until(lambda: live.service.queue.get(event_id).attempts == 1 and
               live.service.queue.get(event_id).status == "queued", 60, "the first attempt to fail")
    waiting = live.service.queue.next_due_in()
    assert 1.5 < waiting <= 3.0  # not the 0.1 s backoff of these settings
    event = wait_finished(live.service, event_id)
    assert event.status == "done" and event.attempts == 2


def test_the_queue_keeps_only_redacted_text(live):
    description = f"{ECC[1]} export GITHUB_TOKEN={TOKEN}; mail bob@example.com from 10.1.2.3."
    event_id = post_github(live.url, issues_event("opened", 35, ECC[0], description), "secret-1").json()["event_id"]
    wait_finished(live.service, event_id)
    raw = b"".join(p.read_bytes() for p in live.service.queue.path.parent.glob(QUEUE_FILE + "*"))
    for secret in (TOKEN, "bob@example.com", "10.1.2.3"):
        assert secret.encode() not in raw
    assert b"Xid" in raw  # the evidence is kept
    assert oct(live.service.queue.path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("mutate,field", [
    (lambda p: p["issue"].update(title={"an": "object"}), "issue.title"),
    (lambda p: p["issue"].update(body="\ud800"), "issue.body"),
    (lambda p: p.update(issue="a string"), "issue"),
])
def test_malformed_signed_github_bodies_are_400_naming_the_field(live, mutate, field):
    payload = issues_event("opened", 36, *ECC)
    mutate(payload)
    response = post_github(live.url, json.dumps(payload).encode(), f"bad-{field}")
    assert response.status_code == 400 and response.json()["detail"].startswith(field)


def test_deep_or_odd_signed_bodies_are_400(live):
    assert post_github(live.url, b"[" * 200_000 + b"]" * 200_000, "deep").status_code in (400, 413)
    deep = b'{"action": "opened", "issue": ' + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}"
    assert post_github(live.url, deep, "deep-2").status_code == 400
    changelog = {**jira_event("jira:issue_updated", "OPS-9", *ECC), "changelog": "a string"}
    response = post_jira(live.url, changelog)
    assert response.status_code == 400 and "changelog" in response.json()["detail"]
    title = jira_event("jira:issue_created", "OPS-9", *ECC)
    title["issue"]["fields"]["summary"] = ["not", {"text": 5}]
    assert post_jira(live.url, title).status_code == 400
    lone = b'{"title": "\\udc00 Xid 79", "description": "x"}'
    answer = httpx.post(f"{live.url}/v1/annotate", content=lone, headers={
        "Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"})
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "title"]


def test_the_openapi_schema_documents_every_status(live):
    paths = httpx.get(f"{live.url}/openapi.json").json()["paths"]
    assert {"400", "401", "404", "413", "429"} <= set(paths["/webhooks/github"]["post"]["responses"])
    assert {"400", "401", "404", "413", "429"} <= set(paths["/webhooks/jira"]["post"]["responses"])
    assert {"400", "401", "404", "413", "422", "429", "503"} <= set(paths["/v1/annotate"]["post"]["responses"])
    assert "503" in paths["/readyz"]["get"]["responses"]


def test_a_body_that_trickles_in_is_cut_and_a_disconnect_is_quiet(kb_home, api, embedder, tmp_path, caplog):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder, request_read_timeout=1.0) as server:
        ready(server)
        caplog.set_level(logging.INFO)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
            started = time.monotonic()
            sock.settimeout(10)
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\":")
        time.sleep(0.5)
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_readyz_is_not_ready_when_the_state_directory_cannot_be_written(kb_home, api, embedder, tmp_path):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder) as server:
        ready(server)
        home = server.service.settings.home
        moved = tmp_path / "moved"
        os.rename(home, moved)
        home.write_text("not a directory any more")
        try:
            answer = httpx.get(f"{server.url}/readyz")
            assert answer.status_code == 503
            assert answer.json()["state_dir_writable"] is False and str(home) in answer.json()["error"]
        finally:
            home.unlink()
            os.rename(moved, home)
        assert httpx.get(f"{server.url}/readyz").status_code == 200


def test_finished_events_are_purged_after_the_retention(kb_home, api, embedder, tmp_path):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder, queue_retention_days=0.5 / 86400) as server:
        ready(server)
        event_id = post_github(server.url, issues_event("opened", 40, *ECC), "purge-1").json()["event_id"]
        wait_finished(server.service, event_id)
        time.sleep(0.6)
        server.service.worker._purged_at = float("-inf")
        assert server.service.worker.purge_if_due() == 1
        with sqlite3.connect(server.service.queue.path) as db:
            assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
            assert db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0] == 1


def test_one_client_with_an_annotate_call_in_hand_is_refused_a_second(kb_home, api, embedder, tmp_path):  # noqa: F811
    with start(kb_home, api, tmp_path, embedder, max_calls_per_client=1, request_read_timeout=2.0) as server:
        ready(server)
        with socket.create_connection(("127.0.0.1", server.port)) as held:
            held.sendall(b"POST /v1/annotate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_TOKEN.encode()
                         + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.3)
            second = httpx.post(f"{server.url}/v1/annotate", json={"title": "Xid 79", "description": "GPU lost"},
                                headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60)
            assert second.status_code == 429 and second.headers["Retry-After"] == "1"
            assert "already in hand" in second.json()["detail"]
            assert post_github(server.url, issues_event("opened", 41, *ECC), "per-client-1").status_code == 202
            held.settimeout(5)
            assert held.recv(4096).startswith(b"HTTP/1.1 408")
        answered = httpx.post(f"{server.url}/v1/annotate", json={"title": "Xid 79", "description": "GPU lost"},
                              headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60)
        assert answered.status_code == 200
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'pmkb_webhook_events_total{outcome="client_busy",source="api"} 1.0' in metrics


def _few_files():
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_pmkb_serve_stays_reachable_through_a_flood_of_slow_connections(kb_home, tmp_path):  # noqa: F811
    """The issue's flood, scaled to a 256-file limit: 400 connections trickling headers, then the
    probes and a signed webhook still answer at once, and each trickler is cut at the header timeout."""
    import subprocess
    import sys

    from test_server import free_port

    from pmkb.listener import raise_file_limit
    from tests.conftest import ROOT

    raise_file_limit()  # this process holds the 400 client ends
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    port = free_port()
    env = command_env() | {
        "PMKB_HOME": str(home), "PMKB_GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "PMKB_WRITEBACK_OUTBOX":
        str(tmp_path / "outbox.jsonl"), "PMKB_HEADER_TIMEOUT": "3", "PMKB_EMBEDDING_DEVICE": "cpu"}
    errlog = (tmp_path / "stderr.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "pmkb", "serve", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errlog, preexec_fn=_few_files)
    url = f"http://127.0.0.1:{port}"
    try:
        def listening():
            assert server.poll() is None, (tmp_path / "stderr.log").read_text()[-2000:]
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(listening, 120, "pmkb serve to listen")
        slow = []
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            slow.append(sock)
        time.sleep(0.5)
        started = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert post_github(url, issues_event("opened", 7, *ECC), "flood-7").status_code == 202
        assert time.monotonic() - started < 5
        last = slow[-1]
        last.settimeout(6)
        assert last.recv(4096).startswith(b"HTTP/1.1 408")  # a survivor is cut at the header timeout
        for sock in slow:
            sock.close()
    finally:
        server.terminate()
        server.wait(30)
        errlog.close()
    text = (tmp_path / "stderr.log").read_text()
    assert "PMKB_MAX_CONNECTIONS" in text and "PMKB_HEADER_TIMEOUT" in text
