"""Vector store for incidents and taxonomy entries (Chroma, embedded or client/server).

Only this module imports chromadb. The store records which embedding model built it and
refuses vectors from another one. An embedded store is open in one process at a time
(``kb.engine.store_lock``); several processes share a knowledge base through a Chroma server.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import numpy as np

from kb.core.files import write_private
from kb.core.incidents import Incident
from kb.core.roles import Hit
from kb.core.settings import Settings
from kb.engine import store_lock
from kb.engine.embedding import setting_for

INCIDENTS = "pmkb-incidents"
TAXONOMY = "pmkb-taxonomy"
STATE = "pmkb-state"
"""On a Chroma server: one record whose token every incident write changes, so that other
processes notice an update that kept the number of incidents the same."""

_local_writes: dict[str, int] = {}
"""The number of this process's latest incident write, by store location."""
_write_numbers = itertools.count(1)  # next() is atomic: two threads writing never get the same number


STATE_FILE = "pmkb-state.json"
"""In an embedded store's directory: a token replaced before and after every write, so that a copy
of the store (``kb.engine.replica``) knows whether it is still current."""


class StoreModelMismatch(RuntimeError):
    """The store was built with another embedding model than the one configured."""


def mismatch_message(location: str, built_with: str | None, configured: str) -> str:
    """What to do when a store built with one embedding model is opened with another."""
    keep = "Use the model it was built with"
    if (setting := setting_for(built_with)) is not None:
        keep += f" ({setting})"
    return (f"the knowledge base at {location} was built with embedding model {built_with!r}, but "
            f"{configured!r} is configured. {keep}, or build a knowledge base for the new model in another "
            f"directory (`pmkb build --kb NEW_DIR`, then `pmkb ingest --kb NEW_DIR` your incident files).")


