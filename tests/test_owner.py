"""The owner first (kb/engine/owner.py): the most probable dimension decides the suggested cause, and
the bot labels the owner when it is as sure as the wanted precision asks."""

from __future__ import annotations

import math

import pytest

from kb.core.suggestion import COMMENT_ONLY, DIMENSION_LABEL, Candidate, Owner, labelling
from kb.engine.owner import MIN_LABELLED, OwnerCalibration, owner_first, owner_masses
from kb.tickets.writeback import render_comment, suggestion_labels
from tests.test_writeback import make_suggestion

DIMENSION = {"gpu_lost": "hardware", "node_outage": "hardware", "system_defect": "platform",
             "platform_misconfiguration": "platform", "resource_overload": "platform", "buggy_code": "user"}.get


def test_the_most_probable_dimension_decides_the_cause():
    causes = [("gpu_lost", 0.34), ("system_defect", 0.25), ("platform_misconfiguration", 0.2),
              ("resource_overload", 0.11), ("buggy_code", 0.1)]
    assert owner_masses(causes, DIMENSION) == pytest.approx({"hardware": 0.34, "platform": 0.56, "user": 0.1})
    assert owner_first(causes, DIMENSION) == [("system_defect", 0.25), ("gpu_lost", 0.34),
                                              ("platform_misconfiguration", 0.2), ("resource_overload", 0.11),
                                              ("buggy_code", 0.1)]


def test_a_top_cause_of_the_most_probable_dimension_stays_first():
    causes = [("gpu_lost", 0.4), ("system_defect", 0.3), ("node_outage", 0.2), ("buggy_code", 0.1)]
    assert owner_first(causes, DIMENSION) is causes


def _calibration(pairs: list[tuple[float, bool]]) -> OwnerCalibration:
    return OwnerCalibration(confidences=[c for c, _ in pairs], correct=[ok for _, ok in pairs])


def test_the_threshold_is_the_lowest_probability_that_keeps_the_precision():
    sure = [(0.95 - n * 0.001, True) for n in range(90)] + [(0.85, False)] * 10  # 90% right down to 0.85
    unsure = [(0.5 - n * 0.001, n % 2 == 1) for n in range(100)]  # half right below
    calibration = _calibration(sure + unsure)
    assert calibration.threshold(0.9) == pytest.approx(0.85)
    assert calibration.labelled_share(0.9) == pytest.approx(0.5)
    assert calibration.threshold(0.8) < 0.5  # asking less labels more
    assert calibration.threshold(0.99) > 0.85


def test_no_threshold_when_too_few_incidents_reach_the_precision():
    calibration = _calibration([(0.9, True)] * (MIN_LABELLED - 1) + [(0.8, False)] * 40)
    assert math.isinf(calibration.threshold(0.9)) and calibration.labelled_share(0.9) == 0.0


def test_fit_scores_the_owner_of_each_plain_ranking():
    rankings = [[("gpu_lost", 0.4), ("system_defect", 0.35), ("resource_overload", 0.25)],
                [("buggy_code", 0.7), ("gpu_lost", 0.3)]]
    calibration = OwnerCalibration.fit(rankings, ["gpu_lost", "buggy_code"], DIMENSION)
    assert calibration.confidences == [0.6, 0.7] and calibration.correct == [False, True]


def _wide_set_suggestion(owner: Owner | None, dimension: str = "platform"):
    members = [Candidate(id="system_defect", confidence=0.4, dimension="platform"),
               Candidate(id="buggy_code", confidence=0.3, dimension="user")]
    return make_suggestion(root_cause="system_defect", dimension=dimension, root_cause_set=members, set_level=0.9,
                           owner=owner)


def test_a_sure_owner_is_labelled_when_the_set_spans_dimensions():
    sure = _wide_set_suggestion(Owner(dimension="platform", confidence=0.82, labelled=True, precision=0.9))
    assert labelling(sure) == DIMENSION_LABEL
    assert suggestion_labels(sure)[0] == "dim:platform"
    assert "sure enough to label" in render_comment(sure, threshold_note=False)
    unsure = _wide_set_suggestion(Owner(dimension="platform", confidence=0.55, labelled=False, precision=0.9))
    assert labelling(unsure) == COMMENT_ONLY and suggestion_labels(unsure) == []
    assert "Owner:" in render_comment(unsure, threshold_note=False)
    assert labelling(_wide_set_suggestion(None)) == COMMENT_ONLY


def test_an_owner_that_is_not_the_shown_causes_dimension_is_never_labelled():
    moved = _wide_set_suggestion(Owner(dimension="user", confidence=0.9, labelled=True, precision=0.9))
    assert labelling(moved) == COMMENT_ONLY


def test_the_engine_gives_every_suggestion_an_owner_labelled_by_the_fitted_threshold(shared_bundled_kb):
    from kb.core.suggestion import Ticket
    from kb.engine.suggest import SuggestionEngine

    engine = SuggestionEngine(shared_bundled_kb)
    fitted = engine.calibration.owner
    assert fitted is not None and len(fitted.confidences) > 300
    ticket = Ticket(title="Nobody can submit jobs since the scheduler upgrade this morning",
                    description="Since the Slurm upgrade at 08:00 every user on the cluster gets "
                                "'sbatch: error: Batch job submission failed: Socket timed out'.")
    s = engine.suggest(ticket)
    assert s.owner is not None and s.owner.dimension == s.root_cause_dimension
    mass = sum(c.confidence for c in s.root_cause_candidates if engine.kb.taxonomy.dimension_of(c.id) == s.owner.dimension)
    assert s.owner.confidence >= mass - 0.01  # the candidates shown are the top five of all causes
    assert s.owner.labelled == (s.owner.confidence >= fitted.threshold(engine.settings.owner_precision))
    strict = SuggestionEngine(shared_bundled_kb)
    strict.settings = strict.settings.model_copy(update={"owner_precision": 1.0})
    assert strict.suggest(ticket).owner.labelled is (fitted.threshold(1.0) <= s.owner.confidence)
