"""Write-back to GitHub and Jira: comment rendering, labels, idempotent comment upsert, dry run.

The tests run against ``FakeTicketApi`` (tests/fake_ticket_api.py), a real HTTP server with the
GitHub and Jira endpoints pmkb uses; it is imported from here by other test modules too.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from fake_ticket_api import FakeTicketApi, api_settings

from kb.core.abstain import TOO_LITTLE_TEXT
from kb.core.settings import Settings
from kb.core.suggestion import (
    Candidate,
    Evidence,
    MitigationStep,
    NodeHistory,
    NodeIncident,
    SimilarIncident,
    Suggestion,
)
from kb.tickets.api import GitHubTicketApi, Identity, JiraTicketApi
from kb.tickets.writeback import (
    GITHUB_MARKER,
    JIRA_MARKER,
    OutboxTicketSystem,
    TicketRef,
    TicketSystem,
    WriteBackError,
    labels_added_by_pmkb,
    labels_in_comment,
    render_comment,
    suggestion_labels,
    write_back,
    write_back_retrying,
    write_suggestion,
)

__all__ = ["FakeTicketApi", "api_settings", "make_suggestion"]


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


def test_render_comment_confident_github():
    body = render_comment(make_suggestion(), threshold_note=False)
    assert body.splitlines()[0] == GITHUB_MARKER
    assert "`gpu_memory_error`" in body and "91%" in body
    assert "**Labels:** `rc:gpu_memory_error` `dim:hardware` `symptom:job_crash`" in body
    assert "hw-gpu-003" in body  # similar incident cited by id
    assert "node_repair" in body and "Drain gpu-12" in body
    assert "confidence threshold" not in body
    assert "confidence threshold" in render_comment(make_suggestion(), threshold_note=True)


@pytest.mark.parametrize(("source", "github", "jira"), [
    ("https://github.com/NVIDIA/nccl/issues/905", "[thread](https://github.com/NVIDIA/nccl/issues/905)",
     "[thread|https://github.com/NVIDIA/nccl/issues/905]"),
    ("pmkb-bundled", None, None),
    ("javascript:alert(1)", None, None),
    ("http://tracker.local/OPS-1", None, None),  # not https
    ("https://evil.example/x)[click](https://evil.example", None, None),  # would break out of the link
    ("https://tracker.example/browse/OPS-1?x=|y", None, None),
    ("https://github.com.evil.example/NVIDIA/nccl/issues/905", None, None),  # not an allowed host
])
def test_a_similar_incident_links_its_thread_only_from_a_plain_https_source(source, github, jira):
    suggestion = make_suggestion()
    suggestion.similar_incidents[0].source = source
    assert "thread" not in render_comment(suggestion, threshold_note=False)  # no allowed host: no link
    for system, expected in (("github", github), ("jira", jira)):
        body = render_comment(suggestion, threshold_note=False, system=system, link_hosts=["github.com"])
        line = next(line for line in body.splitlines() if "hw-gpu-003" in line and "->" in line)
        if expected:
            assert line.endswith(expected)
        else:
            assert "thread" not in line and source not in body


def test_render_comment_cites_the_node_history():
    history = NodeHistory(node="gpu-12", total=2, incidents=[
        NodeIncident(id="INC-7", title="gpu-12 Xid 79", root_cause="gpu_lost"),
        NodeIncident(id="INC-3", title="gpu-12 ECC", root_cause="gpu_memory_error")])
    body = render_comment(make_suggestion(node_history=history), threshold_note=False)
    assert "**Seen before:** gpu-12 appears in 2 earlier incidents: INC-7 (gpu\\_lost), INC-3" in body
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
        assert calls == [("GET", "/user"), ("GET", "/repos/octo/ops/issues/7/comments"),
                         ("GET", "/repos/octo/ops/issues/7"), ("POST", "/repos/octo/ops/issues/7/comments"),
                         ("POST", "/repos/octo/ops/issues/7/labels")]
        for r in api.requests:
            assert r["headers"]["authorization"] == "Bearer gh-token"
            assert r["headers"]["accept"] == "application/vnd.github+json"
            assert r["headers"]["x-github-api-version"] == "2022-11-28"
        assert api.requests[4]["json"] == {"labels": first["labels_added"]}
        second = _first_comment_then_update(api, settings, ref, first, GITHUB_MARKER,
                                            "<!-- pmkb:added rc:gpu_memory_error dim:hardware symptom:job_crash -->")
        assert second["labels_removed"] == ["rc:gpu_memory_error", "dim:hardware"]
        assert second["labels_added"] == ["rc:buggy_code", "dim:user"]  # symptom:job_crash is on already
        assert ("GET", "/user") not in [(r["method"], r["path"]) for r in api.requests]  # asked once per token
        assert labels_added_by_pmkb(api.comments["octo/ops#7"][0]["body"]) == [
            "rc:buggy_code", "dim:user", "symptom:job_crash"]
        assert [(r["method"], r["path"]) for r in api.writes()] == [
            ("PATCH", f"/repos/octo/ops/issues/comments/{first['comment_id']}"),
            ("POST", "/repos/octo/ops/issues/7/labels"),
            ("DELETE", "/repos/octo/ops/issues/7/labels/rc%3Agpu_memory_error"),
            ("DELETE", "/repos/octo/ops/issues/7/labels/dim%3Ahardware"),
            ("PATCH", f"/repos/octo/ops/issues/comments/{first['comment_id']}")]  # the record drops the removed
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
        api.comments["octo/ops#9"] = [{"id": i, "body": f"human comment {i}", "user": {"login": "alice"}}
                                      for i in range(1, 121)]
        api.comments["octo/ops#9"].insert(110, {"id": 500, "body": GITHUB_MARKER + "\nold",
                                                "user": {"login": "pmkb-bot"}})
        result = write_back(api_settings(tmp_path, api), ref, make_suggestion())
        assert result["comment"] == "updated" and result["comment_id"] == 500
        assert [r["query"]["page"] for r in api.requests if r["path"].endswith("/comments")] == [["1"], ["2"]]
        assert len(api.comments["octo/ops#9"]) == 121


def test_jira_write_back_and_update(tmp_path):
    ref = TicketRef(system="jira", key="OPS-12")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        first = write_back(settings, ref, make_suggestion())
        assert [(r["method"], r["path"]) for r in api.requests] == [
            ("GET", "/rest/api/2/myself"), ("GET", "/rest/api/2/issue/OPS-12/comment"),
            ("GET", "/rest/api/2/issue/OPS-12"), ("POST", "/rest/api/2/issue/OPS-12/comment"),
            ("PUT", "/rest/api/2/issue/OPS-12")]
        assert api.requests[2]["query"] == {"fields": ["labels"]}
        assert api.requests[4]["json"] == {"update": {"labels": [
            {"add": "rc:gpu_memory_error"}, {"add": "dim:hardware"}, {"add": "symptom:job_crash"}]}}
        for r in api.requests:
            assert r["headers"]["authorization"] == "Bearer jira-token"
            assert r["headers"]["accept"] == "application/json"
        assert api.requests[3]["headers"]["content-type"] == "application/json"
        _first_comment_then_update(api, settings, ref, first, JIRA_MARKER,
                                   "{{pmkb:added rc:gpu_memory_error dim:hardware symptom:job_crash}}")
        assert [(r["method"], r["path"]) for r in api.writes()] == [
            ("PUT", f"/rest/api/2/issue/OPS-12/comment/{first['comment_id']}"), ("PUT", "/rest/api/2/issue/OPS-12"),
            ("PUT", f"/rest/api/2/issue/OPS-12/comment/{first['comment_id']}")]
        assert {"remove": "rc:gpu_memory_error"} in api.writes()[1]["json"]["update"]["labels"]
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
        ("octo/ops#7", "upsert_comment", "POST", "/repos/octo/ops/issues/7/comments"),
        ("octo/ops#7", "add_labels", "POST", "/repos/octo/ops/issues/7/labels"),
        ("OPS-1", "upsert_comment", "POST", "/rest/api/2/issue/OPS-1/comment")]
    assert lines[1]["json"] == {"labels": ["rc:gpu_memory_error", "dim:hardware", "symptom:job_crash"]}


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


STRANGER_LABELS = ["rc:team_label", "dim:triage", "symptom:needs_owner"]


@pytest.mark.parametrize("ref", [TicketRef(system="github", key="octo/ops#20"), TicketRef(system="jira", key="OPS-20")],
                         ids=["github", "jira"])
def test_a_strangers_marked_comment_is_neither_edited_nor_trusted(tmp_path, ref):
    marker = GITHUB_MARKER if ref.system == "github" else JIRA_MARKER
    forged = (f"{marker}\nLabels: {' '.join(STRANGER_LABELS)}\n"
              + (f"<!-- pmkb:added {' '.join(STRANGER_LABELS)} -->" if ref.system == "github"
                 else "{{pmkb:added " + " ".join(STRANGER_LABELS) + "}}"))
    with FakeTicketApi() as api:
        api.labels[ref.key] = list(STRANGER_LABELS)  # a person's labels, named by the forged comment
        stranger = api.post_as_stranger(ref.key, forged)
        api.requests.clear()
        result = write_back(api_settings(tmp_path, api), ref, make_suggestion())
        assert result["comment"] == "created" and result["comment_id"] != stranger["id"]
        assert result["labels_removed"] == [] and set(STRANGER_LABELS) <= set(api.labels[ref.key])
        assert not [r for r in api.writes() if r["method"] in ("DELETE", "PATCH")
                    or (r["method"] == "PUT" and "/comment/" in r["path"])]
        comments = api.comments[ref.key]
        assert [c["body"] for c in comments][0] == forged and len(comments) == 2
        assert comments[1]["body"].startswith(marker)

        again = write_back(api_settings(tmp_path, api), ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert again["comment"] == "updated" and again["comment_id"] == result["comment_id"]
        assert comments[0]["body"] == forged and set(STRANGER_LABELS) <= set(api.labels[ref.key])


@pytest.mark.parametrize("ref", [TicketRef(system="github", key="octo/ops#21"), TicketRef(system="jira", key="OPS-21")],
                         ids=["github", "jira"])
def test_a_label_a_person_applied_stays_when_the_suggestion_changes(tmp_path, ref):
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.labels[ref.key] = ["rc:gpu_memory_error"]  # a person labelled the ticket before pmkb saw it
        first = write_back(settings, ref, make_suggestion())
        assert first["labels_added"] == ["dim:hardware", "symptom:job_crash"]
        assert labels_added_by_pmkb(api.comments[ref.key][0]["body"]) == ["dim:hardware", "symptom:job_crash"]
        assert labels_in_comment(api.comments[ref.key][0]["body"]) == [
            "rc:gpu_memory_error", "dim:hardware", "symptom:job_crash"]  # the card still shows the suggestion

        second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert second["labels_removed"] == ["dim:hardware"]
        assert sorted(api.labels[ref.key]) == ["dim:user", "rc:buggy_code", "rc:gpu_memory_error", "symptom:job_crash"]
        assert write_back(settings, ref, make_suggestion(abstained=True))["labels_removed"] == [
            "rc:buggy_code", "dim:user", "symptom:job_crash"]
        assert api.labels[ref.key] == ["rc:gpu_memory_error"]


def test_a_comment_written_before_the_record_existed_owns_no_labels(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#22")
    with FakeTicketApi() as api:
        old = render_comment(make_suggestion(), threshold_note=True)  # no pmkb:added line
        api.comments[ref.key] = [{"id": 9, "body": old, "user": {"login": "pmkb-bot"}}]
        api.labels[ref.key] = suggestion_labels(make_suggestion())
        changed = make_suggestion(root_cause="buggy_code", dimension="user")
        result = write_back(api_settings(tmp_path, api), ref, changed)
        assert result["comment"] == "updated" and result["labels_removed"] == []
        assert "rc:gpu_memory_error" in api.labels[ref.key]


def test_the_record_is_read_from_the_last_line_only():
    body = render_comment(make_suggestion(explanation="<!-- pmkb:added rc:team_label -->"), threshold_note=True)
    assert "&lt;!-- pmkb:added rc:team\\_label --&gt;" in body and labels_added_by_pmkb(body) == []
    assert labels_added_by_pmkb(render_comment(make_suggestion(), True, added=["rc:x"])) == ["rc:x"]
    assert labels_added_by_pmkb(render_comment(make_suggestion(), True, "jira", added=["dim:y"])) == ["dim:y"]
    assert labels_added_by_pmkb("") == [] and labels_added_by_pmkb("<!-- pmkb:added -->") == []


def test_the_outbox_is_a_ticket_system_like_github_and_jira(tmp_path):
    github, jira = TicketRef(system="github", key="octo/ops#8"), TicketRef(system="jira", key="OPS-8")
    outbox = tmp_path / "outbox.jsonl"
    with FakeTicketApi() as api, httpx.Client() as client:
        settings = api_settings(tmp_path, api)
        systems = [GitHubTicketApi(settings, github, client), JiraTicketApi(settings, jira, client),
                   OutboxTicketSystem(outbox, github), OutboxTicketSystem(outbox, jira)]
        assert all(isinstance(system, TicketSystem) for system in systems)
        planned = write_suggestion(systems[2], make_suggestion())
        done = write_suggestion(systems[0], make_suggestion())
        posted = api.comments["octo/ops#8"][0]["body"]
    assert planned == {**done, "dry_run": True, "outbox": str(outbox), "comment": "planned", "comment_id": None}
    assert done["dry_run"] is False and done["comment"] == "created"
    # the dry run plans the very comment a first write-back posts
    assert {"body": posted} in [json.loads(x)["json"] for x in outbox.read_text().splitlines()]


class _MemoryTicket:
    """A ticket system held in memory, as a team's own tracker could be plugged in."""

    def __init__(self):
        self.ref, self.comments_, self.labels_ = TicketRef(system="jira", key="MEM-1"), [], ["team"]

    def identity(self) -> Identity:
        return Identity(jira_user=("name", "pmkb"))

    def comments(self) -> list[dict]:
        return self.comments_

    def labels(self) -> list[str]:
        return list(self.labels_)

    def change_labels(self, add, remove):
        self.labels_ = [x for x in self.labels_ + add if x not in remove]

    def create_comment(self, body):
        self.comments_.append({"id": len(self.comments_) + 1, "body": body, "author": {"name": "pmkb"}})
        return len(self.comments_)

    def update_comment(self, comment_id, body):
        self.comments_[int(comment_id) - 1]["body"] = body

    def outcome(self) -> dict:
        return {"dry_run": False}


