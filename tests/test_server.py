"""The webhook service on 127.0.0.1: GitHub and Jira webhooks, the annotate API, operations, crash safety.

The service runs for real (uvicorn on a free loopback port, in a thread; a ``pmkb serve`` subprocess for
the restart tests) over a copy of the bundled knowledge base; ``FakeTicketApi`` stands in for the
GitHub and Jira REST APIs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import command_env, make_settings
from fake_model_server import FakeModelServer, first_choices
from test_writeback import FakeTicketApi

from kb.core.suggestion import Ticket
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.tickets.queue import EventQueue
from kb.tickets.writeback import GITHUB_MARKER, JIRA_MARKER, suggestion_labels
from pmkb.server import QUEUE_FILE, create_app, startup_problems

GITHUB_SECRET, JIRA_SECRET, API_TOKEN = "gh-hook-secret", "jira-shared-secret", "api-token-123"
REPO = "octo/gpu-ops"
ROOT = Path(__file__).resolve().parent.parent
ECC = ("Xid 48 double-bit ECC error on gpu-a-17, training crashed",
       "NVRM: Xid (PCI:0000:3b:00): 48, pid=4121, DBE (double bit error) ECC error. The job died at step 1200.")
IMPORT = ("Job cannot import torch", "ModuleNotFoundError: No module named torch after I changed my conda env")
VAGUE = ("Something is off", "Not sure what happened, please take a look.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class LiveServer:
    """uvicorn serving an app in a thread on a free loopback port."""

    def __init__(self, app):
        self.app, self.port = app, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn to start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def service(self):
        return self.app.state.service


def issues_event(action: str, number: int, title: str, body: str, repo: str = REPO) -> dict:
    """An ``issues`` webhook payload as GitHub sends it (trimmed to the documented top-level keys)."""
    owner = repo.split("/")[0]
    user = {"login": "alice", "id": 1, "node_id": "MDQ6VXNlcjE=", "type": "User", "site_admin": False}
    payload = {
        "action": action,
        "issue": {"url": f"https://api.github.com/repos/{repo}/issues/{number}",
                  "repository_url": f"https://api.github.com/repos/{repo}",
                  "html_url": f"https://github.com/{repo}/issues/{number}", "id": 2000 + number,
                  "node_id": "I_kwDOAbc", "number": number, "title": title, "user": user,
                  "labels": [{"id": 1, "node_id": "LA_1", "name": "triage", "color": "ededed", "default": False}],
                  "state": "open", "locked": False, "assignee": None, "assignees": [], "milestone": None,
                  "comments": 0, "created_at": "2024-05-01T10:00:00Z", "updated_at": "2024-05-01T10:05:00Z",
                  "closed_at": None, "author_association": "MEMBER", "body": body},
        "repository": {"id": 42, "node_id": "R_kgDO", "name": repo.split("/")[1], "full_name": repo,
                       "private": True, "owner": {"login": owner, "id": 7, "type": "Organization"},
                       "html_url": f"https://github.com/{repo}"},
        "sender": user,
    }
    if action == "edited":
        payload["changes"] = {"body": {"from": "(previous text)"}}
    return payload


def jira_event(event: str, key: str, summary: str, description: str, changelog: list | None = None) -> dict:
    """A Jira issue webhook payload (``jira:issue_created`` / ``jira:issue_updated``)."""
    payload = {"timestamp": int(time.time() * 1000), "webhookEvent": event,
               "issue_event_type_name": "issue_created" if event.endswith("created") else "issue_updated",
               "user": {"accountId": "5b10a2844c20165700ede21g", "displayName": "Alice"},
               "issue": {"id": "10002", "self": "https://example.atlassian.net/rest/api/2/issue/10002", "key": key,
                         "fields": {"summary": summary, "description": description, "labels": [],
                                    "issuetype": {"name": "Incident"}, "project": {"key": key.split("-")[0]},
                                    "status": {"name": "Open"}}}}
    if changelog is not None:
        payload["changelog"] = {"id": "10100", "items": changelog}
    return payload


def post_github(url: str, payload: dict | bytes, delivery: str, secret: str = GITHUB_SECRET,
                event: str = "issues") -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return httpx.post(f"{url}/webhooks/github", content=body, timeout=30, headers={
        "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signature,
        "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/abc123"})


def post_jira(url: str, payload: dict | bytes, secret: str | None = JIRA_SECRET, **kw) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **({"X-Pmkb-Secret": secret} if secret else {})}
    return httpx.post(f"{url}/webhooks/jira", content=body, headers=headers, timeout=30, **kw)


def wait_finished(service, event_id: int, timeout: float = 60.0):
    finished = ("done", "skipped", "dead")
    return wait_until(lambda: (e := service.queue.get(event_id)) and e.status in finished and e,
                      timeout, f"event {event_id}")


@pytest.fixture(scope="module")
def kb_home(tmp_path_factory, _built_kb_dir) -> Path:
    """A copy of the bundled knowledge base (its text classifiers fitted once, by the session)."""
    home = tmp_path_factory.mktemp("serve") / "kb"
    shutil.copytree(_built_kb_dir, home)
    return home


@pytest.fixture(scope="module")
def ecc_labels(kb_home, embedder) -> list[str]:
    """The labels the engine's suggestion for the ECC ticket is sure of (what the bot must write)."""
    engine = SuggestionEngine(KnowledgeBase(make_settings(kb_home), embedder=embedder))
    labels = suggestion_labels(engine.suggest(Ticket(title=ECC[0], description=ECC[1])))
    assert {"dim:hardware", "symptom:job_crash"} <= set(labels), labels
    return labels


