"""Vector store for incidents and taxonomy entries (Chroma, embedded or client/server).

Only this module imports chromadb. The store records which embedding model built it and
refuses vectors from another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np

from kb.incidents import Incident
from kb.settings import Settings

INCIDENTS = "pmkb-incidents"
TAXONOMY = "pmkb-taxonomy"


class StoreModelMismatch(RuntimeError):
    """The store was built with another embedding model than the one configured."""


@dataclass
class Hit:
    """One retrieved record with its cosine similarity."""

    id: str
    score: float
    metadata: dict
    document: str


class Store(Protocol):
    """Storage of incident and taxonomy vectors with metadata."""

    model_id: str

    def upsert_incidents(self, incidents: list[Incident], vectors: np.ndarray) -> None:
        """Insert or replace incidents (by id) with their vectors."""

    def incident_hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """Content hashes of stored incidents (all, or those with the given ids)."""

    def incidents(self, where: dict | None = None) -> list[Incident]:
        """Every stored incident matching an optional metadata filter."""

    def query_incidents(self, vector: np.ndarray, k: int, where: dict | None = None) -> list[Hit]:
        """Nearest incidents to a query vector."""

    def upsert_taxonomy(self, ids: list[str], documents: list[str], metadatas: list[dict],
                        vectors: np.ndarray) -> None:
        """Insert or replace taxonomy entries."""

    def taxonomy_vectors(self) -> dict[str, np.ndarray]:
        """Vectors of all taxonomy entries by id."""

    def count(self) -> int:
        """Number of stored incidents."""


def incident_metadata(incident: Incident, dimension: str | None) -> dict:
    """Flat, filterable metadata for an incident plus its full record as JSON."""
    return {
        "title": incident.title[:500],
        "symptom": incident.symptom or "",
        "root_cause": incident.root_cause or "",
        "dimension": dimension or "",
        "mitigation": incident.mitigation or "",
        "provenance": incident.provenance.value,
        "source": incident.source[:500],
        "content_hash": incident.content_hash(),
        "record": incident.model_dump_json(),
    }


class ChromaStore:
    """Chroma-backed store: PersistentClient on a directory, or HttpClient on a server URL."""

    def __init__(self, model_id: str, path: str | None = None, url: str | None = None):
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        self.model_id = model_id
        chroma_settings = ChromaSettings(anonymized_telemetry=False)
        if url:
            from urllib.parse import urlparse

            parsed = urlparse(url)
            self._client = chromadb.HttpClient(host=parsed.hostname or "localhost",
                                               port=parsed.port or 8000,
                                               ssl=parsed.scheme == "https", settings=chroma_settings)
            self.location = url
        else:
            self._client = chromadb.PersistentClient(path=path, settings=chroma_settings)
            self.location = path
        self._incidents = self._collection(INCIDENTS)
        self._taxonomy = self._collection(TAXONOMY)
        self._batch = min(1000, self._client.get_max_batch_size())

    def _collection(self, name: str):
        col = self._client.get_or_create_collection(
            name, metadata={"hnsw:space": "cosine", "embedding_model": self.model_id},
            embedding_function=None)
        built_with = (col.metadata or {}).get("embedding_model")
        if built_with != self.model_id:
            raise StoreModelMismatch(
                f"the knowledge base at {self.location} was built with embedding model "
                f"{built_with!r}, but {self.model_id!r} is configured. Use the model it was "
                f"built with, or run `pmkb reindex` to re-embed it with the new one "
                f"(or choose another --kb directory).")
        return col

    def upsert_incidents(self, incidents: list[Incident], vectors: np.ndarray,
                         dimensions: list[str | None] | None = None) -> None:
        """Insert or replace incidents (by id) with their vectors."""
        dimensions = dimensions or [None] * len(incidents)
        for start in range(0, len(incidents), self._batch):
            chunk = incidents[start:start + self._batch]
            self._incidents.upsert(
                ids=[i.id for i in chunk],
                embeddings=vectors[start:start + self._batch].tolist(),
                documents=[i.document() for i in chunk],
                metadatas=[incident_metadata(i, d) for i, d in
                           zip(chunk, dimensions[start:start + self._batch])])

    def incident_hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """Content hashes of stored incidents (all, or those with the given ids)."""
        result: dict[str, str] = {}
        id_list = list(ids) if ids is not None else None
        if id_list is not None:
            for start in range(0, len(id_list), self._batch):
                got = self._incidents.get(ids=id_list[start:start + self._batch], include=["metadatas"])
                result.update({i: m["content_hash"] for i, m in zip(got["ids"], got["metadatas"])})
            return result
        for ids_, metas, _ in self._scan(include=["metadatas"]):
            result.update({i: m["content_hash"] for i, m in zip(ids_, metas)})
        return result

    def _scan(self, include: list[str], where: dict | None = None):
        offset = 0
        while True:
            got = self._incidents.get(include=include, where=where, limit=self._batch, offset=offset)
            if not got["ids"]:
                return
            yield got["ids"], got["metadatas"], got.get("embeddings")
            offset += len(got["ids"])

    def incidents(self, where: dict | None = None) -> list[Incident]:
        """Every stored incident matching an optional metadata filter."""
        out: list[Incident] = []
        for _, metas, _ in self._scan(include=["metadatas"], where=where):
            out.extend(Incident.model_validate_json(m["record"]) for m in metas)
        return out

    def incident_vectors(self) -> tuple[list[str], np.ndarray]:
        """All incident ids and their stored vectors (for re-embedding checks and search)."""
        ids, vecs = [], []
        for ids_, _, embs in self._scan(include=["embeddings", "metadatas"]):
            ids.extend(ids_)
            vecs.extend(embs)
        return ids, np.asarray(vecs, dtype=np.float32)

    def get_incident(self, incident_id: str) -> Incident | None:
        """One incident by id, or None."""
        got = self._incidents.get(ids=[incident_id], include=["metadatas"])
        return Incident.model_validate_json(got["metadatas"][0]["record"]) if got["ids"] else None

    def query_incidents(self, vector: np.ndarray, k: int, where: dict | None = None) -> list[Hit]:
        """Nearest incidents to a query vector (cosine similarity as score)."""
        total = self.count()
        if total == 0 or k <= 0:
            return []
        res = self._incidents.query(query_embeddings=[np.asarray(vector).tolist()],
                                    n_results=min(k, total), where=where,
                                    include=["metadatas", "distances", "documents"])
        return [Hit(id=i, score=1.0 - float(d), metadata=m, document=doc)
                for i, d, m, doc in zip(res["ids"][0], res["distances"][0],
                                        res["metadatas"][0], res["documents"][0])]

    def query_incident_scores(self, vectors: np.ndarray, k: int,
                              where: dict | None = None) -> list[dict[str, float]]:
        """Ids and cosine similarities of the k nearest incidents to each of many query vectors.

        One call for the whole batch, fetching distances only (no metadata or documents).
        """
        vectors = np.asarray(vectors)
        total = self.count()
        if total == 0 or k <= 0 or not len(vectors):
            return [{} for _ in range(len(vectors))]
        res = self._incidents.query(query_embeddings=vectors.tolist(), n_results=min(k, total),
                                    where=where, include=["distances"])
        return [{i: 1.0 - float(d) for i, d in zip(ids, dists)}
                for ids, dists in zip(res["ids"], res["distances"])]

    def upsert_taxonomy(self, ids: list[str], documents: list[str], metadatas: list[dict],
                        vectors: np.ndarray) -> None:
        """Insert or replace taxonomy entries, dropping entries no longer in the taxonomy."""
        existing = set(self._taxonomy.get(include=[])["ids"])
        stale = sorted(existing - set(ids))
        if stale:
            self._taxonomy.delete(ids=stale)
        self._taxonomy.upsert(ids=ids, documents=documents, metadatas=metadatas,
                              embeddings=np.asarray(vectors).tolist())

    def taxonomy_entries(self) -> list[tuple[str, dict, str]]:
        """All taxonomy entries as (id, metadata, document)."""
        got = self._taxonomy.get(include=["metadatas", "documents"])
        return list(zip(got["ids"], got["metadatas"], got["documents"]))

    def taxonomy_vectors(self) -> dict[str, np.ndarray]:
        """Vectors of all taxonomy entries by id."""
        got = self._taxonomy.get(include=["embeddings"])
        return {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"])}

    def count(self) -> int:
        """Number of stored incidents."""
        return self._incidents.count()

    def reset(self) -> None:
        """Drop both collections (used by reindex with a new model)."""
        for name in (INCIDENTS, TAXONOMY):
            try:
                self._client.delete_collection(name)
            except Exception:  # noqa: BLE001 - absent collection
                pass


def open_store(settings: Settings, model_id: str) -> ChromaStore:
    """Open the store the settings point at (server URL, else a directory under home)."""
    if settings.chroma_url:
        return ChromaStore(model_id, url=settings.chroma_url)
    settings.store_dir.mkdir(parents=True, exist_ok=True)
    return ChromaStore(model_id, path=str(settings.store_dir))