def test_write_suggestion_takes_any_ticket_system():
    ticket = _MemoryTicket()
    assert isinstance(ticket, TicketSystem)
    first = write_suggestion(ticket, make_suggestion())
    again = write_suggestion(ticket, make_suggestion(root_cause="gpu_lost"))
    assert first["comment"] == "created" and again["comment"] == "updated" and len(ticket.comments_) == 1
    assert ticket.labels_ == ["team", "dim:hardware", "symptom:job_crash", "rc:gpu_lost"]
    assert again["labels_removed"] == ["rc:gpu_memory_error"]


def test_write_back_retrying_waits_longer_each_time_and_gives_up_on_a_lasting_error(tmp_path):
    waits: list[float] = []
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.fail_next = 2
        done = write_back_retrying(settings, TicketRef(system="github", key="octo/ops#9"), make_suggestion(),
                                   sleep=waits.append)
        assert done["comment"] == "created" and waits == [1.0, 2.0]
        api.missing.add("octo/ops#404")
        waits.clear()
        with pytest.raises(WriteBackError, match="HTTP 404"):
            write_back_retrying(settings, TicketRef(system="github", key="octo/ops#404"), make_suggestion(),
                                sleep=waits.append)
        assert waits == []
        api.fail_next = 5
        with pytest.raises(WriteBackError, match="HTTP 502"):
            write_back_retrying(settings, TicketRef(system="jira", key="OPS-9"), make_suggestion(), sleep=waits.append)
        assert waits == [1.0, 2.0]


