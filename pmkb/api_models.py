"""The request and response shapes of the webhook service, as its OpenAPI schema documents them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator


class AnnotateRequest(BaseModel):
    """A ticket for ``POST /v1/annotate``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    title: str = ""
    description: str = ""
    log: str = ""  # optional log excerpt

    @field_validator("id", "title", "description", "log")
    @classmethod
    def _valid_unicode(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("is not valid Unicode (it holds a lone surrogate)") from None
        return value


def error_responses(*codes: int) -> dict:
    """OpenAPI entries for the error statuses a route returns."""
    return {code: {"description": ERRORS[code], "model": ErrorBody} for code in codes}


class ErrorBody(BaseModel):
    """The body of every error response."""

    detail: str | list  # what went wrong and, where it helps, what to do


ERRORS = {
    400: "The body is not a JSON object, or a field has the wrong type or is not valid Unicode; `detail` names it",
    401: "Missing or wrong signature, shared secret or bearer token",
    404: "The endpoint is not configured: its secret or token is not set",
    408: "The request body did not arrive within the read timeout",
    413: "The request body is larger than the limit",
    422: "The annotate request has fields that are not allowed or of the wrong type",
    429: "Too many requests from this source; retry after the `Retry-After` header's seconds",
    503: "The knowledge base is still loading or failed to open; retry after `Retry-After`",
}
_TEXT = {"type": ["string", "null"]}
_GITHUB_EVENT = {
    "type": "object", "required": ["action", "issue", "repository"],
    "description": "A GitHub `issues` event (only the fields pmkb reads; others are allowed)",
    "properties": {
        "action": {"type": "string", "description": "opened, edited and reopened are queued; others are ignored",
                   "enum": ["opened", "edited", "reopened", "closed", "deleted", "labeled", "unlabeled",
                            "assigned", "unassigned", "locked", "unlocked", "transferred", "pinned", "unpinned",
                            "milestoned", "demilestoned"]},
        "issue": {"type": "object", "required": ["number"], "properties": {
            "number": {"type": "integer", "minimum": 1}, "title": _TEXT, "body": _TEXT,
            "html_url": _TEXT, "updated_at": {"type": "string", "format": "date-time"}}},
        "repository": {"type": "object", "required": ["full_name"], "properties": {
            "full_name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"}}},
    },
}
_JIRA_EVENT = {
    "type": "object", "required": ["webhookEvent", "issue"],
    "description": "A Jira issue event (only the fields pmkb reads; others are allowed)",
    "properties": {
        "webhookEvent": {"type": "string", "description": "issue created and updated are queued; others are ignored",
                         "enum": ["jira:issue_created", "jira:issue_updated", "jira:issue_deleted", "comment_created",
                                  "comment_updated", "comment_deleted"]},
        "timestamp": {"type": ["integer", "string"],
                      "description": "milliseconds since the epoch, or an ISO 8601 time (Jira Automation's {{now}})"},
        "changelog": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}},
        "issue": {"type": "object", "required": ["key", "fields"], "properties": {
            "key": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*-[0-9]+$"},
            "fields": {"type": "object", "properties": {
                "summary": _TEXT, "updated": {"type": "string"},
                "description": {"type": ["string", "object", "null"],
                                "description": "text, or an Atlassian Document Format tree"}}}}},
    },
}


def webhook_body(schema: dict) -> dict:
    """``openapi_extra`` documenting a webhook's JSON body (the route reads it raw, to check the signature)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


GITHUB_BODY, JIRA_BODY = webhook_body(_GITHUB_EVENT), webhook_body(_JIRA_EVENT)


class Accepted(BaseModel):
    """A webhook committed to the queue (or a redelivery of one that was)."""

    event_id: int
    status: str  # "queued" | "duplicate"
    ticket: str
