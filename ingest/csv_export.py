"""CSV exports from ticket trackers (Jira-style column names by default, configurable)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterator

from ingest import IngestError, IngestWarning, Parsed
from ingest.common import record_to_incident
from kb.core.records import read_text

JIRA_COLUMNS = {
    "id": "Issue key",
    "title": "Summary",
    "description": "Description",
    "resolution": "Custom field (Resolution Notes)",
    "created_at": "Created",
    "tags": "Labels",
    "symptom": "Custom field (Symptom)",
    "root_cause": "Custom field (Root Cause)",
    "mitigation": "Custom field (Mitigation)",
}
"""Incident field -> CSV column. Override any entry with ``--csv-map field=Column``."""

REQUIRED = ("id", "title")


def parse_mapping(pairs: list[str]) -> dict[str, str]:
    """Parse ``field=Column`` pairs from the command line."""
    mapping = {}
    for pair in pairs:
        field, sep, column = pair.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise ValueError(f"bad --csv-map {pair!r}: expected field=Column, e.g. title=Summary")
        if field.strip() not in JIRA_COLUMNS:
            raise ValueError(f"bad --csv-map {pair!r}: unknown field {field.strip()!r}; "
                             f"fields: {', '.join(JIRA_COLUMNS)}")
        mapping[field.strip()] = column.strip()
    return mapping


def read_csv(path: Path, mapping: dict[str, str] | None = None) -> Iterator[Parsed]:
    """Read a CSV export; repeated columns (Jira's several "Labels") are merged."""
    columns = {**JIRA_COLUMNS, **(mapping or {})}
    text, warning = read_text(path)
    if warning:
        yield IngestWarning(str(path), warning)
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or not any(cell.strip() for cell in rows[0]):
        yield IngestError(str(path), "file", "empty file: no header row")
        return
    header = [h.strip() for h in rows[0]]
    missing = [f"{field} (column {columns[field]!r})" for field in REQUIRED if columns[field] not in header]
    if missing:
        yield IngestError(str(path), "header", f"missing required column(s): {', '.join(missing)}; "
                          f"columns present: {', '.join(header)}. Map them with --csv-map field=Column.")
        return
    positions: dict[str, list[int]] = {}
    for index, name in enumerate(header):
        positions.setdefault(name, []).append(index)
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            yield IngestError(str(path), f"row {number}", f"{len(row)} cells but {len(header)} columns")
            continue
        record: dict = {}
        for field, column in columns.items():
            values = [row[i].strip() for i in positions.get(column, []) if i < len(row) and row[i].strip()]
            if values:
                record[field] = values if field == "tags" else values[0]
        try:
            yield record_to_incident(record, source=f"{path.name}:{number}")
        except ValueError as exc:
            yield IngestError(str(path), f"row {number}", str(exc))