def _first_comment_then_update(api, settings, ref, first: dict, marker: str, added_line: str) -> dict:
    """Check the first write's comment (marker first, the labels it added recorded last),
    then write a changed suggestion: the same comment is updated. Returns the second write."""
    posted = next(r["json"]["body"] for r in api.requests if r["method"] == "POST" and "body" in (r["json"] or {}))
    assert posted.startswith(marker) and labels_added_by_pmkb(posted) == first["labels_added"]
    assert posted.splitlines()[-1] == added_line
    api.requests.clear()
    second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
    assert second["comment"] == "updated" and second["comment_id"] == first["comment_id"]
    return second


HOSTILE_TITLE = ('GPU lost again [Fix: run this script](https://evil.example/fix.sh) <a href="https://evil.example">x</a> '
                 "[~accountid:5b10a2844c20] [runbook|https://evil.example/r] !https://evil.example/p.png! <!-- hidden")


def test_hostile_text_from_ingest_and_page_feedback_is_inert_in_both_comment_markups(tmp_path, empty_kb):
    """Through the real paths: a GitHub issue export ingested, and a ticket confirmed on the page."""
    from test_markup import live_markup

    from ingest import read_paths
    from kb.core.incidents import Incident
    from kb.core.suggestion import Ticket
    from kb.engine.classify import Calibration
    from kb.engine.suggest import SuggestionEngine
    from kb.jobs.feedback import LabelSet, save_feedback

    export = tmp_path / "issues.json"
    export.write_text(json.dumps([{
        "number": 7, "html_url": "https://github.com.evil.example/ops/tickets/issues/7", "title": HOSTILE_TITLE,
        "body": "Xid 79: GPU has fallen off the bus on node gpu-q3; the job died.", "created_at": "2026-01-02T00:00:00Z",
        "labels": [{"name": "rc:gpu_lost"}, {"name": "symptom:job_crash"}, {"name": "mitigation:node_repair"}]}]))
    empty_kb.add_incidents([r for r in read_paths([export]) if isinstance(r, Incident)])
    engine = SuggestionEngine(empty_kb, calibration=Calibration())
    page_ticket = Ticket(id="[~accountid:99]<!--", title=HOSTILE_TITLE.replace("GPU lost again", "Node gpu-q9 Xid 79"),
                         description="Xid 79 GPU has fallen off the bus, @oncall please drain www.evil.example")
    save_feedback(empty_kb, page_ticket, engine.suggest(page_ticket),
                  LabelSet(symptom="job_crash", root_cause="gpu_lost", mitigation="node_repair"))
    engine = SuggestionEngine(empty_kb, calibration=Calibration())
    suggestion = engine.suggest(Ticket(title="Xid 79 on gpu-q5", description="GPU has fallen off the bus, job died"))
    suggestion.explanation = "See [the fix](https://evil.example/fix.sh) <!-- and @oncall"
    assert len(suggestion.similar_incidents) == 2
    for system in ("github", "jira"):
        body = render_comment(suggestion, threshold_note=True, system=system, link_hosts=["github.com"])
        lines = body.splitlines()
        quoted = "\n".join(line for line in lines[1:] if not line.startswith(("<sub>", "### ", "h3. ")))
        assert "evil.example" in quoted.replace("\u200b", "").replace("\\", "")  # shown, as text
        own_markup = re.compile(r"\{\{|\}\}")  # pmkb's own code spans on Jira
        assert live_markup(own_markup.sub("", quoted), system) == [], system
        assert "thread" not in body  # github.com.evil.example is not github.com