@pytest.fixture(scope="module")
def api():
    with FakeTicketApi() as fake:
        yield fake


def service_settings(home: Path, api: FakeTicketApi, **kw):
    return make_settings(home, github_webhook_secret=GITHUB_SECRET, jira_webhook_secret=JIRA_SECRET,
                         api_token=API_TOKEN, github_api_url=api.url, github_token="gh-token", jira_url=api.url,
                         jira_token="jira-token", queue_backoff=0.1, **kw)


@pytest.fixture(scope="module")
def live(kb_home, api, embedder, tmp_path_factory):
    home = tmp_path_factory.mktemp("live") / "kb"
    shutil.copytree(kb_home, home)
    settings = service_settings(home, api)
    engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
    with LiveServer(create_app(settings, engine=engine, poll=0.2)) as server:
        wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 60, "/readyz")
        yield server


def test_health_ready_and_openapi(live):
    assert httpx.get(f"{live.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{live.url}/readyz").json()
    assert ready["knowledge_base"] is True and ready["worker"] is True
    schema = httpx.get(f"{live.url}/openapi.json").json()
    assert {"/webhooks/github", "/webhooks/jira", "/v1/annotate"} <= set(schema["paths"])
    assert "Suggestion" in schema["components"]["schemas"]
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_bad_signature_is_refused_and_nothing_is_queued(live):
    before = live.service.queue.counts()
    payload = issues_event("opened", 90, *ECC)
    assert post_github(live.url, payload, "bad-1", secret="wrong-secret").status_code == 401
    unsigned = httpx.post(f"{live.url}/webhooks/github", json=payload, headers={"X-GitHub-Event": "issues"})
    assert unsigned.status_code == 401
    assert live.service.queue.counts() == before


def test_malformed_json_is_400(live):
    assert post_github(live.url, b'{"action": "opened", "issue": ', "bad-json").status_code == 400
    assert post_github(live.url, b"[1, 2]", "bad-list").status_code == 400
    assert post_jira(live.url, b"not json").status_code == 400
    missing_number = issues_event("opened", 1, *ECC)
    del missing_number["issue"]["number"]
    assert post_github(live.url, missing_number, "no-number").status_code == 400


