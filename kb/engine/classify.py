"""Classification: evidence, neighbour votes and taxonomy similarity -> calibrated probabilities.

For each label (root cause or symptom) the score is a weighted sum of four features,

    logit = w_evidence * E + w_vote * V + w_taxonomy * T + w_nearest * N + w_prior * log(prior)
            + w_text * log(p_text) + w_reading * R

where E is the summed signature weight, V the neighbours' similarity-weighted vote, T the
standardised similarity to the category's taxonomy entry, N the similarity of the closest
incident with that label, p_text a text classifier's probability (kb/engine/textclf.py) and R
how much the ticket's scope and change readings favour the label (kb/engine/readings.py; root
causes only); a softmax turns the logits into probabilities. The seven weights are fitted by maximum likelihood on
labelled incidents (leave-one-out over the knowledge base), which also calibrates the
probabilities; ``pmkb eval`` measures the calibration (ECE) on held-out tickets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from kb.core.incidents import vote_weight
from kb.core.suggestion import Evidence, SimilarIncident
from kb.engine.conformal import SetCalibration
from kb.engine.crossval import LeftOutFigures
from kb.engine.evidence import evidence_scores
from kb.engine.owner import OwnerCalibration

FEATURES = ("evidence", "vote", "taxonomy", "nearest", "prior", "text", "reading")
BOUNDS = {"evidence": (0, 10), "vote": (0, 20), "taxonomy": (0, 5), "nearest": (0, 20), "prior": (0, 3),
          "text": (0, 5), "reading": (0, 5)}


class Weights(BaseModel):
    """The fitted weights of one classifier."""

    model_config = ConfigDict(extra="forbid")

    evidence: float = 1.0
    vote: float = 1.0
    taxonomy: float = 0.5
    nearest: float = 2.0
    prior: float = 0.1
    text: float = 1.0
    reading: float = 0.0  # weights fitted before readings existed leave them out

    def as_array(self) -> np.ndarray:
        """Weights in feature order."""
        return np.array([getattr(self, name) for name in FEATURES])


class Calibration(BaseModel):
    """Weights for the root-cause and symptom classifiers, with what they were fitted on."""

    model_config = ConfigDict(extra="forbid")

    root_cause: Weights = Weights()
    symptom: Weights = Weights()
    fitted_on: str = "defaults"  # e.g. "leave-one-out over 260 incidents"
    embedding_model: str | None = None  # the embedder's model_id the weights were fitted with (None: not recorded)
    log_loss: float | None = None
    # Prediction-set calibration: scores of the true labels of the same incidents (see conformal.py).
    root_cause_set: SetCalibration | None = None
    symptom_set: SetCalibration | None = None
    sets_fitted_on: str | None = None
    # The owner's probability and whether it was right, on the same left-out scores (kb/engine/owner.py).
    owner: OwnerCalibration | None = None
    # The ranking's figures on the same incidents, the weights fitted on the other folds (kb/engine/crossval.py).
    left_out: LeftOutFigures | None = None

    def save(self, path: Path) -> None:
        """Write as JSON."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: Path) -> "Calibration | None":
        """Read from JSON, or None when absent."""
        return cls.model_validate_json(path.read_text()) if path.exists() else None


@dataclass
class LabelFeatures:
    """Feature matrix for one ticket over one label set: rows = labels, columns = features."""

    labels: list[str]
    matrix: np.ndarray  # shape (n_labels, len(FEATURES))


def neighbour_votes(similar: list[SimilarIncident], labels: list[str], field: str,
                    power: float = 2.0) -> dict[str, float]:
    """Similarity-weighted share of the neighbours carrying each label."""
    votes = dict.fromkeys(labels, 0.0)
    total = 0.0
    for rank, hit in enumerate(similar):
        label = getattr(hit, field)
        weight = vote_weight(hit.provenance) * max(hit.score, 0.0) ** power / (1 + 0.1 * rank)
        if label in votes and weight > 0:
            votes[label] += weight
            total += weight
    return {k: v / total for k, v in votes.items()} if total else votes


