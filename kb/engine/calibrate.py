"""What the engine learns from the knowledge base's labelled incidents, and where it is kept.

Two things are fitted on the voting incidents (human-labelled or confirmed): the text
classifiers (cached per knowledge base, keyed by a digest of what they learnt from) and the
classifier weights (``Calibration``: this knowledge base's own from ``pmkb calibrate``, else the
weights shipped with pmkb, else fitted on first use).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from kb.core.incidents import Incident
from kb.engine.classify import Calibration, LabelFeatures, fit_weights
from kb.engine.knowledge import KnowledgeBase
from kb.engine.textclf import (
    CACHE_FILE,
    TextClassifier,
    load_classifiers,
    out_of_fold_log_proba,
    save_classifiers,
    training_fingerprint,
)

log = logging.getLogger(__name__)

LeaveOneOut = Callable[[Incident, np.ndarray, str, dict[str, np.ndarray]], tuple[LabelFeatures, LabelFeatures]]
"""``(incident, its vector, its text, out-of-fold text log-probabilities) -> (cause, symptom)
features`` computed as for an unseen ticket: the engine's pipeline with the incident left out."""


class Calibrator:
    """Fits and keeps the text classifiers and the classifier weights of one knowledge base."""

    def __init__(self, kb: KnowledgeBase):
        self.kb = kb
        self.settings = kb.settings

    @property
    def calibration_path(self) -> Path:
        """Where fitted weights are kept for this knowledge base."""
        return self.settings.home / "calibration.json"

    @property
    def classifier_cache_path(self) -> Path:
        """Where the trained text classifiers of this knowledge base are cached."""
        return self.settings.home / CACHE_FILE

    def label_sets(self) -> dict[str, list[str]]:
        """The labels each classifier chooses among, by incident field."""
        return {"root_cause": self.kb.taxonomy.cause_ids, "symptom": self.kb.taxonomy.symptom_ids}

    def fingerprint(self, voters: list[Incident]) -> str:
        """Digest of what classifiers trained on these incidents learn from."""
        return training_fingerprint(voters, self.kb.embedder.model_id)

    def training_set(self, voters: list[Incident]) -> tuple[list[Incident], np.ndarray]:
        """The labelled voting incidents with their stored vectors."""
        ids, vectors = self.kb.store.incident_vectors()
        by_id = {i.id: i for i in voters}
        keep = [n for n, i in enumerate(ids) if i in by_id and by_id[i].labelled and by_id[i].votes]
        return [by_id[ids[n]] for n in keep], vectors[keep] if keep else np.zeros((0, 1), np.float32)

    def text_classifiers(self, voters: list[Incident], fingerprint: str) -> dict[str, TextClassifier]:
        """Classifiers for root cause and symptom: the cached ones when trained on exactly these
        incidents, else fitted now (and cached)."""
        cached = load_classifiers(self.classifier_cache_path, fingerprint)
        if cached is not None:
            return cached
        incidents, vectors = self.training_set(voters)
        texts, reports = [i.text() for i in incidents], [i.document() for i in incidents]
        classifiers = {name: TextClassifier(labels).fit(texts, vectors, [getattr(i, name) for i in incidents],
                                                        reports)
                       for name, labels in self.label_sets().items()}
        try:
            save_classifiers(self.classifier_cache_path, fingerprint, classifiers)
        except OSError as exc:  # a read-only knowledge base still answers, it just refits next time
            log.warning("could not cache the text classifiers at %s: %s", self.classifier_cache_path, exc)
        return classifiers

    def load(self) -> Calibration | None:
        """This knowledge base's fitted weights, else the weights shipped with pmkb; None if neither."""
        return Calibration.load(self.calibration_path) or Calibration.load(self.settings.default_calibration)

    def fit(self, voters: list[Incident], features: LeaveOneOut, save: bool = True) -> Calibration:
        """Fit the classifier weights leave-one-out over the labelled voting incidents.

        Neighbours exclude the incident itself and the text classifier's probabilities are
        out-of-fold, so every feature is computed as it would be for an unseen ticket.
        """
        incidents, vectors = self.training_set(voters)
        texts, reports = [i.text() for i in incidents], [i.document() for i in incidents]
        oof = {name: out_of_fold_log_proba(labels, texts, vectors, [getattr(i, name) for i in incidents], reports)
               for name, labels in self.label_sets().items()}
        cause_samples, cause_truth, symptom_samples, symptom_truth = [], [], [], []
        for n, (incident, vector, text) in enumerate(zip(incidents, vectors, texts)):
            cause_f, symptom_f = features(incident, vector, text, {name: oof[name][n] for name in oof})
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
        return calibration
