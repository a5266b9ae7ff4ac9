"""REST access to one GitHub or Jira ticket for the write-back: auth, errors, retry hints, identity.

Each client is a ``TicketSystem``, as is the dry run's outbox (kb/tickets/outbox.py): the
write-back speaks to all three the same way. It trusts only comments written by the account
behind the token, so each can say who that account is (``identity``) and whether a comment is
by it (``Identity.owns``).
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, model_validator

from kb.core.settings import Settings

_GITHUB_KEY = re.compile(r"^([\w.-]+)/([\w.-]+)#(\d+)$")
_JIRA_KEY = re.compile(r"^[A-Z][A-Z0-9_]*-\d+$")


class WriteBackError(RuntimeError):
    """A call to the ticket system failed.

    ``retryable`` says whether trying again may help. ``retry_after`` is how many seconds the
    ticket system asked the caller to wait before trying again: its ``Retry-After`` header (seconds
    or an HTTP date), or GitHub's ``x-ratelimit-reset`` when ``x-ratelimit-remaining`` is 0. It is
    None when the answer gave no hint (and for errors that are not retryable); a scheduler should
    then use its own backoff.
    """

    def __init__(self, message: str, retryable: bool = True, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


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


_SECONDARY_LIMIT = re.compile(r"secondary rate limit|abuse detection|rate limit exceeded", re.IGNORECASE)
"""GitHub's words for a rate limit that comes without rate-limit headers."""
_NOT_A_USER = re.compile(r"not accessible by integration", re.IGNORECASE)
"""GitHub's answer to GET /user for an App installation token."""
MIN_LIMIT_WAIT = 60.0
"""Seconds to wait on a rate limit that names no time (GitHub asks for at least a minute)."""


def retry_after_seconds(headers: httpx.Headers | dict, now: float | None = None) -> float | None:
    """Seconds an answer's headers ask the client to wait before its next call; None without a hint."""
    headers = httpx.Headers(headers)
    now = datetime.now(timezone.utc).timestamp() if now is None else now
    hint = (headers.get("retry-after") or "").strip()
    if hint.isdigit():
        return float(hint)
    if hint:
        try:
            when = parsedate_to_datetime(hint)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
            return max(0.0, when.timestamp() - now)
    reset = (headers.get("x-ratelimit-reset") or "").strip()
    if headers.get("x-ratelimit-remaining") == "0" and reset.isdigit():
        return max(0.0, float(reset) - now)
    return None


@dataclass(frozen=True)
class Identity:
    """The account a token writes as: a GitHub login, a GitHub App's bot, or a Jira user field."""

    github_login: str | None = None  # None on GitHub: an App installation token, whose login is unknown
    github_app: bool = False  # GitHub: any App's own bot account ("<slug>[bot]") counts as pmkb
    jira_user: tuple[str, str] | None = None  # ("accountId" | "key" | "name", value)

    def owns(self, comment: dict) -> bool:
        """Whether this account wrote the comment."""
        if self.jira_user is not None:
            field, value = self.jira_user
            return (comment.get("author") or {}).get(field) == value
        login = ((comment.get("user") or {}).get("login") or "").lower()
        if self.github_login:
            return login == self.github_login.lower()
        # A person acting through an App has the App in performed_via_github_app too, but their own login.
        app = (comment.get("performed_via_github_app") or {}).get("slug")
        return self.github_app and bool(app) and login == f"{app}[bot]".lower()


_IDENTITIES: dict[str, Identity] = {}
"""Identity per (system, base URL, token, configured login), looked up once per process."""


def forget_identities() -> None:
    """Forget the accounts looked up so far: the next call asks the ticket system again."""
    _IDENTITIES.clear()


@runtime_checkable
class TicketSystem(Protocol):
    """Where the write-back writes one ticket's suggestion: GitHub, Jira, or the dry run's outbox."""

    ref: TicketRef  # the ticket written to

    def identity(self) -> Identity:
        """The account behind the token."""

    def comments(self) -> list[dict]:
        """All comments on the ticket, oldest first."""

    def labels(self) -> list[str]:
        """The ticket's current labels."""

    def change_labels(self, add: list[str], remove: list[str]) -> None:
        """Add and remove labels (nothing is called when both are empty)."""

    def create_comment(self, body: str) -> str | int | None:
        """Post a comment; returns its id."""

    def update_comment(self, comment_id: str | int, body: str) -> None:
        """Replace the body of a comment."""

    def outcome(self) -> dict:
        """What a write-back to it reports besides the labels and the comment (``dry_run`` at least)."""


