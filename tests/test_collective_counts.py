"""Collective-timeout crashes per month and by job size (kb/jobs/collective_counts.py), in the
backfill report and on the dashboard."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from kb.core.incidents import Incident, Provenance
from kb.core.settings import Settings
from kb.core.taxonomy import load_taxonomy
from kb.jobs.collective_counts import collective_figures, incident_item, is_collective_timeout, job_gpus, size_bucket


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy(Settings.model_fields["taxonomy"].default)


@pytest.mark.parametrize("text, gpus", [
    ("pretrain on 8 nodes x 8 GPUs died", 64), ("world_size=256 crashed at step 9k", 256),
    ("torchrun --nproc_per_node=8 --nnodes=4 train.py", 32), ("8 GPUs per node on 16 nodes", 128),
    ("fine-tune on 64 GPUs", 64), ("2x H100 box", 2), ("GPU 3 fell off the bus on gpu-a12", None),
    ("job 4411 on node gpu-b07", None)])
def test_the_job_size_is_the_gpu_count_the_ticket_states(text, gpus):
    assert job_gpus(text) == gpus


@pytest.mark.parametrize("text, timeout", [
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE", True),
    ("NCCL timeout after 30 minutes on the 64-node run", True), ("allreduce timed out after 1800 s", True),
    ("the job timed out in the queue", False), ("CUDA out of memory at step 12", False)])
def test_a_collective_timeout_is_told_from_other_timeouts(text, timeout):
    assert is_collective_timeout(text) is timeout


def test_figures_count_timeouts_among_crashes_per_month_and_size():
    items = [incident_item("NCCL timeout, world_size=512", "job_crash", "2025-03-02T00:00:00Z"),
             incident_item("NCCL watchdog timeout on 16 GPUs", "job_hang", "2025-03-09T00:00:00Z"),
             incident_item("CUDA OOM on 16 GPUs", "job_crash", "2025-03-20T00:00:00Z"),
             incident_item("segfault", "job_crash", datetime(2025, 4, 1, tzinfo=timezone.utc)),
             incident_item("NCCL timeout while the job was slow", "job_slowdown", None),
             incident_item("job pending", "job_submission_failure", None)]
    f = collective_figures(items)
    assert (f.crashes, f.timeouts) == (4, 2) and f.share == 0.5
    data = f.as_dict()
    assert [(r["key"], r["crashes"], r["timeouts"]) for r in data["by_month"]] == [("2025-03", 3, 2),
                                                                                  ("2025-04", 1, 0)]
    assert [(r["key"], r["crashes"], r["timeouts"]) for r in data["by_size"]] == [
        ("9-64 GPUs", 2, 1), ("65-512 GPUs", 1, 1), ("not stated", 1, 0)]
    assert size_bucket(8) == "1-8 GPUs" and size_bucket(513) == "513+ GPUs"


def test_the_backfill_report_has_the_section(taxonomy, tmp_path):
    from kb.jobs.report import read_records, write_report

    base = {"symptom_confidence": 0.9, "root_cause_dimension": "hardware", "root_cause_confidence": 0.9,
            "abstained": False, "retry_safe": True, "similar_incidents": [], "root_cause": "infiniband_failure"}
    records = [dict(base, id=f"t-{n}", symptom="job_crash", collective_timeout=n < 2, job_gpus=gpus,
                    month="2025-0" + str(1 + n % 2)) for n, gpus in enumerate((256, 512, 8, None))]
    out = tmp_path / "run.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report(read_records(out), taxonomy, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "## Collective timeouts" in text and "Collective timeouts: 2 of 4 crashes (50.0%)." in text
    assert "| 65-512 GPUs | 2 | 2 | 100.0% |" in text and "| 2025-01 | 2 | 1 | 50.0% |" in text


def test_the_dashboard_counts_this_clusters_crashes_only():
    from kb.jobs.dashboard import collective_timeouts

    def incident(n, text, symptom="job_crash", source="ops"):
        return Incident(id=f"i-{n}", title=text, description="", symptom=symptom, root_cause="infiniband_failure",
                        source=source, provenance=Provenance.human_labelled,
                        created_at=datetime(2025, 5, n, tzinfo=timezone.utc))

    figures = collective_timeouts([incident(1, "NCCL timeout on 8 nodes x 8 GPUs"),
                                   incident(2, "Xid 79 on gpu-a17"),
                                   incident(3, "NCCL timeout on 64 GPUs", source="pmkb-bundled")])
    assert (figures["crashes"], figures["timeouts"]) == (2, 1)
    assert figures["by_size"][0] == {"key": "9-64 GPUs", "crashes": 1, "timeouts": 1, "share": 1.0}
