"""The job logs a ticket carries beyond its text, fetched for the bot: a Jira issue's attachments
and the GitHub gists an issue links.

Ticket text is untrusted, and so is every address in it: pmkb never fetches a URL a ticket names.
It takes ids and fetches them from the ticket system's own API, with the bot's token:

- Jira: the attachments the webhook lists, by id, from ``PMKB_JIRA_URL``'s
  ``/rest/api/2/attachment/content/{id}``. Jira Cloud answers with a redirect to its media host; a
  redirect is followed only to a host in ``PMKB_ATTACHMENT_HOSTS`` (and the token is sent only to
  Jira itself).
- GitHub: a gist linked as ``https://gist.github.com/<user>/<id>``, by id, from
  ``PMKB_GITHUB_API_URL``'s ``/gists/{id}``; a file the API truncates is read from its ``raw_url``
  only on ``gist.githubusercontent.com`` (GitHub's own raw host).

Every file is bounded (``PMKB_ATTACHMENT_MAX_BYTES`` as sent, ``MAX_FILES`` per ticket, a tarball
unpacked within ``UNPACKED_FACTOR`` times its size) and every call by a deadline. Images, documents
and archives pmkb cannot read are skipped by name. A file that cannot be had costs only itself: it
becomes a note, and the ticket is annotated from what was read.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import httpx

from kb.core.rank_logs import RankLogError, read_upload, sources_as_text
from kb.core.settings import Settings
from kb.tickets.api import jira_auth

log = logging.getLogger(__name__)

MAX_FILES = 10  # files read per ticket; more are named in a note
UNPACKED_FACTOR = 8  # a tarball may unpack to this many times its size
MAX_REDIRECTS = 3
_GIST_LINK = re.compile(r"https://gist\.github\.com/(?:[A-Za-z0-9][A-Za-z0-9-]{0,38}/)?([0-9a-f]{20,40})\b")
_GIST_RAW_HOST = "gist.githubusercontent.com"
# Files that are never a job's logs: pictures, documents, media, and archives the log reader cannot open.
_NOT_LOGS = re.compile(r"\.(?:png|jpe?g|gif|bmp|svg|webp|ico|pdf|docx?|xlsx?|pptx?|odt|mp4|mov|webm|mp3|wav|"
                       r"zip|7z|rar|whl|deb|rpm|iso|exe|dll|so)$", re.I)


@dataclass
class AttachedLogs:
    """What was read from a ticket's attachments: the logs as one text, the files read, and notes
    on what was skipped or could not be had."""

    text: str = ""
    read: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _TooLarge(Exception):
    pass


def attached_logs(settings: Settings, system: str, ticket: dict, client: httpx.Client) -> AttachedLogs:
    """The logs attached to (Jira) or linked from (GitHub gists) one queued ticket."""
    found = AttachedLogs()
    if not settings.fetch_attachments:
        return found
    if system == "jira":
        files = [(a["filename"], a.get("size"), _jira_fetcher(settings, a["id"])) for a in
                 ticket.get("attachments") or ()]
        if files and (not settings.jira_url or settings.jira_token is None):
            found.notes.append(f"{len(files)} attachment(s) not read: PMKB_JIRA_URL and PMKB_JIRA_TOKEN are not set")
            return found
    else:
        files = _gist_files(settings, ticket.get("description") or "", client, found)
    sources = []
    for name, size, fetch in files:
        if len(found.read) >= MAX_FILES:
            found.notes.append(f"{name}: not read, past {MAX_FILES} files")
            continue
        if _NOT_LOGS.search(name):
            continue
        if size is not None and size > settings.attachment_max_bytes:
            found.notes.append(f"{name}: not read, {size} bytes is over PMKB_ATTACHMENT_MAX_BYTES")
            continue
        try:
            data = fetch(client)
            parsed = read_upload(name, data, limit=UNPACKED_FACTOR * max(len(data), 1))
        except _TooLarge:
            found.notes.append(f"{name}: not read, over PMKB_ATTACHMENT_MAX_BYTES "
                               f"({settings.attachment_max_bytes} bytes)")
            continue
        except (httpx.HTTPError, RankLogError, ValueError) as exc:
            found.notes.append(f"{name}: not read ({exc})")
            continue
        found.read.append(name)
        sources += parsed
        found.notes += [note for source in parsed for note in source.notes]
    found.text = sources_as_text(sources)
    for note in found.notes:
        log.info("ticket %s: %s", ticket.get("id", "?"), note)
    return found


def _jira_fetcher(settings: Settings, ident: str):
    def fetch(client: httpx.Client) -> bytes:
        token = settings.jira_token.get_secret_value()
        base = settings.jira_url.rstrip("/")
        return _download(client, f"{base}/rest/api/2/attachment/content/{ident}", settings,
                         {"Authorization": jira_auth(token)}, allowed=_hosts(settings, base))
    return fetch


def _gist_files(settings: Settings, text: str, client: httpx.Client, found: AttachedLogs) -> list:
    """(name, size, fetch) for each file of the gists ``text`` links, from the gist API."""
    api = settings.github_api_url.rstrip("/")
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    if settings.github_token is not None:
        headers["Authorization"] = f"Bearer {settings.github_token.get_secret_value()}"
    files = []
    for gist in dict.fromkeys(_GIST_LINK.findall(text[:1_000_000])):
        if len(files) >= MAX_FILES:
            break
        try:
            meta = json.loads(_download(client, f"{api}/gists/{gist}", settings, headers,
                                        allowed=_hosts(settings, api)))
        except (httpx.HTTPError, ValueError, _TooLarge) as exc:
            found.notes.append(f"gist {gist}: not read ({exc.__class__.__name__}: {exc})")
            continue
        for entry in (meta.get("files") or {}).values() if isinstance(meta, dict) else ():
            if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
                files.append((f"gist {gist}/{entry['filename'][:200]}", entry.get("size"),
                              _gist_fetcher(settings, entry)))
    return files


def _gist_fetcher(settings: Settings, entry: dict):
    def fetch(client: httpx.Client) -> bytes:
        content = entry.get("content")
        if isinstance(content, str) and not entry.get("truncated"):
            data = content.encode("utf-8", "replace")
            if len(data) > settings.attachment_max_bytes:
                raise _TooLarge
            return data
        raw = str(entry.get("raw_url") or "")
        if urlsplit(raw).scheme != "https" or urlsplit(raw).hostname != _GIST_RAW_HOST:
            raise ValueError(f"its raw file is not on {_GIST_RAW_HOST}")
        return _download(client, raw, settings, {}, allowed={_GIST_RAW_HOST})
    return fetch


def _hosts(settings: Settings, base: str) -> set[str]:
    return {(urlsplit(base).hostname or "").lower(), *settings.attachment_hosts}


def _download(client: httpx.Client, url: str, settings: Settings, headers: dict, allowed: set[str]) -> bytes:
    """The body at ``url``, within the size cap and the deadline, following redirects only to
    ``allowed`` hosts; the headers (the token) go only to the first URL's host."""
    deadline = time.monotonic() + settings.attachment_timeout
    first = urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        sent = headers if urlsplit(url).netloc == first else {}
        with client.stream("GET", url, headers=sent, timeout=settings.attachment_timeout,
                           follow_redirects=False) as resp:
            if resp.is_redirect:
                target = urljoin(url, resp.headers.get("location", ""))
                host = (urlsplit(target).hostname or "").lower()
                if urlsplit(target).scheme not in ("https", urlsplit(url).scheme) or host not in allowed:
                    raise ValueError(f"redirected to {host or 'nowhere'}, which is not in PMKB_ATTACHMENT_HOSTS")
                url = target
                continue
            if resp.status_code >= 400:
                raise ValueError(f"HTTP {resp.status_code}")
            chunks, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > settings.attachment_max_bytes:
                    raise _TooLarge
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"took longer than {settings.attachment_timeout:g} s "
                                            "(PMKB_ATTACHMENT_TIMEOUT)")
                chunks.append(chunk)
            return b"".join(chunks)
    raise ValueError(f"more than {MAX_REDIRECTS} redirects")
