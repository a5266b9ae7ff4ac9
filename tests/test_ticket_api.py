"""GitHub and Jira REST calls: which account is pmkb's, and the retry hints carried by errors."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import httpx
import pytest
from fake_ticket_api import FakeTicketApi, api_settings
from test_writeback import make_suggestion

from kb.core.settings import Settings
from kb.tickets.api import forget_identities, retry_after_seconds
from kb.tickets.writeback import (
    GITHUB_MARKER,
    JIRA_MARKER,
    TicketRef,
    WriteBackError,
    write_back,
)


def test_github_app_installation_token_owns_only_its_bot_comments(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#23")
    with FakeTicketApi() as api:
        api.github_app = "pmkb-app"
        api.post_as_stranger(ref.key, GITHUB_MARKER + "\nby a person")
        # A person acting through the same App: the App is named, but the login is theirs.
        api.comments[ref.key].append({"id": 1, "body": GITHUB_MARKER + "\nvia the app", "user": {"login": "mallory"},
                                      "performed_via_github_app": {"slug": "pmkb-app"}})
        settings = api_settings(tmp_path, api)
        first = write_back(settings, ref, make_suggestion())
        assert first["comment"] == "created"
        assert api.comments[ref.key][-1]["user"]["login"] == "pmkb-app[bot]"
        second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert second["comment"] == "updated" and second["comment_id"] == first["comment_id"]
        assert [c["body"].split("\n")[1] for c in api.comments[ref.key][:2]] == ["by a person", "via the app"]
        assert sum(r["path"] == "/user" for r in api.requests) == 1  # 403 once, then remembered

        api.requests.clear()  # a configured login is used as it is: no lookup
        pinned = api_settings(tmp_path, api, github_bot_login="pmkb-app[bot]")
        assert write_back(pinned, ref, make_suggestion(root_cause="buggy_code", dimension="user"))[
            "comment"] == "unchanged"
        assert all(r["path"] != "/user" for r in api.requests)
        other_login = api_settings(tmp_path, api, github_bot_login="someone-else")
        assert write_back(other_login, ref, make_suggestion())["comment"] == "created"


@pytest.mark.parametrize("myself", [{"accountId": "557058:pmkb-bot"}, {"name": "pmkb", "key": "JIRAUSER10100"}],
                         ids=["cloud", "data-center"])
def test_jira_owns_only_comments_of_the_account_behind_the_token(tmp_path, myself):
    ref = TicketRef(system="jira", key="OPS-24")
    with FakeTicketApi() as api:
        api.jira_myself = myself
        api.strangers["other-token"] = "pmkb"  # same display name and name, another account
        api.post_as_stranger(ref.key, JIRA_MARKER + "\nLabels: rc:team_label", token="other-token")
        settings = api_settings(tmp_path, api)
        first = write_back(settings, ref, make_suggestion())
        second = write_back(settings, ref, make_suggestion(root_cause="buggy_code", dimension="user"))
        assert (first["comment"], second["comment"]) == ("created", "updated")
        assert second["comment_id"] == first["comment_id"] and len(api.comments[ref.key]) == 2
        assert api.comments[ref.key][0]["body"] == JIRA_MARKER + "\nLabels: rc:team_label"
        if "key" in myself:  # Data Center: the key decides, not the (renamable) name
            api.jira_myself = {"name": "pmkb", "key": "JIRAUSER99999"}
            forget_identities()
            assert write_back(settings, ref, make_suggestion())["comment"] == "created"


def test_retry_after_seconds_reads_each_kind_of_hint():
    now = 1_800_000_000.0
    assert retry_after_seconds({"Retry-After": "120"}, now) == 120.0
    date = format_datetime(datetime.fromtimestamp(now + 90, timezone.utc), usegmt=True)
    assert retry_after_seconds({"Retry-After": date}, now) == 90.0
    past = format_datetime(datetime.fromtimestamp(now - 90, timezone.utc), usegmt=True)
    assert retry_after_seconds({"Retry-After": past}, now) == 0.0
    reset = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(now) + 300)}
    assert retry_after_seconds(reset, now) == 300.0
    assert retry_after_seconds({**reset, "x-ratelimit-remaining": "12"}, now) is None
    assert retry_after_seconds({**reset, "Retry-After": "5"}, now) == 5.0  # the explicit hint wins
    for junk in ({}, {"Retry-After": "soon"}, {"Retry-After": "-3"}, {"Retry-After": "1e9"}, {"Retry-After": "nan"},
                 {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "tomorrow"}):
        assert retry_after_seconds(junk, now) is None


def test_write_back_errors_carry_the_retry_hint(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#25")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        write_back(settings, TicketRef(system="github", key="octo/ops#1"), make_suggestion())  # GET /user done
        reset = int(time.time()) + 600
        cases = [(429, {"Retry-After": "7"}, True, 7.0),
                 (503, {"Retry-After": format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120),
                                                       usegmt=True)}, True, 120.0),
                 (403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}, True, 600.0),
                 (403, {"Retry-After": "60"}, True, 60.0),  # GitHub's secondary rate limit
                 (502, {}, True, None),
                 (403, {"x-ratelimit-remaining": "4999"}, False, None),  # a permission error
                 (404, {"Retry-After": "9"}, False, None)]
        for status, headers, retryable, after in cases:
            api.fail_with(1, status, headers)
            with pytest.raises(WriteBackError, match=f"HTTP {status}") as failed:
                write_back(settings, ref, make_suggestion())
            assert failed.value.retryable is retryable, (status, headers)
            if after is None:
                assert failed.value.retry_after is None, (status, headers)
            else:
                assert after - 3 <= failed.value.retry_after <= after, (status, headers)
        api.fail_with(2, 429, {"Retry-After": "1"})  # the next two calls fail, the third answers
        for _ in range(2):
            with pytest.raises(WriteBackError):
                write_back(api_settings(tmp_path, api), ref, make_suggestion())
        assert write_back(settings, ref, make_suggestion())["comment"] == "created"
    with pytest.raises(WriteBackError, match="ConnectError") as down:  # the server is gone now
        write_back(settings, ref, make_suggestion(), client=httpx.Client())
    assert down.value.retryable is True and down.value.retry_after is None


def test_a_rate_limited_identity_lookup_is_retried_not_taken_for_an_app(tmp_path):
    ref = TicketRef(system="github", key="octo/ops#26")
    with FakeTicketApi() as api:
        settings = api_settings(tmp_path, api)
        api.fail_with(1, 403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 30)})
        with pytest.raises(WriteBackError, match="GET /user") as limited:
            write_back(settings, ref, make_suggestion())
        assert limited.value.retryable and 25 <= limited.value.retry_after <= 30
        api.post_as_stranger(ref.key, GITHUB_MARKER + "\nLabels: rc:team_label")
        assert write_back(settings, ref, make_suggestion())["comment"] == "created"  # the stranger's stays theirs
        assert api.comments[ref.key][0]["body"].endswith("rc:team_label")


class _TrickleHandler(http.server.BaseHTTPRequestHandler):
    """Answers 200 with a body sent one byte every 0.3 s (a slow or hostile API), or gzip JSON at once."""

    def do_GET(self):
        if self.path.startswith("/trickle"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "60")
            self.end_headers()
            try:
                for _ in range(60):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                pass
            return
        body = gzip.compress(json.dumps({"login": "pmkb-bot"}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_write_back_timeout_is_a_deadline_for_the_whole_call():
    from kb.tickets.api import GitHubTicketApi

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TrickleHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = Settings(github_api_url=f"http://127.0.0.1:{server.server_port}", github_token="t",
                            writeback_timeout=1.0)
        with httpx.Client() as client:
            api = GitHubTicketApi(settings, TicketRef(system="github", key="o/r#1"), client)
            assert api.call("GET", "/user").json() == {"login": "pmkb-bot"}  # gzip decoded once
            started = time.monotonic()
            with pytest.raises(WriteBackError, match="deadline for the whole call") as cut:
                api.call("GET", "/trickle")
            assert time.monotonic() - started < 2.5 and cut.value.retryable
    finally:
        server.shutdown()
        server.server_close()
