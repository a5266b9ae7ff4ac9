"""Write-back to GitHub and Jira: comment rendering, labels, idempotent comment upsert, dry run.

``FakeTicketApi`` is a real HTTP server on 127.0.0.1 that implements the few GitHub and Jira REST
endpoints pmkb uses, keeps issues' comments and labels in memory and records every request.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import httpx
import pytest

from kb.abstain import TOO_LITTLE_TEXT
from kb.evidence import Evidence
from kb.history import NodeHistory, NodeIncident
from kb.mitigate import MitigationStep
from kb.search import SimilarIncident
from kb.settings import Settings
from kb.suggestion import Candidate, Suggestion
from kb.writeback import (GITHUB_MARKER, JIRA_MARKER, TicketRef, WriteBackError, labels_in_comment,
                          render_comment, suggestion_labels, write_back)

_GH_COMMENTS = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_GH_COMMENT = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")
_GH_LABELS = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/labels(?:/(.+))?$")
_JIRA_ISSUE = re.compile(r"^/rest/api/2/issue/([A-Z][A-Z0-9_]*-\d+)(/comment(?:/(\d+))?)?$")


class FakeTicketApi:
    """GitHub and Jira REST endpoints in memory, on a free loopback port; records every request."""

    def __init__(self):
        self.requests: list[dict] = []
        self.comments: dict[str, list[dict]] = {}  # "o/r#1" or "OPS-1" -> [{"id", "body"}]
        self.labels: dict[str, list[str]] = {}
        self.missing: set[str] = set()  # tickets that answer 404
        self.fail_next = 0  # answer this many requests with 502
        self.stall_after_create = 0.0  # seconds to wait after storing a new comment, before answering
        self._next_id = 1000
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                record = {"method": self.command, "path": url.path, "query": parse_qs(url.query),
                          "headers": {k.lower(): v for k, v in self.headers.items()},
                          "json": json.loads(raw) if raw else None, "at": time.time()}
                with api._lock:
                    api.requests.append(record)
                status, body, headers = api.route(record)
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the stalled-answer tests): nothing to answer

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeTicketApi":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _new_comment(self, key: str, body: str, jira: bool) -> dict:
        with self._lock:
            self._next_id += 1
            comment = {"id": str(self._next_id) if jira else self._next_id, "body": body}
            self.comments.setdefault(key, []).append(comment)
        if self.stall_after_create:
            time.sleep(self.stall_after_create)
        return comment

    def _find(self, comment_id: str) -> dict | None:
        return next((c for cs in self.comments.values() for c in cs if str(c["id"]) == comment_id), None)

    def route(self, r: dict) -> tuple[int, object, dict]:
        """Status, JSON body and headers for one recorded request."""
        with self._lock:
            if self.fail_next:
                self.fail_next -= 1
                return 502, {"message": "bad gateway"}, {}
        if not r["headers"].get("authorization", "").startswith(("Bearer ", "Basic ")):
            return 401, {"message": "Requires authentication"}, {}
        method, path, body = r["method"], r["path"], r["json"]
        if m := _GH_COMMENTS.match(path):
            key = f"{m[1]}#{m[2]}"
            if key in self.missing:
                return 404, {"message": "Not Found"}, {}
            if method == "POST":
                return 201, self._new_comment(key, body["body"], jira=False), {}
            per_page, page = int(r["query"]["per_page"][0]), int(r["query"].get("page", ["1"])[0])
            items = self.comments.get(key, [])
            chunk = items[(page - 1) * per_page: page * per_page]
            more = page * per_page < len(items)
            link = {"Link": f'<{self.url}{path}?per_page={per_page}&page={page + 1}>; rel="next"'} if more else {}
            return 200, chunk, link
        if (m := _GH_COMMENT.match(path)) and method == "PATCH":
            comment = self._find(m[2])
            if comment is None:
                return 404, {"message": "Not Found"}, {}
            comment["body"] = body["body"]
            return 200, comment, {}
        if m := _GH_LABELS.match(path):
            key = f"{m[1]}#{m[2]}"
            labels = self.labels.setdefault(key, [])
            if method == "POST":
                labels += [x for x in body["labels"] if x not in labels]
                return 200, [{"name": x} for x in labels], {}
            if method == "DELETE":
                name = unquote(m[3])
                if name not in labels:
                    return 404, {"message": "Label does not exist"}, {}
                labels.remove(name)
                return 200, [{"name": x} for x in labels], {}
        if m := _JIRA_ISSUE.match(path):
            key, comment_part, comment_id = m[1], m[2], m[3]
            if key in self.missing:
                return 404, {"errorMessages": ["Issue does not exist"]}, {}
            if comment_id and method == "PUT":
                comment = self._find(comment_id)
                comment["body"] = body["body"]
                return 200, comment, {}
            if comment_part and method == "POST":
                return 201, self._new_comment(key, body["body"], jira=True), {}
            if comment_part and method == "GET":
                start, size = int(r["query"]["startAt"][0]), int(r["query"]["maxResults"][0])
                items = self.comments.get(key, [])
                return 200, {"startAt": start, "maxResults": size, "total": len(items),
                             "comments": items[start:start + size]}, {}
            if not comment_part and method == "PUT":
                labels = self.labels.setdefault(key, [])
                for op in body["update"]["labels"]:
                    if "add" in op and op["add"] not in labels:
                        labels.append(op["add"])
                    if "remove" in op and op["remove"] in labels:
                        labels.remove(op["remove"])
                return 204, None, {}
        return 404, {"message": f"no route {method} {path}"}, {}

    def writes(self) -> list[dict]:
        """Recorded requests other than GETs."""
        return [r for r in self.requests if r["method"] != "GET"]


def make_suggestion(root_cause="gpu_memory_error", dimension="hardware", abstained=False,
                    evidence_text="NVRM: Xid 48, double bit ECC on gpu-12", **kw) -> Suggestion:
    """A complete Suggestion as the engine returns it."""
    confidence = 0.31 if abstained else 0.91
    fields = dict(
        id="o/r#1", symptom="job_crash", symptom_confidence=0.8,
        symptom_candidates=[Candidate(id="job_crash", confidence=0.8)],
        root_cause=root_cause, root_cause_name=root_cause.replace("_", " ").title(),
        root_cause_dimension=dimension, root_cause_confidence=confidence,
        root_cause_candidates=[Candidate(id=root_cause, confidence=confidence),
                               Candidate(id="gpu_processor_fault", confidence=0.22),
                               Candidate(id="buggy_code", confidence=0.1)],
        abstained=abstained, mitigation="node_repair",
        mitigations=[MitigationStep(id="node_repair", confidence=0.7, next_step="Drain gpu-12 and run DCGM.",
                                    from_incidents=["hw-gpu-003"])],
        retry_safe=not abstained, suspect={"node": "gpu-12"},
        similar_incidents=[SimilarIncident(id="hw-gpu-003", title="gpu-v-113 job killed, Xid 48", score=0.76,
                                           dense=0.8, lexical=0.6, symptom="job_crash", root_cause=root_cause,
                                           root_cause_dimension=dimension, mitigation="node_repair",
                                           resolution="drained", provenance="human_labelled", source="x")],
        evidence=[Evidence(signal="xid_48", text=evidence_text, category=root_cause, causes={root_cause: 3.0},
                           explanation="Double-bit ECC error.", start=0, end=10)],
        explanation="Most likely GPU memory.", trace={"engine": "pmkb-engine/test"})
    fields.update(kw)
    return Suggestion(**fields)


def api_settings(tmp_path, api: FakeTicketApi, **kw) -> Settings:
    """Settings that point write-back at the fake API."""
    return Settings(home=tmp_path, github_api_url=api.url, github_token="gh-token", jira_url=api.url,
                    jira_token="jira-token", **kw)


def test_render_comment_confident_github():
    body = render_comment(make_suggestion(), threshold_note=False)
    assert body.splitlines()[0] == GITHUB_MARKER
    assert "`gpu_memory_error`" in body and "91%" in body
    assert "**Labels:** `rc:gpu_memory_error` `dim:hardware` `symptom:job_crash`" in body
    assert "hw-gpu-003" in body  # similar incident cited by id
    assert "node_repair" in body and "Drain gpu-12" in body
    assert "confidence threshold" not in body
    assert "confidence threshold" in render_comment(make_suggestion(), threshold_note=True)


def test_render_comment_cites_the_node_history():
    history = NodeHistory(node="gpu-12", total=2, incidents=[
        NodeIncident(id="INC-7", title="gpu-12 Xid 79", root_cause="gpu_lost"),
        NodeIncident(id="INC-3", title="gpu-12 ECC", root_cause="gpu_memory_error")])
    body = render_comment(make_suggestion(node_history=history), threshold_note=False)
    assert "**Seen before:** gpu-12 appears in 2 earlier incidents: INC-7 (gpu_lost), INC-3" in body
    assert "Seen before" not in render_comment(make_suggestion(), threshold_note=False)


def test_render_comment_for_a_ticket_that_says_too_little_asks_for_more():
    s = make_suggestion(abstained=True, abstain_reason=TOO_LITTLE_TEXT)
    body = render_comment(s, threshold_note=True)
    assert "says too little" in body and "error message" in body and "below the confidence" not in body
    assert labels_in_comment(body) == [] and suggestion_labels(s) == []


def test_render_comment_abstained_lists_candidates_and_no_labels():
    body = render_comment(make_suggestion(abstained=True), threshold_note=True)
    assert "not sure" in body
    assert all(f"`{c}`" in body for c in ("gpu_memory_error", "gpu_processor_fault", "buggy_code"))
    assert labels_in_comment(body) == [] and "**Labels:** none" in body
    assert suggestion_labels(make_suggestion(abstained=True)) == []


def test_render_comment_jira_markup_and_labels_round_trip():
    body = render_comment(make_suggestion(), threshold_note=True, system="jira")
    assert body.splitlines()[0] == JIRA_MARKER
    assert "**" not in body and "h3. pmkb suggestion" in body and "{{rc:gpu_memory_error}}" in body
    assert labels_in_comment(body) == ["rc:gpu_memory_error", "dim:hardware", "symptom:job_crash"]


def test_render_comment_neutralises_ticket_text():
    s = make_suggestion(evidence_text="ping @oncall-team `rm -rf` {code}")
    github = render_comment(s, threshold_note=False)
    assert "@oncall-team" not in github and "@\u200boncall-team" in github and "`rm -rf`" not in github
    assert "{code}" not in render_comment(s, threshold_note=False, system="jira")


def test_ticket_ref_checks_the_key():
    assert TicketRef(system="github", key="octo/ops-tickets#12").github_parts() == ("octo", "ops-tickets", 12)
    assert TicketRef(system="jira", key="OPS-12").key == "OPS-12"
    for system, key in (("github", "octo#12"), ("github", "o/r/12"), ("jira", "ops-12"), ("jira", "OPS")):
        with pytest.raises(ValueError):
            TicketRef(system=system, key=key)


def test_github_write_back_then_update_without_second_comment(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#7")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        first = write_back(settings, ref, make_suggestion())
        assert first["comment"] == "created" and first["labels_added"] == [
            "rc:gpu_memory_error", "dim:hardware", "symptom:job_crash"]
        calls = [(r["method"], r["path"]) for r in api.requests]
        assert calls == [("GET", "/repos/octo/ops/issues/7/comments"), ("POST", "/repos/octo/ops/issues/7/labels"),
                         ("POST", "/repos/octo/ops/issues/7/comments")]
        for r in api.requests:
            assert r["headers"]["authorization"] == "Bearer gh-token"
            assert r["headers"]["accept"] == "application/vnd.github+json"
            assert r["headers"]["x-github-api-version"] == "2022-11-28"
        assert api.requests[1]["json"] == {"labels": first["labels_added"]}
        assert api.requests[2]["json"]["body"].startswith(GITHUB_MARKER)

        api.requests.clear()
        second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert second["comment"] == "updated" and second["comment_id"] == first["comment_id"]
        assert second["labels_removed"] == ["rc:gpu_memory_error", "dim:hardware"]
        assert [(r["method"], r["path"]) for r in api.writes()] == [
            ("POST", "/repos/octo/ops/issues/7/labels"),
            ("DELETE", "/repos/octo/ops/issues/7/labels/rc%3Agpu_memory_error"),
            ("DELETE", "/repos/octo/ops/issues/7/labels/dim%3Ahardware"),
            ("PATCH", f"/repos/octo/ops/issues/comments/{first['comment_id']}")]
        assert len(api.comments["octo/ops#7"]) == 1
        assert api.labels["octo/ops#7"] == ["symptom:job_crash", "rc:buggy_code", "dim:user"]

        api.requests.clear()  # same suggestion again: nothing to change
        assert write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))[
            "comment"] == "unchanged"
        assert not [r for r in api.writes() if r["method"] == "PATCH"]


def test_github_abstained_posts_comment_without_labels_and_drops_its_old_labels(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#8")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        write_back(settings, ref, make_suggestion())
        api.requests.clear()
        api.labels["octo/ops#8"].append("team:infra")  # a human's label stays
        result = write_back(settings, ref, make_suggestion(abstained=True))
        assert result["labels_added"] == [] and result["comment"] == "updated"
        assert not [r for r in api.requests if r["method"] == "POST" and r["path"].endswith("/labels")]
        assert api.labels["octo/ops#8"] == ["team:infra"]
        assert "not sure" in api.comments["octo/ops#8"][0]["body"]


def test_github_finds_its_comment_on_a_later_page(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#9")
    with FakeTicketApi() as api:
        api.comments["octo/ops#9"] = [{"id": i, "body": f"human comment {i}"} for i in range(1, 121)]
        api.comments["octo/ops#9"].insert(110, {"id": 500, "body": GITHUB_MARKER + "\nold"})
        result = write_back(api_settings(tmp_path, api), ref, make_suggestion())
        assert result["comment"] == "updated" and result["comment_id"] == 500
        assert [r["query"]["page"] for r in api.requests if r["method"] == "GET"] == [["1"], ["2"]]
        assert len(api.comments["octo/ops#9"]) == 121


def test_jira_write_back_and_update(tmp_path):
    ref = TicketRef(system="jira", key="OPS-12")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        first = write_back(settings, ref, make_suggestion())
        assert [(r["method"], r["path"]) for r in api.requests] == [
            ("GET", "/rest/api/2/issue/OPS-12/comment"), ("PUT", "/rest/api/2/issue/OPS-12"),
            ("POST", "/rest/api/2/issue/OPS-12/comment")]
        assert api.requests[1]["json"] == {"update": {"labels": [
            {"add": "rc:gpu_memory_error"}, {"add": "dim:hardware"}, {"add": "symptom:job_crash"}]}}
        for r in api.requests:
            assert r["headers"]["authorization"] == "Bearer jira-token"
            assert r["headers"]["accept"] == "application/json"
        assert api.requests[2]["headers"]["content-type"] == "application/json"
        assert api.requests[2]["json"]["body"].startswith(JIRA_MARKER)

        api.requests.clear()
        second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert second["comment"] == "updated" and second["comment_id"] == first["comment_id"]
        assert [(r["method"], r["path"]) for r in api.writes()] == [
            ("PUT", "/rest/api/2/issue/OPS-12"), ("PUT", f"/rest/api/2/issue/OPS-12/comment/{first['comment_id']}")]
        assert {"remove": "rc:gpu_memory_error"} in api.writes()[0]["json"]["update"]["labels"]
        assert len(api.comments["OPS-12"]) == 1


def test_jira_cloud_token_with_email_uses_basic_auth(tmp_path):
    with FakeTicketApi() as api:
        settings = Settings(home=tmp_path, jira_url=api.url, jira_token="me@example.com:tok")
        write_back(settings, TicketRef(system="jira", key="OPS-3"), make_suggestion())
        assert api.requests[0]["headers"]["authorization"] == "Basic bWVAZXhhbXBsZS5jb206dG9r"


def test_dry_run_writes_the_outbox_and_calls_nothing(tmp_path):
    outbox = tmp_path / "out" / "outbox.jsonl"
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        result = write_back(settings, TicketRef(system="github", key="octo/ops#7"), make_suggestion(), outbox=outbox)
        write_back(settings, TicketRef(system="jira", key="OPS-1"), make_suggestion(abstained=True), outbox=outbox)
        assert api.requests == []
    assert result["dry_run"] is True and result["comment"] == "planned"
    lines = [json.loads(x) for x in outbox.read_text().splitlines()]
    assert [(x["ticket"], x["action"], x["method"], x["path"]) for x in lines] == [
        ("octo/ops#7", "add_labels", "POST", "/repos/octo/ops/issues/7/labels"),
        ("octo/ops#7", "upsert_comment", "POST", "/repos/octo/ops/issues/7/comments"),
        ("OPS-1", "upsert_comment", "POST", "/rest/api/2/issue/OPS-1/comment")]
    assert lines[0]["json"] == {"labels": ["rc:gpu_memory_error", "dim:hardware", "symptom:job_crash"]}


def test_errors_say_whether_a_retry_can_help(tmp_path):
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.missing.add("octo/ops#404")
        with pytest.raises(WriteBackError, match="HTTP 404") as missing:
            write_back(settings, TicketRef(system="github", key="octo/ops#404"), make_suggestion())
        assert missing.value.retryable is False
        api.fail_next = 1
        with pytest.raises(WriteBackError, match="HTTP 502") as flaky:
            write_back(settings, TicketRef(system="jira", key="OPS-5"), make_suggestion())
        assert flaky.value.retryable is True
        with pytest.raises(WriteBackError, match="PMKB_GITHUB_TOKEN") as unset:
            write_back(Settings(home=tmp_path), TicketRef(system="github", key="o/r#1"), make_suggestion())
        assert unset.value.retryable is False
    with pytest.raises(WriteBackError, match="ConnectError") as down:  # the server is gone now
        write_back(settings, TicketRef(system="jira", key="OPS-5"), make_suggestion(), client=httpx.Client())
    assert down.value.retryable is True
