"""A running ``pmkb serve`` answers the command line's questions about its knowledge base.

The service has the model, the store and the engine loaded; a new ``pmkb suggest`` process would
spend seconds loading them again (and an embedded store serves one process at a time). So the
service announces itself in the knowledge-base directory (``service.json``: its loopback URL, its
process id, its embedding model and LLM setting), and ``pmkb suggest`` asks it over
``POST /v1/annotate`` with the API token both read from the same settings (without one, only a
service started with ``--insecure-dev`` answers).

The announcement is trusted only as far as it must be: the file must belong to this user and be
writable by no one else, the URL must be on the loopback interface (the token is never sent
elsewhere), the process must be alive, and the service must use the same embedding model and LLM
setting as the command, so its answer is the one the command would give. Anything else, or a
service that does not answer within ``ASK_TIMEOUT``, and the command answers in its own process.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from kb.core.files import write_private
from kb.core.settings import Settings
from kb.core.suggestion import Suggestion, Ticket

SERVICE_FILE = "service.json"
ASK_TIMEOUT = 60.0  # seconds for the service's answer (it serves callers in turn)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class ServiceRefused(RuntimeError):
    """The running service refused the command's token; the message says what to set."""


def _identity(settings: Settings) -> dict:
    return {"embedding_model": settings.embedding_model, "embedder": settings.embedder, "llm": settings.llm}


def announce(settings: Settings, host: str, port: int) -> Path | None:
    """Write the service's announcement (0600) when it listens on the loopback interface or on every
    interface; the path, or None when there is nothing the command line could reach."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if host not in _LOOPBACK:
        return None
    url = f"http://{'[::1]' if host == '::1' else host}:{port}"
    path = Path(settings.home) / SERVICE_FILE
    payload = json.dumps({"url": url, "pid": os.getpid(), **_identity(settings)}).encode("utf-8")
    write_private(path, lambda out: out.write(payload))
    return path


def withdraw(settings: Settings) -> None:
    """Remove this process's announcement (another service's is left alone)."""
    path = Path(settings.home) / SERVICE_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def running_service(settings: Settings) -> str | None:
    """The URL of a live ``pmkb serve`` on this knowledge base that answers as this command would."""
    path = Path(settings.home) / SERVICE_FILE
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        record = json.loads(path.read_text())
        url, pid = str(record["url"]), int(record["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if urlsplit(url).hostname not in _LOOPBACK or urlsplit(url).scheme != "http":
        return None
    if any(record.get(k) != v for k, v in _identity(settings).items()):
        return None
    return url


def ask(settings: Settings, ticket: Ticket) -> Suggestion | None:
    """The running service's suggestion for ``ticket``, or None when there is none to ask or it
    cannot answer (the command then answers itself); raises ServiceRefused when it refuses the token."""
    url = running_service(settings)
    if url is None:
        return None
    import httpx

    token = settings.api_token.get_secret_value() if settings.api_token is not None else ""
    try:  # without a token only a service started with --insecure-dev answers
        answer = httpx.post(f"{url}/v1/annotate", timeout=ASK_TIMEOUT,
                            json={"id": ticket.id, "title": ticket.title, "description": ticket.description,
                                  "log": ticket.log},
                            headers={"Authorization": f"Bearer {token}"} if token.strip() else {})
    except httpx.HTTPError:
        return None
    if answer.status_code in (401, 403):
        raise ServiceRefused(f"the pmkb serve running on this knowledge base ({url}) refused this command's "
                             "token: give it the service's PMKB_API_TOKEN to have it answer")
    if answer.status_code != 200:
        return None
    try:
        return Suggestion.model_validate(answer.json())
    except ValueError:
        return None