def test_github_opened_labels_and_comments_once_despite_redelivery(live, api, ecc_labels):
    payload = issues_event("opened", 1, *ECC)
    first = post_github(live.url, payload, "delivery-1")
    assert first.status_code == 202 and first.json()["status"] == "queued"
    again = post_github(live.url, payload, "delivery-1")  # GitHub's "Redeliver"
    assert again.status_code == 202 and again.json() == {**first.json(), "status": "duplicate"}
    event = wait_finished(live.service, first.json()["event_id"])
    assert event.status == "done" and event.result["comment"] == "created"
    calls = [(r["method"], r["path"]) for r in api.requests if "/issues/1/" in r["path"]]
    assert calls == [("GET", f"/repos/{REPO}/issues/1/comments"), ("POST", f"/repos/{REPO}/issues/1/comments"),
                     ("POST", f"/repos/{REPO}/issues/1/labels")]
    labels_call = next(r for r in api.requests if r["path"] == f"/repos/{REPO}/issues/1/labels")
    assert labels_call["json"] == {"labels": ecc_labels}
    assert labels_call["headers"]["authorization"] == "Bearer gh-token"
    assert labels_call["headers"]["accept"] == "application/vnd.github+json"
    assert labels_call["headers"]["x-github-api-version"] == "2022-11-28"
    assert labels_call["headers"]["content-type"] == "application/json"
    comments = api.comments[f"{REPO}#1"]
    assert len(comments) == 1 and comments[0]["body"].startswith(GITHUB_MARKER)
    assert "gpu_memory_error" in comments[0]["body"] and "hw-" in comments[0]["body"]


def test_edit_updates_the_bot_comment(live, api):
    opened = post_github(live.url, issues_event("opened", 2, *ECC), "delivery-2a").json()
    wait_finished(live.service, opened["event_id"])
    comment_id = api.comments[f"{REPO}#2"][0]["id"]
    edited = post_github(live.url, issues_event("edited", 2, *IMPORT), "delivery-2b").json()
    assert edited["event_id"] != opened["event_id"]
    event = wait_finished(live.service, edited["event_id"])
    assert event.result["comment"] == "updated" and event.result["root_cause"] == "environment_dependency"
    assert any(r["method"] == "PATCH" and r["path"] == f"/repos/{REPO}/issues/comments/{comment_id}"
               for r in api.requests)
    assert len(api.comments[f"{REPO}#2"]) == 1 and "environment_dependency" in api.comments[f"{REPO}#2"][0]["body"]
    assert "rc:gpu_memory_error" not in api.labels[f"{REPO}#2"] and "rc:environment_dependency" in api.labels[
        f"{REPO}#2"]
    reopened = post_github(live.url, issues_event("reopened", 2, *IMPORT), "delivery-2c").json()
    assert wait_finished(live.service, reopened["event_id"]).result["skipped"]  # same text: nothing to redo


def test_abstained_comment_has_no_labels(live, api):
    response = post_github(live.url, issues_event("opened", 3, *VAGUE), "delivery-3").json()
    event = wait_finished(live.service, response["event_id"])
    assert event.result["abstained"] is True and event.result["labels_added"] == []
    assert not [r for r in api.requests if r["path"] == f"/repos/{REPO}/issues/3/labels"]
    assert "not sure" in api.comments[f"{REPO}#3"][0]["body"]


def test_events_not_handled_are_acknowledged(live):
    before = live.service.queue.counts()
    assert post_github(live.url, {"zen": "Keep it logically awesome.", "hook_id": 1}, "ping-1",
                       event="ping").status_code == 200
    labeled = post_github(live.url, issues_event("labeled", 1, *ECC), "labeled-1")
    assert labeled.status_code == 200 and labeled.json()["status"] == "ignored"
    assert post_github(live.url, {"action": "created"}, "comment-1", event="issue_comment").status_code == 200
    label_change = jira_event("jira:issue_updated", "OPS-1", *ECC,
                              changelog=[{"field": "labels", "fromString": "", "toString": "rc:gpu_lost"}])
    assert post_jira(live.url, label_change).json()["status"] == "ignored"
    assert post_jira(live.url, {"webhookEvent": "comment_created"}).json()["status"] == "ignored"
    assert live.service.queue.counts() == before