class _RestClient:
    """Base URL, headers, one-request error mapping and the identity cache of one ticket system."""

    def __init__(self, ref: TicketRef, client: httpx.Client, base: str, headers: dict, timeout: float,
                 token: str, login: str | None = None):
        self.ref, self.client, self.base, self.headers, self.timeout = ref, client, base.rstrip("/"), headers, timeout
        self._cache_key = hashlib.sha256(f"{ref.system}\n{self.base}\n{token}\n{login}".encode()).hexdigest()

    def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
             accept: tuple[int, ...] = ()) -> httpx.Response:
        """One request; raises WriteBackError unless the status is < 400 or in ``accept``.

        Retryable: 5xx, 429, rate-limited 403 and network errors; the error carries the answer's
        retry hint.
        """
        try:
            resp = self._request(method, path, body, params)
        except httpx.HTTPError as exc:
            raise WriteBackError(f"{method} {path} for {self.ref.key}: {type(exc).__name__}: {exc}") from exc
        status = resp.status_code
        # GitHub answers its rate limits with 403 as well as 429: primary (remaining 0), secondary
        # (Retry-After, or no header at all and a message saying so).
        secondary = status == 403 and _SECONDARY_LIMIT.search(resp.text[:2000]) is not None
        limited = status == 429 or secondary or (status == 403 and (resp.headers.get("x-ratelimit-remaining") == "0"
                                                                    or "retry-after" in resp.headers))
        if status < 400 or (status in accept and not limited):
            return resp
        retryable = limited or status >= 500
        wait = retry_after_seconds(resp.headers) if retryable else None
        if limited and wait is None:
            wait = MIN_LIMIT_WAIT  # GitHub asks for at least a minute when it names no time
        limit = f" rate limited: the ticket system asks to wait {wait:.0f} s, not a token problem;" if limited else ""
        raise WriteBackError(f"{method} {path} for {self.ref.key}: HTTP {status}{limit} {resp.text[:300]}",
                             retryable=retryable, retry_after=wait)

    def _request(self, method: str, path: str, body: dict | None, params: dict | None) -> httpx.Response:
        """The whole answer within ``self.timeout`` seconds from the start of the call: httpx's
        timeouts bound each read, so an answer sent a byte at a time is cut at the deadline."""
        deadline = time.monotonic() + self.timeout
        with self.client.stream(method, self.base + path, json=body, params=params, headers=self.headers,
                                timeout=self.timeout) as resp:
            chunks = []
            for chunk in resp.iter_raw():  # as sent: the new Response decodes it by its headers
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"the answer took longer than {self.timeout:g} s "
                                            "(PMKB_WRITEBACK_TIMEOUT, a deadline for the whole call)")
        return httpx.Response(resp.status_code, headers=resp.headers, content=b"".join(chunks), request=resp.request)

    def identity(self) -> Identity:
        """The account behind the token, asked of the ticket system once per process."""
        known = _IDENTITIES.get(self._cache_key)
        if known is None:
            known = _IDENTITIES[self._cache_key] = self._lookup_identity()
        return known

    def _lookup_identity(self) -> Identity:
        raise NotImplementedError

    def outcome(self) -> dict:
        """A call to the ticket system itself: no dry run."""
        return {"dry_run": False}


