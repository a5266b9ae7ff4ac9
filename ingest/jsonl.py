"""JSON Lines and JSON-array files of incident records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ingest import IngestError, IngestWarning, Parsed
from ingest.common import record_to_incident
from kb.core.records import read_text
from kb.core.redact import redact


def read_jsonl(path: Path) -> Iterator[Parsed]:
    """One JSON object per line; a bad line is reported with its number and skipped."""
    text, warning = read_text(path)
    if warning:
        yield IngestWarning(str(path), warning)
    if not text.strip():
        yield IngestError(str(path), "file", "empty file: no records")
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            quoted = redact(line)  # before cutting: a secret cut in two would no longer be recognised
            snippet = quoted[:60] + ("..." if len(quoted) > 60 else "")
            yield IngestError(str(path), f"line {number}", f"malformed JSON ({exc.msg} at column "
                              f"{exc.colno}): {snippet!r}")
            continue
        try:
            yield record_to_incident(record, source=f"{path.name}:{number}")
        except ValueError as exc:
            yield IngestError(str(path), f"line {number}", str(exc))


def read_json_array(path: Path) -> Iterator[Parsed]:
    """A JSON array of incident objects (or one object)."""
    text, warning = read_text(path)
    if warning:
        yield IngestWarning(str(path), warning)
    if not text.strip():
        yield IngestError(str(path), "file", "empty file: no records")
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        yield IngestError(str(path), f"line {exc.lineno}", f"malformed JSON: {exc.msg}")
        return
    records = data if isinstance(data, list) else [data]
    for number, record in enumerate(records, start=1):
        try:
            yield record_to_incident(record, source=f"{path.name}#{number}")
        except ValueError as exc:
            yield IngestError(str(path), f"record {number}", str(exc))
