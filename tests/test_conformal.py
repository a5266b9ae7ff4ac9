"""Prediction sets: the coverage guarantee on exchangeable data, the quantile, adaptive sizes."""

import math

import numpy as np
import pytest

from kb.engine.conformal import SetCalibration, conformal_quantile, label_score, prediction_set

LABELS = [f"c{n}" for n in range(10)]


def _tickets(rng: np.random.Generator, n: int, concentration: float = 0.5):
    """Rankings from a calibrated model: each truth is drawn from the ranking's own probabilities."""
    rankings, truths = [], []
    for probs in rng.dirichlet([concentration] * len(LABELS), size=n):
        order = np.argsort(-probs)
        rankings.append([(LABELS[i], float(probs[i])) for i in order])
        truths.append(LABELS[rng.choice(len(LABELS), p=probs)])
    return rankings, truths


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_sets_cover_the_truth_at_the_promised_rate(alpha):
    rng = np.random.default_rng(7)
    covered = []
    for _ in range(60):
        rankings, truths = _tickets(rng, 400)
        calibration = SetCalibration.fit(rankings[:200], truths[:200], [1.0] * 200)
        covered += [t in calibration.predict(r, alpha) for r, t in zip(rankings[200:], truths[200:])]
    # Marginal coverage is at least 1 - alpha and at most 1 - alpha + 1 / (n + 1), up to sampling error.
    assert 1 - alpha - 0.01 <= np.mean(covered) <= 1 - alpha + 1 / 201 + 0.02


def test_unit_weights_give_the_textbook_quantile():
    scores = np.random.default_rng(1).random(99)
    for alpha in (0.05, 0.1, 0.3):
        rank = math.ceil((len(scores) + 1) * (1 - alpha))
        assert conformal_quantile(scores, np.ones(99), alpha) == np.sort(scores)[rank - 1]
    assert conformal_quantile(scores[:5], np.ones(5), 0.1) == math.inf  # too few to promise 90%


def test_heavier_incidents_pull_the_quantile_towards_their_scores():
    scores = np.array([0.1] * 50 + [0.9] * 50)
    even = conformal_quantile(scores, np.ones(100), 0.4)
    confirmed_low = conformal_quantile(scores, np.array([3.0] * 50 + [1.0] * 50), 0.4)
    assert even == 0.9 and confirmed_low == 0.1


def test_an_easy_ticket_gets_one_cause_and_a_hard_one_several():
    easy = [("gpu_lost", 0.93), ("node_outage", 0.04), ("gpu_memory_error", 0.03)]
    hard = [("platform_misconfiguration", 0.34), ("improper_configuration", 0.31), ("service_outage", 0.2),
            ("buggy_code", 0.15)]
    assert prediction_set(easy, 0.95) == ["gpu_lost"]
    assert prediction_set(hard, 0.95) == ["platform_misconfiguration", "improper_configuration",
                                          "service_outage"]
    assert prediction_set(hard, 0.1) == ["platform_misconfiguration"]  # never empty


def test_a_label_is_in_the_set_exactly_when_its_score_is_under_the_threshold():
    rng = np.random.default_rng(3)
    rankings, _ = _tickets(rng, 50)
    for ranking in rankings:
        threshold = float(rng.random())
        members = set(prediction_set(ranking, threshold))
        below = {label for label, _ in ranking if label_score(ranking, label) <= threshold}
        assert members == below | {ranking[0][0]}
