"""Prediction sets with a coverage guarantee: split conformal prediction with an adaptive score.

For a ticket the engine ranks every root cause (and symptom) by probability. The set is the
shortest prefix of that ranking that holds the true label with probability at least 1 - alpha,
over tickets drawn like the calibration incidents: an easy ticket gets one cause, a hard one
several. The score of a label (RAPS, Angelopoulos et al. 2021) is the probability mass ranked
above it plus its own, plus ``penalty`` for every rank beyond ``free_ranks`` (which keeps sets
from growing through a long tail of small probabilities). Calibration scores are those of the
true labels of labelled incidents, each scored as an unseen ticket (left out of its own
neighbours, out-of-fold text classifier); an incident can weigh more than another (the team's
confirmed incidents are its own distribution), and the quantile is the weighted one with the
finite-sample correction.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr

PENALTY = 0.02
"""Score added per rank beyond ``FREE_RANKS``."""
FREE_RANKS = 2


def label_score(ranked: list[tuple[str, float]], label: str, penalty: float = PENALTY,
                free_ranks: int = FREE_RANKS) -> float:
    """The score of ``label`` in a ranking, best first: mass up to and including it, plus the penalty."""
    mass = 0.0
    for rank, (candidate, p) in enumerate(ranked, 1):
        mass += p
        if candidate == label:
            return mass + penalty * max(0, rank - free_ranks)
    return math.inf  # not ranked at all: no set holds it


def conformal_quantile(scores: np.ndarray, weights: np.ndarray, alpha: float) -> float:
    """The weighted (1 - alpha) quantile of calibration scores with the finite-sample correction:
    the smallest score s such that the weight of scores <= s is at least (1 - alpha) of the total
    weight plus one more ticket's (of weight 1). Infinite when there are too few scores."""
    scores, weights = np.asarray(scores, float), np.asarray(weights, float)
    order = np.argsort(scores, kind="stable")
    cumulative = np.cumsum(weights[order])
    at = int(np.searchsorted(cumulative, (1 - alpha) * (cumulative[-1] + 1.0) if len(cumulative) else 1.0,
                             side="left"))
    return float(scores[order][at]) if at < len(scores) else math.inf


def prediction_set(ranked: list[tuple[str, float]], threshold: float, penalty: float = PENALTY,
                   free_ranks: int = FREE_RANKS) -> list[str]:
    """The labels whose score is at most ``threshold``, best first (never empty: the top label
    is always in)."""
    members, mass = [], 0.0
    for rank, (label, p) in enumerate(ranked, 1):
        mass += p
        if members and mass + penalty * max(0, rank - free_ranks) > threshold:
            break
        members.append(label)
    return members


class SetCalibration(BaseModel):
    """Calibration scores for the prediction sets of one label field, and what they came from."""

    model_config = ConfigDict(extra="forbid")

    scores: list[float]  # the true labels' scores, one per calibration incident
    weights: list[float]  # how much each incident counts
    penalty: float = PENALTY
    free_ranks: int = FREE_RANKS
    _thresholds: dict[float, float] = PrivateAttr(default_factory=dict)

    def threshold(self, alpha: float) -> float:
        """The score threshold of sets at level 1 - alpha (computed once per alpha: every
        suggestion asks for it)."""
        if alpha not in self._thresholds:
            self._thresholds[alpha] = conformal_quantile(np.array(self.scores), np.array(self.weights), alpha)
        return self._thresholds[alpha]

    def predict(self, ranked: list[tuple[str, float]], alpha: float) -> list[str]:
        """The prediction set of a ranking at level 1 - alpha."""
        return prediction_set(ranked, self.threshold(alpha), self.penalty, self.free_ranks)

    @classmethod
    def fit(cls, rankings: list[list[tuple[str, float]]], truths: list[str], weights: list[float],
            penalty: float = PENALTY, free_ranks: int = FREE_RANKS) -> "SetCalibration":
        """Scores of the true labels in rankings made as for unseen tickets."""
        scores = [label_score(r, t, penalty, free_ranks) for r, t in zip(rankings, truths)]
        return cls(scores=[round(s, 6) if math.isfinite(s) else 1e9 for s in scores],
                   weights=list(weights), penalty=penalty, free_ranks=free_ranks)
