"""Write a suggestion back to its ticket: labels and one pmkb comment, on GitHub or Jira.

Idempotent: the comment carries a marker, so a second run (a redelivery, an edited ticket, a
restart mid-way) finds the comment it posted before and updates it instead of adding another.
Labels pmkb applied earlier and no longer suggests are removed; labels it never applied are left
alone. A dry run writes each intended call to an outbox JSONL file instead of calling the API.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, model_validator

from kb.abstain import TOO_LITTLE_ADVICE, TOO_LITTLE_TEXT
from kb.settings import Settings
from kb.suggestion import Suggestion

GITHUB_MARKER = "<!-- pmkb:suggestion -->"
"""First line of the pmkb comment on GitHub (an HTML comment: invisible when rendered)."""
JIRA_MARKER = "{{pmkb:suggestion}}"
"""First line of the pmkb comment on Jira (wiki markup has no hidden text)."""
MARKER_TOKEN = "pmkb:suggestion"
LABEL_PREFIXES = ("rc:", "dim:", "symptom:")
_LABELS_LINE = re.compile(r"^\W*Labels:?\W*(.*)$", re.MULTILINE)
_LABEL = re.compile(r"\b(?:rc|dim|symptom):[A-Za-z0-9_.-]+")
_GITHUB_KEY = re.compile(r"^([\w.-]+)/([\w.-]+)#(\d+)$")
_JIRA_KEY = re.compile(r"^[A-Z][A-Z0-9_]*-\d+$")


class WriteBackError(RuntimeError):
    """A call to the ticket system failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class TicketRef(BaseModel):
    """Which ticket to write to: GitHub "owner/repo#123" or Jira "OPS-12"."""

    model_config = ConfigDict(extra="forbid")

    system: Literal["github", "jira"]
    key: str

    @model_validator(mode="after")
    def _check_key(self) -> "TicketRef":
        pattern = _GITHUB_KEY if self.system == "github" else _JIRA_KEY
        if not pattern.match(self.key):
            example = "owner/repo#123" if self.system == "github" else "OPS-12"
            raise ValueError(f"{self.system} ticket key {self.key!r} is not of the form {example}")
        return self

    def github_parts(self) -> tuple[str, str, int]:
        """(owner, repo, issue number) of a GitHub reference."""
        owner, repo, number = _GITHUB_KEY.match(self.key).groups()
        return owner, repo, int(number)


def suggestion_labels(s: Suggestion) -> list[str]:
    """Labels for a confident suggestion (none when it abstained)."""
    if s.abstained:
        return []
    return [f"rc:{s.root_cause}", f"dim:{s.root_cause_dimension}", f"symptom:{s.symptom}"]


def _clean(text: str, system: str, width: int = 200) -> str:
    """Ticket or incident text made inert: no mentions, no markup breaking out of code spans."""
    text = " ".join(text.split())
    text = text if len(text) <= width else text[:width - 3] + "..."
    text = text.replace("@", "@\u200b")
    return text.replace("`", "'") if system == "github" else text.replace("{", "(").replace("}", ")")


