"""A read-only copy of an embedded store, for commands that only read: no chromadb, no lock.

Importing chromadb and paging the incidents out of it take about 1.3 s of a ``pmkb suggest`` that
should answer in one. So a command that has the store open writes what the readers need (every
incident's record, document and vector, and the taxonomy entries) into one file beside it,
``pmkb-replica.npz``, and the next ``pmkb suggest``, ``search``, ``node`` or ``stats`` reads that
file instead, searching the vectors exactly (a matrix product: 2,600 incidents take well under a
millisecond).

The copy is used only while it is the store's current state. Every write to an embedded store
replaces the token in ``pmkb-state.json`` before and after it (``ChromaStore``), and the copy
records the token it was made at, read before the store was read: a write during or after the copy
leaves it stale, and a reader that finds it stale opens the store as before (and leaves a fresh
copy for the next one). Chroma itself touches its files on every open, so their times say nothing.
Writes to the copy raise ``ReplicaReadOnly``.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Iterable

import numpy as np

from kb.core.files import write_private
from kb.core.incidents import Incident
from kb.core.roles import Hit
from kb.engine.store import ChromaStore, StoreModelMismatch, mismatch_message, new_token, store_token

log = logging.getLogger(__name__)

REPLICA_FILE = "pmkb-replica.npz"
FORMAT = 1


class ReplicaReadOnly(RuntimeError):
    """A write was tried on the read-only copy of a store."""


def replica_path(directory: Path) -> Path:
    """Where the copy of the embedded store in ``directory`` lives."""
    return Path(directory) / REPLICA_FILE


def _json_array(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)


def _matrix(vectors, rows: int) -> np.ndarray:
    """Vectors as a (rows, dimension) float32 matrix; (0, 1) when there are none."""
    return np.asarray(vectors, dtype=np.float32).reshape(rows, -1) if rows else np.zeros((0, 1), np.float32)


def save_replica(store: ChromaStore) -> Path | None:
    """Write the copy of an embedded store; None for an empty one or one on a server (no directory)."""
    if store.path is None:
        return None
    directory = Path(store.path)
    token = store_token(directory) or new_token(directory)  # first: a write while copying leaves the copy stale
    ids, metadatas, documents, vectors = store.incident_records()
    if not ids:
        return None  # an empty store is built by the reader that finds it so: nothing to copy
    tax_ids, tax_metadatas, tax_documents, tax_vectors = store.taxonomy_records()
    arrays = {
        "manifest": _json_array({"format": FORMAT, "token": token, "model_id": store.model_id,
                                 "count": len(ids)}),
        "incidents": _json_array([ids, metadatas, documents]),
        "vectors": _matrix(vectors, len(ids)),
        "taxonomy": _json_array([tax_ids, tax_metadatas, tax_documents]),
        "taxonomy_vectors": _matrix(tax_vectors, len(tax_ids)),
    }
    path = replica_path(directory)
    write_private(path, lambda fh: np.savez(fh, **arrays))
    return path


def _check_parts(ids, metadatas, documents, vectors: np.ndarray, taxonomy, taxonomy_vectors: np.ndarray) -> None:
    """ValueError unless the copy's parts fit together: one metadata record, document and vector row
    per id (and per taxonomy entry), and a record in every incident's metadata."""
    rows = len(ids)
    if not (len(metadatas) == len(documents) == rows and vectors.ndim == 2 and vectors.shape[0] == rows
            and vectors.dtype == np.float32):
        raise ValueError(f"{rows} ids but {len(metadatas)} metadata records, {len(documents)} documents and "
                         f"vectors of shape {vectors.shape}")
    if not all(isinstance(m, dict) and isinstance(m.get("record"), str) for m in metadatas):
        raise ValueError("an incident's metadata has no record")
    if len(taxonomy) != 3 or len({len(part) for part in taxonomy}) != 1 \
            or taxonomy_vectors.ndim != 2 or taxonomy_vectors.shape[0] != len(taxonomy[0]):
        raise ValueError("the taxonomy entries do not match their vectors")


def open_replica(directory: Path, model_id: str) -> StoreReplica | None:
    """The copy of the embedded store in ``directory`` when it is current and not empty, else None.

    Raises ``StoreModelMismatch`` when the store was built with another embedding model.
    """
    path = replica_path(directory)
    token = store_token(directory)
    if token is None or not path.is_file():
        return None
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:  # written 0600 by this user; anything else was not
        log.warning("the copy of the store at %s is not private to this user (mode %o): not read; the store is "
                    "opened instead (remove the file, the next command writes it again)", path, info.st_mode & 0o777)
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            manifest = json.loads(data["manifest"].tobytes())
            if manifest.get("format") != FORMAT or manifest.get("token") != token or not manifest.get("count"):
                return None
            if manifest.get("model_id") != model_id:
                raise StoreModelMismatch(mismatch_message(str(directory), manifest.get("model_id"), model_id))
            ids, metadatas, documents = json.loads(data["incidents"].tobytes())
            tax = json.loads(data["taxonomy"].tobytes())
            vectors, tax_vectors = data["vectors"], data["taxonomy_vectors"]
        _check_parts(ids, metadatas, documents, vectors, tax, tax_vectors)
        replica = StoreReplica(model_id, str(directory), ids, metadatas, documents, vectors, tax, tax_vectors, token)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        log.warning("the copy of the store at %s cannot be read (%s): the store is opened instead", path, exc)
        return None
    if not replica.taxonomy_entries():
        return None
    return replica


