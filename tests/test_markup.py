"""Someone else's text in a ticket comment: shown as typed, never acting as markup (kb/tickets/markup.py)."""

from __future__ import annotations

import re

import pytest

from kb.core.settings import Settings
from kb.tickets.markup import ZWSP, inert, inert_code, thread_link

HOSTILE = [
    "[Fix: run this script](https://evil.example/fix.sh)",
    '<a href="https://evil.example">docs</a>',
    "<!-- everything after this is hidden",
    "[~accountid:5b10a2844c20165700ede21g] please look",
    "[see the runbook|https://evil.example/runbook]",
    "!https://evil.example/track.png!",
    "![x](https://evil.example/pixel.png)",
    "ping @oncall-team, fixed in #1234, see www.evil.example or https://evil.example",
    "{html}<script>alert(1)</script>{html} {color:red}x{color}",
    "# Heading",
    "1. list item",
    "h1. Heading",
]

LIVE = {
    "github": [re.compile(r"(?<!\\)\[[^\]\n]*(?<!\\)\]\("), re.compile(r"<[A-Za-z!/]"),
               re.compile(r"https?://"), re.compile(r"(?<![\\\w])www\."), re.compile(r"@\w"),
               re.compile(r"#\d"), re.compile(r"^(?:#|\d+\.\s)")],
    "jira": [re.compile(r"(?<!\\)[\[\]{}|!]"), re.compile(r"https?://"), re.compile(r"@\w"),
             re.compile(r"(?<!\\)~"), re.compile(r"www\."), re.compile(r"^(?:[#*-]\s|h\d\.|bq\.)")],
}
"""What would act in each target: a link, an image, raw HTML, a mention, a macro, a bare address,
an issue reference, a block at the start of a line."""


def live_markup(text: str, target: str) -> list[str]:
    """The pieces of ``text`` that would act as markup in ``target``."""
    return [m.group(0) for pattern in LIVE[target] for m in pattern.finditer(text)]


@pytest.mark.parametrize("target", ["github", "jira"])
@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_text_is_inert_and_keeps_its_characters(hostile, target):
    assert any(live_markup(hostile, t) for t in LIVE), "the case must hold live markup to begin with"
    shown = inert(hostile, target, width=400)
    assert live_markup(shown, target) == []
    unescaped = re.sub(r"\\(.)", r"\1", shown.replace(ZWSP, ""))
    if target == "github":
        unescaped = unescaped.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    assert unescaped == hostile


def test_code_spans_cannot_be_closed_and_jira_code_is_escaped():
    assert "`" not in inert_code("`rm -rf /` [x](https://e.example)", "github")
    assert live_markup(inert_code("[~accountid:1] !https://e.example/p.png!", "jira"), "jira") == []


def test_plain_identifiers_stay_readable():
    assert inert("hw-gpu-003 on gpu-a17 v1.2", "github") == "hw-gpu-003 on gpu-a17 v1.2"
    assert inert("a" * 300, "github", width=50).endswith("...") and len(inert("a" * 300, "github", 50)) == 50


def test_an_unknown_target_names_the_available_ones():
    with pytest.raises(ValueError, match="github, jira"):
        inert("x", "markdown")


@pytest.mark.parametrize(("source", "linked"), [
    ("https://github.com/NVIDIA/nccl/issues/905", True),
    ("https://GitHub.com/NVIDIA/nccl/issues/905", True),
    ("https://github.com.evil.example/NVIDIA/nccl/issues/905", False),
    ("https://evil.example/github.com/x", False),
    ("https://gist.github.com/x/1", False),  # a subdomain is another host
    ("https://github.com@evil.example/x", False),
    ("https://github.com/x)[click](https://evil.example", False),
    ("http://github.com/NVIDIA/nccl/issues/905", False),
    ("javascript:alert(1)", False),
])
def test_a_thread_is_linked_only_on_an_allowed_host(source, linked):
    for target in ("github", "jira"):
        link = thread_link(source, target, ["github.com"])
        assert bool(link) is linked, (source, target)
    assert thread_link(source, "github", []) == ""


def test_link_hosts_default_to_the_ticket_systems_own_host():
    settings = Settings(jira_url="https://ops.atlassian.example/")
    assert settings.link_hosts("github") == ["github.com"]
    assert settings.link_hosts("jira") == ["ops.atlassian.example"]
    assert Settings(github_api_url="https://ghe.corp.example/api/v3").link_hosts("github") == ["ghe.corp.example"]
    assert Settings().link_hosts("jira") == []
    chosen = Settings(comment_link_hosts="GitHub.com, wiki.corp.example")
    assert chosen.link_hosts("jira") == ["github.com", "wiki.corp.example"]
    assert Settings(comment_link_hosts="").link_hosts("github") == []
    with pytest.raises(ValueError, match="host names only"):
        Settings(comment_link_hosts="https://github.com")


def test_link_hosts_from_the_environment(monkeypatch):
    monkeypatch.setenv("PMKB_COMMENT_LINK_HOSTS", "github.com,tracker.corp.example")
    assert Settings().link_hosts("github") == ["github.com", "tracker.corp.example"]