def render_comment(suggestion: Suggestion, threshold_note: bool, system: str = "github") -> str:
    """The pmkb comment for a ticket: GitHub Markdown, or Jira wiki markup when ``system="jira"``.

    ``threshold_note`` adds a closing line explaining that labels are applied only above the
    confidence threshold.
    """
    s, gh = suggestion, system == "github"
    code = (lambda t: f"`{t}`") if gh else (lambda t: "{{" + t + "}}")
    bold = (lambda t: f"**{t}**") if gh else (lambda t: f"*{t}*")
    lines = [GITHUB_MARKER if gh else JIRA_MARKER]
    heading = "### " if gh else "h3. "
    if s.abstained:
        lines.append(f"{heading}pmkb is not sure about the root cause")
        lines.append(f"No labels were applied: {TOO_LITTLE_ADVICE}. Candidates so far:"
                     if s.abstain_reason == TOO_LITTLE_TEXT else
                     f"The best guess is at {s.root_cause_confidence:.0%}, below the confidence threshold, "
                     "so no labels were applied. Candidates:")
        lines += [f"{'1.' if gh else '#'} {code(c.id)} {c.confidence:.0%}" for c in s.root_cause_candidates]
    else:
        lines.append(f"{heading}pmkb suggestion: {s.root_cause_name} ({code(s.root_cause)}, "
                     f"{s.root_cause_dimension}) at {s.root_cause_confidence:.0%}")
        others = ", ".join(f"{code(c.id)} {c.confidence:.0%}" for c in s.root_cause_candidates[1:3])
        if others:
            lines.append(f"Next candidates: {others}")
    suspect = ", ".join(f"{k} {_clean(v, system, 60)}" for k, v in (s.suspect or {}).items())
    lines.append(f"{bold('Symptom:')} {code(s.symptom)} {s.symptom_confidence:.0%}. "
                 f"{bold('Retry safe:')} {'yes' if s.retry_safe else 'no'}"
                 + (f". {bold('Suspect:')} {suspect}" if suspect else ""))
    if s.node_history:
        lines.append(f"{bold('Seen before:')} {_clean(s.node_history.summary(), system, 600)}")
    labels = suggestion_labels(s)
    lines.append(f"{bold('Labels:')} " + (" ".join(code(label) for label in labels) if labels else "none"))
    if s.explanation:
        lines += ["", _clean(s.explanation, system, 600)]
    bullet = "-" if gh else "*"
    if s.evidence:
        lines += ["", bold("Evidence")]
        lines += [f"{bullet} {code(e.signal)}: {code(_clean(e.text, system, 160))} -> {e.points_to}: "
                  f"{_clean(e.explanation, system)}" for e in s.evidence[:6]]
    if s.similar_incidents:
        lines += ["", bold("Similar incidents")]
        lines += [f"{bullet} {bold(_clean(h.id, system, 80))} ({h.score:.2f}): {_clean(h.title, system, 120)} "
                  f"({h.root_cause or 'unlabelled'} -> {h.mitigation or '-'})" for h in s.similar_incidents]
    if s.mitigations:
        lines += ["", bold("Mitigation")]
        for m in s.mitigations:
            seen = f" (as in {', '.join(m.from_incidents[:3])})" if m.from_incidents else ""
            lines.append(f"{'1.' if gh else '#'} {bold(m.id)} {m.confidence:.0%}: "
                         f"{_clean(m.next_step, system, 300)}{seen}")
    if s.low_gpu_utilisation:
        lines += ["", bold("Low GPU utilisation checks")]
        lines += [f"{bullet} {h.name}: {_clean(h.fix, system, 300)}" for h in s.low_gpu_utilisation]
    footer = [s.trace.get("engine", "pmkb"), "this comment is updated when the ticket changes"]
    if threshold_note:
        footer.append("labels are applied only when the top root cause reaches the confidence threshold; "
                      "below it pmkb lists candidates instead")
    lines += ["", f"<sub>{'; '.join(footer)}.</sub>" if gh else "_" + "; ".join(footer) + "._"]
    return "\n".join(lines)


def labels_in_comment(body: str) -> list[str]:
    """The labels a pmkb comment says were applied (from its Labels line)."""
    match = _LABELS_LINE.search(body)
    return _LABEL.findall(match.group(1)) if match else []


