"""Dashboard data: distributions, the published split, trends and the incident filter."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kb.core.incidents import Incident, Provenance
from kb.core.settings import Settings
from kb.core.taxonomy import load_taxonomy
from kb.jobs.dashboard import (
    IncidentFilter,
    dimension_comparison,
    distribution,
    filter_incidents,
    incident_rows,
    over_time,
    published_source,
    published_split,
    summary,
)


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy(Settings.model_fields["taxonomy"].default)


def _incident(id_, cause=None, symptom="job_crash", when=None, provenance=Provenance.human_labelled,
              text=""):
    return Incident(id=id_, title=f"ticket {id_}", description=text, root_cause=cause, symptom=symptom,
                    created_at=datetime.fromisoformat(when).replace(tzinfo=timezone.utc) if when else None,
                    provenance=provenance)


@pytest.fixture
def incidents():
    return [
        _incident("a", "gpu_memory_error", when="2024-01-05", text="Xid 94 on gpu-h100-0417"),
        _incident("b", "gpu_memory_error", when="2024-01-20"),
        _incident("c", "service_outage", symptom="job_hang", when="2024-02-02"),
        _incident("d", "buggy_code", when="2024-02-10", provenance=Provenance.confirmed,
                  text="shape mismatch in the projection head"),
        _incident("e", None, symptom=None, provenance=Provenance.machine_suggested),
    ]


def test_the_published_split_is_the_taxonomys_dimension_shares(taxonomy):
    assert published_split(taxonomy) == {"hardware": 0.2833, "platform": 0.2833, "user": 0.4334}
    assert "Gao et al." in published_source(taxonomy)


def test_distribution_counts_every_incident_and_names_the_unlabelled(taxonomy, incidents):
    rows = incident_rows(incidents, taxonomy)
    by_cause = distribution(rows, "root_cause")
    assert by_cause[0] == {"root_cause": "gpu_memory_error", "incidents": 2, "share": 0.4}
    assert {r["root_cause"]: r["incidents"] for r in by_cause}["unlabelled"] == 1
    assert sum(r["incidents"] for r in distribution(rows, "symptom")) == len(incidents)
    with pytest.raises(ValueError, match="cannot group incidents by 'colour'"):
        distribution(rows, "colour")


def test_dimension_shares_are_over_labelled_incidents_beside_the_published_ones(taxonomy, incidents):
    rows = incident_rows(incidents, taxonomy)
    comparison = {r["dimension"]: r for r in dimension_comparison(rows, taxonomy)}
    assert comparison["hardware"]["incidents"] == 2  # gpu_memory_error twice
    assert comparison["hardware"]["knowledge_base"] == pytest.approx(2 / 4)
    assert comparison["user"]["knowledge_base"] == pytest.approx(1 / 4)
    assert comparison["user"]["published"] == 0.4334
    assert sum(r["knowledge_base"] for r in comparison.values()) == pytest.approx(1.0)


def test_over_time_groups_dated_incidents_by_month(taxonomy, incidents):
    rows = incident_rows(incidents, taxonomy)
    trend = over_time(rows, "dimension", "month")
    assert trend == [{"period": "2024-01", "dimension": "hardware", "incidents": 2},
                     {"period": "2024-02", "dimension": "platform", "incidents": 1},
                     {"period": "2024-02", "dimension": "user", "incidents": 1}]
    assert [r["period"] for r in over_time(rows, "symptom", "year")] == ["2024", "2024"]
    assert summary(rows) == {"incidents": 5, "labelled": 4, "confirmed": 1, "machine_suggested": 1,
                             "dated": 4}
    assert [r["id"] for r in rows] == ["d", "c", "b", "a", "e"]  # newest first, undated last


def test_filter_by_labels_provenance_and_text(taxonomy, incidents):
    def ids(**kw):
        return [r["id"] for r in filter_incidents(incidents, taxonomy, IncidentFilter(**kw))]

    assert ids() == ["d", "c", "b", "a", "e"]
    assert ids(dimensions=["hardware"]) == ["b", "a"]
    assert ids(symptoms=["job_hang"]) == ["c"]
    assert ids(root_causes=["unlabelled"]) == ["e"]
    assert ids(provenances=["confirmed", "machine_suggested"]) == ["d", "e"]
    assert ids(text="XID gpu-h100-0417") == ["a"]  # every word, any case, in the description too
    assert ids(text="projection", dimensions=["hardware"]) == []


def test_the_bundled_knowledge_base_adds_up(shared_bundled_kb):
    kb = shared_bundled_kb
    rows = incident_rows(kb.store.incidents(), kb.taxonomy)
    stats = kb.stats()
    assert len(rows) == stats["incidents"] > 200
    assert {r["dimension"]: r["incidents"] for r in distribution(rows, "dimension")} == stats["dimension"]
    comparison = dimension_comparison(rows, kb.taxonomy)
    assert [r["published"] for r in comparison] == [0.2833, 0.2833, 0.4334]
    assert sum(r["incidents"] for r in over_time(rows)) == summary(rows)["dated"]


def test_automation_counts_this_clusters_labelled_incidents_only(taxonomy):
    from kb.jobs.dashboard import automation

    def incident(n, cause, mitigation, text, source="ops"):
        return Incident(id=f"i-{n}", title=text, description=text, root_cause=cause, mitigation=mitigation,
                        source=source, provenance=Provenance.human_labelled)

    incidents = [incident(1, "gpu_lost", "node_repair", "Xid 79 on node gpu-a17"),
                 incident(2, "gpu_lost", "job_resubmission", "Xid 79 again on node gpu-a17"),
                 incident(3, "gpu_memory_error", "user_code_improvement", "ECC error on host gpu-b02"),
                 incident(4, "buggy_code", "user_code_improvement", "NaN loss on node gpu-c03"),
                 incident(5, "gpu_lost", "node_repair", "Xid 79 on node gpu-z99", source="pmkb-bundled")]
    figures = automation(incidents, taxonomy, 20)
    assert (figures["total"], figures["plans"], figures["right"]) == (4, 3, 2)
    assert figures["repeat_offenders"] == [("gpu-a17", 2)] and figures["minutes_saved"] == 40
