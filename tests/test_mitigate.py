"""Mitigation ranking: how each cause's incidents were mitigated, blended with the neighbours."""

import pytest

from kb.core.incidents import Incident
from kb.core.settings import Settings
from kb.core.taxonomy import load_taxonomy
from kb.engine.mitigate import (
    HISTORY_STRENGTH,
    _default_weights,
    cause_mitigations,
    rank_mitigations,
)

TAX = load_taxonomy(Settings.model_fields["taxonomy"].default)


def _incident(n, cause, mitigation):
    return Incident(id=f"i{n}", title="t", description="d", root_cause=cause, mitigation=mitigation,
                    symptom="job_crash")


def test_usual_mitigations_follow_the_knowledge_base_smoothed_toward_the_defaults():
    history = [_incident(n, "gpu_lost", "job_resubmission") for n in range(15)]
    table = cause_mitigations(TAX, history)
    defaults = _default_weights(TAX.root_cause("gpu_lost").default_mitigations)
    total = 15 + HISTORY_STRENGTH
    assert table["gpu_lost"]["job_resubmission"] == pytest.approx(
        (15 + HISTORY_STRENGTH * defaults.get("job_resubmission", 0)) / total)
    assert sum(table["gpu_lost"].values()) == pytest.approx(1.0)
    assert table["buggy_code"] == pytest.approx(_default_weights(TAX.root_cause("buggy_code").default_mitigations))


def test_ranking_uses_the_usual_mitigations_when_given():
    causes = [("gpu_lost", 1.0)]
    assert rank_mitigations(TAX, causes, [], None)[0].id == TAX.root_cause("gpu_lost").default_mitigations[0]
    usual = cause_mitigations(TAX, [_incident(n, "gpu_lost", "wait_for_recovery") for n in range(30)])
    assert rank_mitigations(TAX, causes, [], None, usual)[0].id == "wait_for_recovery"
