"""What the engine learns from the knowledge base's labelled incidents, and where it is kept.

Two things are fitted on the voting incidents (human-labelled or confirmed): the text
classifiers (cached per knowledge base, keyed by a digest of what they learnt from) and the
classifier weights (``Calibration``: this knowledge base's own from ``pmkb calibrate``, else the
weights shipped with pmkb, else fitted on first use).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np

from kb.core.files import per_model_file
from kb.core.incidents import Incident, Provenance
from kb.core.readings import KINDS, ReadingLabel, ReadingsError, ReadingVocabulary, load_labels, load_vocabulary
from kb.engine.classify import Calibration, LabelFeatures, fit_weights, predict
from kb.engine.conformal import SetCalibration
from kb.engine.crossval import cross_validate
from kb.engine.history import BUNDLED_SOURCE
from kb.engine.knowledge import KnowledgeBase
from kb.engine.owner import OwnerCalibration
from kb.engine.readings import reading_feature, reading_spans, reading_table, reading_truths
from kb.engine.textclf import (
    CACHE_FILE,
    TextClassifier,
    load_classifiers,
    out_of_fold_log_proba,
    save_classifiers,
    training_fingerprint,
)

log = logging.getLogger(__name__)

CONFIRMED_SET_WEIGHT = 3.0
"""How much a confirmed incident counts in the prediction sets' calibration against a human-labelled
one: confirmed incidents are this team's own tickets, the distribution the sets must hold on."""

MIN_REAL_INCIDENTS = 300
"""Reports of real incidents (anything but the reports written for pmkb) needed before the weights
and the prediction sets are fitted on them alone; with fewer, on every labelled incident."""

LeaveOneOut = Callable[[Incident, np.ndarray, str, dict[str, np.ndarray]], tuple[LabelFeatures, LabelFeatures]]
"""``(incident, its vector, its text, out-of-fold text log-probabilities) -> (cause, symptom)
features`` computed as for an unseen ticket: the engine's pipeline with the incident left out."""


def training_sample(incidents: list[Incident], limit: int) -> list[Incident]:
    """At most ``limit`` incidents, taken in turns from each root cause (confirmed ones first, then
    in a fixed pseudo-random order), so a rare cause keeps all its incidents; all when they fit."""
    if len(incidents) <= limit:
        return incidents
    by_cause: dict[str | None, list[Incident]] = {}
    for incident in sorted(incidents, key=lambda i: (i.provenance != Provenance.confirmed,
                                                     hashlib.sha256(i.id.encode()).digest())):
        by_cause.setdefault(incident.root_cause, []).append(incident)
    queues = [iter(group) for group in by_cause.values()]
    chosen: list[Incident] = []
    while queues and len(chosen) < limit:
        for queue in list(queues):
            incident = next(queue, None)
            if incident is None:
                queues.remove(queue)
            elif len(chosen) < limit:
                chosen.append(incident)
    return chosen


def fitting_rows(incidents: list[Incident]) -> list[int]:
    """Which left-out incidents the weights and the prediction sets are fitted on: the real ones (public
    reports, this team's tickets) when there are ``MIN_REAL_INCIDENTS``, else all. The written reports
    still teach the text classifiers and vote as neighbours; how far to trust each feature, and how
    wide a set must be, is learnt on tickets as people file them."""
    real = [n for n, incident in enumerate(incidents) if incident.source != BUNDLED_SOURCE]
    return real if len(real) >= MIN_REAL_INCIDENTS else list(range(len(incidents)))