def standardise(values: dict[str, float]) -> dict[str, float]:
    """Z-score across labels, so only the relative taxonomy similarity counts."""
    arr = np.array(list(values.values()), dtype=np.float64)
    std = float(arr.std()) or 1.0
    return {k: (v - float(arr.mean())) / std for k, v in values.items()}


def nearest_similarity(similar: list[SimilarIncident], labels: list[str], field: str) -> dict[str, float]:
    """Score of the most similar voting incident carrying each label (0 when none is retrieved)."""
    best = dict.fromkeys(labels, 0.0)
    for hit in similar:
        label = getattr(hit, field)
        if label in best and vote_weight(hit.provenance) > 0:
            best[label] = max(best[label], hit.score)
    return best


def build_features(labels: list[str], evidence: list[Evidence], similar: list[SimilarIncident],
                   taxonomy_sims: dict[str, float], priors: dict[str, float], field: str,
                   text_log_proba: np.ndarray | None = None, votes_from: int = 8,
                   reading: np.ndarray | None = None) -> LabelFeatures:
    """Assemble the features (in FEATURES order) for every label."""
    ev_field = "causes" if field == "root_cause" else "symptoms"
    ev = evidence_scores(evidence, labels, ev_field)
    votes = neighbour_votes(similar[:votes_from], labels, field)
    near = nearest_similarity(similar, labels, field)
    tax = standardise({label: taxonomy_sims.get(label, 0.0) for label in labels})
    prior = {label: np.log(priors.get(label, 0.0) + 1e-3) for label in labels}
    text = text_log_proba if text_log_proba is not None else np.full(len(labels), -np.log(len(labels)))
    read = reading if reading is not None and len(reading) == len(labels) else np.zeros(len(labels))
    matrix = np.array([[ev[label], votes[label], tax[label], near[label], prior[label], text[n], read[n]]
                       for n, label in enumerate(labels)])
    return LabelFeatures(labels, matrix)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def predict(features: LabelFeatures, weights: Weights) -> list[tuple[str, float]]:
    """Labels ranked by probability."""
    probs = softmax(features.matrix @ weights.as_array())
    order = np.argsort(-probs)
    return [(features.labels[i], float(probs[i])) for i in order]


def fit_weights(samples: list[LabelFeatures], truths: list[str], start: Weights | None = None,
                l2: float = 0.01) -> tuple[Weights, float]:
    """Maximum-likelihood weights (with a little L2) for labelled samples; returns (weights, log loss)."""
    from scipy.optimize import minimize

    usable = [(f.matrix, f.labels.index(t)) for f, t in zip(samples, truths) if t in f.labels]
    if not usable:
        return start or Weights(), float("nan")
    mats = np.stack([m for m, _ in usable])
    idx = np.array([i for _, i in usable])

    def loss(w: np.ndarray) -> float:
        logits = mats @ w
        logits = logits - logits.max(axis=1, keepdims=True)
        logz = np.log(np.exp(logits).sum(axis=1))
        return float(np.mean(logz - logits[np.arange(len(idx)), idx]) + l2 * np.sum(w ** 2))

    x0 = (start or Weights()).as_array()
    res = minimize(loss, x0, method="L-BFGS-B", bounds=[BOUNDS[name] for name in FEATURES])
    w = res.x
    return (Weights(**{name: round(float(v), 4) for name, v in zip(FEATURES, w)}),
            float(loss(w) - l2 * np.sum(w ** 2)))


def expected_calibration_error(confidences: list[float], correct: list[bool], bins: int = 10) -> float:
    """ECE: |accuracy - confidence| averaged over equal-width confidence bins, weighted by size."""
    conf = np.asarray(confidences, dtype=float)
    hit = np.asarray(correct, dtype=float)
    if not len(conf):
        return float("nan")
    edges = np.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        if mask.any():
            ece += mask.mean() * abs(hit[mask].mean() - conf[mask].mean())
    return float(ece)
