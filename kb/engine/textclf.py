"""A supervised text classifier over the knowledge base: TF-IDF words, TF-IDF character n-grams
and the embedding, multinomial logistic regression. One of the classifier's features
(kb/engine/classify.py).

Character n-grams (within word boundaries) match the pieces of error tokens that tickets spell
in many ways (``ibv_reg_mr`` / ``ibv_reg_mr_iova2``, ``OOMKilled`` / ``oom-kill``, ``Xid 79`` /
``Xid79``), which whole-word features miss."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

from kb.core.files import write_private
from kb.core.text import TOKEN_PATTERN

log = logging.getLogger(__name__)

MAX_CHAR_FEATURES = 50_000
MODEL_VERSION = 3  # bump when the features or the model change: cached classifiers are then refitted
REPORT_WEIGHT = 0.5
"""Weight of an incident's full report (ticket plus resolution) as an extra training sample. It
teaches the classifier the words of what was found (a device-plugin bug, a node-image setting),
which tickets sometimes already carry; the ticket text alone stays the main sample."""
CACHE_FILE = "text_classifiers.npz"
"""Name of the classifier cache in the knowledge-base directory."""
LEGACY_CACHE_FILES = ("text_classifiers.pkl",)
"""Pickled caches written by earlier versions: never read, removed when the cache is next saved."""
CACHE_FORMAT = 1


def _new_vectorizers() -> list:
    """The word and character TF-IDF vectorizers, unfitted."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return [TfidfVectorizer(sublinear_tf=True, token_pattern=TOKEN_PATTERN),
            TfidfVectorizer(sublinear_tf=True, analyzer="char_wb", ngram_range=(3, 5), min_df=2,
                            max_features=MAX_CHAR_FEATURES)]


