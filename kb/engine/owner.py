"""The owner first: which dimension (hardware, platform or user) owns a ticket, then the cause within it.

An on-call engineer decides who owns a ticket before naming its cause. The engine does the same
with its own probabilities: a dimension's probability is the sum of its causes' (the owner is the
dimension with the most), and the suggested cause is the most probable cause of that dimension.
Where several causes of one dimension share the probability a single cause of another holds, the
owner and the suggestion follow the dimension, as an engineer routing the ticket would.

How sure the owner is decides whether the ticket bot labels it. ``OwnerCalibration`` keeps the
owner's probability and whether it was right for the labelled incidents, each scored as an unseen
ticket; the labelling threshold for a wanted precision is the lowest probability above which the
owner was right that often.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, PrivateAttr

MIN_LABELLED = 30
"""Left-out incidents a threshold must label at least: fewer say too little about its precision."""


def owner_masses(causes: list[tuple[str, float]], dimension_of: Callable[[str], str | None]) -> dict[str, float]:
    """Each dimension's probability: the sum of its causes' probabilities."""
    masses: dict[str, float] = {}
    for cause, p in causes:
        dimension = dimension_of(cause)
        if dimension is not None:
            masses[dimension] = masses.get(dimension, 0.0) + p
    return masses


def most_probable_owner(causes: list[tuple[str, float]],
                        dimension_of: Callable[[str], str | None]) -> tuple[str, float] | None:
    """The dimension whose causes hold the most probability, with that probability (None: no cause
    has a dimension)."""
    masses = owner_masses(causes, dimension_of)
    return max(masses.items(), key=lambda item: item[1]) if masses else None


def owner_first(causes: list[tuple[str, float]], dimension_of: Callable[[str], str | None]) -> list[tuple[str, float]]:
    """The ranking with the most probable cause of the most probable dimension first, the others in
    their order (unchanged when the top cause already belongs to that dimension)."""
    found = most_probable_owner(causes, dimension_of)
    if found is None or dimension_of(causes[0][0]) == (owner := found[0]):
        return causes
    at = next(n for n, (cause, _) in enumerate(causes) if dimension_of(cause) == owner)
    return [causes[at], *causes[:at], *causes[at + 1:]]


class OwnerCalibration(BaseModel):
    """The owner's probability and whether it was right, for labelled incidents scored as unseen tickets."""

    model_config = ConfigDict(extra="forbid")

    confidences: list[float]
    correct: list[bool]
    _thresholds: dict[float, float] = PrivateAttr(default_factory=dict)

    @classmethod
    def fit(cls, rankings: list[list[tuple[str, float]]], truths: list[str],
            dimension_of: Callable[[str], str | None]) -> "OwnerCalibration":
        """From plain rankings (best first) and the true causes."""
        confidences, correct = [], []
        for ranked, truth in zip(rankings, truths):
            found = most_probable_owner(ranked, dimension_of)
            if found is not None and dimension_of(truth) is not None:
                confidences.append(round(found[1], 6))
                correct.append(found[0] == dimension_of(truth))
        return cls(confidences=confidences, correct=correct)

    def threshold(self, precision: float) -> float:
        """The lowest owner probability at and above which the owner was right at least
        ``precision`` of the time over at least ``MIN_LABELLED`` incidents; infinite when none is."""
        if precision not in self._thresholds:
            confidences = np.asarray(self.confidences, dtype=float)
            order = np.argsort(-confidences, kind="stable")
            ranked = confidences[order]
            share = np.cumsum(np.asarray(self.correct, dtype=float)[order]) / np.arange(1, len(order) + 1)
            # a threshold labels every incident at or above it: only the last of equal probabilities ends a prefix
            ends = [k for k in range(MIN_LABELLED - 1, len(order))
                    if (k + 1 == len(order) or ranked[k + 1] < ranked[k]) and share[k] >= precision]
            self._thresholds[precision] = float(ranked[ends[-1]]) if ends else math.inf
        return self._thresholds[precision]

    def labelled_share(self, precision: float) -> float:
        """The share of the calibration incidents whose owner that threshold labels."""
        tau = self.threshold(precision)
        return float(np.mean([c >= tau for c in self.confidences])) if self.confidences else 0.0
