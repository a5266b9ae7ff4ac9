"""The one Incident type that every source is converted into at the edge."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TEXT_CHARS = 20_000
"""Longer descriptions are trimmed (head and tail kept) before storing and embedding."""


class Provenance(str, Enum):
    """Who stands behind an incident's labels."""

    human_labelled = "human_labelled"  # labelled by an engineer when filed or reviewed
    machine_suggested = "machine_suggested"  # labels come from pmkb and nobody confirmed them
    confirmed = "confirmed"  # a machine suggestion an engineer accepted or corrected


VOTE_WEIGHT = {Provenance.human_labelled.value: 1.0, Provenance.confirmed.value: 1.0,
               Provenance.machine_suggested.value: 0.0}
"""How much an incident's labels count, by provenance: unconfirmed machine labels do not vote.
The one place that decides it, for retrieval, neighbour votes, priors and training alike."""
VOTERS = [name for name, weight in VOTE_WEIGHT.items() if weight > 0]
"""Provenances whose labels vote."""


def vote_weight(provenance: str | Provenance) -> float:
    """How much labels of this provenance count (0: they do not vote)."""
    return VOTE_WEIGHT.get(getattr(provenance, "value", provenance), 0.0)


class Incident(BaseModel):
    """A past (or new) incident: the ticket text, what resolved it and its labels."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)  # stable id within its source
    title: str = ""  # the ticket's title as filed
    description: str = ""  # the ticket body as filed (redacted before storage)
    resolution: str = ""  # what was found and done; empty for open tickets
    symptom: str | None = None  # symptom id of the taxonomy
    root_cause: str | None = None  # root-cause id of the taxonomy
    mitigation: str | None = None  # mitigation id of the taxonomy
    source: str = ""  # where the record came from (file, URL, tracker key)
    created_at: datetime | None = None
    tags: list[str] = Field(default_factory=list)
    provenance: Provenance = Provenance.human_labelled

    @field_validator("id")
    @classmethod
    def _strip_id(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("id is empty")
        return value

    @field_validator("symptom", "root_cause", "mitigation", mode="before")
    @classmethod
    def _blank_is_none(cls, value):
        return value or None

    @property
    def labelled(self) -> bool:
        """True when the incident carries a root-cause label."""
        return self.root_cause is not None

    @property
    def votes(self) -> bool:
        """True when its labels count (a person stands behind them)."""
        return vote_weight(self.provenance) > 0

    def text(self) -> str:
        """The ticket text used for retrieval (title and description, not the resolution)."""
        return f"{self.title}\n{self.description}".strip()

    def document(self) -> str:
        """Text stored for the incident: the ticket and, when known, its resolution."""
        parts = [self.title, self.description]
        if self.resolution:
            parts.append(f"Resolution: {self.resolution}")
        return "\n".join(p for p in parts if p)

    def content_hash(self) -> str:
        """Stable hash of everything that matters for storage; unchanged hash -> skip."""
        payload = self.model_dump(mode="json")
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def trim_middle(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Keep the head and tail of an over-long text, marking what was cut."""
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n[... {cut} characters trimmed ...]\n{text[-half:]}"
