"""GitHub issues exports: the REST API's JSON list of issues (``GET /repos/{o}/{r}/issues``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

from ingest import IngestError, IngestWarning, Parsed
from ingest.common import record_to_incident
from kb.core.records import read_text

_LABEL_PREFIXES = {"rc": "root_cause", "symptom": "symptom", "mitigation": "mitigation"}


def looks_like_github_export(path: Path) -> bool:
    """True when the file is a JSON list whose first item has GitHub issue fields."""
    try:
        text, _ = read_text(path)
        data = json.loads(text)
    except (OSError, json.JSONDecodeError):
        return False
    return (isinstance(data, list) and bool(data) and isinstance(data[0], dict)
            and "number" in data[0] and ("html_url" in data[0] or "node_id" in data[0]))


def issue_to_record(issue: dict) -> dict:
    """Map one GitHub issue object onto incident fields; ``rc:``/``symptom:`` labels become labels."""
    url = issue.get("html_url") or ""
    match = re.search(r"github\.com/([^/]+/[^/]+)/issues/(\d+)", url)
    repo = match.group(1) if match else issue.get("repository_url", "").rsplit("/repos/", 1)[-1]
    record = {
        "id": f"{repo}#{issue['number']}" if repo else f"gh-{issue['number']}",
        "title": issue.get("title") or "",
        "description": issue.get("body") or "",
        "source": url,
        "created_at": issue.get("created_at"),
    }
    tags = []
    for label in issue.get("labels") or []:
        name = label.get("name") if isinstance(label, dict) else str(label)
        prefix, sep, value = (name or "").partition(":")
        if sep and prefix in _LABEL_PREFIXES:
            record[_LABEL_PREFIXES[prefix]] = value.strip()
        elif name and not (sep and prefix == "dim"):
            tags.append(name)
    record["tags"] = tags
    return record


def read_github_export(path: Path) -> Iterator[Parsed]:
    """Read an exported issue list; pull requests are skipped."""
    text, warning = read_text(path)
    if warning:
        yield IngestWarning(str(path), warning)
    try:
        issues = json.loads(text)
    except json.JSONDecodeError as exc:
        yield IngestError(str(path), f"line {exc.lineno}", f"malformed JSON: {exc.msg}")
        return
    for number, issue in enumerate(issues, start=1):
        if not isinstance(issue, dict) or "number" not in issue:
            yield IngestError(str(path), f"record {number}", "not a GitHub issue object (no 'number')")
            continue
        if "pull_request" in issue:
            continue
        try:
            yield record_to_incident(issue_to_record(issue), source=str(path.name))
        except ValueError as exc:
            yield IngestError(str(path), f"record {number} (#{issue['number']})", str(exc))
