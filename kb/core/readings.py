"""Readings: what an expert reads from a ticket before any error string.

Two readings decide the owner more often than the logs do: the **scope** (one job, one user or
team, one node, many users, the whole cluster) and the **change** (the user changed something,
the platform changed, a hardware event, nothing changed, a first attempt). Their vocabulary is
data (``data/readings.yaml``), beside the taxonomy; each value says which dimension it points to.
Labelled readings of the bundled reports (``data/reading_labels.jsonl``) teach the reader
(kb/engine/readings.py); this module holds the types and the loaders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from kb.core.taxonomy import Taxonomy, read_yaml

KINDS = ("scope", "change")
"""The readings taken from every ticket, in the order they are shown."""
UNKNOWN = "unknown"
"""The value every reading has for a ticket that does not say."""

ReadingId = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$", max_length=60)]


class ReadingsError(ValueError):
    """A readings vocabulary or labels file that cannot be used; the message names the file and the entry."""


class ReadingValue(BaseModel):
    """One value a reading can take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ReadingId
    name: str = Field(min_length=1, max_length=80)  # shown on the card
    means: str = Field(min_length=1, max_length=300)  # what a ticket says for this value
    points_to: str | None = None  # the dimension it leans toward (None: neither)


class ReadingVocabulary(BaseModel):
    """The values of each reading."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: list[ReadingValue]
    change: list[ReadingValue]

    @model_validator(mode="after")
    def _each_kind_is_well_formed(self) -> "ReadingVocabulary":
        for kind in KINDS:
            ids = [v.id for v in self.values(kind)]
            if len(set(ids)) != len(ids):
                raise ValueError(f"{kind}: repeated ids {sorted({i for i in ids if ids.count(i) > 1})}")
            if UNKNOWN not in ids:
                raise ValueError(f"{kind}: the value {UNKNOWN!r} (the ticket does not say) is missing")
        return self

    def values(self, kind: str) -> list[ReadingValue]:
        """The values of one reading, in file order."""
        return list(getattr(self, kind))

    def ids(self, kind: str) -> list[str]:
        """The value ids of one reading."""
        return [v.id for v in self.values(kind)]

    def value(self, kind: str, value_id: str) -> ReadingValue:
        """One value by id; KeyError names the ones there are."""
        for v in self.values(kind):
            if v.id == value_id:
                return v
        raise KeyError(f"{kind} has no value {value_id!r}; available: {', '.join(self.ids(kind))}")


class Reading(BaseModel):
    """A reading taken from one ticket, with the words it was read from."""

    model_config = ConfigDict(extra="forbid")

    kind: str  # scope | change
    id: str  # the value's id in the vocabulary
    name: str  # the value's name
    confidence: float  # the reader's probability of this value
    span: str = ""  # the words of the ticket it was read from ("" for unknown)
    start: int = -1  # where the span starts in the ticket text (-1: not located)
    points_to: str | None = None  # the dimension this value leans toward

    def describe(self) -> str:
        """One line: 'Scope: many users, from "other teams see the same" -> points to platform'."""
        line = f"{self.kind.capitalize()}: {self.name} ({self.confidence:.0%})"
        if self.span:
            line += f', from "{self.span}"'
        return line + (f" -> points to {self.points_to}" if self.points_to else "")


class ReadingLabel(BaseModel):
    """The labelled readings of one incident (an expert's, from its ticket text)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)  # the incident's id
    scope: ReadingId
    scope_span: str = ""
    change: ReadingId
    change_span: str = ""
    second: dict | None = None  # a second expert's blind labels of the same text, when taken
    alt_root_causes: list[str] = Field(default_factory=list)  # other causes an expert found defensible


def load_vocabulary(path: Path | str, taxonomy: Taxonomy) -> ReadingVocabulary:
    """The readings vocabulary in ``path``; raises ReadingsError naming the problem."""
    data = read_yaml(Path(path))
    try:
        vocabulary = ReadingVocabulary.model_validate(data)
    except ValidationError as exc:
        raise ReadingsError(f"{path}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc
    dimensions = {d.id for d in taxonomy.dimensions}
    for kind in KINDS:
        for v in vocabulary.values(kind):
            if v.points_to is not None and v.points_to not in dimensions:
                raise ReadingsError(f"{path}: {kind} value {v.id!r} points to {v.points_to!r}, which is not a "
                                    f"dimension of the taxonomy ({', '.join(sorted(dimensions))})")
    return vocabulary


def load_labels(path: Path | str, vocabulary: ReadingVocabulary) -> dict[str, ReadingLabel]:
    """Labelled readings by incident id; raises ReadingsError naming the line of a bad record."""
    labels: dict[str, ReadingLabel] = {}
    path = Path(path)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            label = ReadingLabel.model_validate(json.loads(line))
        except (ValueError, ValidationError) as exc:
            raise ReadingsError(f"{path}: line {number}: not a readings label: {str(exc)[:300]}") from exc
        for kind in KINDS:
            if getattr(label, kind) not in vocabulary.ids(kind):
                raise ReadingsError(f"{path}: line {number}: {kind} {getattr(label, kind)!r} is not in the "
                                    f"vocabulary ({', '.join(vocabulary.ids(kind))})")
        labels[label.id] = label
    return labels