@pytest.mark.parametrize(("system", "key"), [("github", "octo/ops#31"), ("jira", "OPS-31")])
def test_a_failed_comment_after_a_plan_leaves_no_orphaned_pmkb_labels(tmp_path, system, key):
    """One transient failure of the comment call, a retry, then an edit that changes the cause:
    the labels of the first suggestion go, as pmkb's own."""
    ref = TicketRef(system=system, key=key)
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.fail_comment_writes = 1
        with pytest.raises(WriteBackError) as failed:
            write_back(settings, ref, make_suggestion(root_cause="gpu_lost"))
        assert failed.value.retryable
        retried = write_back(settings, ref, make_suggestion(root_cause="gpu_lost"))
        assert retried["comment"] == "created"
        edited = write_back(settings, ref, make_suggestion(root_cause="environment_dependency", dimension="user"))
        assert set(edited["labels_removed"]) == {"rc:gpu_lost", "dim:hardware"}
        assert sorted(api.labels[key]) == ["dim:user", "rc:environment_dependency", "symptom:job_crash"]
        assert len(api.comments[key]) == 1


def test_a_failed_label_call_after_the_comment_is_repaired_by_the_retry(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#32")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        write_back(settings, ref, make_suggestion())  # warms the identity cache, so the next failure hits labels
        changed = make_suggestion(root_cause="gpu_lost")
        original_route = api.route

        def fail_labels_once(r, calls=[0]):
            if r["path"].endswith("/labels") and r["method"] == "POST" and not calls[0]:
                calls[0] += 1
                return 502, {"message": "bad gateway"}, {}
            return original_route(r)

        api.route = fail_labels_once
        with pytest.raises(WriteBackError):
            write_back(settings, ref, changed)
        done = write_back(settings, ref, changed)
        assert "rc:gpu_lost" in api.labels["octo/ops#32"] and "rc:gpu_memory_error" not in api.labels["octo/ops#32"]
        assert done["comment"] == "unchanged" and len(api.comments["octo/ops#32"]) == 1


SECONDARY = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."


def test_a_secondary_rate_limit_without_headers_is_retried_after_a_minute_at_least(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#41")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api, github_bot_login="pmkb-bot")
        api.fail_with(1, status=403, message=SECONDARY)
        with pytest.raises(WriteBackError) as limited:
            write_back(settings, ref, make_suggestion())
        assert limited.value.retryable and limited.value.retry_after >= 60
        assert write_back(settings, ref, make_suggestion())["comment"] == "created"


def test_a_limited_first_call_for_the_identity_is_not_remembered_as_an_app(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#42")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.fail_with(1, status=403, message=SECONDARY)  # the very first call: GET /user
        with pytest.raises(WriteBackError) as limited:
            write_back(settings, ref, make_suggestion())
        assert limited.value.retryable and "/user" in str(limited.value)
        first = write_back(settings, ref, make_suggestion())
        again = write_back(settings, ref, make_suggestion(root_cause="gpu_lost"))
        assert first["comment"] == "created" and again["comment"] == "updated"  # its own comment, found again
        assert len(api.comments["octo/ops#42"]) == 1
        assert "rc:gpu_memory_error" not in api.labels["octo/ops#42"]


def test_write_back_retrying_waits_for_a_rate_limit_to_reset_and_says_when_it_is_too_far(tmp_path):
    import time

    waits: list[float] = []
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api, github_bot_login="pmkb-bot")
        reset = int(time.time()) + 30
        api.fail_with(1, 403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})
        done = write_back_retrying(settings, TicketRef(system="github", key="octo/ops#51"), make_suggestion(),
                                   sleep=waits.append)
        assert done["comment"] == "created" and len(waits) == 1 and 25 <= waits[0] <= 31
        waits.clear()
        api.fail_with(1, 403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 600)})
        with pytest.raises(WriteBackError, match="rate limited: the ticket system asks to wait") as limited:
            write_back_retrying(settings, TicketRef(system="github", key="octo/ops#52"), make_suggestion(),
                                sleep=waits.append, max_wait=300)
        assert waits == [] and limited.value.retry_after > 500


def test_a_full_disk_never_leaves_a_torn_line_in_the_outbox(tmp_path, monkeypatch):
    import errno
    import os

    from kb.tickets import outbox as outbox_module

    outbox = tmp_path / "outbox.jsonl"
    write_back(Settings(home=tmp_path), TicketRef(system="github", key="octo/ops#61"), make_suggestion(),
               outbox=outbox)
    before = outbox.read_bytes()
    real_write = os.write

    def disk_fills(fd, data):
        real_write(fd, data[:10])  # part of the line reaches the file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outbox_module.os, "write", disk_fills)
    with pytest.raises(OSError, match="No space left"):
        write_back(Settings(home=tmp_path), TicketRef(system="github", key="octo/ops#62"), make_suggestion(),
                   outbox=outbox)
    assert outbox.read_bytes() == before
    assert all(json.loads(line) for line in before.decode().splitlines())
    assert oct(outbox.stat().st_mode & 0o777) == "0o600"
