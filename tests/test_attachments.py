"""The bot's attached logs (kb/tickets/attachments.py): a Jira issue's attachments and linked GitHub
gists fetched by id from the ticket system's own API (tests/fake_ticket_api.py), bounded, and never
from an address a ticket names."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import httpx
import pytest
from fake_ticket_api import FakeTicketApi, api_settings

from kb.tickets.attachments import MAX_FILES, attached_logs
from pmkb.payloads import Ignored, jira_event

DATA = Path(__file__).resolve().parent / "data" / "collectives"
STALL = (DATA / "gloo-stall-interleaved.log").read_bytes()
GIST = "aa5c1f0e9d8b7c6a5f4e3d2c1b0a9f8e"


@pytest.fixture
def api():
    with FakeTicketApi() as fake:
        yield fake


def tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def jira_ticket(*attachments: tuple[str, str, int | None]) -> dict:
    return {"id": "OPS-9", "title": "job hangs", "description": "logs attached",
            "attachments": [{"id": i, "filename": n, "size": s} for i, n, s in attachments]}


def test_jira_attachments_are_fetched_by_id_with_the_bots_token_and_read_as_rank_logs(api, tmp_path):
    api.attachments = {"101": tarball({"job/rank0.log": b"step 1 ok\n", "job/out.log": STALL}),
                       "102": b"\x89PNG\r\n", "103": b"x" * 5000}
    settings = api_settings(tmp_path, api, attachment_max_bytes=4096)
    ticket = jira_ticket(("101", "logs.tar.gz", None), ("102", "screenshot.png", 6), ("103", "big.log", 5000))
    with httpx.Client() as client:
        found = attached_logs(settings, "jira", ticket, client)
    assert found.read == ["logs.tar.gz"]
    assert "Timed out waiting" in found.text and "[rank0]: step 1 ok" in found.text
    assert any("big.log" in note and "PMKB_ATTACHMENT_MAX_BYTES" in note for note in found.notes)
    fetched = [r["path"] for r in api.requests]
    assert fetched == ["/rest/api/2/attachment/content/101"]  # the picture is not fetched, nor the big file
    assert api.requests[0]["headers"]["authorization"] == "Bearer jira-token"


def test_a_file_over_the_cap_is_cut_while_it_streams_when_its_size_is_not_listed(api, tmp_path):
    api.attachments = {"7": b"y" * 50_000}
    with httpx.Client() as client:
        found = attached_logs(api_settings(tmp_path, api, attachment_max_bytes=4096), "jira",
                              jira_ticket(("7", "rank3.log", None)), client)
    assert found.read == [] and found.text == ""
    assert "over PMKB_ATTACHMENT_MAX_BYTES" in found.notes[0]


def test_a_redirect_is_followed_only_to_an_allowed_host_and_never_with_the_token(api, tmp_path):
    api.attachments = {"5": STALL}
    api.media_origin = api.url.replace("127.0.0.1", "localhost")  # another host name: Jira Cloud's media host
    ticket = jira_ticket(("5", "slurm-991.out", len(STALL)))
    with httpx.Client() as client:
        refused = attached_logs(api_settings(tmp_path, api), "jira", ticket, client)
        assert refused.read == [] and "localhost, which is not in PMKB_ATTACHMENT_HOSTS" in refused.notes[0]
        allowed = attached_logs(api_settings(tmp_path, api, attachment_hosts=["localhost"]), "jira", ticket, client)
    assert allowed.read == ["slurm-991.out"] and "Timed out waiting" in allowed.text
    media = [r for r in api.requests if r["path"] == "/media/5"]
    assert len(media) == 1 and "authorization" not in media[0]["headers"]


def test_a_tarball_that_unpacks_past_its_bound_is_cut_with_a_note(api, tmp_path):
    bomb = tarball({"rank0.log": b"\n" * 2_000_000})  # about 2 KB packed
    api.attachments = {"9": bomb}
    with httpx.Client() as client:
        found = attached_logs(api_settings(tmp_path, api), "jira", jira_ticket(("9", "logs.tgz", len(bomb))), client)
    assert found.text == "" and any("size limit" in note for note in found.notes)


def test_gists_linked_in_a_github_issue_are_read_through_the_api_and_other_links_never(api, tmp_path):
    api.gists = {GIST: {"rank2.log": {"filename": "rank2.log", "size": len(STALL), "truncated": False,
                                      "content": STALL.decode()},
                        "huge.log": {"filename": "huge.log", "size": 9_000_000, "truncated": True,
                                     "content": "", "raw_url": "https://evil.example/raw/huge.log"}}}
    body = (f"Job died, logs: https://gist.github.com/alice/{GIST} and https://gist.github.com/bob/{'b' * 32}\n"
            "Also see https://evil.example/rank1.log and http://169.254.169.254/latest/meta-data/")
    ticket = {"id": "o/r#3", "title": "NCCL timeout", "description": body}
    with httpx.Client() as client:
        found = attached_logs(api_settings(tmp_path, api), "github", ticket, client)
    assert found.read == [f"gist {GIST}/rank2.log"] and "Timed out waiting" in found.text
    assert any("huge.log" in n and "not on gist.githubusercontent.com" in n for n in found.notes)
    assert any(f"gist {'b' * 32}" in n and "HTTP 404" in n for n in found.notes)
    assert [r["path"] for r in api.requests] == [f"/gists/{GIST}", f"/gists/{'b' * 32}"]


def test_at_most_max_files_are_read_per_ticket(api, tmp_path):
    api.attachments = {str(n): b"ok\n" for n in range(MAX_FILES + 3)}
    ticket = jira_ticket(*[(str(n), f"rank{n}.log", 3) for n in range(MAX_FILES + 3)])
    with httpx.Client() as client:
        found = attached_logs(api_settings(tmp_path, api), "jira", ticket, client)
    assert len(found.read) == MAX_FILES and sum("past 10 files" in n for n in found.notes) == 3


def test_reading_attachments_can_be_turned_off_and_needs_jiras_token(api, tmp_path):
    api.attachments = {"1": STALL}
    ticket = jira_ticket(("1", "out.log", None))
    with httpx.Client() as client:
        assert attached_logs(api_settings(tmp_path, api, fetch_attachments=False), "jira", ticket, client).read == []
        no_token = api_settings(tmp_path, api)
        no_token.jira_token = None
        assert "PMKB_JIRA_TOKEN" in attached_logs(no_token, "jira", ticket, client).notes[0]
    assert api.requests == []


def test_the_jira_payload_keeps_well_formed_attachments_and_an_attachment_change_is_new_evidence():
    fields = {"summary": "hang", "description": "see logs", "attachment": [
        {"id": "10001", "filename": "rank0.log", "size": 12, "content": "https://evil.example/x"},
        {"id": "../../admin", "filename": "x.log"}, {"id": 10002, "filename": "rank1.log", "size": True},
        "not an object", {"id": "10003"}]}
    payload = {"webhookEvent": "jira:issue_updated", "issue": {"key": "OPS-1", "fields": fields},
               "changelog": {"items": [{"field": "Attachment", "toString": "rank0.log"}]}}
    event = jira_event(payload)
    assert event.ticket["attachments"] == [{"id": "10001", "filename": "rank0.log", "size": 12},
                                           {"id": "10002", "filename": "rank1.log", "size": None}]
    payload["changelog"]["items"] = [{"field": "labels", "toString": "rc:gpu_lost"}]
    with pytest.raises(Ignored):
        jira_event(payload)


def test_gzip_encoded_answers_are_bounded_as_decoded(api, tmp_path):
    """A server that sends a small gzip body (Content-Encoding) is held to the cap on what it decodes to."""
    api.attachments = {"4": gzip.compress(b"z" * 100_000)}
    settings = api_settings(tmp_path, api, attachment_max_bytes=4096)

    def fetch(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=api.attachments["4"])

    with httpx.Client(transport=httpx.MockTransport(fetch)) as client:
        found = attached_logs(settings, "jira", jira_ticket(("4", "rank0.log", 300)), client)
    assert found.read == [] and "over PMKB_ATTACHMENT_MAX_BYTES" in found.notes[0]
