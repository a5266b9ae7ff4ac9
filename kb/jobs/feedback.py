"""Feedback on a suggestion: an engineer accepts or corrects the labels.

The ticket becomes a ``confirmed`` incident in the knowledge base, so the next search finds
it, and an append-only audit record (JSONL under the knowledge-base home) says who changed
what, when, and which suggestion it started from.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb.core.incidents import Incident, Provenance
from kb.core.settings import Settings
from kb.core.suggestion import Suggestion, Ticket
from kb.engine.knowledge import KnowledgeBase, check_labels

AUDIT_FILE = "feedback_audit.jsonl"
"""Name of the audit log inside the knowledge-base home."""
FEEDBACK_SOURCE = "pmkb-feedback"
"""``Incident.source`` of tickets saved through feedback."""
ANONYMOUS = "anonymous"
LABEL_FIELDS = ("symptom", "root_cause", "mitigation")


class FeedbackError(ValueError):
    """Feedback that cannot be saved; the message names the ticket and the problem."""


class LabelSet(BaseModel):
    """The three labels of an incident."""

    model_config = ConfigDict(extra="forbid")

    symptom: str | None = None  # symptom id of the taxonomy
    root_cause: str | None = None  # root-cause id of the taxonomy
    mitigation: str | None = None  # mitigation id of the taxonomy

    def changed_from(self, other: LabelSet | None) -> list[str]:
        """Names of the labels that differ from ``other`` (all set ones when there is none)."""
        if other is None:
            return [name for name in LABEL_FIELDS if getattr(self, name) is not None]
        return [name for name in LABEL_FIELDS if getattr(self, name) != getattr(other, name)]


class FeedbackRecord(BaseModel):
    """One line of the audit log: who confirmed or corrected which labels of which ticket."""

    model_config = ConfigDict(extra="forbid")

    at: datetime  # when it was saved (UTC)
    reviewer: str  # the name the engineer gave, or "anonymous"
    ticket_id: str  # the ticket as it was submitted
    incident_id: str  # the confirmed incident it became in the knowledge base
    action: Literal["accepted", "corrected"]  # accepted: saved labels equal the suggestion's
    suggested: LabelSet  # what the suggestion said
    previous: LabelSet | None = None  # labels of a stored incident with this id that were replaced
    new: LabelSet  # what was saved
    changed: list[str] = Field(default_factory=list)  # labels that differ from the suggestion
    suggestion: dict = Field(default_factory=dict)  # confidence, abstained and the suggestion's trace
    # The close-call question the card asked and how it was answered (by the engineer on the page,
    # or from the ticket's own text), when there was one.
    close_call: dict | None = None


def audit_path(settings: Settings) -> Path:
    """Where the feedback audit log of this knowledge base lives."""
    return Path(settings.home) / AUDIT_FILE


def incident_id_for(ticket: Ticket) -> str:
    """A stable id for a ticket: its own id, or one derived from its text when it has none."""
    given = (ticket.id or "").strip()
    if given and given != Ticket.model_fields["id"].default:
        return given
    digest = hashlib.sha256(ticket.text().encode("utf-8")).hexdigest()[:12]
    return f"ticket-{digest}"


def suggested_labels(suggestion: Suggestion) -> LabelSet:
    """The labels a suggestion proposes."""
    return LabelSet(symptom=suggestion.symptom, root_cause=suggestion.root_cause,
                    mitigation=suggestion.mitigation)


def ticket_incident(ticket: Ticket, labels: LabelSet, resolution: str = "",
                    at: datetime | None = None) -> Incident:
    """The confirmed incident a ticket becomes (the log excerpt is kept in the description)."""
    description = ticket.description.strip()
    if ticket.log.strip():
        description = f"{description}\n\nLog excerpt:\n{ticket.log.strip()}".strip()
    title = ticket.title.strip() or description.split("\n", 1)[0][:200]
    return Incident(id=incident_id_for(ticket), title=title, description=description,
                    resolution=resolution.strip(), symptom=labels.symptom, root_cause=labels.root_cause,
                    mitigation=labels.mitigation, source=FEEDBACK_SOURCE,
                    created_at=at or datetime.now(timezone.utc), tags=["feedback"],
                    provenance=Provenance.confirmed)


def _suggestion_summary(suggestion: Suggestion) -> dict:
    return {"root_cause_confidence": suggestion.root_cause_confidence,
            "symptom_confidence": suggestion.symptom_confidence,
            "abstained": suggestion.abstained, "trace": suggestion.trace}


def _close_call_summary(suggestion: Suggestion) -> dict | None:
    question = suggestion.close_call
    if question is None:
        return None
    return {"causes": question.causes, "question": question.question, "answered": question.answered,
            "ticket_points_to": question.ticket_points_to,
            "ticket_says": question.ticket_says.span if question.ticket_says else None}


def append_audit(settings: Settings, record: FeedbackRecord) -> Path:
    """Append one record to the audit log (one JSON line, flushed to disk) and return its path."""
    path = audit_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Owner only whatever the process's umask (the page's server does not set one): it holds ticket text.
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8") as sink:
        sink.write(record.model_dump_json() + "\n")
        sink.flush()
        os.fsync(sink.fileno())
    return path


def read_audit(settings: Settings) -> list[FeedbackRecord]:
    """Every audit record, oldest first (an empty list when nothing was saved yet)."""
    path = audit_path(settings)
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(FeedbackRecord.model_validate_json(line))
            except ValueError as exc:
                raise FeedbackError(f"{path}: line {number}: not a feedback record: {exc}") from exc
    return out


def save_feedback(kb: KnowledgeBase, ticket: Ticket, suggestion: Suggestion, labels: LabelSet,
                  reviewer: str | None = None, resolution: str = "",
                  at: datetime | None = None) -> FeedbackRecord:
    """Store the ticket as a confirmed incident with these labels and append the audit record.

    Labels must be taxonomy ids and a root cause is required (a confirmed incident without
    one would not help the next search). Callers holding a ``Retriever`` should refresh it
    when an existing id was replaced, since the incident count does not change then.
    """
    at = at or datetime.now(timezone.utc)
    who = (reviewer or "").strip() or ANONYMOUS
    if not ticket.text().strip():
        raise FeedbackError(f"ticket {ticket.id!r} has no text; there is nothing to save")
    if not labels.root_cause:
        raise FeedbackError(f"ticket {ticket.id!r}: choose a root cause before saving")
    incident = ticket_incident(ticket, labels, resolution, at)
    problem = check_labels(incident, kb.taxonomy)
    if problem:
        raise FeedbackError(f"{problem}; choose labels from the taxonomy")
    stored = kb.store.get_incident(incident.id)
    previous = (LabelSet(symptom=stored.symptom, root_cause=stored.root_cause,
                         mitigation=stored.mitigation) if stored is not None else None)
    report = kb.add_incidents([incident])
    if report.errors:
        raise FeedbackError(f"ticket {ticket.id!r} was not saved: {'; '.join(report.errors)}")
    suggested = suggested_labels(suggestion)
    changed = labels.changed_from(suggested)
    record = FeedbackRecord(at=at, reviewer=who, ticket_id=ticket.id, incident_id=incident.id,
                            action="corrected" if changed else "accepted", suggested=suggested,
                            previous=previous, new=labels, changed=changed,
                            suggestion=_suggestion_summary(suggestion),
                            close_call=_close_call_summary(suggestion))
    append_audit(kb.settings, record)
    return record


def audit_lines(settings: Settings, limit: int = 20) -> list[str]:
    """The latest audit records as short human-readable lines, newest first."""
    lines = []
    for rec in reversed(read_audit(settings)[-limit:]):
        moves = ", ".join(f"{name}: {getattr(rec.suggested, name)} -> {getattr(rec.new, name)}"
                          for name in rec.changed) or "labels as suggested"
        lines.append(f"{rec.at:%Y-%m-%d %H:%M} UTC {rec.reviewer} {rec.action} {rec.incident_id} ({moves})")
    return lines


def dump_record(record: FeedbackRecord) -> str:
    """The record as indented JSON (for display)."""
    return json.dumps(record.model_dump(mode="json"), indent=2, ensure_ascii=False)
