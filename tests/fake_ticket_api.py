"""``FakeTicketApi``: the few GitHub and Jira REST endpoints pmkb uses, as a real HTTP server.

It listens on a free 127.0.0.1 port, keeps issues' comments (with their authors) and labels in
memory and records every request. Every token is pmkb's account except those in ``strangers``,
which act as other people.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

from kb.core.settings import Settings
from kb.tickets.api import forget_identities

_GH_COMMENTS = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_GH_COMMENT = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")
_GH_LABELS = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/labels(?:/(.+))?$")
_GH_ISSUE = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)$")
_JIRA_ATTACHMENT = re.compile(r"^/rest/api/2/attachment/content/(\d+)$")
_MEDIA = re.compile(r"^/media/(\d+)$")
_GIST = re.compile(r"^/gists/([0-9a-f]+)$")
_JIRA_ISSUE = re.compile(r"^/rest/api/2/issue/([A-Z][A-Z0-9_]*-\d+)(/comment(?:/(\d+))?)?$")


class FakeTicketApi:
    """GitHub and Jira REST endpoints in memory, on a free loopback port; records every request."""

    def __init__(self):
        self.requests: list[dict] = []
        # "o/r#1" -> [{"id", "body", "user", "performed_via_github_app"}], "OPS-1" -> [{"id", "body", "author"}]
        self.comments: dict[str, list[dict]] = {}
        self.labels: dict[str, list[str]] = {}
        self.missing: set[str] = set()  # tickets that answer 404
        self.fail_next = 0  # answer this many requests with 502
        self.fail_comment_writes = 0  # answer this many comment POSTs / PUTs / PATCHes with 502
        self.failures: list[tuple[int, dict, str | None]] = []  # answers for the next requests (fail_with)
        self.github_login = "pmkb-bot"  # the GitHub user behind pmkb's token (GET /user)
        self.github_app: str | None = None  # an App's slug: pmkb's token is its installation token
        # GET /rest/api/2/myself for pmkb's token: Jira Cloud's shape; Data Center's has name and key instead.
        self.jira_myself: dict = {"accountId": "557058:pmkb-bot", "displayName": "pmkb"}
        self.strangers: dict[str, str] = {"stranger-token": "mallory"}  # token -> someone else's login
        self.attachments: dict[str, bytes] = {}  # Jira attachment id -> content
        # Set: attachment content answers 303 to this origin's /media/<id> (Jira Cloud's media host),
        # served without a token.
        self.media_origin: str | None = None
        self.gists: dict[str, dict] = {}  # gist id -> its "files" mapping, as GET /gists/<id> answers
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
                raw_body = isinstance(body, bytes)
                data = body if raw_body else b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/octet-stream" if raw_body else "application/json")
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
        forget_identities()  # another fake may have had this port, with another account behind a token
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        forget_identities()

    def fail_with(self, count: int, status: int = 502, headers: dict | None = None, message: str | None = None) -> None:
        """Answer the next ``count`` requests with ``status``, these headers (Retry-After, rate limits)
        and this message."""
        with self._lock:
            self.failures += [(status, dict(headers or {}), message)] * count

    def post_as_stranger(self, key: str, body: str, token: str = "stranger-token") -> dict:
        """Post a comment through the API as the account of one of ``strangers``; returns it."""
        path = (f"/repos/{key.replace('#', '/issues/')}/comments" if "#" in key
                else f"/rest/api/2/issue/{key}/comment")
        return httpx.post(self.url + path, json={"body": body}, headers={"Authorization": f"Bearer {token}"}).json()

    def _github_user(self, token: str) -> tuple[dict, dict | None]:
        """The comment author and performed_via_github_app of a request with this token."""
        if token in self.strangers:
            return {"login": self.strangers[token], "type": "User"}, None
        if self.github_app:
            return {"login": f"{self.github_app}[bot]", "type": "Bot"}, {"slug": self.github_app,
                                                                          "name": self.github_app}
        return {"login": self.github_login, "type": "User"}, None

    def _jira_user(self, token: str) -> dict:
        if token in self.strangers:
            name = self.strangers[token]
            return {"accountId": f"557058:{name}", "name": name, "key": name, "displayName": name}
        return dict(self.jira_myself)

    def _new_comment(self, key: str, body: str, jira: bool, token: str = "") -> dict:
        if jira:
            author = {"author": self._jira_user(token)}
        else:
            user, app = self._github_user(token)
            author = {"user": user, "performed_via_github_app": app}
        with self._lock:
            self._next_id += 1
            comment = {"id": str(self._next_id) if jira else self._next_id, "body": body, **author}
            self.comments.setdefault(key, []).append(comment)
        if self.stall_after_create:
            time.sleep(self.stall_after_create)
        return comment

    def _find(self, comment_id: str) -> dict | None:
        return next((c for cs in self.comments.values() for c in cs if str(c["id"]) == comment_id), None)

    def route(self, r: dict) -> tuple[int, object, dict]:
        """Status, JSON body and headers for one recorded request."""
        with self._lock:
            if self.failures:
                status, headers, message = self.failures.pop(0)
                return status, {"message": message or f"failing on purpose with {status}"}, headers
            if self.fail_next:
                self.fail_next -= 1
                return 502, {"message": "bad gateway"}, {}
        if self.fail_comment_writes and r["method"] in ("POST", "PUT", "PATCH") and "/comment" in r["path"]:
            with self._lock:
                self.fail_comment_writes -= 1
            return 502, {"message": "bad gateway on the comment"}, {}
        if (m := _MEDIA.match(r["path"])) and m[1] in self.attachments:
            return 200, self.attachments[m[1]], {}
        if (m := _GIST.match(r["path"])) and r["method"] == "GET":  # public gists need no token
            return (200, {"id": m[1], "files": self.gists[m[1]]}, {}) if m[1] in self.gists else (
                404, {"message": "Not Found"}, {})
        if not r["headers"].get("authorization", "").startswith(("Bearer ", "Basic ")):
            return 401, {"message": "Requires authentication"}, {}
        method, path, body = r["method"], r["path"], r["json"]
        token = r["headers"]["authorization"].split(" ", 1)[1]
        if path == "/user" and method == "GET":
            if self.github_app and token not in self.strangers:
                return 403, {"message": "Resource not accessible by integration"}, {}
            return 200, {**self._github_user(token)[0], "id": 7}, {}
        if path == "/rest/api/2/myself" and method == "GET":
            return 200, self._jira_user(token), {}
        if (m := _JIRA_ATTACHMENT.match(path)) and method == "GET":
            if m[1] not in self.attachments:
                return 404, {"errorMessages": ["Attachment does not exist"]}, {}
            if self.media_origin:
                return 303, None, {"Location": f"{self.media_origin}/media/{m[1]}"}
            return 200, self.attachments[m[1]], {}
        if (m := _GH_ISSUE.match(path)) and method == "GET":
            key = f"{m[1]}#{m[2]}"
            if key in self.missing:
                return 404, {"message": "Not Found"}, {}
            return 200, {"number": int(m[2]), "labels": [{"name": x} for x in self.labels.get(key, [])]}, {}
        if m := _GH_COMMENTS.match(path):
            key = f"{m[1]}#{m[2]}"
            if key in self.missing:
                return 404, {"message": "Not Found"}, {}
            if method == "POST":
                return 201, self._new_comment(key, body["body"], jira=False, token=token), {}
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
                return 201, self._new_comment(key, body["body"], jira=True, token=token), {}
            if not comment_part and method == "GET":
                return 200, {"key": key, "fields": {"labels": list(self.labels.get(key, []))}}, {}
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


def api_settings(tmp_path, api: FakeTicketApi, **kw) -> Settings:
    """Settings that point write-back at the fake API."""
    return Settings(home=tmp_path, github_api_url=api.url, github_token="gh-token", jira_url=api.url,
                    jira_token="jira-token", **kw)