def test_jira_created_and_updated(live, api, ecc_labels):
    assert post_jira(live.url, jira_event("jira:issue_created", "OPS-12", *ECC), secret="nope").status_code == 401
    assert post_jira(live.url, jira_event("jira:issue_created", "OPS-12", *ECC), secret=None).status_code == 401
    created = post_jira(live.url, jira_event("jira:issue_created", "OPS-12", *ECC))
    assert created.status_code == 202
    wait_finished(live.service, created.json()["event_id"])
    calls = [(r["method"], r["path"]) for r in api.requests if "OPS-12" in r["path"]]
    assert calls == [("GET", "/rest/api/2/issue/OPS-12/comment"), ("GET", "/rest/api/2/issue/OPS-12"),
                     ("POST", "/rest/api/2/issue/OPS-12/comment"), ("PUT", "/rest/api/2/issue/OPS-12")]
    put = next(r for r in api.requests if r["method"] == "PUT" and r["path"] == "/rest/api/2/issue/OPS-12")
    assert put["json"] == {"update": {"labels": [{"add": label} for label in ecc_labels]}}
    assert put["headers"]["authorization"] == "Bearer jira-token"
    assert put["headers"]["content-type"] == "application/json"
    updated = post_jira(live.url, jira_event("jira:issue_updated", "OPS-12", *IMPORT, changelog=[
        {"field": "description", "fromString": "old", "toString": IMPORT[1]}]))
    assert wait_finished(live.service, updated.json()["event_id"]).result["comment"] == "updated"
    assert len(api.comments["OPS-12"]) == 1 and api.comments["OPS-12"][0]["body"].startswith(JIRA_MARKER)
    adf = {"type": "doc", "version": 1, "content": [{"type": "paragraph", "content": [{"type": "text",
                                                                                      "text": ECC[1]}]}]}
    rich = post_jira(live.url, jira_event("jira:issue_created", "OPS-13", ECC[0], adf)).json()
    assert wait_finished(live.service, rich["event_id"]).result["root_cause"] == "gpu_memory_error"


def test_retries_then_dead_letter(live, api):
    api.fail_next = 2  # two 502s, then the API recovers
    flaky = post_github(live.url, issues_event("opened", 4, *ECC), "delivery-4").json()
    event = wait_finished(live.service, flaky["event_id"])
    assert event.status == "done" and event.attempts == 3
    api.missing.add(f"{REPO}#5")
    gone = post_github(live.url, issues_event("opened", 5, *ECC), "delivery-5").json()
    event = wait_finished(live.service, gone["event_id"])
    assert event.status == "dead" and event.attempts == 1 and "HTTP 404" in event.last_error