def store_token(directory: Path) -> str | None:
    """The embedded store's current write token (None before its first write under this version)."""
    try:
        return json.loads((Path(directory) / STATE_FILE).read_text(encoding="utf-8"))["token"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def new_token(directory: Path) -> str:
    """Replace the embedded store's write token (only while holding its lock); the new token."""
    token = uuid.uuid4().hex
    payload = json.dumps({"token": token, "at": time.time()}).encode("utf-8")
    write_private(Path(directory) / STATE_FILE, lambda fh: fh.write(payload))
    return token


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
    """Chroma-backed store: PersistentClient on a directory, or HttpClient on a server URL.

    An embedded store holds the directory's lock (``kb.engine.store_lock``) until it is closed or
    garbage-collected; opening a directory that another process has open raises ``StoreLocked``.
    """

    def __init__(self, model_id: str, path: str | None = None, url: str | None = None,
                 refresh_seconds: float = 5.0):
        self.model_id = model_id
        self.location = url or path
        self.path = None if url else path  # the embedded store's directory
        self.refresh_seconds = refresh_seconds
        self._seen: tuple[float, tuple] | None = None  # (when, count and token) last read from a server
        lock = None if url else store_lock.acquire(path)  # first: a store in use fails before the slow import
        try:
            self._client = _connect(path, url)
        except BaseException:
            if lock:
                store_lock.release(lock)
            raise
        self._key = lock or url  # where this process counts its writes
        # The client is closed before the lock is given back, so the next holder finds the files at rest.
        self._closer = weakref.finalize(self, _close, self._client, lock)
        self._closer.atexit = False  # at exit the kernel drops the lock; nothing to wait for
        try:
            self._incidents = self._collection(INCIDENTS)
            self._taxonomy = self._collection(TAXONOMY)
            self._state = self._client.get_or_create_collection(STATE, embedding_function=None) if url else None
            self._batch = min(1000, self._client.get_max_batch_size())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the client and, for an embedded store, give back its lock (idempotent)."""
        self._closer()

    def _collection(self, name: str):
        col = self._client.get_or_create_collection(
            name, metadata={"hnsw:space": "cosine", "embedding_model": self.model_id},
            embedding_function=None)
        built_with = (col.metadata or {}).get("embedding_model")
        if built_with != self.model_id:
            raise StoreModelMismatch(mismatch_message(str(self.location), built_with, self.model_id))
        return col

    @contextmanager
    def _writing(self):
        """Around a write: the embedded store's token changes before it (a crash mid-write leaves
        every copy stale) and after it (a copy made during it is stale)."""
        if self.path is not None:
            new_token(Path(self.path))
        try:
            yield
        finally:
            if self.path is not None:
                new_token(Path(self.path))

    def upsert_incidents(self, incidents: list[Incident], vectors: np.ndarray,
                         dimensions: list[str | None] | None = None) -> None:
        """Insert or replace incidents (by id) with their vectors."""
        dimensions = dimensions or [None] * len(incidents)
        with self._writing():
            for start in range(0, len(incidents), self._batch):
                chunk = incidents[start:start + self._batch]
                self._incidents.upsert(
                    ids=[i.id for i in chunk],
                    embeddings=vectors[start:start + self._batch].tolist(),
                    documents=[i.document() for i in chunk],
                    metadatas=[incident_metadata(i, d) for i, d in
                               zip(chunk, dimensions[start:start + self._batch])])
            self._changed()

    def _changed(self) -> None:
        """Record an incident write: at once for this process, through the token for others."""
        _local_writes[self._key] = next(_write_numbers)
        if self._state is not None:
            self._state.upsert(ids=["incidents"], embeddings=[[1.0]],
                               metadatas=[{"token": uuid.uuid4().hex, "at": time.time()}])

    def state(self) -> tuple:
        """A value that changes when the stored incidents change.

        This process's writes change it at once. On a Chroma server, where other processes may
        write too, it also holds the incident count and the write token, read again at most every
        ``refresh_seconds``; an embedded store is locked to this process, so nothing else can change it.
        """
        local = _local_writes.get(self._key, 0)
        if self._state is None:
            return (local,)
        seen, now = self._seen, time.monotonic()
        if seen is None or now - seen[0] >= self.refresh_seconds:
            got = self._state.get(ids=["incidents"], include=["metadatas"])
            token = got["metadatas"][0].get("token") if got["ids"] else None
            seen = self._seen = (now, (self.count(), token))
        return (local, *seen[1])

    def incident_hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """Content hashes of stored incidents (all, or those with the given ids)."""
        result: dict[str, str] = {}
        id_list = list(ids) if ids is not None else None
        if id_list is not None:
            for start in range(0, len(id_list), self._batch):
                got = self._incidents.get(ids=id_list[start:start + self._batch], include=["metadatas"])
                result.update({i: m["content_hash"] for i, m in zip(got["ids"], got["metadatas"])})
            return result
        for got in self._scan(include=["metadatas"]):
            result.update({i: m["content_hash"] for i, m in zip(got["ids"], got["metadatas"])})
        return result

    def _scan(self, include: list[str], where: dict | None = None):
        """Every stored incident matching ``where``, a page of Chroma's ``get`` result at a time."""
        offset = 0
        while True:
            got = self._incidents.get(include=include, where=where, limit=self._batch, offset=offset)
            if not got["ids"]:
                return
            yield got
            offset += len(got["ids"])

    def incidents(self, where: dict | None = None) -> list[Incident]:
        """Every stored incident matching an optional metadata filter."""
        out: list[Incident] = []
        for got in self._scan(include=["metadatas"], where=where):
            out.extend(Incident.model_validate_json(m["record"]) for m in got["metadatas"])
        return out

    def incident_vectors(self) -> tuple[list[str], np.ndarray]:
        """All incident ids and their stored vectors (for re-embedding checks and search)."""
        ids, vecs = [], []
        for got in self._scan(include=["embeddings"]):
            ids.extend(got["ids"])
            vecs.extend(got["embeddings"])
        return ids, np.asarray(vecs, dtype=np.float32)

    def incident_records(self) -> tuple[list[str], list[dict], list[str], np.ndarray]:
        """Every incident as stored: ids, metadata, documents and vectors (for the store's copy)."""
        ids, metadatas, documents, vectors = [], [], [], []
        for got in self._scan(include=["metadatas", "documents", "embeddings"]):
            ids.extend(got["ids"])
            metadatas.extend(got["metadatas"])
            documents.extend(got["documents"])
            vectors.extend(got["embeddings"])
        return ids, metadatas, documents, np.asarray(vectors, dtype=np.float32)

    def taxonomy_records(self) -> tuple[list[str], list[dict], list[str], np.ndarray]:
        """Every taxonomy entry as stored: ids, metadata, documents and vectors."""
        got = self._taxonomy.get(include=["metadatas", "documents", "embeddings"])
        return got["ids"], got["metadatas"], got["documents"], np.asarray(got["embeddings"], dtype=np.float32)

    def get_incident(self, incident_id: str) -> Incident | None:
        """One incident by id, or None."""
        got = self._incidents.get(ids=[incident_id], include=["metadatas"])
        return Incident.model_validate_json(got["metadatas"][0]["record"]) if got["ids"] else None

    def query_incidents(self, vector: np.ndarray, k: int, where: dict | None = None) -> list[Hit]:
        """Nearest incidents to a query vector (cosine similarity as score).

        Chroma returns fewer than ``k`` when fewer are stored, so the store is not counted first:
        counting reads every row (9 ms at 100,000 incidents, more than the search itself).
        """
        if k <= 0:
            return []
        res = self._incidents.query(query_embeddings=[np.asarray(vector).tolist()],
                                    n_results=k, where=where,
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
        if k <= 0 or not len(vectors):
            return [{} for _ in range(len(vectors))]
        res = self._incidents.query(query_embeddings=vectors.tolist(), n_results=k,
                                    where=where, include=["distances"])
        return [{i: 1.0 - float(d) for i, d in zip(ids, dists)}
                for ids, dists in zip(res["ids"], res["distances"])]

    def upsert_taxonomy(self, ids: list[str], documents: list[str], metadatas: list[dict],
                        vectors: np.ndarray) -> None:
        """Insert or replace taxonomy entries, dropping entries no longer in the taxonomy."""
        existing = set(self._taxonomy.get(include=[])["ids"])
        stale = sorted(existing - set(ids))
        with self._writing():
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
        """Drop both collections."""
        with self._writing():
            for name in (INCIDENTS, TAXONOMY):
                try:
                    self._client.delete_collection(name)
                except Exception:  # noqa: BLE001 - absent collection
                    pass
            self._changed()


def _connect(path: str | None, url: str | None):
    """A Chroma client: HttpClient on a server URL, else PersistentClient on a directory."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma_settings = ChromaSettings(anonymized_telemetry=False)
    if url:
        from urllib.parse import urlparse

        parsed = urlparse(url)
        return chromadb.HttpClient(host=parsed.hostname or "localhost", port=parsed.port or 8000,
                                   ssl=parsed.scheme == "https", settings=chroma_settings)
    return chromadb.PersistentClient(path=path, settings=chroma_settings)


def _close(client, lock: str | None) -> None:
    try:
        client.close()
    finally:
        if lock is not None:
            store_lock.release(lock)


def open_store(settings: Settings, model_id: str) -> ChromaStore:
    """Open the store the settings point at (server URL, else a directory under home)."""
    if settings.chroma_url:
        return ChromaStore(model_id, url=settings.chroma_url, refresh_seconds=settings.chroma_refresh_seconds)
    settings.store_dir.mkdir(parents=True, exist_ok=True)
    return ChromaStore(model_id, path=str(settings.store_dir))
