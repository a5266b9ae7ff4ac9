"""Weight fitting and calibration measures on data whose answer is known."""

import numpy as np

from kb.core.suggestion import SimilarIncident
from kb.engine.classify import (
    FEATURES,
    LabelFeatures,
    Weights,
    expected_calibration_error,
    fit_weights,
    neighbour_votes,
    predict,
)


def _hit(cause, score, provenance="human_labelled"):
    return SimilarIncident(id=cause + str(score), title="", score=score, dense=score, lexical=0, symptom=None,
                           root_cause=cause, root_cause_dimension=None, mitigation=None, resolution="",
                           provenance=provenance, source="")


def test_votes_ignore_unconfirmed_machine_labels():
    votes = neighbour_votes([_hit("a", 0.9), _hit("b", 0.95, "machine_suggested")], ["a", "b"], "root_cause")
    assert votes == {"a": 1.0, "b": 0.0}


def test_fit_finds_the_informative_feature():
    rng = np.random.default_rng(0)
    labels = ["a", "b", "c"]
    samples, truths = [], []
    for _ in range(300):
        truth = rng.integers(3)
        matrix = rng.normal(size=(3, len(FEATURES)))
        matrix[:, 0] = 0
        matrix[truth, 0] = 1.0 if rng.random() < 0.9 else 0.0
        samples.append(LabelFeatures(labels, matrix))
        truths.append(labels[truth])
    weights, loss = fit_weights(samples, truths, l2=0.001)
    assert weights.evidence > 3 * max(getattr(weights, f) for f in FEATURES if f != "evidence")
    accuracy = np.mean([predict(f, weights)[0][0] == t for f, t in zip(samples, truths)])
    assert accuracy > 0.85 and loss < np.log(3)


def test_ece_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.2, 1.0, 5000)
    calibrated = rng.random(5000) < conf
    assert expected_calibration_error(conf.tolist(), calibrated.tolist()) < 0.03
    overconfident = rng.random(5000) < conf * 0.5
    assert expected_calibration_error(conf.tolist(), overconfident.tolist()) > 0.25


def test_predict_is_a_distribution():
    ranked = predict(LabelFeatures(["a", "b"], np.array([[1.0] + [0] * (len(FEATURES) - 1), [0] * len(FEATURES)])), Weights())
    assert ranked[0][0] == "a" and abs(sum(p for _, p in ranked) - 1) < 1e-9