def test_annotate_api_with_bearer_token(live):
    url = f"{live.url}/v1/annotate"
    ticket = {"id": "T-1", "title": ECC[0], "description": ECC[1]}
    assert httpx.post(url, json=ticket).status_code == 401
    assert httpx.post(url, json=ticket, headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    answer = httpx.post(url, json=ticket, headers=auth, timeout=60)
    assert answer.status_code == 200
    body = answer.json()
    assert body["id"] == "T-1" and body["root_cause"] == "gpu_memory_error" and body["abstained"] is False
    assert body["similar_incidents"] and body["evidence"]
    assert httpx.post(url, content=b"{oops", headers={**auth, "Content-Type": "application/json"}).status_code == 400
    assert httpx.post(url, json={"title": "", "description": ""}, headers=auth).status_code == 400
    assert httpx.post(url, json={"title": "x", "labels": ["rc:gpu_lost"]}, headers=auth).status_code == 422


def test_metrics(live):
    text = httpx.get(f"{live.url}/metrics").text
    assert 'pmkb_webhook_events_total{outcome="queued",source="github"}' in text
    assert 'pmkb_webhook_events_total{outcome="unauthorized",source="github"}' in text
    assert "pmkb_event_latency_seconds_bucket" in text and "pmkb_event_processing_seconds_count" in text
    assert "pmkb_queue_depth" in text and 'pmkb_queue_events{status="done"}' in text


def test_size_limit_rate_limit_and_query_secret(kb_home, api, embedder, tmp_path):
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    settings = service_settings(home, api, max_request_bytes=4096, rate_limit_per_second=0.01, rate_limit_burst=3,
                                jira_secret_in="query")
    engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
    with LiveServer(create_app(settings, engine=engine)) as server:
        big = issues_event("opened", 6, "big", "x" * 5000)
        assert post_github(server.url, big, "big-1").status_code == 413
        chunks = (b"x" * 1024 for _ in range(8))  # no Content-Length: chunked upload
        assert httpx.post(f"{server.url}/webhooks/jira?secret={JIRA_SECRET}", content=chunks).status_code == 413
        event = jira_event("jira:issue_created", "OPS-77", *ECC)
        assert post_jira(server.url, event).status_code == 401  # header secret is not read in query mode
        ok = httpx.post(f"{server.url}/webhooks/jira", params={"secret": JIRA_SECRET}, json=event)
        assert ok.status_code == 202
        statuses = [post_github(server.url, issues_event("labeled", 6, *ECC), f"rl-{n}").status_code
                    for n in range(4)]
        assert statuses == [200, 200, 200, 429]  # burst 3; a refused oversize body takes no token
        limited = post_github(server.url, issues_event("labeled", 6, *ECC), "rl-x")
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert sum(server.service.queue.counts().values()) == 1


def test_refuses_to_start_without_secrets(tmp_path):
    assert startup_problems(make_settings(tmp_path), insecure_dev=True) == []
    assert "PMKB_GITHUB_TOKEN" in startup_problems(make_settings(tmp_path, github_webhook_secret="s"), False)[0]
    env = command_env() | {"PMKB_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "pmkb", "serve", "--port", str(free_port())], env=env,
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode != 0
    assert "PMKB_GITHUB_WEBHOOK_SECRET" in run.stderr and "--insecure-dev" in run.stderr


def start_serve(home: Path, api: FakeTicketApi, port: int) -> subprocess.Popen:
    env = command_env() | {
        "PMKB_HOME": str(home), "PMKB_GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "PMKB_GITHUB_API_URL": api.url,
        "PMKB_GITHUB_TOKEN": "gh-token", "PMKB_QUEUE_BACKOFF": "0.1", "PMKB_EMBEDDING_DEVICE": "cpu"}
    return subprocess.Popen([sys.executable, "-m", "pmkb", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    def ready():
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout, "pmkb serve to become ready")


@pytest.mark.slow
def test_kill_9_with_events_queued_loses_none_and_comments_once(kb_home, tmp_path):
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    with FakeTicketApi() as api:
        api.stall_after_create = 30.0  # the first comment is stored, then the answer hangs: kill lands here
        port = free_port()
        first = start_serve(home, api, port)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, first)
            ids = [post_github(url, issues_event("opened", n, *ECC), f"crash-{n}").json()["event_id"]
                   for n in range(1, 5)]
            wait_until(lambda: f"{REPO}#1" in api.comments, 120, "the first comment to be posted")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        queue = EventQueue(home / QUEUE_FILE)
        assert queue.counts() == {"queued": 3, "claimed": 1, "done": 0, "skipped": 0, "dead": 0}
        api.stall_after_create = 0.0
        second = start_serve(home, api, port)
        try:
            wait_ready(url, second)
            wait_until(lambda: queue.counts()["done"] == 4, 120, "all four events to be handled")
        finally:
            second.terminate()
            try:
                second.wait(30)
            except subprocess.TimeoutExpired:
                second.kill()
        assert {n: len(api.comments[f"{REPO}#{n}"]) for n in range(1, 5)} == {1: 1, 2: 1, 3: 1, 4: 1}
        posts = [r["path"] for r in api.requests if r["method"] == "POST" and r["path"].endswith("/comments")]
        assert sorted(posts) == sorted(f"/repos/{REPO}/issues/{n}/comments" for n in range(1, 5))
        assert queue.get(ids[0]).attempts == 2 and queue.get(ids[0]).result["comment"] in ("unchanged", "updated")
        assert all(queue.get(i).attempts == 1 for i in ids[1:])


MODEL_SAYS = "The model read the double-bit ECC line on gpu-a-17. Drain the node and resubmit the job."


def test_the_bot_comments_the_suggestion_the_page_shows_with_a_model_configured(kb_home, embedder, tmp_path):
    """The worker and /v1/annotate suggest through make_suggester: the model's explanation is in the comment."""
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    outbox = tmp_path / "outbox.jsonl"
    with FakeModelServer(first_choices(MODEL_SAYS)) as model:
        settings = make_settings(home, github_webhook_secret=GITHUB_SECRET, api_token=API_TOKEN,
                                 writeback_outbox=outbox, **model.settings())
        engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
        with LiveServer(create_app(settings, engine=engine, poll=0.2)) as server:
            wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 60, "/readyz")
            queued = post_github(server.url, issues_event("opened", 31, *ECC), "model-1").json()
            assert wait_finished(server.service, queued["event_id"]).status == "done"
            annotated = httpx.post(f"{server.url}/v1/annotate", json={"id": "T-9", "title": ECC[0],
                                                                       "description": ECC[1]},
                                   headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60).json()
        assert model.requests  # the model was asked
    comment = next(json.loads(line) for line in outbox.read_text().splitlines()
                   if json.loads(line)["action"] == "upsert_comment")
    assert MODEL_SAYS in comment["json"]["body"]
    assert annotated["explanation"].startswith(MODEL_SAYS)
    assert annotated["trace"]["llm"]["backend"] == "openai" and annotated["trace"]["llm_prose"] == "accepted"


def test_a_service_that_builds_its_engine_refits_classifiers_in_the_background(kb_home, api, tmp_path):
    """New incidents never hold up a webhook while the text classifiers refit."""
    from fastapi.testclient import TestClient

    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    app = create_app(service_settings(home, api))
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, 180, "/readyz")
        assert app.state.service.engine.snapshots.refit_in_background


