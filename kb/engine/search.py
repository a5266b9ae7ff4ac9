"""Hybrid retrieval: BM25 over incident text fused with dense similarity from the store."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kb.core.incidents import VOTERS, Incident
from kb.core.suggestion import SimilarIncident
from kb.core.text import tokenize
from kb.engine.knowledge import KnowledgeBase

DENSE_WEIGHT = 0.7
"""Share of the dense similarity in the fused score; BM25 (max-normalised) takes the rest."""


class BM25:
    """Okapi BM25 over a fixed corpus, with an inverted index for sparse scoring.

    The index is built with numpy: every (term, document) pair once, sorted by term, so a term's
    postings are one slice (a few times faster to build than a dict of lists, which a command
    answering one ticket pays for on every start)."""

    def __init__(self, documents: list[list[str]], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.size = len(documents)
        self.lengths = np.array([len(d) for d in documents], dtype=np.float32)
        self.avg_length = float(self.lengths.mean()) if self.size else 0.0
        vocabulary: dict[str, int] = {}
        term_ids = np.fromiter((vocabulary.setdefault(t, len(vocabulary)) for d in documents for t in d),
                               dtype=np.int64)
        doc_ids = np.repeat(np.arange(self.size, dtype=np.int64), self.lengths.astype(np.int64))
        pairs, freqs = np.unique(term_ids * max(self.size, 1) + doc_ids, return_counts=True)
        terms = pairs // max(self.size, 1)
        self._docs = pairs % max(self.size, 1)
        self._freqs = freqs.astype(np.float32)
        self._start = np.searchsorted(terms, np.arange(len(vocabulary) + 1))
        self.vocabulary = vocabulary
        df = np.diff(self._start)
        self._idf = np.log(1 + (self.size - df + 0.5) / (df + 0.5)).astype(np.float32)
        self._norm = self.k1 * (1 - self.b + self.b * self.lengths / max(self.avg_length, 1e-9))
        self._weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _term_weights(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(document indices, BM25 weights) of a term; computed once, since they do not depend on the query."""
        cached = self._weights.get(term)
        if cached is None:
            n = self.vocabulary.get(term)
            if n is None:
                return None
            rows = slice(self._start[n], self._start[n + 1])
            idx, tf = self._docs[rows], self._freqs[rows]
            cached = self._weights[term] = (idx, self._idf[n] * tf * (self.k1 + 1) / (tf + self._norm[idx]))
        return cached

    def scores(self, query: list[str]) -> np.ndarray:
        """BM25 score of every document for the query tokens."""
        out = np.zeros(self.size, dtype=np.float32)
        if not self.size:
            return out
        for term in set(query):
            found = self._term_weights(term)
            if found is not None:
                out[found[0]] += found[1]
        return out


@dataclass
class Corpus:
    """What a retriever searches, as loaded from the store: incidents and their lexical index."""

    incidents: list[Incident]
    bm25: BM25
    position: dict[str, int]
    stored_count: int  # incidents in the store when loaded
    generation: int = 0  # the knowledge base's write generation when loaded; a change triggers a reload
    state: tuple = ()  # the store's state when loaded (``Store.state``); likewise


def _matches(incident: Incident, where: dict | None, dimension: str | None) -> bool:
    if not where:
        return True
    values = {"symptom": incident.symptom, "root_cause": incident.root_cause, "dimension": dimension,
              "mitigation": incident.mitigation, "provenance": incident.provenance.value,
              "source": incident.source}
    for key, wanted in where.items():
        allowed = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        if values.get(key) not in allowed:
            return False
    return True


def chroma_where(where: dict | None) -> dict | None:
    """Translate a simple ``{field: value | [values]}`` filter to Chroma's syntax."""
    if not where:
        return None
    clauses = [{k: {"$in": list(v)}} if isinstance(v, (list, tuple, set)) else {k: v}
               for k, v in where.items()]
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


