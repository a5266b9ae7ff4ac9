"""The backfill report: figures on records whose distribution is known, Markdown and PNG plots."""

from __future__ import annotations

import json

import pytest

from kb.core.settings import Settings
from kb.core.taxonomy import load_taxonomy
from kb.jobs.report import CLUSTER_MIN_SCORE, read_records, summarise, write_report


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy(Settings().taxonomy)


def record(n: int, cause: str, dimension: str, symptom: str = "job_crash", abstained: bool = False,
           retry_safe: bool = False, similar: tuple[str, float] | None = None, confidence: float = 0.8) -> dict:
    """An annotation record with only the fields the report reads filled in realistically."""
    hits = [{"id": similar[0], "title": f"past incident {similar[0]}", "score": similar[1],
             "root_cause": cause}] if similar else []
    return {"id": f"t-{n}", "symptom": symptom, "symptom_confidence": 0.7, "root_cause": cause,
            "root_cause_dimension": dimension, "root_cause_confidence": confidence,
            "root_cause_candidates": [], "mitigation": "node_repair", "mitigations": [],
            "similar_incidents": hits, "evidence": [], "abstained": abstained, "retry_safe": retry_safe,
            "suspect": None, "low_gpu_utilisation": [], "explanation": "", "trace": {}}


@pytest.fixture
def records() -> list[dict]:
    """10 tickets: 5 hardware (4 retry-safe), 3 platform, 2 user; 2 abstained; clusters A(4), B(2)."""
    return [
        record(0, "gpu_lost", "hardware", retry_safe=True, similar=("A", 0.9)),
        record(1, "gpu_lost", "hardware", retry_safe=True, similar=("A", 0.85)),
        record(2, "gpu_lost", "hardware", retry_safe=True, similar=("A", 0.8)),
        record(3, "infiniband_failure", "hardware", symptom="job_hang", retry_safe=True, similar=("A", 0.7)),
        record(4, "gpu_memory_error", "hardware", abstained=True, confidence=0.3, similar=("C", 0.9)),
        record(5, "service_outage", "platform", symptom="cluster_unavailability", similar=("B", 0.75)),
        record(6, "service_outage", "platform", symptom="cluster_unavailability", similar=("B", 0.95)),
        record(7, "system_defect", "platform", similar=("D", CLUSTER_MIN_SCORE - 0.01)),
        record(8, "buggy_code", "user", abstained=True, confidence=0.2),
        record(9, "improper_configuration", "user", symptom="job_slowdown", similar=("E", 0.65)),
    ]


def test_figures_of_a_known_distribution(records, taxonomy):
    f = summarise(records, taxonomy)
    assert (f.total, f.abstained, f.retry_safe, f.without_precedent) == (10, 2, 4, 2)
    assert dict(f.dimensions) == {"hardware": 5, "platform": 3, "user": 2}
    assert dict(f.confident_dimensions) == {"hardware": 4, "platform": 3, "user": 1}
    assert f.causes["gpu_lost"] == 3 and f.symptoms["cluster_unavailability"] == 2
    assert f.published == pytest.approx({"hardware": 0.2833, "platform": 0.2833, "user": 0.4334})
    assert "Gao et al." in f.published_source
    assert [(c.anchor, c.size, c.cause) for c in f.clusters] == [("A", 4, "gpu_lost"), ("B", 2, "service_outage")]
    assert f.clusters[0].cause_share == pytest.approx(0.75) and f.clusters[0].examples == ["t-0", "t-1", "t-2"]
    assert sum(f.confidence_bins) == 10 and f.confidence_bins[4] == 1  # 0.2 falls in [0.20, 0.25)


def test_markdown_and_plots(records, taxonomy, tmp_path):
    out = tmp_path / "run.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    path = tmp_path / "run.report.md"
    figures = write_report(read_records(out), taxonomy, path, run={"annotated": 10, "failed": 0})
    text = path.read_text()
    assert figures.total == 10 and "from 10 annotated tickets" in text
    assert "| hardware | 5 | 50.0% | 4 | 50.0% | 28.3% | +21.7 pt |" in text
    assert "| user | 2 | 20.0% | 1 | 12.5% | 43.3% | -23.3 pt |" in text
    assert "| abstained (not sure: no label applied) | 2 | 20.0% |" in text
    assert "retry-safe" in text and "| 4 | 40.0% |" in text
    assert "| 1 | 4 | A: past incident A | gpu_lost (75.0%) | t-0, t-1, t-2 |" in text
    assert "This run: annotated 10, failed 0." in text
    for name in ("dimensions", "symptoms", "root_causes", "confidence"):
        png = tmp_path / f"run.report-{name}.png"
        assert f"]({png.name})" in text
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_an_empty_output_gives_a_report_without_plots(taxonomy, tmp_path):
    path = tmp_path / "empty.report.md"
    figures = write_report([], taxonomy, path)
    assert figures.total == 0 and "from 0 annotated tickets" in path.read_text()
    assert not list(tmp_path.glob("*.png"))


def test_what_automating_remediation_would_save(records, taxonomy, tmp_path):
    """Plans: retry-safe, not abstained, a node named. t-0..t-2 name nodes (gpu-a1 twice), t-3 names
    one but its incident was mitigated by a code fix; t-4 abstained; t-9 is not retry-safe."""
    nodes = {0: "gpu-a1", 1: "gpu-a1", 2: "gpu-b2", 3: "gpu-c3", 4: "gpu-d4", 9: "gpu-e5"}
    labels = {0: "node_repair", 1: "job_resubmission", 3: "user_code_improvement", 9: "node_repair"}
    for n, node in nodes.items():
        records[n]["suspect"] = {"node": node}
    for n, mitigation in labels.items():
        records[n]["labelled_mitigation"] = mitigation
    f = summarise(records, taxonomy, handling_minutes=45).automation
    assert (f.total, f.plans, f.labelled, f.right) == (10, 4, 3, 2)
    assert f.precision == pytest.approx(2 / 3) and f.repeat_offenders == [("gpu-a1", 2)]
    assert len(f.nodes) == 3 and f.minutes_saved == 90
    out = tmp_path / "run.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    text = write_report(read_records(out), taxonomy, tmp_path / "r.md", handling_minutes=45) and (
        tmp_path / "r.md").read_text()
    assert "## What automating remediation would save" in text
    assert "| with a remediation plan | 4 (40.0%) |" in text
    assert "| plan precision (resolved by resubmission or node repair) | 66.7% (2 of 3 labelled) |" in text
    assert "| repeat offenders (nodes in 2+ plans) | gpu-a1 (2) |" in text
    assert "| on-call time saved at 45 min per incident | 1.5 h (2 right plans x 45 min) |" in text
    for r in records:
        r.pop("labelled_mitigation", None)
    unlabelled = summarise(records, taxonomy, handling_minutes=45).automation
    assert unlabelled.precision is None and unlabelled.minutes_saved == 4 * 45  # an upper bound, said so
