"""Someone else's text made inert for the markup of the ticket system it is written to.

Everything a comment quotes from the knowledge base (a similar incident's id, title and source),
from the ticket (evidence lines, the suspect node) or from a model (the explanation) may carry
markup meant to act: a Markdown or Jira link to a script, raw HTML, ``<!--`` that hides the rest
of the comment, a ``[~accountid:...]`` or ``@team`` mention that pings people, a Jira image
``!https://...!`` that calls out when the comment is viewed, a bare address that the tracker turns
into a link. ``inert`` renders such text so that it shows as the characters it is and does nothing;
``inert_code`` does the same for text inside a code span. Links are made only by ``thread_link``,
and only to hosts the operator allows.

Targets: ``github`` (GitHub Flavored Markdown, with HTML) and ``jira`` (Jira wiki markup, which
the REST API v2 that pmkb writes through takes; an Atlassian Document Format body would carry
the same text in text nodes, which hold no markup at all).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

TARGETS = ("github", "jira")
ZWSP = "\u200b"
"""A zero-width space: breaks a mention, an issue reference or a bare address without showing."""

_MARKDOWN_ESCAPED = set("\\`*_{}[]|~")
_BLOCK_START = re.compile(r"^(?:[#+=-]|\d+(?=[.)]))")
"""What would open a heading, a list or a rule when the text starts a line."""
_HTML_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;", '"': "&quot;"}
_JIRA_ESCAPED = set("\\[]{}|*_+^~!?#")
_JIRA_DASH = re.compile(r"(?:^|(?<=\s))-|-(?=\s|$)")
"""A dash that could open or close a strike-through (inside a word, as in an id, it cannot)."""
_JIRA_BLOCK = re.compile(r"^(?:bq|h[1-6])\.")
"""A Jira heading or quote when the text starts a line."""
_BARE_ADDRESS = re.compile(r"(?i)\b(https?|ftp|file|mailto|javascript|data)(:)|\b(www)(\.)")
_REFERENCE = re.compile(r"([@#])(?=\w)")


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _defuse(text: str) -> str:
    """Bare addresses, mentions and issue references broken by a zero-width space."""
    text = _BARE_ADDRESS.sub(lambda m: f"{m[1]}{ZWSP}{m[2]}" if m[1] else f"{m[3]}{ZWSP}{m[4]}", text)
    return _REFERENCE.sub(lambda m: m[1] + ZWSP, text)


def _check(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"unknown comment markup {target!r}; available: {', '.join(TARGETS)}")


def inert(text: str, target: str, width: int = 200) -> str:
    """``text`` on one line, at most ``width`` characters, rendered as plain text in ``target``'s markup."""
    _check(target)
    text = _defuse(_shorten(text, width))
    if target == "github":
        text = "".join(_HTML_ENTITIES.get(c) or (f"\\{c}" if c in _MARKDOWN_ESCAPED else c) for c in text)
        start = _BLOCK_START.match(text)
        return text if not start else f"{start[0]}\\{text[len(start[0]):]}" if start[0].isdigit() else f"\\{text}"
    text = _JIRA_BLOCK.sub(lambda m: m[0][0] + ZWSP + m[0][1:], text)
    text = "".join(f"\\{c}" if c in _JIRA_ESCAPED else c for c in text)
    return _JIRA_DASH.sub(r"\\-", text)


def inert_code(text: str, target: str, width: int = 160) -> str:
    """``text`` for the inside of a code span: GitHub shows a code span as typed, so only the
    backtick that would close it goes; Jira renders markup inside ``{{...}}``, so it is escaped."""
    _check(target)
    text = _defuse(_shorten(text, width))
    return text.replace("`", "'") if target == "github" else inert(text, target, width)


PLAIN_HTTPS = re.compile(r"https://[A-Za-z0-9.-]+(?::\d{1,5})?(?:/[A-Za-z0-9._~%/+-]*)?")
"""An address that may be linked: https, and no character that could end a Markdown or Jira link,
open another one or carry a query."""


def host_of(url: str | None) -> str | None:
    """The lower-case host of an address, or None when it has none."""
    try:
        return (urlsplit(url or "").hostname or "").lower() or None
    except ValueError:
        return None


def thread_link(source: str, target: str, hosts: Iterable[str]) -> str:
    """A link to where a similar incident was reported, or "" unless its source is a plain https
    address on one of ``hosts`` (exact host names; a subdomain is another host)."""
    _check(target)
    if not PLAIN_HTTPS.fullmatch(source or "") or host_of(source) not in {h.lower() for h in hosts}:
        return ""
    return f" [thread]({source})" if target == "github" else f" [thread|{source}]"
