"""The knowledge base: taxonomy, embedder and store together, and how incidents get in."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable

from kb.core.incidents import Incident
from kb.core.redact import redact, redact_key
from kb.core.roles import Embedder, Store
from kb.core.settings import Settings
from kb.core.taxonomy import Taxonomy, load_taxonomy
from kb.engine.embedding import make_embedder
from kb.engine.replica import open_replica, save_replica
from kb.engine.shipped_vectors import ShippedVectors, embed_documents
from kb.engine.store import ChromaStore, open_store

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
"""Called with the number of records just processed."""


@dataclass
class AddReport:
    """What an ingest did: counts and the records that failed validation."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    embedded: int = 0  # of the written, those the model embedded (the rest had shipped vectors)
    errors: list[str] = field(default_factory=list)

    @property
    def written(self) -> int:
        """Records written to the store."""
        return self.added + self.updated


def redact_incident(incident: Incident) -> Incident:
    """A copy of the incident with secrets and personal data removed from its text and metadata.

    The id is a key (re-ingesting a record updates it in place), so it changes only when it holds a
    secret, and then always the same way (see ``redact_key``).
    """
    return incident.model_copy(update={
        "id": redact_key(incident.id),
        "title": redact(incident.title),
        "description": redact(incident.description),
        "resolution": redact(incident.resolution),
        "source": redact(incident.source),
        "tags": [redact(tag) for tag in incident.tags],
    })


def check_labels(incident: Incident, taxonomy: Taxonomy) -> str | None:
    """Name the first label that is not in the taxonomy, or None when all are known."""
    checks = (("symptom", incident.symptom, taxonomy.symptom_ids),
              ("root_cause", incident.root_cause, taxonomy.cause_ids),
              ("mitigation", incident.mitigation, taxonomy.mitigation_ids))
    for name, value, known in checks:
        if value is not None and value not in known:
            return f"incident {incident.id!r}: unknown {name} {value!r} (not in taxonomy {taxonomy.name})"
    return None