def where_matches(metadata: dict, where: dict | None) -> bool:
    """Whether a record's metadata passes a Chroma ``where`` filter ($and, $or, $in, $nin, $eq, $ne)."""
    if not where:
        return True
    for key, condition in where.items():
        if key == "$and":
            if not all(where_matches(metadata, clause) for clause in condition):
                return False
        elif key == "$or":
            if not any(where_matches(metadata, clause) for clause in condition):
                return False
        elif isinstance(condition, dict):
            value = metadata.get(key)
            for operator, operand in condition.items():
                passed = {"$in": lambda: value in operand, "$nin": lambda: value not in operand,
                          "$eq": lambda: value == operand, "$ne": lambda: value != operand}.get(operator)
                if passed is None:
                    raise ValueError(f"filter operator {operator!r} is not supported on the store's copy")
                if not passed():
                    return False
        elif metadata.get(key) != condition:
            return False
    return True


class StoreReplica:
    """The ``Store`` read side over the copy of an embedded store (see the module doc)."""

    def __init__(self, model_id: str, location: str, ids: list[str], metadatas: list[dict], documents: list[str],
                 vectors: np.ndarray, taxonomy: list, taxonomy_vectors: np.ndarray, token: str):
        self.model_id = model_id
        self.location = location
        self._ids, self._metadatas, self._documents = ids, metadatas, documents
        self._position = {incident_id: n for n, incident_id in enumerate(ids)}
        norms = np.linalg.norm(vectors, axis=1, keepdims=True) if len(ids) else np.ones((0, 1), np.float32)
        self._vectors = vectors
        self._unit = vectors / np.maximum(norms, 1e-12)
        self._taxonomy = list(zip(*taxonomy)) if taxonomy and taxonomy[0] else []
        self._taxonomy_vectors = taxonomy_vectors
        self._token = token
        self._incidents: list[Incident] | None = None

    def _all(self) -> list[Incident]:
        if self._incidents is None:
            self._incidents = [Incident.model_validate_json(m["record"]) for m in self._metadatas]
        return self._incidents

    def _rows(self, where: dict | None) -> list[int]:
        return [n for n, m in enumerate(self._metadatas) if where_matches(m, where)]

    def incidents(self, where: dict | None = None) -> list[Incident]:
        """Every incident of the copy matching an optional metadata filter."""
        everything = self._all()
        return list(everything) if not where else [everything[n] for n in self._rows(where)]

    def incident_hashes(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """Content hashes of the copy's incidents (all, or those with the given ids)."""
        rows = range(len(self._ids)) if ids is None else [self._position[i] for i in ids if i in self._position]
        return {self._ids[n]: self._metadatas[n]["content_hash"] for n in rows}

    def incident_vectors(self) -> tuple[list[str], np.ndarray]:
        """Ids and vectors of every incident."""
        return list(self._ids), self._vectors

    def get_incident(self, incident_id: str) -> Incident | None:
        """One incident by id, or None."""
        n = self._position.get(incident_id)
        return None if n is None else self._all()[n]

    def _nearest(self, vector: np.ndarray, k: int, rows: np.ndarray | None) -> list[tuple[int, float]]:
        query = np.asarray(vector, dtype=np.float32)
        query = query / max(float(np.linalg.norm(query)), 1e-12)
        candidates = self._unit if rows is None else self._unit[rows]
        scores = candidates @ query
        k = min(k, len(scores))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        index = top if rows is None else rows[top]
        return [(int(n), float(s)) for n, s in zip(index, scores[top])]

    def _filtered(self, where: dict | None) -> np.ndarray | None:
        return None if not where else np.asarray(self._rows(where), dtype=np.int64)

    def query_incidents(self, vector: np.ndarray, k: int, where: dict | None = None) -> list[Hit]:
        """The k nearest incidents to a query vector, by exact cosine similarity."""
        return [Hit(id=self._ids[n], score=score, metadata=self._metadatas[n], document=self._documents[n])
                for n, score in self._nearest(vector, k, self._filtered(where))]

    def query_incident_scores(self, vectors: np.ndarray, k: int,
                              where: dict | None = None) -> list[dict[str, float]]:
        """For each query vector, its k nearest incidents' cosine similarities by id."""
        rows = self._filtered(where)
        return [{self._ids[n]: score for n, score in self._nearest(v, k, rows)} for v in np.asarray(vectors)]

    def taxonomy_entries(self) -> list[tuple[str, dict, str]]:
        """(id, metadata, document) of every taxonomy entry."""
        return list(self._taxonomy)

    def taxonomy_vectors(self) -> dict[str, np.ndarray]:
        """Vectors of all taxonomy entries by id."""
        return {entry[0]: self._taxonomy_vectors[n] for n, entry in enumerate(self._taxonomy)}

    def count(self) -> int:
        """Number of incidents in the copy."""
        return len(self._ids)

    def state(self) -> tuple:
        """The store token the copy was made at (it never changes: the copy is read-only)."""
        return (self._token,)

    def _read_only(self, *_args, **_kwargs):
        raise ReplicaReadOnly(f"the knowledge base at {self.location} was opened read-only (from its copy "
                              f"{REPLICA_FILE}); open it without read_only to write")

    upsert_incidents = upsert_taxonomy = reset = _read_only

    def close(self) -> None:
        """Nothing to release: the copy holds no lock."""