class Retriever:
    """Finds the past incidents most similar to a ticket (dense + BM25, fused)."""

    def __init__(self, kb: KnowledgeBase, dense_weight: float = DENSE_WEIGHT):
        self.kb = kb
        self.dense_weight = dense_weight
        self._corpus: Corpus | None = None

    def corpus(self) -> Corpus:
        """The loaded corpus, reloaded first when the store changed."""
        if (self._corpus is None or self._corpus.state != self.kb.store.state()
                or self._corpus.generation != self.kb.generation):
            self.refresh()
        return self._corpus

    def incidents(self) -> list[Incident]:
        """The incidents it retrieves from, as of its last load."""
        return self.corpus().incidents

    def refresh(self) -> None:
        """Reload the lexical index from the store (after incidents were added)."""
        state = self.kb.store.state()  # read first: a write during the scan forces another reload
        incidents = self.kb.store.incidents()
        docs = [tokenize(i.document()) for i in incidents]
        self._corpus = Corpus(incidents, BM25(docs), {i.id: n for n, i in enumerate(incidents)},
                               len(incidents), self.kb.generation, state)

    def dense_candidates(self, vectors: np.ndarray, k: int = 5,
                         where: dict | None = None) -> list[dict[str, float]]:
        """The dense candidate pools of many query vectors in one store call.

        Pass each one as ``dense`` to ``retrieve_similar`` (same ``k`` and ``where``) to skip its
        own store query; batch jobs use this to avoid a round trip per ticket.
        """
        return self.kb.store.query_incident_scores(vectors, max(50, 5 * k), chroma_where(where))

    def retrieve_similar(self, text: str, k: int = 5, where: dict | None = None,
                         query_vector: np.ndarray | None = None,
                         exclude: set[str] | None = None,
                         dense: dict[str, float] | None = None) -> list[SimilarIncident]:
        """The k most similar incidents, best first; ``where`` filters on labels/provenance.

        ``dense``: this query's pool from ``dense_candidates``, when already fetched.
        """
        corpus = self.corpus()
        if not corpus.incidents:
            return []
        pool = max(50, 5 * k)
        if dense is None:
            vector = self.kb.embedder.embed_query(text) if query_vector is None else query_vector
            dense = self.kb.store.query_incident_scores(np.asarray(vector)[None, :], pool, chroma_where(where))[0]
        dense = {incident_id: max(score, 0.0) for incident_id, score in dense.items()}
        lexical = corpus.bm25.scores(tokenize(text))
        best = float(lexical.max()) if lexical.size else 0.0
        if best <= 0:
            lexical_top = []
        elif lexical.size > pool:  # the pool's members in any order: linear in the corpus, not n log n
            lexical_top = np.argpartition(-lexical, pool - 1)[:pool]
        else:
            lexical_top = np.arange(lexical.size)
        candidates = set(dense) | {corpus.incidents[i].id for i in lexical_top}
        exclude = exclude or set()
        scored = []
        for incident_id in candidates:
            pos = corpus.position.get(incident_id)
            if pos is None or incident_id in exclude:
                continue
            incident = corpus.incidents[pos]
            dimension = self.kb.dimension_of(incident.root_cause)
            if not _matches(incident, where, dimension):
                continue
            d = dense.get(incident_id)
            if d is None:  # outside the dense pool: compute it exactly is not possible cheaply
                d = 0.0
            lex = float(lexical[pos]) / best if best > 0 else 0.0
            score = self.dense_weight * d + (1 - self.dense_weight) * lex
            scored.append((score, d, lex, incident, dimension))
        scored.sort(key=lambda s: -s[0])
        return [SimilarIncident(id=i.id, title=i.title, score=round(s, 4), dense=round(d, 4),
                                lexical=round(lex, 4), symptom=i.symptom, root_cause=i.root_cause,
                                root_cause_dimension=dim, mitigation=i.mitigation,
                                resolution=i.resolution, provenance=i.provenance.value, source=i.source)
                for s, d, lex, i, dim in scored[:k]]


class VotingRetriever(Retriever):
    """Retrieval over the incidents whose labels vote (``VOTERS``).

    Unconfirmed machine suggestions are left out of the dense and the lexical search alike, so
    adding them to the knowledge base never changes a classification: they can neither crowd
    voting neighbours out nor shift the BM25 statistics. ``pinned`` keeps the corpus loaded
    first (for a batch job whose own machine-suggested additions would only force reloads).
    """

    def __init__(self, kb: KnowledgeBase, dense_weight: float = DENSE_WEIGHT, pinned: bool = False):
        super().__init__(kb, dense_weight)
        self.pinned = pinned

    def corpus(self) -> Corpus:
        if self.pinned and self._corpus is not None:
            return self._corpus
        return super().corpus()

    def _voting_where(self, where: dict | None) -> dict | None:
        corpus = self.corpus()
        if not self.pinned and len(corpus.incidents) == corpus.stored_count:
            return where  # every stored incident votes: no filter needed
        wanted = (where or {}).get("provenance", VOTERS)
        wanted = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        return {**(where or {}), "provenance": [p for p in wanted if p in VOTERS]}

    def refresh(self) -> None:
        """Reload the lexical index from the store, keeping only incidents that vote."""
        state = self.kb.store.state()  # read first: a write during the scan forces another reload
        everything = self.kb.store.incidents()
        voters = [i for i in everything if i.votes]
        self._corpus = Corpus(voters, BM25([tokenize(i.document()) for i in voters]),
                               {i.id: n for n, i in enumerate(voters)}, len(everything), self.kb.generation,
                               state)

    def dense_candidates(self, vectors: np.ndarray, k: int = 5,
                         where: dict | None = None) -> list[dict[str, float]]:
        """Dense candidate pools of many query vectors, voting incidents only."""
        return super().dense_candidates(vectors, k, self._voting_where(where))

    def retrieve_similar(self, text: str, k: int = 5, where: dict | None = None,
                         query_vector: np.ndarray | None = None, exclude: set[str] | None = None,
                         dense: dict[str, float] | None = None) -> list[SimilarIncident]:
        """The k most similar voting incidents, best first."""
        return super().retrieve_similar(text, k, self._voting_where(where), query_vector, exclude, dense)
