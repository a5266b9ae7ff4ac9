"""Webhook payloads: every malformed field is a BadPayload that names it, never another exception."""

from __future__ import annotations

import pytest

from pmkb.payloads import (
    BadPayload,
    Ignored,
    github_event,
    jira_event,
    jira_text,
    parse_json_object,
)


def github(**issue) -> dict:
    return {"action": "opened", "repository": {"full_name": "octo/gpu-ops"},
            "issue": {"number": 7, "title": "Xid 79", "body": "GPU has fallen off the bus",
                      "updated_at": "2024-05-01T10:05:00Z", **issue}}


def jira(**fields) -> dict:
    return {"webhookEvent": "jira:issue_created", "timestamp": 1714557900000,
            "issue": {"key": "OPS-3", "fields": {"summary": "NCCL timeout", "description": "rank 3", **fields}}}


def test_a_github_issue_becomes_a_versioned_ticket_event():
    event = github_event("issues", github())
    assert (event.system, event.key, event.action) == ("github", "octo/gpu-ops#7", "opened")
    assert event.ticket == {"id": "octo/gpu-ops#7", "title": "Xid 79", "description": "GPU has fallen off the bus"}
    assert event.version == 1714557900.0


def test_a_jira_issue_becomes_a_versioned_ticket_event():
    event = jira_event(jira(updated="2024-05-01T10:05:30.000+0000"))
    assert (event.key, event.ticket["title"], event.version) == ("OPS-3", "NCCL timeout", 1714557930.0)
    assert jira_event(jira()).version == 1714557900.0  # no fields.updated: the event's timestamp


@pytest.mark.parametrize("payload,field", [
    (github(title={"text": "an object"}), "issue.title"),
    (github(body=["a", "list"]), "issue.body"),
    (github(number="7"), "issue.number"),
    (github(number=True), "issue.number"),
    (github(title="\ud800 lone surrogate"), "issue.title"),
    (github(updated_at="yesterday"), "issue.updated_at"),
    ({"action": "opened", "issue": "not an object", "repository": {"full_name": "o/r"}}, "issue"),
    ({"action": "opened", "issue": {"number": 1}, "repository": {"full_name": ["o/r"]}}, "repository.full_name"),
    ({"action": "opened", "issue": {"number": 1}, "repository": {"full_name": "../../etc"}}, "repository.full_name"),
])
def test_malformed_github_fields_are_named(payload, field):
    with pytest.raises(BadPayload, match=f"^{field.replace('.', '[.]')} "):
        github_event("issues", payload)


@pytest.mark.parametrize("payload,field", [
    ({**jira(), "changelog": "a string"}, "changelog"),
    ({**jira(), "changelog": {"items": "a string"}}, "changelog.items"),
    (jira(summary={"type": "doc", "content": 5}), "issue.fields.summary.content"),
    (jira(description=12), "issue.fields.description"),
    (jira(description="\udfff"), "issue.fields.description"),
    ({"webhookEvent": "jira:issue_created", "issue": {"key": "OPS-1", "fields": "x"}}, "issue.fields"),
    ({"webhookEvent": "jira:issue_created", "issue": {"key": 5, "fields": {}}}, "issue.key"),
    ({**jira(), "timestamp": "soon"}, "timestamp"),
])
def test_malformed_jira_fields_are_named(payload, field):
    with pytest.raises(BadPayload, match=f"^{field.replace('.', '[.]')} "):
        jira_event(payload)


def test_deep_nesting_is_refused_not_a_recursion_error():
    with pytest.raises(BadPayload, match="nests deeper"):
        parse_json_object(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(BadPayload, match="nests deeper"):
        parse_json_object(b'{"issue": ' + b"[" * 80 + b"]" * 80 + b"}")  # within Python's limit, over ours
    doc: dict = {"type": "doc", "content": []}
    node = doc
    for _ in range(200):
        child = {"type": "paragraph", "content": []}
        node["content"].append(child)
        node = child
    with pytest.raises(BadPayload, match="issue.fields.description"):
        jira_text(doc, "issue.fields.description")


def test_other_events_are_ignored_and_bodies_that_are_not_objects_refused():
    with pytest.raises(Ignored):
        github_event("issues", {**github(), "action": "labeled"})
    with pytest.raises(Ignored):
        github_event("ping", {})
    with pytest.raises(Ignored):
        jira_event({**jira(), "webhookEvent": "jira:issue_updated", "changelog": {"items": [{"field": "labels"}]}})
    with pytest.raises(Ignored):
        github_event("issues", {**github(), "action": ["opened"]})
    with pytest.raises(Ignored):
        jira_event({**jira(), "webhookEvent": ["jira:issue_created"]})
    with pytest.raises(Ignored):
        jira_event({**jira(), "webhookEvent": "jira:issue_updated", "changelog": {"items": [{"field": ["x"]}]}})
    for body in (b"[1]", b"{oops", b"\xff\xfe"):
        with pytest.raises(BadPayload):
            parse_json_object(body)