class KnowledgeBase:
    """Entry point of the core: opens the taxonomy, embedder and store named by the settings."""

    def __init__(self, settings: Settings, embedder: Embedder | None = None, read_only: bool = False):
        self.settings = settings
        self._embedder = embedder
        self.read_only = read_only
        """Only reads: an embedded store is read from its current copy when there is one
        (``kb.engine.replica``: no chromadb, no lock), and ``save_replica`` leaves one otherwise."""
        self.generation = 0
        """Counts this knowledge base's writes to the store, so readers reload even when an update
        kept the number of incidents the same (other writers show through ``Store.state``)."""

    @cached_property
    def taxonomy(self) -> Taxonomy:
        """The validated taxonomy."""
        return load_taxonomy(self.settings.taxonomy)

    @property
    def embedder(self) -> Embedder:
        """The configured embedder (built on first use)."""
        if self._embedder is None:
            self._embedder = make_embedder(self.settings)
        return self._embedder

    @cached_property
    def store(self) -> Store:
        """The vector store (opened on first use; refuses a store built by another model)."""
        if self.read_only and self.settings.read_copy and not self.settings.chroma_url:
            replica = open_replica(self.settings.store_dir, self.embedder.model_id)
            if replica is not None:
                return replica
        return open_store(self.settings, self.embedder.model_id)

    def save_replica(self) -> None:
        """Leave a current copy of an embedded store for the commands that only read (when the
        store was opened, not read from a copy); a failure to write it costs only speed."""
        store = self.store
        if self.settings.read_copy and isinstance(store, ChromaStore):
            try:
                save_replica(store)
            except OSError as exc:
                log.warning("could not write the store's copy for fast reads in %s: %s", store.path, exc)

    @cached_property
    def shipped_vectors(self) -> ShippedVectors | None:
        """The bundled reports' shipped vectors, when they are this embedder's (else None)."""
        return ShippedVectors.load(Path(self.settings.bundled_vectors), self.embedder.model_id)

    def dimension_of(self, cause: str | None) -> str | None:
        """Dimension of a root-cause id, or None."""
        return self.taxonomy.dimension_of(cause) if cause else None

    def prepare(self, incidents: Iterable[Incident]) -> tuple[list[Incident], list[str]]:
        """Redact and validate labels; returns the usable incidents and the errors."""
        ready, errors = [], []
        for incident in incidents:
            problem = check_labels(incident, self.taxonomy)
            if problem:
                errors.append(redact(problem))  # it quotes the record's id and labels
            else:
                ready.append(redact_incident(incident))
        return ready, errors

    def add_incidents(self, incidents: Iterable[Incident], progress: Progress | None = None,
                      batch_size: int = 128) -> AddReport:
        """Redact, validate, skip unchanged (content hash), embed and upsert incidents."""
        ready, errors = self.prepare(incidents)
        report = AddReport(errors=errors)
        latest: dict[str, Incident] = {}
        for incident in ready:  # a record repeated in one batch: the last one wins
            latest[incident.id] = incident
        ready = list(latest.values())
        for start in range(0, len(ready), batch_size):
            chunk = ready[start:start + batch_size]
            known = self.store.incident_hashes([i.id for i in chunk])
            todo = [i for i in chunk if known.get(i.id) != i.content_hash()]
            report.unchanged += len(chunk) - len(todo)
            report.updated += sum(1 for i in todo if i.id in known)
            report.added += sum(1 for i in todo if i.id not in known)
            if todo:
                vectors, embedded = embed_documents(self.embedder, [i.text() for i in todo], self.shipped_vectors)
                report.embedded += embedded
                self.store.upsert_incidents(todo, vectors, [self.dimension_of(i.root_cause) for i in todo])
                self.generation += 1
            if progress:
                progress(len(chunk))
        return report

    def sync_taxonomy(self) -> None:
        """Embed the taxonomy's root causes and symptoms into their own collection."""
        tax = self.taxonomy
        ids, docs, metas = [], [], []
        for cause in tax.root_causes:
            ids.append(f"cause:{cause.id}")
            docs.append(cause.document())
            metas.append({"kind": "root_cause", "label": cause.id, "dimension": cause.dimension,
                          "name": cause.name})
        for symptom in tax.symptoms:
            ids.append(f"symptom:{symptom.id}")
            docs.append(f"{symptom.name}. {symptom.definition} {'; '.join(symptom.indicators)}")
            metas.append({"kind": "symptom", "label": symptom.id, "dimension": "", "name": symptom.name})
        self.store.upsert_taxonomy(ids, docs, metas, self.embedder.embed_documents(docs))

    def bundled_incidents(self) -> list[Incident]:
        """The incident reports shipped with pmkb (JSONL files under data/incidents)."""
        folder = Path(self.settings.bundled_incidents)
        out = []
        for file in sorted(folder.glob("*.jsonl")):
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        out.append(Incident.model_validate_json(line))
                    except ValueError as exc:
                        raise ValueError(f"{file}: line {number}: bundled incident invalid: {exc}") from exc
        return out

    def ensure_built(self, log: Callable[[str], None] | None = None) -> bool:
        """Build the knowledge base from the bundled data when it is empty; True if it did."""
        if self.store.count() > 0:
            if not self.store.taxonomy_entries():
                self.sync_taxonomy()
            return False
        incidents = self.bundled_incidents()
        if log:
            log(f"knowledge base at {self.settings.home} is empty: building it from "
                f"{len(incidents)} bundled incident reports ...")
        self.sync_taxonomy()
        report = self.add_incidents(incidents)
        if log:
            log(f"{report.written - report.embedded} of the {report.written} reports' vectors were shipped for "
                f"{self.embedder.model_id}; {report.embedded} embedded")
        return True

    def stats(self) -> dict:
        """Counts by symptom, root cause, dimension and provenance."""
        incidents = self.store.incidents()
        return {
            "incidents": len(incidents),
            "symptom": dict(Counter(i.symptom or "unlabelled" for i in incidents).most_common()),
            "root_cause": dict(Counter(i.root_cause or "unlabelled" for i in incidents).most_common()),
            "dimension": dict(Counter(self.dimension_of(i.root_cause) or "unlabelled"
                                      for i in incidents).most_common()),
            "provenance": dict(Counter(i.provenance.value for i in incidents).most_common()),
            "embedding_model": self.embedder.model_id,
            "location": str(self.store.location),
        }


def dump_json(obj) -> str:
    """JSON text for CLI output."""
    return json.dumps(obj, indent=2, ensure_ascii=False, default=str)