class _Api:
    """A thin REST client for one ticket system: base URL, headers, error mapping."""

    def __init__(self, settings: Settings, ref: TicketRef, client: httpx.Client):
        self.ref, self.client = ref, client
        if ref.system == "github":
            if settings.github_token is None:
                raise WriteBackError("PMKB_GITHUB_TOKEN is not set: set it, or run with --dry-run", False)
            self.base = settings.github_api_url.rstrip("/")
            self.headers = {"Authorization": f"Bearer {settings.github_token.get_secret_value()}",
                            "Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        else:
            if not settings.jira_url or settings.jira_token is None:
                raise WriteBackError("PMKB_JIRA_URL and PMKB_JIRA_TOKEN must be set: set them, or run "
                                     "with --dry-run", False)
            self.base = settings.jira_url.rstrip("/")
            token = settings.jira_token.get_secret_value()
            # Jira Cloud API tokens go with the account e-mail as Basic auth ("me@example.com:token");
            # Jira Data Center personal access tokens are Bearer tokens.
            auth = (f"Basic {base64.b64encode(token.encode()).decode()}" if ":" in token
                    else f"Bearer {token}")
            self.headers = {"Authorization": auth, "Accept": "application/json",
                            "Content-Type": "application/json"}
        self.timeout = settings.writeback_timeout

    def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
             ok_missing: bool = False) -> httpx.Response:
        """One request; raises WriteBackError (retryable for 5xx, 429, rate limits, network errors)."""
        try:
            resp = self.client.request(method, self.base + path, json=body, params=params,
                                       headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise WriteBackError(f"{method} {path} for {self.ref.key}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 404 and ok_missing:
            return resp
        if resp.status_code >= 400:
            limited = resp.status_code == 429 or (resp.status_code == 403 and
                                                  resp.headers.get("x-ratelimit-remaining") == "0")
            raise WriteBackError(f"{method} {path} for {self.ref.key}: HTTP {resp.status_code}: "
                                 f"{resp.text[:300]}", retryable=limited or resp.status_code >= 500)
        return resp


def _github_comments(api: _Api, owner: str, repo: str, number: int) -> list[dict]:
    comments, page = [], 1
    while True:
        resp = api.call("GET", f"/repos/{owner}/{repo}/issues/{number}/comments",
                        params={"per_page": 100, "page": page})
        comments += resp.json()
        if "next" not in resp.links:
            return comments
        page += 1


def _jira_comments(api: _Api, key: str) -> list[dict]:
    comments, start = [], 0
    while True:
        data = api.call("GET", f"/rest/api/2/issue/{key}/comment",
                        params={"startAt": start, "maxResults": 100}).json()
        batch = data.get("comments") or []
        comments += batch
        start += len(batch)
        if not batch or start >= data.get("total", 0):
            return comments


def _own_comment(comments: list[dict]) -> dict | None:
    return next((c for c in comments if MARKER_TOKEN in (c.get("body") or "")), None)


def _dry_run(outbox: Path, ref: TicketRef, labels: list[str], body: str) -> dict:
    at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    if ref.system == "github":
        owner, repo, number = ref.github_parts()
        base = f"/repos/{owner}/{repo}/issues/{number}"
        actions = ([{"action": "add_labels", "method": "POST", "path": f"{base}/labels", "json": {"labels": labels}}]
                   if labels else [])
        actions.append({"action": "upsert_comment", "method": "POST", "path": f"{base}/comments",
                        "json": {"body": body}})
    else:
        base = f"/rest/api/2/issue/{ref.key}"
        actions = ([{"action": "add_labels", "method": "PUT", "path": base,
                     "json": {"update": {"labels": [{"add": label} for label in labels]}}}] if labels else [])
        actions.append({"action": "upsert_comment", "method": "POST", "path": f"{base}/comment",
                        "json": {"body": body}})
    outbox.parent.mkdir(parents=True, exist_ok=True)
    with outbox.open("a", encoding="utf-8") as sink:
        for action in actions:
            sink.write(json.dumps({"at": at, "system": ref.system, "ticket": ref.key, **action},
                                  ensure_ascii=False) + "\n")
    return {"system": ref.system, "ticket": ref.key, "dry_run": True, "outbox": str(outbox),
            "labels_added": labels, "labels_removed": [], "comment": "planned", "comment_id": None}


def write_back(settings: Settings, ref: TicketRef, suggestion: Suggestion, outbox: Path | None = None,
               client: httpx.Client | None = None) -> dict:
    """Label the ticket and create or update the one pmkb comment; returns what was done.

    ``outbox`` (or ``settings.writeback_outbox``) makes it a dry run that only records the calls.
    """
    labels = suggestion_labels(suggestion)
    body = render_comment(suggestion, threshold_note=True, system=ref.system)
    outbox = outbox or settings.writeback_outbox
    if outbox is not None:
        return _dry_run(Path(outbox), ref, labels, body)
    own_client = client is None
    client = client or httpx.Client()
    try:
        api = _Api(settings, ref, client)
        if ref.system == "github":
            owner, repo, number = ref.github_parts()
            existing = _own_comment(_github_comments(api, owner, repo, number))
        else:
            existing = _own_comment(_jira_comments(api, ref.key))
        removed = [x for x in labels_in_comment(existing["body"]) if x not in labels] if existing else []
        if ref.system == "github":
            issue = f"/repos/{owner}/{repo}/issues/{number}"
            if labels:
                api.call("POST", f"{issue}/labels", {"labels": labels})
            for label in removed:
                api.call("DELETE", f"{issue}/labels/{quote(label, safe='')}", ok_missing=True)
            comment_path = f"/repos/{owner}/{repo}/issues/comments/{existing['id']}" if existing else None
            update_method, create_path = "PATCH", f"{issue}/comments"
        else:
            issue = f"/rest/api/2/issue/{ref.key}"
            ops = [{"add": x} for x in labels] + [{"remove": x} for x in removed]
            if ops:
                api.call("PUT", issue, {"update": {"labels": ops}})
            comment_path = f"{issue}/comment/{existing['id']}" if existing else None
            update_method, create_path = "PUT", f"{issue}/comment"
        if existing and existing.get("body") == body:
            outcome, comment_id = "unchanged", existing["id"]
        elif existing:
            api.call(update_method, comment_path, {"body": body})
            outcome, comment_id = "updated", existing["id"]
        else:
            outcome, comment_id = "created", api.call("POST", create_path, {"body": body}).json().get("id")
    finally:
        if own_client:
            client.close()
    return {"system": ref.system, "ticket": ref.key, "dry_run": False, "labels_added": labels,
            "labels_removed": removed, "comment": outcome, "comment_id": comment_id}
