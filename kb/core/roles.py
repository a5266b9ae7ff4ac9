"""The roles of pmkb as Protocols: what a shell or a job may rely on, whichever backend fills it.

``Embedder`` (sentence-transformers, hashing), ``Store`` (Chroma embedded or on a server),
``Retriever`` (hybrid search, or its voting-only form), ``Suggester`` (the engine, or the
LLM-assisted suggester over it). Code takes these types, never a concrete class, and calls only
what the Protocol declares: there is no probing for optional methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import numpy as np

from kb.core.incidents import Incident
from kb.core.suggestion import SimilarIncident, Suggestion, Ticket


@runtime_checkable
class Embedder(Protocol):
    """Embeds documents and queries separately (many models want different prefixes)."""

    model_id: str  # recorded in the store; vectors of two models never mix

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """An (n, dim) float32 array of L2-normalised vectors."""

    def embed_query(self, text: str) -> np.ndarray:
        """A (dim,) float32 L2-normalised vector."""

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """An (n, dim) array of query vectors, in as few model calls as the backend can."""


@dataclass
class Hit:
    """One record a store retrieved, with its cosine similarity."""

    id: str
    score: float
    metadata: dict
    document: str


@runtime_checkable
class Store(Protocol):
    """Incident and taxonomy vectors with their metadata, in one place or on a server."""

    model_id: str
    location: str

    def upsert_incidents(self, incidents: list[Incident], vectors: np.ndarray,
                         dimensions: list[str | None] | None = None) -> None:
        """Insert or replace incidents (by id) with their vectors."""

    def incident_hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """Content hashes of stored incidents (all, or those with the given ids)."""

    def incidents(self, where: dict | None = None) -> list[Incident]:
        """Every stored incident matching an optional metadata filter."""

    def incident_vectors(self) -> tuple[list[str], np.ndarray]:
        """Ids and vectors of every stored incident."""

    def get_incident(self, incident_id: str) -> Incident | None:
        """One incident by id, or None."""

    def query_incidents(self, vector: np.ndarray, k: int, where: dict | None = None) -> list[Hit]:
        """The k nearest incidents to a query vector."""

    def query_incident_scores(self, vectors: np.ndarray, k: int,
                              where: dict | None = None) -> list[dict[str, float]]:
        """For many query vectors, their k nearest incidents' similarities by id (one call)."""

    def upsert_taxonomy(self, ids: list[str], documents: list[str], metadatas: list[dict],
                        vectors: np.ndarray) -> None:
        """Insert or replace taxonomy entries."""

    def taxonomy_entries(self) -> list[tuple[str, dict, str]]:
        """(id, metadata, document) of every taxonomy entry."""

    def taxonomy_vectors(self) -> dict[str, np.ndarray]:
        """Vectors of all taxonomy entries by id."""

    def count(self) -> int:
        """Number of stored incidents."""

    def state(self) -> tuple:
        """A value that changes when the stored incidents change (readers reload on a change)."""

    def reset(self) -> None:
        """Remove every incident and taxonomy entry."""

    def close(self) -> None:
        """Release the store (an embedded store's lock); idempotent."""


@runtime_checkable
class Retriever(Protocol):
    """Finds the past incidents most similar to a ticket."""

    def refresh(self) -> None:
        """Reload what the retriever indexes from the store."""

    def incidents(self) -> list[Incident]:
        """The incidents it retrieves from, as of its last load."""

    def dense_candidates(self, vectors: np.ndarray, k: int = 5,
                         where: dict | None = None) -> list[dict[str, float]]:
        """The dense candidate pools of many query vectors in one store call (pass each one as
        ``dense`` to ``retrieve_similar`` with the same ``k`` and ``where``)."""

    def retrieve_similar(self, text: str, k: int = 5, where: dict | None = None,
                         query_vector: np.ndarray | None = None, exclude: set[str] | None = None,
                         dense: dict[str, float] | None = None) -> list[SimilarIncident]:
        """The k most similar incidents, best first; ``where`` filters on labels and provenance."""


@runtime_checkable
class Suggester(Protocol):
    """Ticket in, Suggestion out: the engine alone, or a model over the engine."""

    def suggest(self, ticket: Ticket, exclude: set[str] | None = None) -> Suggestion:
        """The full suggestion for one ticket."""

    def suggest_batch(self, tickets: list[Ticket],
                      exclude: set[str] | None = None) -> list[Suggestion | Exception]:
        """Suggestions for many tickets (a ticket that fails gets its exception in its place)."""

    def refine(self, ticket: Ticket, suggestion: Suggestion) -> Suggestion:
        """A suggestion made better by what this suggester adds to the engine's (the engine's
        own returns it unchanged); reuses the engine's work instead of suggesting again."""

    def describe(self) -> dict:
        """What suggests: engine version, model, prompt; for traces and the page."""