class _StoredModel:
    """A stored classifier's inference without scikit-learn: the TF-IDF transform of the word and
    character vectorizers (fixed vocabularies and idf, sublinear tf, each part l2-normalised, as
    ``TfidfVectorizer`` does) and the logistic model's probabilities, in numpy. A new process that
    answers one ticket then never imports scikit-learn (seconds on a small machine);
    ``tests/test_textclf.py`` checks it gives scikit-learn's probabilities."""

    _white_spaces = re.compile(r"\s\s+")
    _tokens = re.compile(TOKEN_PATTERN)

    def __init__(self, vocabularies: list[list[str]], idfs: list[np.ndarray], coef: np.ndarray,
                 intercept: np.ndarray):
        self.index = [dict(zip(terms, range(len(terms)))) for terms in vocabularies]
        self.offsets = [0, len(vocabularies[0])]
        self.idfs, self.coef, self.intercept = idfs, coef, intercept
        self.dense = sum(map(len, vocabularies))

    @classmethod
    def _char_wb(cls, text: str) -> list[str]:
        grams = []
        for word in cls._white_spaces.sub(" ", text).split():
            word = f" {word} "
            for n in range(3, 6):
                grams += [word[i:i + n] for i in range(max(len(word) - n, 0) + 1)]
                if len(word) <= n:
                    break
        return grams

    @classmethod
    @lru_cache(maxsize=16)
    def _counted(cls, lowered: str) -> tuple[Counter, Counter]:
        """The text's word and character n-gram counts: one suggestion asks every classifier
        (causes, symptoms, readings) about the same text, so they are counted once."""
        return Counter(cls._tokens.findall(lowered)), Counter(cls._char_wb(lowered))

    def _part(self, counted: Counter, part: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.index[part]
        found = [(column, count) for term, count in counted.items() if (column := index.get(term)) is not None]
        columns = np.fromiter((c for c, _ in found), dtype=np.int64, count=len(found))
        values = np.log(np.fromiter((n for _, n in found), dtype=np.float64, count=len(found))) + 1.0
        values = values * self.idfs[part][columns]
        norm = np.sqrt(np.dot(values, values))
        return columns + self.offsets[part], (values / norm if norm else values)

    def predict_proba(self, texts: list[str], vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float64)
        scores = vectors @ self.coef[:, self.dense:].T + self.intercept
        for row, text in enumerate(texts):
            for part, counted in enumerate(self._counted(text.lower())):
                columns, values = self._part(counted, part)
                scores[row] += self.coef[:, columns] @ values
        if self.coef.shape[0] == 1:  # two classes: one row of coefficients, the logistic function
            positive = 1.0 / (1.0 + np.exp(-scores[:, 0]))
            return np.column_stack([1.0 - positive, positive])
        scores -= scores.max(axis=1, keepdims=True)
        exp = np.exp(scores)
        return exp / exp.sum(axis=1, keepdims=True)


class TextClassifier:
    """Predicts a label distribution for a ticket from its words and its embedding."""

    def __init__(self, labels: list[str], strength: float = 32.0):
        self.labels = labels
        self.strength = strength
        self._vectorizers = []
        self._model = None
        self._classes: list[int] = []
        self._state: tuple[dict, dict[str, np.ndarray]] | None = None  # what from_state was given

    def _matrix(self, texts: list[str], vectors: np.ndarray, fit: bool = False):
        from scipy.sparse import csr_matrix, hstack

        if fit:
            self._vectorizers = _new_vectorizers()
            parts = [v.fit_transform(texts) for v in self._vectorizers]
        else:
            parts = [v.transform(texts) for v in self._vectorizers]
        return hstack([*parts, csr_matrix(np.asarray(vectors))]).tocsr()

    def fit(self, texts: list[str], vectors: np.ndarray, truths: list[str],
            extra_texts: list[str] | None = None) -> "TextClassifier":
        """Train on labelled texts (labels outside ``self.labels`` are ignored).

        ``extra_texts``: a second text of each sample, added with the same label at weight
        ``REPORT_WEIGHT`` (and the ticket's vector): an incident's full report (ticket and
        resolution) for causes and symptoms, the words an expert read a reading from for readings.
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
        if extra_texts is not None:
            extra = [i for i in keep if extra_texts[i] and extra_texts[i] != texts[i]]
            rows, weights = keep + extra, weights + [REPORT_WEIGHT] * len(extra)
            sample_texts += [extra_texts[i] for i in extra]
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
        probs = (self._model.predict_proba(texts, vectors) if isinstance(self._model, _StoredModel)
                 else self._model.predict_proba(self._matrix(texts, vectors)))
        full = np.full((len(texts), len(self.labels)), 1e-3)
        full[:, self._classes] = probs + 1e-3
        return np.log(full / full.sum(axis=1, keepdims=True))

    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The fitted classifier as plain data: a JSON-safe header and numeric arrays."""
        if isinstance(self._model, _StoredModel):
            return self._state
        header = {"labels": list(self.labels), "strength": self.strength, "trained": self._model is not None}
        if self._model is None:
            return header, {}
        header["vocabularies"] = [v.get_feature_names_out().tolist() for v in self._vectorizers]
        arrays = {f"idf{n}": np.asarray(v.idf_) for n, v in enumerate(self._vectorizers)}
        arrays.update(coef=self._model.coef_, intercept=self._model.intercept_,
                      classes=np.asarray(self._classes, dtype=np.int64))
        return header, arrays

    @classmethod
    def from_state(cls, header: dict, arrays: dict[str, np.ndarray]) -> "TextClassifier":
        """A classifier rebuilt from ``to_state``'s output, for inference (``_StoredModel``); raises
        ValueError when it does not fit together."""
        labels = header["labels"]
        if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
            raise ValueError("labels are not a list of names")
        clf = cls(labels, float(header["strength"]))
        if not header["trained"]:
            return clf
        vocabularies = header["vocabularies"]
        if not (isinstance(vocabularies, list) and len(vocabularies) == 2
                and all(isinstance(terms, list) and set(map(type, terms)) <= {str} for terms in vocabularies)):
            raise ValueError("vocabularies are not two lists of terms")
        idfs = [_numeric(arrays, f"idf{n}", (len(vocabularies[n]),)) for n in range(2)]  # checks the vocabulary too
        coef, intercept = _numeric(arrays, "coef"), _numeric(arrays, "intercept")
        classes = _numeric(arrays, "classes")
        if classes.ndim != 1 or len(classes) < 2 or len(set(classes.tolist())) != len(classes) \
                or not all(0 <= c < len(labels) for c in classes.tolist()):
            raise ValueError("classes do not index the labels")
        rows = 1 if len(classes) == 2 else len(classes)
        if coef.ndim != 2 or coef.shape[0] != rows or coef.shape[1] <= sum(map(len, vocabularies)) \
                or intercept.shape != (rows,):
            raise ValueError(f"coefficients of shape {coef.shape} do not fit the vocabularies and classes")
        clf._model = _StoredModel(vocabularies, [np.asarray(i, dtype=np.float64) for i in idfs],
                                  np.asarray(coef, dtype=np.float64), np.asarray(intercept, dtype=np.float64))
        clf._classes = classes.tolist()
        clf._state = (header, arrays)
        return clf


def out_of_fold_log_proba(labels: list[str], texts: list[str], vectors: np.ndarray, truths: list[str],
                          extra_texts: list[str] | None = None, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Log-probabilities for each text from a classifier that did not see it (k-fold)."""
    rng = np.random.default_rng(seed)
    assignment = rng.permutation(len(texts)) % folds
    out = np.zeros((len(texts), len(labels)))
    vectors = np.asarray(vectors)
    for fold in range(folds):
        train = np.where(assignment != fold)[0]
        test = np.where(assignment == fold)[0]
        clf = TextClassifier(labels).fit([texts[i] for i in train], vectors[train], [truths[i] for i in train],
                                         None if extra_texts is None else [extra_texts[i] for i in train])
        out[test] = clf.log_proba([texts[i] for i in test], vectors[test])
    return out


def training_fingerprint(incidents, model_id: str) -> str:
    """Stable digest of what the classifiers learn from: every training incident's content and
    labels, the embedding model and the classifier version."""
    digest = hashlib.sha256(f"v{MODEL_VERSION}\x00{model_id}".encode())
    for incident in sorted(incidents, key=lambda i: i.id):
        digest.update(f"\x00{incident.id}\x00{incident.content_hash()}".encode())
    return digest.hexdigest()


def _numeric(arrays: dict[str, np.ndarray], name: str, shape: tuple | None = None) -> np.ndarray:
    """A stored array that must be numeric (and of ``shape`` when given); ValueError otherwise."""
    if name not in arrays:
        raise ValueError(f"array {name!r} is missing")
    value = arrays[name]
    if value.dtype.kind not in "iuf" or (shape is not None and value.shape != shape):
        raise ValueError(f"array {name!r} is {value.dtype} {value.shape}, not numbers of shape {shape or 'any'}")
    return value


def load_classifiers(path: Path, fingerprint: str) -> dict[str, TextClassifier] | None:
    """Classifiers cached at ``path`` when they were trained on exactly this data, else None.

    The file is read as data only (a numpy archive opened with ``allow_pickle=False`` and a JSON
    header), so nothing in the knowledge-base directory can run code when it is loaded. An
    unreadable, foreign or stale file is ignored (and replaced on the next save).
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        header = json.loads(_numeric(arrays, "header").astype(np.uint8).tobytes().decode("utf-8"))
        if not isinstance(header, dict) or header.get("format") != CACHE_FORMAT:
            raise ValueError(f"not a format-{CACHE_FORMAT} classifier cache")
        if header.get("fingerprint") != fingerprint:
            return None
        return {field: TextClassifier.from_state(
                    part, {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{field}.")})
                for field, part in header["classifiers"].items()}
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache only costs a refit
        log.warning("ignoring the text-classifier cache %s (%s); it will be rebuilt", path, exc)
        return None


def save_classifiers(path: Path, fingerprint: str, classifiers: dict[str, TextClassifier]) -> None:
    """Cache trained classifiers atomically, readable by the owner only.

    A crash mid-write leaves the old file or none. A pickled cache left by an earlier version
    is removed unread.
    """
    header: dict = {"format": CACHE_FORMAT, "fingerprint": fingerprint, "classifiers": {}}
    arrays: dict[str, np.ndarray] = {}
    for field, clf in classifiers.items():
        header["classifiers"][field], state = clf.to_state()
        arrays.update({f"{field}.{name}": value for name, value in state.items()})
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    write_private(path, lambda fh: np.savez(fh, **arrays))
    for legacy in (path.with_name(name) for name in LEGACY_CACHE_FILES):
        if legacy == path:
            continue
        try:
            legacy.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove %s, a pickled classifier cache of an earlier version: %s", legacy, exc)
            continue
        log.info("removed %s, a pickled classifier cache of an earlier version", legacy)
