"""The suggestion engine: ticket -> redact -> embed -> retrieve -> evidence -> read -> classify -> owner."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, NamedTuple

import numpy as np

from kb import __version__
from kb.core.abstain import label_decision, says_too_little
from kb.core.close_calls import CloseCalls, CloseCallsError, load_close_calls
from kb.core.incidents import Incident, trim_middle
from kb.core.readings import Reading
from kb.core.redact import redact
from kb.core.roles import Retriever
from kb.core.suggestion import (
    Candidate,
    CloseCallQuestion,
    EmptyTicket,
    Evidence,
    NodeHistory,
    Owner,
    SimilarIncident,
    Suggestion,
    Ticket,
    explain,
)
from kb.core.taxonomy import load_low_util_taxonomy
from kb.core.untrusted import strip_instruction_lines
from kb.engine.calibrate import Calibrator
from kb.engine.classify import Calibration, build_features, predict
from kb.engine.collective import follow_verdict, read_collective
from kb.engine.evidence import find_evidence, find_suspect, load_signatures
from kb.engine.history import node_history
from kb.engine.knowledge import KnowledgeBase
from kb.engine.mitigate import low_utilisation_hints, rank_mitigations, wants_low_utilisation_hints
from kb.engine.owner import owner_first, owner_masses
from kb.engine.readings import Reader, reading_feature
from kb.engine.remediate import plan_for
from kb.engine.search import VotingRetriever
from kb.engine.sets import close_call, prediction_sets
from kb.engine.settle import AnswerOdds, answer_odds, settle_by_engineer, ticket_hint
from kb.engine.snapshot import CorpusSnapshot, Snapshots

log = logging.getLogger(__name__)


MAX_TICKET_CHARS = 12_000
"""Ticket text beyond this is trimmed in the middle for embedding (evidence is found on all of it)."""




class Ranked(NamedTuple):
    """What the engine reads and ranks for one ticket, before it is assembled into a Suggestion."""

    evidence: list[Evidence]
    similar: list[SimilarIncident]
    causes: list[tuple[str, float]]  # every root cause, best first
    symptoms: list[tuple[str, float]]
    readings: list[Reading]
    answered: CloseCallQuestion | None  # the close call the engineer answered, if any


@dataclass
class PreparedTicket:
    """A ticket ready to embed: its redacted text and the (trimmed) query that is embedded."""

    ticket: Ticket
    text: str  # redacted ticket text; evidence is found on all of it
    query: str  # the text embedded and searched (trimmed in the middle when long)
    # The reporter's own words (redacted title and description) when the ticket also carries a log:
    # scope and change are what people say, so they are read from these, never from machine output.
    prose: str | None = None


def _cleaned(raw: str) -> str:
    """Redacted text without the sentences that give orders (untrusted instructions never count as
    evidence), or the redacted text when nothing else is left."""
    text = redact(raw)
    cleaned, _ = strip_instruction_lines(text)
    return cleaned if cleaned.strip() else text


def _cosine_map(query: np.ndarray, vectors: dict[str, np.ndarray], prefix: str) -> dict[str, float]:
    return {key.split(":", 1)[1]: float(np.dot(query, vec)) for key, vec in vectors.items()
            if key.startswith(prefix)}


class SuggestionEngine:
    """Suggests symptom, root cause, mitigation and similar incidents for tickets, without an LLM."""

    def __init__(self, kb: KnowledgeBase, retriever: Retriever | None = None,
                 calibration: Calibration | None = None, refit_in_background: bool = False):
        self.kb = kb
        self.settings = kb.settings
        self.retriever = retriever or VotingRetriever(kb)
        self.calibrator = Calibrator(kb)
        self._calibration = calibration
        self.snapshots = Snapshots(self.retriever, kb, self.calibrator, refit_in_background)
        self.hint_close_calls = True  # a close call shows what the ticket's readings say to it
        self.owner_decides = True  # the most probable dimension's best cause is suggested (kb/engine/owner.py)
        self._odds: tuple[list[Incident], AnswerOdds] | None = None

    @cached_property
    def signatures(self):
        """Validated log signatures."""
        return load_signatures(self.settings.signatures, self.kb.taxonomy, self.low_util)

    @cached_property
    def close_calls(self) -> CloseCalls:
        """The questions that decide between two easily confused causes; none (said in the log)
        when the file does not fit the taxonomy, e.g. the bundled file under a team's own taxonomy."""
        try:
            return load_close_calls(self.settings.close_calls, self.kb.taxonomy)
        except CloseCallsError as exc:
            log.warning("close-call questions are off: %s. Point PMKB_CLOSE_CALLS at a file written for "
                        "this taxonomy (data/close_calls.yaml shows the format)", exc)
            return CloseCalls(entries=[])

    @cached_property
    def low_util(self):
        """The low-GPU-utilisation taxonomy."""
        return load_low_util_taxonomy(self.settings.low_gpu_taxonomy)

    @property
    def calibration_path(self):
        """Where fitted weights are kept for this knowledge base."""
        return self.calibrator.calibration_path

    @property
    def classifier_cache_path(self):
        """Where the trained text classifiers of this knowledge base are cached."""
        return self.calibrator.classifier_cache_path

    @property
    def calibration(self) -> Calibration:
        """Fitted classifier weights: this knowledge base's own (``pmkb calibrate``), else the
        weights shipped with pmkb (fitted on the bundled incidents), else fitted now."""
        return self.load_calibration()

    def load_calibration(self, on_fit: Callable[[], None] | None = None) -> Calibration:
        """The calibration, read once; ``on_fit`` is called first when there is none to read and it
        has to be fitted now (a few minutes: callers say so)."""
        if self._calibration is None:
            loaded = self.calibrator.load()
            if loaded is None and on_fit is not None:
                on_fit()
            self._calibration = loaded or self.fit_calibration()
        return self._calibration

    @cached_property
    def _taxonomy_vectors(self) -> dict[str, np.ndarray]:
        vectors = self.kb.store.taxonomy_vectors()
        if not vectors:
            self.kb.sync_taxonomy()
            vectors = self.kb.store.taxonomy_vectors()
        return vectors

    def snapshot(self) -> CorpusSnapshot:
        """The corpus snapshot every stage of one suggestion reads (see kb/engine/snapshot.py)."""
        return self.snapshots.current()

    def usual_mitigations(self) -> dict[str, dict[str, float]]:
        """How each root cause's incidents in this knowledge base were mitigated (smoothed)."""
        return self.snapshot().mitigations

    def reader(self, snapshot: CorpusSnapshot | None = None) -> Reader | None:
        """The scope and change reader of a snapshot's classifiers (None when readings are off)."""
        readings = self.calibrator.readings
        return None if readings is None else Reader(readings[0], (snapshot or self.snapshot()).classifiers)

    def node_history(self, node: str, exclude: set[str] | None = None,
                     snapshot: CorpusSnapshot | None = None) -> NodeHistory | None:
        """Earlier incidents of the knowledge base, labelled or not, that name ``node`` (indexed
        once per snapshot, so a batch job's pinned corpus keeps the index it started with)."""
        return node_history((snapshot or self.snapshot()).nodes(), node, exclude)

    def _features(self, snapshot: CorpusSnapshot, vector: np.ndarray, similar: list[SimilarIncident],
                  evidence: list[Evidence], text_log_proba: dict[str, np.ndarray]):
        tax = self.kb.taxonomy
        vectors = self._taxonomy_vectors
        reading = (reading_feature(self.reader(snapshot).distributions(text_log_proba), snapshot.readings)
                   if snapshot.readings else None)
        cause_f = build_features(tax.cause_ids, evidence, similar, _cosine_map(vector, vectors, "cause:"),
                                 snapshot.priors["root_cause"], "root_cause", text_log_proba["root_cause"],
                                 reading=reading)
        symptom_f = build_features(tax.symptom_ids, evidence, similar, _cosine_map(vector, vectors, "symptom:"),
                                   snapshot.priors["symptom"], "symptom", text_log_proba["symptom"])
        return cause_f, symptom_f

    @staticmethod
    def _text_log_proba(snapshot: CorpusSnapshot, text: str, vector: np.ndarray) -> dict[str, np.ndarray]:
        """Every text classifier's log-probabilities for one text (causes, symptoms, readings)."""
        return {name: c.log_proba([text], vector[None, :])[0] for name, c in snapshot.classifiers.items()}

    def _left_out_features(self, snapshot: CorpusSnapshot):
        """The pipeline's features for a labelled incident scored as an unseen ticket."""
        def left_out(incident: Incident, vector: np.ndarray, text: str, text_log_proba: dict[str, np.ndarray]):
            similar = self.retriever.retrieve_similar(text, k=self.settings.neighbours, query_vector=vector,
                                                      exclude={incident.id})
            return self._features(snapshot, vector, similar, find_evidence(text, self.signatures),
                                  text_log_proba)

        return left_out

    def fit_sets(self) -> Calibration:
        """Calibrate the prediction sets on this knowledge base, keeping the classifier weights."""
        snapshot = self.snapshot()
        self._calibration = self.calibrator.fit_sets(snapshot.incidents, self._left_out_features(snapshot),
                                                     self.calibration)
        return self._calibration

    def fit_calibration(self, save: bool = True) -> Calibration:
        """Fit the classifier weights leave-one-out over the labelled incidents (``Calibrator.fit``)."""
        snapshot = self.snapshot()
        self._calibration = self.calibrator.fit(snapshot.incidents, self._left_out_features(snapshot), save)
        return self._calibration

    def prepare(self, ticket: Ticket | Incident) -> PreparedTicket:
        """Redact a ticket and cut its query text; raises EmptyTicket when there is no text."""
        if isinstance(ticket, Incident):
            ticket = Ticket(id=ticket.id, title=ticket.title, description=ticket.description)
        raw = ticket.text()
        if not raw.strip():
            raise EmptyTicket(f"ticket {ticket.id!r} has no title, description or log text")
        text, prose = _cleaned(raw), None
        if ticket.log.strip() and (words := "\n".join(p for p in (ticket.title, ticket.description) if p.strip())):
            prose = trim_middle(_cleaned(words), MAX_TICKET_CHARS)
        return PreparedTicket(ticket, text, trim_middle(text, MAX_TICKET_CHARS), prose)

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
        inputs = iter(self._batch_inputs(good))
        share = (time.perf_counter() - started) / max(len(good), 1)
        out: list[Suggestion | Exception] = []
        for item in prepared:
            if isinstance(item, Exception):
                out.append(item)
                continue
            vector, pool, text = next(inputs)
            try:
                out.append(self.suggest_prepared(item, vector, exclude, time.perf_counter() - share,
                                                 dense=pool, text_log_proba=text))
            except Exception as exc:  # noqa: BLE001 - reported per ticket by the caller
                out.append(exc)
        return out

    def cause_rankings(self, tickets: list[Ticket | Incident]) -> list[list[tuple[str, float]]]:
        """Every root cause with its probability, best first (the owner's best cause first, see
        ``_ranked``), for each ticket (batched as ``suggest_batch``): what the prediction sets at any
        level are cut from."""
        snapshot = self.snapshot()
        prepared = [self.prepare(ticket) for ticket in tickets]
        return [self._ranked(snapshot, p, vector, dense=pool, text_log_proba=text).causes
                for p, (vector, pool, text) in zip(prepared, self._batch_inputs(prepared))]

    def _batch_inputs(self, prepared: list[PreparedTicket]):
        """(query vector, dense candidate pool, text classifier output) per prepared ticket, each
        computed for the whole batch in one call."""
        queries = [p.query for p in prepared]
        vectors = self.kb.embedder.embed_queries(queries) if queries else np.zeros((0, 0), np.float32)
        return zip(vectors, self.dense_candidates(vectors), self.text_log_probas(queries, vectors))

    def _ranked(self, snapshot: CorpusSnapshot, prepared: PreparedTicket, vector: np.ndarray,
                exclude: set[str] | None = None, dense: dict[str, float] | None = None,
                text_log_proba: dict[str, np.ndarray] | None = None) -> Ranked:
        """Evidence, similar incidents, readings and the ranked root causes and symptoms of a
        prepared ticket; a close call the engineer answered has already moved the ranking."""
        if text_log_proba is None:
            text_log_proba = self._text_log_proba(snapshot, prepared.query, vector)
        reader = self.reader(snapshot)
        prose_vector = vector
        if prepared.prose is not None and reader is not None:  # readings from the reporter's words only
            prose_vector = self.kb.embedder.embed_query(prepared.prose)
            text_log_proba = {**text_log_proba, **{kind: clf.log_proba([prepared.prose], prose_vector[None, :])[0]
                                                   for kind, clf in reader.classifiers.items()}}
        evidence = find_evidence(prepared.text, self.signatures)
        similar = self.retriever.retrieve_similar(prepared.query, k=self.settings.neighbours, query_vector=vector,
                                                  exclude=exclude, dense=dense)
        cause_f, symptom_f = self._features(snapshot, vector, similar, evidence, text_log_proba)
        causes = predict(cause_f, self.calibration.root_cause)
        readings = (reader.read(prepared.prose or prepared.text, prose_vector, text_log_proba)
                    if reader is not None else [])
        causes, answered = self._answered(causes, prepared.ticket.close_call_answer)
        if answered is None and self.owner_decides:  # an answered close call decides the owner itself
            causes = owner_first(causes, self.kb.taxonomy.dimension_of)
        return Ranked(evidence, similar, causes, predict(symptom_f, self.calibration.symptom), readings, answered)

    def _answered(self, causes: list[tuple[str, float]], answer: str | None):
        """The ranking after the engineer's ``answer`` to its close call (``settle_by_engineer``), with
        the answered question; unchanged and None without an answer to this ranking's question."""
        set_calibration = self.calibration.root_cause_set
        if set_calibration is None or not answer:
            return causes, None
        question = close_call(self.kb.taxonomy, self.close_calls, causes,
                              set_calibration.predict(causes, self.settings.set_alpha))
        if question is None:
            return causes, None
        return settle_by_engineer(causes, question, answer)

    def _owner(self, causes: list[tuple[str, float]]) -> Owner:
        """The top cause's dimension with its probability, labelled when that reaches the threshold
        fitted for ``settings.owner_precision``."""
        dimension = self.kb.taxonomy.dimension_of(causes[0][0])
        confidence = owner_masses(causes, self.kb.taxonomy.dimension_of).get(dimension, 0.0)
        fitted, precision = self.calibration.owner, self.settings.owner_precision
        return Owner(dimension=dimension, confidence=round(confidence, 4),
                     labelled=fitted is not None and confidence >= fitted.threshold(precision),
                     precision=precision if fitted is not None else None)

    def _answer_odds(self, snapshot: CorpusSnapshot) -> AnswerOdds:
        """How far each ``settled_by`` reading is trusted in this snapshot's knowledge base (computed once)."""
        cached = self._odds
        if cached is None or cached[0] is not snapshot.incidents:
            labels = self.calibrator.readings[1] if self.calibrator.readings is not None else {}
            cached = (snapshot.incidents, answer_odds(self.close_calls, snapshot.incidents, labels))
            self._odds = cached  # one assignment: a snapshot's incidents and their odds together
        return cached[1]

    def dense_candidates(self, vectors: np.ndarray) -> list[dict[str, float] | None]:
        """Dense candidate pools for many query vectors in one store call (None: fetch per ticket)."""
        if not len(vectors):
            return []
        return self.retriever.dense_candidates(vectors, k=self.settings.neighbours)

    def text_log_probas(self, queries: list[str], vectors: np.ndarray) -> list[dict[str, np.ndarray]]:
        """The text classifiers' log-probabilities for many prepared queries, one call per classifier."""
        if not queries:
            return []
        classifiers = self.snapshot().classifiers
        batch = {field: c.log_proba(queries, np.asarray(vectors)) for field, c in classifiers.items()}
        return [{field: rows[n] for field, rows in batch.items()} for n in range(len(queries))]

    def suggest_prepared(self, prepared: PreparedTicket, vector: np.ndarray,
                         exclude: set[str] | None = None, started: float | None = None,
                         dense: dict[str, float] | None = None,
                         text_log_proba: dict[str, np.ndarray] | None = None) -> Suggestion:
        """The suggestion for a prepared ticket whose query vector (and dense pool, text
        classifier output) is already computed, as batch jobs do."""
        started = time.perf_counter() if started is None else started
        ticket, text = prepared.ticket, prepared.text
        snapshot = self.snapshot()
        evidence, similar, causes, symptoms, readings, answered = self._ranked(
            snapshot, prepared, vector, exclude, dense, text_log_proba)
        top_cause, top_p = causes[0]
        tax = self.kb.taxonomy
        cause = tax.root_cause(top_cause)
        collective = read_collective(text)
        if collective is not None:
            causes = follow_verdict(causes, collective, {c: tax.dimension_of(c) for c in tax.cause_ids})
            top_cause, top_p = causes[0]
            cause = tax.root_cause(top_cause)
        suspect = find_suspect(text) if top_cause in tax.suspect_node_causes or any(
            e.suspect for e in evidence) else None
        if collective is not None and collective.suspect_node:
            suspect = {"node": collective.suspect_node, **({"rank": str(collective.suspects[0])}
                                                          if len(collective.suspects) == 1 else {})}
        mitigations = rank_mitigations(tax, causes[:5], similar, suspect, snapshot.mitigations)
        history = (self.node_history(suspect["node"], {ticket.id, *(exclude or ())}, snapshot)
                   if suspect and suspect.get("node") else None)
        low_util = (low_utilisation_hints(self.low_util, evidence, text)
                    if wants_low_utilisation_hints(tax, symptoms[0][0], evidence) else [])
        sets = prediction_sets(self.calibration, tax, self.close_calls, self.settings.set_alpha, causes, symptoms,
                               self.settings.label_alpha)
        sets["owner"] = self._owner(causes)
        if answered is not None and (sets.get("close_call") is None or set(sets["close_call"].causes) == set(
                answered.causes)):
            sets["close_call"] = answered  # the question the engineer answered
        elif sets.get("close_call") is not None and self.hint_close_calls:
            sets["close_call"] = ticket_hint(sets["close_call"], self.close_calls, readings,
                                             self._answer_odds(snapshot)) or sets["close_call"]
        decision = label_decision(top_p, cause.retry_safe if collective is None else collective.retry_safe,
                                  self.settings.abstain_threshold,
                                  says_too_little(text, bool(evidence), self.settings.min_ticket_words))
        suggestion = Suggestion(
            id=ticket.id, symptom=symptoms[0][0], symptom_confidence=round(symptoms[0][1], 4),
            symptom_candidates=[Candidate(id=s, confidence=round(p, 4)) for s, p in symptoms[:3]],
            root_cause=top_cause, root_cause_name=cause.name, root_cause_dimension=cause.dimension,
            root_cause_confidence=round(top_p, 4),
            root_cause_candidates=[Candidate(id=c, confidence=round(p, 4)) for c, p in causes[:5]],
            mitigation=mitigations[0].id if mitigations else cause.default_mitigations[0],
            mitigations=mitigations[:4], suspect=suspect, **decision, **sets,
            node_history=history, readings=readings, collective=collective,
            similar_incidents=similar[:5], evidence=evidence, low_gpu_utilisation=low_util,
            trace=self.describe())
        if self.settings.scheduler:
            suggestion.remediation = plan_for(suggestion, self.settings.scheduler, text)
        suggestion.explanation = explain(suggestion)
        suggestion.trace["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return suggestion

    def refine(self, ticket: Ticket, suggestion: Suggestion) -> Suggestion:
        """The engine's own suggestion needs nothing more: returned as it is (see ``Suggester``)."""
        return suggestion

    def describe(self) -> dict:
        """What suggests: the engine, its taxonomy, embedding model and calibration."""
        return {"engine": f"pmkb-engine/{__version__}", "taxonomy": self.kb.taxonomy.name,
                "embedding_model": self.kb.embedder.model_id, "calibration": self.calibration.fitted_on,
                "llm": None}
