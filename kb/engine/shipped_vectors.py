"""Vectors shipped with the bundled reports, so that building the bundled knowledge base embeds
almost nothing.

Embedding the bundled reports is most of ``pmkb build`` on a small machine: about 13 minutes on two
cores with the default model, 90 s with the light one. ``data/vectors/`` holds a file per bundled
model with each report's document vector (float16), keyed by the model's id and a digest of the
exact text that was embedded. A build takes a vector from it only when both match and embeds
everything else, so an edited report, a team's own incidents or another model are embedded as
before. ``make vectors`` rewrites the files, and a test fails when one no longer covers every
bundled report.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import zipfile
from pathlib import Path

import numpy as np

from kb.core.files import per_model_file
from kb.core.roles import Embedder

log = logging.getLogger(__name__)

DIGEST_BYTES = 16


def text_digest(text: str) -> bytes:
    """The key of a document's vector: a digest of the exact text embedded."""
    return hashlib.sha256(text.encode("utf-8")).digest()[:DIGEST_BYTES]


class ShippedVectors:
    """Document vectors of one model, by text digest."""

    def __init__(self, model_id: str, vectors: dict[bytes, np.ndarray]):
        self.model_id = model_id
        self.vectors = vectors

    def __len__(self) -> int:
        return len(self.vectors)

    def get(self, text: str) -> np.ndarray | None:
        """The shipped vector of this exact text, or None."""
        return self.vectors.get(text_digest(text))

    @classmethod
    def load(cls, path: Path, model_id: str) -> ShippedVectors | None:
        """This model's vectors from ``path`` (a file, or a folder with a file per model); None (and
        everything is embedded) when there are none, they are another model's, or the file is
        unreadable (a warning says which and how to rewrite it)."""
        path = per_model_file(path, model_id, ".npz")
        if not path.is_file():
            log.info("no vectors ship for %s (%s): every report is embedded", model_id, path)
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                shipped_model, digests, vectors = str(data["model_id"]), data["digests"], data["vectors"]
            if digests.shape != (len(vectors), DIGEST_BYTES) or vectors.ndim != 2:
                raise ValueError(f"{len(digests)} digests of shape {digests.shape} for vectors {vectors.shape}")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("ignoring the shipped vectors in %s (%s): every report is embedded instead; "
                        "`make vectors` rewrites the file", path, exc)
            return None
        if shipped_model != model_id:
            log.info("the shipped vectors in %s are %s's, not %s's: every report is embedded",
                     path, shipped_model, model_id)
            return None
        return cls(model_id, {bytes(d): v for d, v in zip(digests, vectors)})

    @staticmethod
    def write(path: Path, model_id: str, texts: list[str], vectors: np.ndarray) -> Path:
        """Save ``vectors`` (one row per text) as the shipped vectors of ``model_id`` (in its file of
        the folder ``path``); returns the file written."""
        path = per_model_file(path, model_id, ".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        digests = np.frombuffer(b"".join(text_digest(t) for t in texts), dtype=np.uint8)
        np.savez_compressed(path, model_id=np.array(model_id), digests=digests.reshape(-1, DIGEST_BYTES),
                            vectors=np.asarray(vectors, dtype=np.float16))
        return path


def embed_documents(embedder: Embedder, texts: list[str], shipped: ShippedVectors | None) -> tuple[np.ndarray, int]:
    """Document vectors of ``texts``: the shipped ones where text and model match, the embedder's
    for the rest (in one call); and how many the embedder made."""
    if shipped is None or shipped.model_id != embedder.model_id or not texts:
        return embedder.embed_documents(texts), len(texts)
    found = [shipped.get(t) for t in texts]
    missing = [n for n, vector in enumerate(found) if vector is None]
    if missing:
        for n, vector in zip(missing, embedder.embed_documents([texts[n] for n in missing])):
            found[n] = vector
    return np.vstack(found).astype(np.float32), len(missing)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the shipped vectors of the bundled reports (``make vectors``): for the models named
    (``package:...`` or a model directory), else for both bundled models."""
    from kb.core.settings import DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL, load_settings
    from kb.engine.knowledge import KnowledgeBase

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for model in (argv if argv is not None else sys.argv[1:]) or [DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL]:
        settings = load_settings(embedding_model=model)
        kb = KnowledgeBase(settings)
        incidents, errors = kb.prepare(kb.bundled_incidents())
        if errors:
            print("bundled reports with invalid labels: fix them first:\n" + "\n".join(errors), file=sys.stderr)
            return 1
        texts = [i.text() for i in incidents]
        print(f"embedding {len(texts)} bundled reports with {kb.embedder.model_id} ...", flush=True)
        vectors = np.vstack([kb.embedder.embed_documents(texts[start:start + 256])
                             for start in _progress(range(0, len(texts), 256), len(texts))])
        path = ShippedVectors.write(settings.bundled_vectors, kb.embedder.model_id, texts, vectors)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _progress(starts: range, total: int):
    for start in starts:
        yield start
        print(f"  {min(start + starts.step, total)}/{total}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
