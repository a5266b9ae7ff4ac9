"""A supervised text classifier over the knowledge base: TF-IDF words, TF-IDF character n-grams
and the embedding, multinomial logistic regression. One of the classifier's features
(kb/classify.py).

Character n-grams (within word boundaries) match the pieces of error tokens that tickets spell
in many ways (``ibv_reg_mr`` / ``ibv_reg_mr_iova2``, ``OOMKilled`` / ``oom-kill``, ``Xid 79`` /
``Xid79``), which whole-word features miss."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import warnings
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TOKEN_PATTERN = r"[A-Za-z_][A-Za-z0-9_]+|\d+"
MAX_CHAR_FEATURES = 50_000
MODEL_VERSION = 3  # bump when the features or the model change: cached classifiers are then refitted
REPORT_WEIGHT = 0.5
"""Weight of an incident's full report (ticket plus resolution) as an extra training sample. It
teaches the classifier the words of what was found (a device-plugin bug, a node-image setting),
which tickets sometimes already carry; the ticket text alone stays the main sample."""


class TextClassifier:
    """Predicts a label distribution for a ticket from its words and its embedding."""

    def __init__(self, labels: list[str], strength: float = 32.0):
        self.labels = labels
        self.strength = strength
        self._vectorizers = []
        self._model = None
        self._classes: list[int] = []

    def _matrix(self, texts: list[str], vectors: np.ndarray, fit: bool = False):
        from scipy.sparse import csr_matrix, hstack
        from sklearn.feature_extraction.text import TfidfVectorizer

        if fit:
            self._vectorizers = [
                TfidfVectorizer(sublinear_tf=True, token_pattern=TOKEN_PATTERN),
                TfidfVectorizer(sublinear_tf=True, analyzer="char_wb", ngram_range=(3, 5), min_df=2,
                                max_features=MAX_CHAR_FEATURES),
            ]
            parts = [v.fit_transform(texts) for v in self._vectorizers]
        else:
            parts = [v.transform(texts) for v in self._vectorizers]
        return hstack([*parts, csr_matrix(np.asarray(vectors))]).tocsr()

    def fit(self, texts: list[str], vectors: np.ndarray, truths: list[str],
            reports: list[str] | None = None) -> "TextClassifier":
        """Train on labelled texts (labels outside ``self.labels`` are ignored).

        ``reports``: each incident's full report (ticket and resolution), added as a second sample
        of the same label with weight ``REPORT_WEIGHT`` (and the ticket's vector).
        """
        from sklearn.linear_model import LogisticRegression

        keep = [i for i, t in enumerate(truths) if t in self.labels]
        y = np.array([self.labels.index(truths[i]) for i in keep])
        self._model = None
        if len(set(y.tolist())) < 2:
            return self
        vectors = np.asarray(vectors)
        rows, weights = keep, [1.0] * len(keep)
        sample_texts = [texts[i] for i in keep]
        if reports is not None:
            extra = [i for i in keep if reports[i] and reports[i] != texts[i]]
            rows, weights = keep + extra, weights + [REPORT_WEIGHT] * len(extra)
            sample_texts += [reports[i] for i in extra]
            y = np.concatenate([y, [self.labels.index(truths[i]) for i in extra]]).astype(int)
        matrix = self._matrix(sample_texts, vectors[rows], fit=True)
        with warnings.catch_warnings():  # convergence warnings: a loose fit is enough for ranking
            warnings.simplefilter("ignore")
            self._model = LogisticRegression(C=self.strength, max_iter=200, tol=1e-3).fit(
                matrix, y, sample_weight=np.asarray(weights))
        self._classes = self._model.classes_.tolist()
        return self

    def log_proba(self, texts: list[str], vectors: np.ndarray) -> np.ndarray:
        """(n, len(labels)) log-probabilities; uniform when untrained, a small floor for unseen labels."""
        out = np.full((len(texts), len(self.labels)), np.log(1.0 / len(self.labels)))
        if self._model is None or not texts:
            return out
        probs = self._model.predict_proba(self._matrix(texts, vectors))
        full = np.full((len(texts), len(self.labels)), 1e-3)
        full[:, self._classes] = probs + 1e-3
        return np.log(full / full.sum(axis=1, keepdims=True))


def out_of_fold_log_proba(labels: list[str], texts: list[str], vectors: np.ndarray, truths: list[str],
                          reports: list[str] | None = None, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Log-probabilities for each text from a classifier that did not see it (k-fold)."""
    rng = np.random.default_rng(seed)
    assignment = rng.permutation(len(texts)) % folds
    out = np.zeros((len(texts), len(labels)))
    vectors = np.asarray(vectors)
    for fold in range(folds):
        train = np.where(assignment != fold)[0]
        test = np.where(assignment == fold)[0]
        clf = TextClassifier(labels).fit([texts[i] for i in train], vectors[train], [truths[i] for i in train],
                                         None if reports is None else [reports[i] for i in train])
        out[test] = clf.log_proba([texts[i] for i in test], vectors[test])
    return out


def training_fingerprint(incidents, model_id: str) -> str:
    """Stable digest of what the classifiers learn from: every training incident's content and
    labels, the embedding model and the classifier version."""
    digest = hashlib.sha256(f"v{MODEL_VERSION}\x00{model_id}".encode())
    for incident in sorted(incidents, key=lambda i: i.id):
        digest.update(f"\x00{incident.id}\x00{incident.content_hash()}".encode())
    return digest.hexdigest()


def load_classifiers(path: Path, fingerprint: str) -> dict[str, TextClassifier] | None:
    """Classifiers cached at ``path`` when they were trained on exactly this data, else None.

    The cache lives in the knowledge base's own directory and is written only by pmkb; an
    unreadable or stale file is ignored (and replaced on the next save).
    """
    try:
        with open(path, "rb") as fh:
            cached = pickle.load(fh)  # noqa: S301 - pmkb's own file inside the knowledge base
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged cache only costs a refit
        log.warning("ignoring the text-classifier cache %s (%s); it will be rebuilt", path, exc)
        return None
    if not isinstance(cached, dict) or cached.get("fingerprint") != fingerprint:
        return None
    return cached.get("classifiers")


def save_classifiers(path: Path, fingerprint: str, classifiers: dict[str, TextClassifier]) -> None:
    """Cache trained classifiers atomically (a crash mid-write leaves the old file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(partial, "wb") as fh:
        pickle.dump({"fingerprint": fingerprint, "classifiers": classifiers}, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, path)
