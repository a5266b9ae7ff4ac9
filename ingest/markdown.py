"""A folder of Markdown postmortems, labels in YAML front matter."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import yaml

from ingest import IngestError, IngestWarning, Parsed
from ingest.common import record_to_incident
from kb.core.records import read_text
from kb.core.yamlsafe import load_yaml

_RESOLUTION_HEADINGS = re.compile(
    r"^(resolution|fix|remediation|mitigation|root cause( analysis)?|what we did|action items|follow[- ]?ups?)\b",
    re.I)


def split_front_matter(text: str) -> tuple[dict, str]:
    """Split ``---`` YAML front matter from the body; raises ValueError if it is malformed."""
    if not text.startswith("---"):
        return {}, text
    parts = re.split(r"^---\s*$", text, maxsplit=2, flags=re.M)
    if len(parts) < 3:
        raise ValueError("front matter opened with --- but never closed")
    try:
        meta = load_yaml(parts[1]) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError("front matter must be a mapping")
    return meta, parts[2]


def parse_postmortem(text: str) -> dict:
    """Title from the first H1, resolution from resolution-like sections, the rest is description."""
    meta, body = split_front_matter(text)
    title = meta.get("title")
    description, resolution = [], []
    target = description
    for line in body.splitlines():
        heading = re.match(r"^(#{1,6})\s+(.*)", line)
        if heading and len(heading.group(1)) == 1 and title is None:
            title = heading.group(2).strip()
            continue
        if heading:
            target = resolution if _RESOLUTION_HEADINGS.match(heading.group(2).strip()) else description
            continue
        target.append(line)
    record = {k: v for k, v in meta.items()}
    record["title"] = title or ""
    record.setdefault("description", "\n".join(description).strip())
    record.setdefault("resolution", "\n".join(resolution).strip())
    return record


def read_markdown_files(files: list[Path]) -> Iterator[Parsed]:
    """Read Markdown postmortems; the id defaults to the file name without extension."""
    for file in files:
        text, warning = read_text(file)
        if warning:
            yield IngestWarning(str(file), warning)
        if not text.strip():
            yield IngestError(str(file), "file", "empty file: no postmortem")
            continue
        try:
            record = parse_postmortem(text)
            yield record_to_incident(record, source=str(file.name), fallback_id=file.stem)
        except ValueError as exc:
            yield IngestError(str(file), "front matter", str(exc))


def read_markdown_dir(folder: Path) -> Iterator[Parsed]:
    """Every ``*.md`` file under a folder."""
    yield from read_markdown_files(sorted(Path(folder).rglob("*.md")))