class GitHubTicketApi(_RestClient):
    """One GitHub issue over the REST API."""

    def __init__(self, settings: Settings, ref: TicketRef, client: httpx.Client):
        if settings.github_token is None:
            raise WriteBackError("PMKB_GITHUB_TOKEN is not set: set it, or run with --dry-run", False)
        token = settings.github_token.get_secret_value()
        super().__init__(ref, client, settings.github_api_url, {
            "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28"}, settings.writeback_timeout, token, settings.github_bot_login)
        self.login = settings.github_bot_login
        owner, repo, number = ref.github_parts()
        self.issue = f"/repos/{owner}/{repo}/issues/{number}"
        self.repo = f"/repos/{owner}/{repo}"

    def _lookup_identity(self) -> Identity:
        if self.login:
            return Identity(github_login=self.login)
        resp = self.call("GET", "/user", accept=(403, 404))
        if resp.status_code == 404 or _NOT_A_USER.search(resp.text[:2000]):  # an App installation token is no user
            return Identity(github_app=True)
        if resp.status_code == 403:  # any other refusal says nothing about the account: not remembered
            raise WriteBackError(f"GET /user for {self.ref.key}: HTTP 403: {resp.text[:300]}", retryable=True,
                                 retry_after=retry_after_seconds(resp.headers) or MIN_LIMIT_WAIT)
        return Identity(github_login=resp.json()["login"])

    def comments(self) -> list[dict]:
        """All comments on the issue, every page."""
        comments, page = [], 1
        while True:
            resp = self.call("GET", f"{self.issue}/comments", params={"per_page": 100, "page": page})
            comments += resp.json()
            if "next" not in resp.links:
                return comments
            page += 1

    def labels(self) -> list[str]:
        """The issue's labels, from the issue itself."""
        found = self.call("GET", self.issue).json().get("labels") or []
        return [x if isinstance(x, str) else x.get("name", "") for x in found]

    def change_labels(self, add: list[str], remove: list[str]) -> None:
        """POST the new labels, DELETE the dropped ones (one already gone is fine)."""
        if add:
            self.call("POST", f"{self.issue}/labels", {"labels": add})
        for label in remove:
            self.call("DELETE", f"{self.issue}/labels/{quote(label, safe='')}", accept=(404,))

    def create_comment(self, body: str) -> int | None:
        """POST a comment on the issue."""
        return self.call("POST", f"{self.issue}/comments", {"body": body}).json().get("id")

    def update_comment(self, comment_id: str | int, body: str) -> None:
        """PATCH a comment of the repository."""
        self.call("PATCH", f"{self.repo}/issues/comments/{comment_id}", {"body": body})


class JiraTicketApi(_RestClient):
    """One Jira issue over the REST API v2 (Cloud and Data Center)."""

    def __init__(self, settings: Settings, ref: TicketRef, client: httpx.Client):
        if not settings.jira_url or settings.jira_token is None:
            raise WriteBackError("PMKB_JIRA_URL and PMKB_JIRA_TOKEN must be set: set them, or run "
                                 "with --dry-run", False)
        token = settings.jira_token.get_secret_value()
        super().__init__(ref, client, settings.jira_url, {
            "Authorization": jira_auth(token), "Accept": "application/json", "Content-Type": "application/json"},
            settings.writeback_timeout, token)
        self.issue = f"/rest/api/2/issue/{ref.key}"

    def _lookup_identity(self) -> Identity:
        me = self.call("GET", "/rest/api/2/myself").json()
        # Cloud identifies users by accountId only; Data Center by key (stable) and name (renamable).
        field = next((f for f in ("accountId", "key", "name") if me.get(f)), None)
        if field is None:
            raise WriteBackError(f"GET /rest/api/2/myself for {self.ref.key}: no accountId, key or name in the "
                                 "answer, so pmkb cannot tell its own comments", False)
        return Identity(jira_user=(field, me[field]))

    def comments(self) -> list[dict]:
        """All comments on the issue, every page."""
        comments, start = [], 0
        while True:
            data = self.call("GET", f"{self.issue}/comment", params={"startAt": start, "maxResults": 100}).json()
            batch = data.get("comments") or []
            comments += batch
            start += len(batch)
            if not batch or start >= data.get("total", 0):
                return comments

    def labels(self) -> list[str]:
        """The issue's labels field."""
        return self.call("GET", self.issue, params={"fields": "labels"}).json().get("fields", {}).get("labels") or []

    def change_labels(self, add: list[str], remove: list[str]) -> None:
        """One PUT with an add or remove operation per label."""
        ops = [{"add": x} for x in add] + [{"remove": x} for x in remove]
        if ops:
            self.call("PUT", self.issue, {"update": {"labels": ops}})

    def create_comment(self, body: str) -> str | None:
        """POST a comment on the issue."""
        return self.call("POST", f"{self.issue}/comment", {"body": body}).json().get("id")

    def update_comment(self, comment_id: str | int, body: str) -> None:
        """PUT a new body on one of the issue's comments."""
        self.call("PUT", f"{self.issue}/comment/{comment_id}", {"body": body})


def jira_auth(token: str) -> str:
    """The Authorization header for a Jira token: Jira Cloud API tokens go with the account e-mail
    as Basic auth ("me@example.com:token"); Jira Data Center personal access tokens are Bearer tokens."""
    return f"Basic {base64.b64encode(token.encode()).decode()}" if ":" in token else f"Bearer {token}"


def ticket_api(settings: Settings, ref: TicketRef, client: httpx.Client) -> TicketSystem:
    """The REST client for the ticket's system; raises WriteBackError when its token is not set."""
    return (GitHubTicketApi if ref.system == "github" else JiraTicketApi)(settings, ref, client)
