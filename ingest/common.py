"""Helpers shared by the readers: decoding, field aliases, record -> Incident."""

from __future__ import annotations

from pydantic import ValidationError

from kb.core.incidents import Incident, trim_middle
from kb.core.redact import redact

ALIASES = {
    "id": ("id", "key", "issue_key", "number", "ticket", "ticket_id"),
    "title": ("title", "summary", "subject", "name"),
    "description": ("description", "body", "text", "details"),
    "resolution": ("resolution", "fix", "resolution_notes", "postmortem"),
    "symptom": ("symptom",),
    "root_cause": ("root_cause", "cause", "rootcause"),
    "mitigation": ("mitigation",),
    "source": ("source", "url", "html_url", "link"),
    "created_at": ("created_at", "created", "date", "opened_at"),
    "tags": ("tags", "labels"),
    "provenance": ("provenance",),
}


def _pick(record: dict, names: tuple[str, ...]):
    for name in names:
        if name in record and record[name] not in (None, ""):
            return record[name]
    return None


def record_to_incident(record: dict, source: str, fallback_id: str | None = None) -> Incident:
    """Map a loosely-named record onto Incident; raises ValueError with a readable message."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    fields: dict = {}
    for field, names in ALIASES.items():
        value = _pick(record, names)
        if value is not None:
            fields[field] = value
    if "id" not in fields:
        if fallback_id is None:
            raise ValueError("record has no id (expected one of: id, key, number)")
        fields["id"] = fallback_id
    fields["id"] = str(fields["id"])
    if not (fields.get("title") or fields.get("description")):
        raise ValueError(f"record {redact(fields['id'])!r} has neither a title nor a description")
    for text_field in ("title", "description", "resolution"):
        if text_field in fields:
            fields[text_field] = trim_middle(str(fields[text_field]))
    tags = fields.get("tags")
    if isinstance(tags, str):
        fields["tags"] = [t.strip() for t in tags.replace(";", ",").split(",") if t.strip()]
    elif isinstance(tags, list):
        fields["tags"] = [t["name"] if isinstance(t, dict) and "name" in t else str(t) for t in tags]
    fields.setdefault("source", source)
    try:
        return Incident(**fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"record {redact(fields['id'])!r}: {problems}") from None
