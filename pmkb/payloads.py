"""Webhook payloads turned into ticket events: GitHub ``issues`` and Jira issue events.

Payloads are authenticated but still untrusted: any field may have the wrong type, nest without
end or carry text that is not valid Unicode. Every problem is a ``BadPayload`` naming the field, so
the service answers 400 with that name rather than failing somewhere later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

GITHUB_ACTIONS = {"opened", "edited", "reopened"}
JIRA_EVENTS = {"jira:issue_created", "jira:issue_updated"}
JIRA_TEXT_FIELDS = {"summary", "description", "Attachment"}  # an attached log is new evidence
MAX_DEPTH = 64
"""Deepest nesting accepted in a body (Atlassian Document Format trees are a few levels deep)."""
_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")
_JIRA_ID = re.compile(r"^\d{1,18}$")
MAX_ATTACHMENTS = 100  # entries of a Jira issue's attachment list kept for the bot


class BadPayload(ValueError):
    """An authenticated body that pmkb cannot use; the message names the field."""


class Ignored(Exception):
    """An authenticated event pmkb does not act on (the reason is the message)."""


@dataclass(frozen=True)
class TicketEvent:
    """What the service queues for one webhook: which ticket, its text and how new this version is."""

    system: str  # "github" | "jira"
    key: str  # "owner/repo#12" or "OPS-12"
    ticket: dict  # id, title, description
    action: str  # the sender's event or action name
    version: float | None  # when the ticket was last changed (epoch seconds), to order events
    url: str | None = None


def parse_json_object(body: bytes) -> dict:
    """The body as a JSON object; BadPayload when it is not JSON, not an object or nests too deep."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise BadPayload(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadPayload(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadPayload("the body is not a JSON object")
    _check_depth(data, "body")
    return data


def _check_depth(value, field: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise BadPayload(f"{field} nests deeper than {MAX_DEPTH} levels")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        if isinstance(child, (dict, list)):
            _check_depth(child, field, depth + 1)


def _object(value, field: str, required: bool = True) -> dict:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise BadPayload(f"{field} must be an object, not {_kind(value)}")
    return value


def _string(value, field: str, required: bool = False) -> str:
    """A text field: a string (or absent/null when not required), valid Unicode."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadPayload(f"{field} must be a{' non-empty' if required else ''} string, not {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadPayload(f"{field} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def _kind(value) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(
        type(value), f"{type(value).__name__} {str(value)[:20]!r}")


def _timestamp(value, field: str) -> float | None:
    """Epoch seconds of an ISO 8601 time (GitHub, Jira) or None when absent."""
    if value is None:
        return None
    text = _string(value, field)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BadPayload(f"{field} is not an ISO 8601 time: {text[:40]!r}") from None


def github_event(event: str | None, payload: dict) -> TicketEvent:
    """The ticket event of a GitHub ``issues`` webhook; Ignored for other events and actions."""
    action = payload.get("action")
    if event == "ping":
        raise Ignored("ping")
    if event != "issues" or not isinstance(action, str) or action not in GITHUB_ACTIONS:
        raise Ignored(f"event {str(event)[:40]}/{str(action)[:40]} is not handled")
    issue = _object(payload.get("issue"), "issue")
    repo = _object(payload.get("repository"), "repository")
    number = issue.get("number")
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        raise BadPayload(f"issue.number must be a positive integer, not {_kind(number)}")
    full_name = _string(repo.get("full_name"), "repository.full_name", required=True)
    if not _REPO.match(full_name):
        raise BadPayload(f"repository.full_name must look like owner/repo, not {full_name[:60]!r}")
    key = f"{full_name}#{number}"
    ticket = {"id": key, "title": _string(issue.get("title"), "issue.title"),
              "description": _string(issue.get("body"), "issue.body")}
    url = _string(issue.get("html_url"), "issue.html_url") or None
    return TicketEvent("github", key, ticket, action, _timestamp(issue.get("updated_at"), "issue.updated_at"), url)


def jira_event(payload: dict) -> TicketEvent:
    """The ticket event of a Jira issue webhook; Ignored for other events or non-text changes."""
    event = payload.get("webhookEvent")
    if not isinstance(event, str) or event not in JIRA_EVENTS:
        raise Ignored(f"event {str(event)[:60]} is not handled")
    items = _object(payload.get("changelog"), "changelog", required=False).get("items")
    if items is not None and not isinstance(items, list):
        raise BadPayload(f"changelog.items must be a list, not {_kind(items)}")
    if event == "jira:issue_updated" and items and not any(
            isinstance(i, dict) and isinstance(i.get("field"), str) and i["field"] in JIRA_TEXT_FIELDS
            for i in items):
        raise Ignored("neither summary, description nor attachments changed")
    issue = _object(payload.get("issue"), "issue")
    fields = _object(issue.get("fields"), "issue.fields")
    key = _string(issue.get("key"), "issue.key", required=True)
    ticket = {"id": key, "title": jira_text(fields.get("summary"), "issue.fields.summary"),
              "description": jira_text(fields.get("description"), "issue.fields.description")}
    if attachments := jira_attachments(fields):
        ticket["attachments"] = attachments
    version = _jira_time(fields.get("updated"))
    if version is None and payload.get("timestamp") is not None:
        version = _jira_stamp(payload["timestamp"])
    return TicketEvent("jira", key, ticket, event, version)


def jira_attachments(fields: dict) -> list[dict]:
    """The attachments a Jira webhook's ``issue.fields`` lists, as ``{id, filename, size}`` (entries
    without a numeric id or a name are left out)."""
    found = fields.get("attachment")
    out = []
    for item in found[:MAX_ATTACHMENTS] if isinstance(found, list) else ():
        if not isinstance(item, dict):
            continue
        ident, name, size = str(item.get("id", "")), item.get("filename"), item.get("size")
        if _JIRA_ID.match(ident) and isinstance(name, str) and name:
            out.append({"id": ident, "filename": name[:200],
                        "size": size if isinstance(size, int) and not isinstance(size, bool) else None})
    return out


def _jira_stamp(stamp) -> float:
    """Epoch seconds of the event's ``timestamp``: milliseconds as Jira's own webhooks send them (a
    number or its digits), or an ISO 8601 time as Jira Automation's ``{{now}}`` renders it."""
    if isinstance(stamp, str) and stamp.strip().isdigit():
        stamp = int(stamp.strip())
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return stamp / 1000
    if isinstance(stamp, str) and (seconds := _jira_time(stamp.strip())) is not None:
        return seconds
    raise BadPayload(f"timestamp must be milliseconds since the epoch or an ISO 8601 time, not {_kind(stamp)}")


def _jira_time(value) -> float | None:
    # Jira writes "2024-05-01T10:05:00.000+0000" ({{now}}: "...00.0+0000"); fromisoformat wants "+00:00".
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", value)).timestamp()
    except ValueError:
        return None


def jira_text(value, field: str, depth: int = 0) -> str:
    """Plain text of a Jira field: a string, or the text nodes of an Atlassian Document Format tree."""
    if depth > MAX_DEPTH:
        raise BadPayload(f"{field} nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, str):
        return _string(value, field)
    if isinstance(value, dict):
        text = value.get("text")
        if text is not None:
            return _string(text, f"{field}.text")
        return jira_text(value.get("content"), f"{field}.content", depth + 1)
    if isinstance(value, list):
        return "\n".join(filter(None, (jira_text(v, field, depth + 1) for v in value)))
    raise BadPayload(f"{field} must be text or a document, not {_kind(value)}")