def documented_jira_automation_body() -> str:
    """The Jira Automation body of docs/webhooks.md, as written there."""
    doc = (ROOT / "docs" / "webhooks.md").read_text(encoding="utf-8")
    block = doc.split("web request\n  body *Custom data*:", 1)[1].split("```", 2)[1]
    return "\n".join(line.strip() for line in block.strip().splitlines())


@pytest.mark.parametrize(("key", "now"), [("OPS-4240", "2026-12-05T10:05:00.0+0000"),
                                         ("OPS-4241", "2026-12-05T10:05:00.123+0100"), ("OPS-4242", "1796465100000")])
def test_the_documented_jira_automation_body_is_accepted(live, key, now):
    rendered = {"{{now}}": now, "{{issue.key}}": key,
                "{{issue.summary.asJsonString}}": json.dumps("Xid 79 on gpu-a3, GPU has fallen off the bus"),
                "{{issue.description.asJsonString}}": json.dumps('Job 9912 died: "GPU has fallen off the bus"')}
    body = documented_jira_automation_body()
    assert set(re.findall(r"\{\{[^}]+\}\}", body)) == set(rendered), "the docs use a smart value this test lacks"
    for smart, value in rendered.items():
        body = body.replace(smart, value)
    answer = post_jira(live.url, body.encode())
    assert answer.status_code == 202, answer.text
    event = wait_finished(live.service, answer.json()["event_id"])
    assert event.ticket == key and event.status == "done" and event.version is not None


def test_a_jira_timestamp_that_is_no_time_is_refused_naming_it(live):
    payload = jira_event("jira:issue_created", "OPS-4243", "t", "d")
    payload["timestamp"] = "yesterday"
    answer = post_jira(live.url, payload)
    assert answer.status_code == 400 and "timestamp" in answer.text


def test_readyz_is_not_ready_while_the_queue_cannot_be_written(live):
    worker = live.service.worker
    worker.write_error = "the event queue cannot be written: database or disk is full"
    try:
        answer = httpx.get(f"{live.url}/readyz")
        assert answer.status_code == 503 and "disk is full" in answer.json()["error"]
    finally:
        worker.write_error = None
    assert httpx.get(f"{live.url}/readyz").status_code == 200


def test_the_logs_attached_to_a_jira_issue_give_the_comment_its_collective_verdict(live, api):
    logs = (Path(__file__).resolve().parent / "data" / "collectives" / "gloo-stall-interleaved.log").read_bytes()
    api.attachments["20001"] = logs
    payload = jira_event("jira:issue_created", "OPS-77", "4-rank training job hangs at step 3 then dies",
                         "The job stopped making progress, then every rank timed out. Logs attached.")
    payload["issue"]["fields"]["attachment"] = [{"id": "20001", "filename": "slurm-4411.out", "size": len(logs)}]
    event = post_jira(live.url, payload).json()
    wait_finished(live.service, event["event_id"])
    fetched = [r for r in api.requests if r["path"] == "/rest/api/2/attachment/content/20001"]
    assert len(fetched) == 1 and fetched[0]["headers"]["authorization"] == "Bearer jira-token"
    body = api.comments["OPS-77"][0]["body"]
    assert "*Collective timeout:* one node: rank 2 (localhost) never arrived" in body
