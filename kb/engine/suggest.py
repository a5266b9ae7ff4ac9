"""The suggestion engine: ticket -> redact -> embed -> retrieve -> evidence -> classify -> Suggestion."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property

import numpy as np

from kb import __version__
from kb.core.abstain import abstain_reason, says_too_little
from kb.core.incidents import Incident, trim_middle
from kb.core.redact import redact
from kb.core.suggestion import (
    Candidate,
    EmptyTicket,
    Evidence,
    NodeHistory,
    SimilarIncident,
    Suggestion,
    Ticket,
    explain,
)
from kb.core.taxonomy import load_low_util_taxonomy
from kb.core.untrusted import strip_instruction_lines
from kb.engine.classify import (
    VOTING_PROVENANCE,
    Calibration,
    build_features,
    fit_weights,
    predict,
)
from kb.engine.evidence import find_evidence, find_suspect, load_signatures
from kb.engine.history import node_history, node_index
from kb.engine.knowledge import KnowledgeBase
from kb.engine.mitigate import (
    cause_mitigations,
    low_utilisation_hints,
    rank_mitigations,
)
from kb.engine.search import BM25, DENSE_WEIGHT, Retriever, _Corpus, tokenize
from kb.engine.textclf import (
    CACHE_FILE,
    TextClassifier,
    load_classifiers,
    out_of_fold_log_proba,
    save_classifiers,
    training_fingerprint,
)

log = logging.getLogger(__name__)

MAX_TICKET_CHARS = 12_000
"""Ticket text beyond this is trimmed in the middle for embedding (evidence is found on all of it)."""
LOW_UTIL_SYMPTOMS = {"job_slowdown"}
VOTERS = [name for name, weight in VOTING_PROVENANCE.items() if weight > 0]
"""Provenances whose labels vote (unconfirmed machine suggestions do not)."""


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

    def _load(self):
        if self.pinned and self._corpus is not None:
            return self._corpus
        return super()._load()

    def _voting_where(self, where: dict | None) -> dict | None:
        corpus = self._load()
        if not self.pinned and len(corpus.incidents) == corpus.stored_count:
            return where  # every stored incident votes: no filter needed
        wanted = (where or {}).get("provenance", VOTERS)
        wanted = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        return {**(where or {}), "provenance": [p for p in wanted if p in VOTERS]}

    def refresh(self) -> None:
        """Reload the lexical index from the store, keeping only incidents that vote."""
        state = self.kb.store.state()  # read first: a write during the scan forces another reload
        everything = self.kb.store.incidents()
        voters = [i for i in everything if VOTING_PROVENANCE.get(i.provenance.value, 0) > 0]
        self._corpus = _Corpus(voters, BM25([tokenize(i.document()) for i in voters]),
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


@dataclass
class PreparedTicket:
    """A ticket ready to embed: its redacted text and the (trimmed) query that is embedded."""

    ticket: Ticket
    text: str  # redacted ticket text; evidence is found on all of it
    query: str  # the text embedded and searched (trimmed in the middle when long)


def embed_queries(embedder, texts: list[str]) -> np.ndarray:
    """Query vectors for many texts: one batched call when the embedder offers ``embed_queries``."""
    batch = getattr(embedder, "embed_queries", None)
    if batch is not None:
        return batch(texts)
    return np.stack([embedder.embed_query(t) for t in texts]) if texts else np.zeros((0, 0), np.float32)


def _cosine_map(query: np.ndarray, vectors: dict[str, np.ndarray], prefix: str) -> dict[str, float]:
    return {key.split(":", 1)[1]: float(np.dot(query, vec)) for key, vec in vectors.items()
            if key.startswith(prefix)}


class SuggestionEngine:
    """Suggests symptom, root cause, mitigation and similar incidents for tickets, without an LLM."""

    def __init__(self, kb: KnowledgeBase, retriever: Retriever | None = None,
                 calibration: Calibration | None = None):
        self.kb = kb
        self.settings = kb.settings
        self.retriever = retriever or VotingRetriever(kb)
        self._calibration = calibration
        self._corpus_cache: tuple[object, dict] = (None, {})

    @cached_property
    def signatures(self):
        """Validated log signatures."""
        return load_signatures(self.settings.signatures, self.kb.taxonomy, self.low_util)

    @cached_property
    def low_util(self):
        """The low-GPU-utilisation taxonomy."""
        return load_low_util_taxonomy(self.settings.low_gpu_taxonomy)

    @property
    def calibration_path(self):
        """Where fitted weights are kept for this knowledge base."""
        return self.settings.home / "calibration.json"

    @property
    def calibration(self) -> Calibration:
        """Fitted classifier weights: this knowledge base's own (``pmkb calibrate``), else the
        weights shipped with pmkb (fitted on the bundled incidents), else fitted now."""
        if self._calibration is None:
            self._calibration = (Calibration.load(self.calibration_path)
                                 or Calibration.load(self.settings.default_calibration)
                                 or self.fit_calibration())
        return self._calibration

    @cached_property
    def _taxonomy_vectors(self) -> dict[str, np.ndarray]:
        vectors = self.kb.store.taxonomy_vectors()
        if not vectors:
            self.kb.sync_taxonomy()
            vectors = self.kb.store.taxonomy_vectors()
        return vectors

    def _training_set(self) -> tuple[list[Incident], np.ndarray]:
        """Voting (human-labelled or confirmed) incidents with their stored vectors."""
        ids, vectors = self.kb.store.incident_vectors()
        by_id = {i.id: i for i in self.retriever._load().incidents}
        keep = [n for n, i in enumerate(ids) if i in by_id and by_id[i].labelled
                and VOTING_PROVENANCE.get(by_id[i].provenance.value, 0) > 0]
        return [by_id[ids[n]] for n in keep], vectors[keep] if keep else np.zeros((0, 1), np.float32)

    def _text_classifiers(self) -> dict[str, TextClassifier]:
        """Text classifiers for root cause and symptom, retrained when the voting incidents change
        (adding machine-suggested incidents does not retrain them)."""
        corpus = self.retriever._load()
        if getattr(self, "_clf_corpus", None) is not corpus:  # the corpus reloads when the store changes
            self._clf_corpus = corpus
            voters = [i for i in corpus.incidents if VOTING_PROVENANCE.get(i.provenance.value, 0) > 0]
            fingerprint = training_fingerprint(voters, self.kb.embedder.model_id)
            if getattr(self, "_clf_fingerprint", None) != fingerprint:
                self._clf = (load_classifiers(self.classifier_cache_path, fingerprint)
                             or self._fit_text_classifiers(fingerprint))
                self._clf_fingerprint = fingerprint
        return self._clf

    @property
    def classifier_cache_path(self):
        """Where the trained text classifiers of this knowledge base are cached."""
        return self.settings.home / CACHE_FILE

    def _label_sets(self) -> dict[str, list[str]]:
        """The labels each classifier chooses among, by incident field."""
        return {"root_cause": self.kb.taxonomy.cause_ids, "symptom": self.kb.taxonomy.symptom_ids}

    def _fit_text_classifiers(self, fingerprint: str) -> dict[str, TextClassifier]:
        incidents, vectors = self._training_set()
        texts, reports = [i.text() for i in incidents], [i.document() for i in incidents]
        classifiers = {field: TextClassifier(labels).fit(texts, vectors, [getattr(i, field) for i in incidents],
                                                         reports)
                       for field, labels in self._label_sets().items()}
        try:
            save_classifiers(self.classifier_cache_path, fingerprint, classifiers)
        except OSError as exc:  # a read-only knowledge base still answers, it just refits next time
            log.warning("could not cache the text classifiers at %s: %s", self.classifier_cache_path, exc)
        return classifiers

    def _per_corpus(self, key: str, compute):
        """``compute(voting incidents)``, once per loaded corpus rather than per ticket."""
        corpus = self.retriever._load()
        if self._corpus_cache[0] is not corpus:
            self._corpus_cache = (corpus, {})
        cache = self._corpus_cache[1]
        if key not in cache:
            cache[key] = compute([i for i in corpus.incidents if VOTING_PROVENANCE.get(i.provenance.value, 0) > 0])
        return cache[key]

    def _priors(self, field: str, labels: list[str]) -> dict[str, float]:
        def count(voters):
            counts = Counter(getattr(i, field) for i in voters)
            total = sum(counts[label] for label in labels)
            return {label: (counts[label] + 1) / (total + len(labels)) for label in labels}

        return self._per_corpus(f"prior:{field}", count)

    def usual_mitigations(self) -> dict[str, dict[str, float]]:
        """How each root cause's incidents in this knowledge base were mitigated (smoothed)."""
        return self._per_corpus("mitigations", lambda voters: cause_mitigations(self.kb.taxonomy, voters))

    def node_history(self, node: str, exclude: set[str] | None = None) -> NodeHistory | None:
        """Earlier incidents of the knowledge base, labelled or not, that name ``node`` (indexed
        once per loaded corpus, so a batch job's pinned corpus keeps the index it started with)."""
        index = self._per_corpus("nodes", lambda _voters: node_index(self.kb.store.incidents()))
        return node_history(index, node, exclude)

    def _features(self, text: str, vector: np.ndarray, similar: list[SimilarIncident],
                  evidence: list[Evidence], text_log_proba: dict[str, np.ndarray] | None = None):
        tax = self.kb.taxonomy
        vectors = self._taxonomy_vectors
        if text_log_proba is None:
            clf = self._text_classifiers()
            text_log_proba = {field: c.log_proba([text], vector[None, :])[0] for field, c in clf.items()}
        cause_f = build_features(tax.cause_ids, evidence, similar, _cosine_map(vector, vectors, "cause:"),
                                 self._priors("root_cause", tax.cause_ids), "root_cause",
                                 text_log_proba["root_cause"])
        symptom_f = build_features(tax.symptom_ids, evidence, similar,
                                   _cosine_map(vector, vectors, "symptom:"),
                                   self._priors("symptom", tax.symptom_ids), "symptom",
                                   text_log_proba["symptom"])
        return cause_f, symptom_f

    def fit_calibration(self, save: bool = True) -> Calibration:
        """Fit the classifier weights leave-one-out over the labelled incidents of the knowledge base.

        Neighbours exclude the incident itself and the text classifier's probabilities are
        out-of-fold, so every feature is computed as it would be for an unseen ticket.
        """
        incidents, vectors = self._training_set()
        texts, reports = [i.text() for i in incidents], [i.document() for i in incidents]
        oof = {field: out_of_fold_log_proba(labels, texts, vectors, [getattr(i, field) for i in incidents], reports)
               for field, labels in self._label_sets().items()}
        cause_samples, cause_truth, symptom_samples, symptom_truth = [], [], [], []
        for n, (incident, vector, text) in enumerate(zip(incidents, vectors, texts)):
            similar = self.retriever.retrieve_similar(text, k=self.settings.neighbours, query_vector=vector,
                                                      exclude={incident.id})
            cause_f, symptom_f = self._features(text, vector, similar, find_evidence(text, self.signatures),
                                                {field: oof[field][n] for field in oof})
            cause_samples.append(cause_f)
            cause_truth.append(incident.root_cause)
            if incident.symptom:
                symptom_samples.append(symptom_f)
                symptom_truth.append(incident.symptom)
        cause_w, cause_loss = fit_weights(cause_samples, cause_truth)
        symptom_w, _ = fit_weights(symptom_samples, symptom_truth)
        calibration = Calibration(root_cause=cause_w, symptom=symptom_w, log_loss=round(cause_loss, 4),
                                  fitted_on=f"leave-one-out over {len(cause_samples)} labelled incidents "
                                            f"({datetime.now(timezone.utc):%Y-%m-%d})")
        if save and cause_samples:
            calibration.save(self.calibration_path)
        self._calibration = calibration
        return calibration

    def prepare(self, ticket: Ticket | Incident) -> PreparedTicket:
        """Redact a ticket and cut its query text; raises EmptyTicket when there is no text."""
        if isinstance(ticket, Incident):
            ticket = Ticket(id=ticket.id, title=ticket.title, description=ticket.description)
        raw = ticket.text()
        if not raw.strip():
            raise EmptyTicket(f"ticket {ticket.id!r} has no title, description or log text")
        text = redact(raw)
        cleaned, _ = strip_instruction_lines(text)  # untrusted instructions never count as evidence
        text = cleaned if cleaned.strip() else text
        return PreparedTicket(ticket, text, trim_middle(text, MAX_TICKET_CHARS))

    def suggest(self, ticket: Ticket | Incident, exclude: set[str] | None = None) -> Suggestion:
        """The full suggestion for one ticket."""
        started = time.perf_counter()
        prepared = self.prepare(ticket)
        vector = self.kb.embedder.embed_query(prepared.query)
        return self.suggest_prepared(prepared, vector, exclude, started)

    def suggest_batch(self, tickets: list[Ticket | Incident],
                      exclude: set[str] | None = None) -> list[Suggestion | Exception]:
        """Suggestions for many tickets with one batched embedding call.

        A ticket that fails gets its exception in its place, so one bad ticket does not lose
        the batch.
        """
        started = time.perf_counter()
        prepared: list[PreparedTicket | Exception] = []
        for ticket in tickets:
            try:
                prepared.append(self.prepare(ticket))
            except EmptyTicket as exc:
                prepared.append(exc)
        good = [p for p in prepared if isinstance(p, PreparedTicket)]
        vectors = embed_queries(self.kb.embedder, [p.query for p in good])
        pools = iter(self.dense_candidates(vectors))
        texts = iter(self.text_log_probas([p.query for p in good], vectors))
        vectors = iter(vectors)
        share = (time.perf_counter() - started) / max(len(good), 1)
        out: list[Suggestion | Exception] = []
        for item in prepared:
            if isinstance(item, Exception):
                out.append(item)
                continue
            try:
                out.append(self.suggest_prepared(item, next(vectors), exclude, time.perf_counter() - share,
                                                 dense=next(pools), text_log_proba=next(texts)))
            except Exception as exc:  # noqa: BLE001 - reported per ticket by the caller
                out.append(exc)
        return out

    def dense_candidates(self, vectors: np.ndarray) -> list[dict[str, float] | None]:
        """Dense candidate pools for many query vectors in one store call (None: fetch per ticket)."""
        fetch = getattr(self.retriever, "dense_candidates", None)
        if fetch is None or not len(vectors):
            return [None] * len(vectors)
        return fetch(vectors, k=self.settings.neighbours)

    def text_log_probas(self, queries: list[str], vectors: np.ndarray) -> list[dict[str, np.ndarray]]:
        """The text classifiers' log-probabilities for many prepared queries, one call per classifier."""
        if not queries:
            return []
        batch = {field: c.log_proba(queries, np.asarray(vectors)) for field, c in self._text_classifiers().items()}
        return [{field: rows[n] for field, rows in batch.items()} for n in range(len(queries))]

    def suggest_prepared(self, prepared: PreparedTicket, vector: np.ndarray,
                         exclude: set[str] | None = None, started: float | None = None,
                         dense: dict[str, float] | None = None,
                         text_log_proba: dict[str, np.ndarray] | None = None) -> Suggestion:
        """The suggestion for a prepared ticket whose query vector (and dense pool, text
        classifier output) is already computed, as batch jobs do."""
        started = time.perf_counter() if started is None else started
        ticket, text, query = prepared.ticket, prepared.text, prepared.query
        evidence = find_evidence(text, self.signatures)
        similar = self.retriever.retrieve_similar(query, k=self.settings.neighbours, query_vector=vector,
                                                  exclude=exclude, dense=dense)
        cause_f, symptom_f = self._features(query, vector, similar, evidence, text_log_proba)
        causes = predict(cause_f, self.calibration.root_cause)
        symptoms = predict(symptom_f, self.calibration.symptom)
        top_cause, top_p = causes[0]
        cause = self.kb.taxonomy.root_cause(top_cause)
        suspect = find_suspect(text) if cause.dimension == "hardware" or any(
            e.suspect for e in evidence) else None
        mitigations = rank_mitigations(self.kb.taxonomy, causes[:5], similar, suspect, self.usual_mitigations())
        history = (self.node_history(suspect["node"], {ticket.id, *(exclude or ())})
                   if suspect and suspect.get("node") else None)
        low_util = (low_utilisation_hints(self.low_util, evidence, text)
                    if symptoms[0][0] in LOW_UTIL_SYMPTOMS or any(e.low_gpu_utilisation for e in evidence)
                    else [])
        reason = abstain_reason(top_p, self.settings.abstain_threshold,
                                says_too_little(text, bool(evidence), self.settings.min_ticket_words))
        abstained = reason is not None
        suggestion = Suggestion(
            id=ticket.id, symptom=symptoms[0][0], symptom_confidence=round(symptoms[0][1], 4),
            symptom_candidates=[Candidate(id=s, confidence=round(p, 4)) for s, p in symptoms[:3]],
            root_cause=top_cause, root_cause_name=cause.name, root_cause_dimension=cause.dimension,
            root_cause_confidence=round(top_p, 4),
            root_cause_candidates=[Candidate(id=c, confidence=round(p, 4)) for c, p in causes[:5]],
            abstained=abstained, abstain_reason=reason,
            mitigation=mitigations[0].id if mitigations else cause.default_mitigations[0],
            mitigations=mitigations[:4], retry_safe=cause.retry_safe and not abstained, suspect=suspect,
            node_history=history,
            similar_incidents=similar[:5], evidence=evidence, low_gpu_utilisation=low_util,
            trace={"engine": f"pmkb-engine/{__version__}", "taxonomy": self.kb.taxonomy.name,
                   "embedding_model": self.kb.embedder.model_id,
                   "calibration": self.calibration.fitted_on, "llm": None})
        suggestion.explanation = explain(suggestion)
        suggestion.trace["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return suggestion