class Calibrator:
    """Fits and keeps the text classifiers and the classifier weights of one knowledge base."""

    def __init__(self, kb: KnowledgeBase):
        self.kb = kb
        self.settings = kb.settings
        self.real_only = True  # fit on the real incidents once there are enough (``fitting_rows``); False: on all

    @property
    def calibration_path(self) -> Path:
        """Where fitted weights are kept for this knowledge base."""
        return self.settings.home / "calibration.json"

    @property
    def classifier_cache_path(self) -> Path:
        """Where the trained text classifiers of this knowledge base are cached."""
        return self.settings.home / CACHE_FILE

    @cached_property
    def readings(self) -> tuple[ReadingVocabulary, dict[str, ReadingLabel]] | None:
        """The readings vocabulary and the labelled readings the reader learns from; None (said in
        the log) when either file cannot be used, and the suggestions go without readings."""
        try:
            vocabulary = load_vocabulary(self.settings.readings, self.kb.taxonomy)
            return vocabulary, load_labels(self.settings.reading_labels, vocabulary)
        except (OSError, ReadingsError) as exc:
            log.warning("scope and change readings are off: %s. Point PMKB_READINGS and PMKB_READING_LABELS at "
                        "files that fit this taxonomy (data/readings.yaml shows the format)", exc)
            return None

    def label_sets(self) -> dict[str, list[str]]:
        """The labels each classifier chooses among: incident fields, then the readings."""
        sets = {"root_cause": self.kb.taxonomy.cause_ids, "symptom": self.kb.taxonomy.symptom_ids}
        if self.readings is not None:
            sets |= {kind: self.readings[0].ids(kind) for kind in KINDS}
        return sets

    def training_samples(self, incidents: list[Incident], name: str) -> tuple[list[str | None], list[str]]:
        """(truths, second samples) of one classifier: an incident field with the full reports, or
        a reading with the words the expert read it from."""
        if name in KINDS and self.readings is not None:
            labels = self.readings[1]
            return reading_truths(incidents, labels, name), reading_spans(incidents, labels, name)
        return [getattr(i, name) for i in incidents], [i.document() for i in incidents]

    def fingerprint(self, voters: list[Incident]) -> str:
        """Digest of what classifiers trained on these incidents learn from (the labelled readings included)."""
        digest = hashlib.sha256(training_fingerprint(voters, self.kb.embedder.model_id).encode())
        if sum(i.labelled and i.votes for i in voters) > self.settings.classifier_max_samples:
            digest.update(f"sample of {self.settings.classifier_max_samples}".encode())
        if self.readings is not None:
            digest.update(self._readings_digest.encode())
        return digest.hexdigest()

    @cached_property
    def _readings_digest(self) -> str:
        """Digest of the readings files as loaded (read once, like ``readings``)."""
        return hashlib.sha256(self.settings.reading_labels.read_bytes()
                              + self.settings.readings.read_bytes()).hexdigest()

    def training_set(self, voters: list[Incident]) -> tuple[list[Incident], np.ndarray]:
        """The labelled voting incidents with their stored vectors (a sample of them beyond
        ``classifier_max_samples``, see ``training_sample``)."""
        ids, vectors = self.kb.store.incident_vectors()
        chosen = {i.id: i for i in training_sample([i for i in voters if i.labelled and i.votes],
                                                   self.settings.classifier_max_samples)}
        keep = [n for n, i in enumerate(ids) if i in chosen]
        return [chosen[ids[n]] for n in keep], vectors[keep] if keep else np.zeros((0, 1), np.float32)

    def text_classifiers(self, voters: list[Incident], fingerprint: str) -> dict[str, TextClassifier]:
        """Classifiers for root cause and symptom: the cached ones when trained on exactly these
        incidents, else fitted now (and cached)."""
        cached = load_classifiers(self.classifier_cache_path, fingerprint)
        if cached is not None:
            return cached
        incidents, vectors = self.training_set(voters)
        texts = [i.text() for i in incidents]
        classifiers = {name: TextClassifier(labels).fit(texts, vectors, *self.training_samples(incidents, name))
                       for name, labels in self.label_sets().items()}
        try:
            save_classifiers(self.classifier_cache_path, fingerprint, classifiers)
        except OSError as exc:  # a read-only knowledge base still answers, it just refits next time
            log.warning("could not cache the text classifiers at %s: %s", self.classifier_cache_path, exc)
        return classifiers

    def load(self) -> Calibration | None:
        """This knowledge base's fitted weights, else the weights shipped with pmkb for this knowledge
        base's embedding model; None if neither."""
        own = Calibration.load(self.calibration_path)
        if own is not None:
            return own
        model_id = self.kb.embedder.model_id
        path = per_model_file(self.settings.default_calibration, model_id, ".json")
        shipped = Calibration.load(path)
        if shipped is None:
            log.info("no classifier weights ship for %s (%s): they are fitted on this knowledge base", model_id, path)
        elif shipped.embedding_model not in (None, model_id):
            log.info("the shipped classifier weights were fitted with %s, not %s: they are fitted on this "
                     "knowledge base instead", shipped.embedding_model, model_id)
            return None
        return shipped

    def _left_out(self, voters: list[Incident], features: LeaveOneOut):
        """Each labelled voting incident scored as an unseen ticket: (incidents, their cause
        features, their symptom features)."""
        incidents, vectors = self.training_set(voters)
        texts = [i.text() for i in incidents]
        oof = {name: out_of_fold_log_proba(labels, texts, vectors, *self.training_samples(incidents, name))
               for name, labels in self.label_sets().items()}
        samples = [features(incident, vector, text, {name: oof[name][n] for name in oof})
                   for n, (incident, vector, text) in enumerate(zip(incidents, vectors, texts))]
        return incidents, [c for c, _ in samples], [s for _, s in samples]

    def fit(self, voters: list[Incident], features: LeaveOneOut, save: bool = True) -> Calibration:
        """Fit the classifier weights leave-one-out over the labelled voting incidents, and the
        prediction sets on the same left-out scores.

        Neighbours exclude the incident itself and the text classifier's probabilities are
        out-of-fold, so every feature is computed as it would be for an unseen ticket.
        """
        incidents, cause_f, symptom_f = self._left_out(voters, features)
        incidents, cause_f, symptom_f = self._fitting(incidents, cause_f, symptom_f)
        with_symptom = [n for n, i in enumerate(incidents) if i.symptom]
        cause_w, cause_loss = fit_weights(cause_f, [i.root_cause for i in incidents])
        symptom_w, _ = fit_weights([symptom_f[n] for n in with_symptom], [incidents[n].symptom for n in with_symptom])
        calibration = Calibration(root_cause=cause_w, symptom=symptom_w, log_loss=round(cause_loss, 4),
                                  embedding_model=self.kb.embedder.model_id,
                                  fitted_on=f"leave-one-out over {len(incidents)} labelled {self._kind(incidents)} "
                                            f"({datetime.now(timezone.utc):%Y-%m-%d})")
        calibration = self._with_sets(calibration, incidents, cause_f, symptom_f).model_copy(update={
            "left_out": cross_validate(cause_f, [i.root_cause for i in incidents], self.kb.taxonomy.dimension_of,
                                       expert_readings=self.expert_readings(voters, incidents))})
        if save and incidents:
            calibration.save(self.calibration_path)
        return calibration

    def expert_readings(self, voters: list[Incident], incidents: list[Incident]) -> list[np.ndarray | None] | None:
        """Each incident's reading feature from its expert-labelled readings, as the reader's is
        computed from its distributions (None where it has no labels; None when readings are off)."""
        if self.readings is None:
            return None
        vocabulary, labels = self.readings
        table = reading_table(voters, labels, vocabulary, self.kb.taxonomy.cause_ids)

        def certain(label: ReadingLabel) -> dict[str, np.ndarray]:
            return {kind: (np.asarray(vocabulary.ids(kind)) == getattr(label, kind)).astype(float) for kind in KINDS}

        return [reading_feature(certain(labels[i.id]), table) if i.id in labels else None for i in incidents]

    def fit_sets(self, voters: list[Incident], features: LeaveOneOut, calibration: Calibration) -> Calibration:
        """The prediction sets fitted anew on these incidents, the weights kept as they are."""
        return self._with_sets(calibration, *self._fitting(*self._left_out(voters, features)))

    def _fitting(self, incidents: list[Incident], cause_f: list[LabelFeatures], symptom_f: list[LabelFeatures]):
        """The left-out incidents and features kept for fitting (``fitting_rows``)."""
        rows = fitting_rows(incidents) if self.real_only else range(len(incidents))
        return [incidents[n] for n in rows], [cause_f[n] for n in rows], [symptom_f[n] for n in rows]

    @staticmethod
    def _kind(incidents: list[Incident]) -> str:
        written = any(i.source == BUNDLED_SOURCE for i in incidents)
        return "incidents" if written else "real incidents"

    def _with_sets(self, calibration: Calibration, incidents: list[Incident], cause_f: list[LabelFeatures],
                   symptom_f: list[LabelFeatures]) -> Calibration:
        weights = [CONFIRMED_SET_WEIGHT if i.provenance == Provenance.confirmed else 1.0 for i in incidents]
        with_symptom = [n for n, i in enumerate(incidents) if i.symptom]
        confirmed = sum(i.provenance == Provenance.confirmed for i in incidents)
        rankings = [predict(f, calibration.root_cause) for f in cause_f]
        truths = [i.root_cause for i in incidents]
        return calibration.model_copy(update={
            "root_cause_set": SetCalibration.fit(rankings, truths, weights),
            "owner": OwnerCalibration.fit(rankings, truths, self.kb.taxonomy.dimension_of),
            "symptom_set": SetCalibration.fit([predict(symptom_f[n], calibration.symptom) for n in with_symptom],
                                              [incidents[n].symptom for n in with_symptom],
                                              [weights[n] for n in with_symptom]),
            "sets_fitted_on": f"left-out scores of {len(incidents)} labelled {self._kind(incidents)} "
                              f"({confirmed} confirmed, "
                              f"weighing {CONFIRMED_SET_WEIGHT:g} each) ({datetime.now(timezone.utc):%Y-%m-%d})"})
