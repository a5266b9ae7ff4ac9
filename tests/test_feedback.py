"""Feedback: a ticket becomes a confirmed incident with an audit record, and search finds it."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from conftest import make_settings

from kb.core.suggestion import Suggestion, Ticket
from kb.engine.classify import Calibration
from kb.engine.search import Retriever
from kb.engine.suggest import SuggestionEngine
from kb.jobs.feedback import (
    AUDIT_FILE,
    FeedbackError,
    LabelSet,
    audit_lines,
    audit_path,
    incident_id_for,
    read_audit,
    save_feedback,
    ticket_incident,
)

TICKET = Ticket(
    id="OPS-7731",
    title="Pretraining job on gpu-zz-0991 died, rank 17 hit an uncorrectable ECC error",
    description="Job 99120 (16 nodes) exited after 7h. Rank 17 on gpu-zz-0991 raised "
                "RuntimeError: CUDA error: uncorrectable ECC error encountered. Contact ops@example.com.",
    log="NVRM: Xid (PCI:0000:3b:00): 94, pid=4411, name=python, Contained: CE User Channel",
)


@pytest.fixture(scope="module")
def suggestion(shared_bundled_kb) -> Suggestion:
    """The engine's suggestion for the ticket (default weights: no fitting), computed once."""
    return SuggestionEngine(shared_bundled_kb, calibration=Calibration()).suggest(TICKET)


def test_accepting_stores_a_confirmed_incident_and_an_audit_record(bundled_kb, suggestion):
    kb = bundled_kb
    before = kb.store.count()
    at = datetime(2025, 3, 4, 2, 17, tzinfo=timezone.utc)
    labels = LabelSet(symptom=suggestion.symptom, root_cause=suggestion.root_cause,
                      mitigation=suggestion.mitigation)

    record = save_feedback(kb, TICKET, suggestion, labels, reviewer="  Ada Lovelace ", at=at)

    assert record.action == "accepted" and record.changed == []
    assert record.reviewer == "Ada Lovelace" and record.previous is None
    assert kb.store.count() == before + 1
    stored = kb.store.get_incident("OPS-7731")
    assert stored.provenance.value == "confirmed"
    assert (stored.symptom, stored.root_cause, stored.mitigation) == (
        suggestion.symptom, suggestion.root_cause, suggestion.mitigation)
    assert "Xid (PCI:0000:3b:00): 94" in stored.description  # the log excerpt is kept
    assert "ops@example.com" not in stored.description  # redacted on the way in
    assert stored.created_at == at
    lines = (kb.settings.home / AUDIT_FILE).read_text().splitlines()
    assert len(lines) == 1
    raw = json.loads(lines[0])
    assert raw["reviewer"] == "Ada Lovelace" and raw["ticket_id"] == "OPS-7731"
    assert raw["at"].startswith("2025-03-04T02:17")
    assert raw["new"]["root_cause"] == suggestion.root_cause
    assert raw["suggestion"]["trace"]["engine"].startswith("pmkb-engine/")


def test_correction_records_old_and_new_labels_and_search_finds_it_at_once(bundled_kb, suggestion):
    kb = bundled_kb
    retriever = Retriever(kb)
    retriever.retrieve_similar("warm the lexical index", k=1)  # loaded before the save
    labels = LabelSet(symptom="job_crash", root_cause="gpu_lost", mitigation="job_resubmission")
    assert suggestion.root_cause != "gpu_lost"

    record = save_feedback(kb, TICKET, suggestion, labels)

    assert record.action == "corrected" and "root_cause" in record.changed
    assert record.suggested.root_cause == suggestion.root_cause and record.new.root_cause == "gpu_lost"
    assert record.reviewer == "anonymous"
    hits = retriever.retrieve_similar(TICKET.text(), k=3)
    assert hits[0].id == "OPS-7731"
    assert (hits[0].root_cause, hits[0].provenance) == ("gpu_lost", "confirmed")
    assert audit_lines(kb.settings)[0].endswith(
        f"anonymous corrected OPS-7731 (root_cause: {suggestion.root_cause} -> gpu_lost"
        + (f", mitigation: {suggestion.mitigation} -> job_resubmission)"
           if suggestion.mitigation != "job_resubmission" else ")"))


def test_saving_again_records_the_labels_it_replaced(bundled_kb, suggestion):
    kb = bundled_kb
    first = LabelSet(symptom="job_crash", root_cause="gpu_memory_error", mitigation="node_repair")
    second = LabelSet(symptom="job_crash", root_cause="gpu_lost", mitigation="node_repair")
    save_feedback(kb, TICKET, suggestion, first, reviewer="ada")
    count = kb.store.count()
    record = save_feedback(kb, TICKET, suggestion, second, reviewer="grace")

    assert kb.store.count() == count  # replaced, not duplicated
    assert record.previous == first and record.new == second
    assert [r.reviewer for r in read_audit(kb.settings)] == ["ada", "grace"]
    retriever = Retriever(kb)
    assert retriever.retrieve_similar(TICKET.text(), k=1)[0].root_cause == "gpu_lost"


def test_labels_outside_the_taxonomy_are_refused_and_nothing_is_written(bundled_kb, suggestion):
    kb = bundled_kb
    count = kb.store.count()
    with pytest.raises(FeedbackError, match="unknown root_cause 'cosmic_rays'"):
        save_feedback(kb, TICKET, suggestion, LabelSet(symptom="job_crash", root_cause="cosmic_rays"))
    with pytest.raises(FeedbackError, match="choose a root cause"):
        save_feedback(kb, TICKET, suggestion, LabelSet(symptom="job_crash"))
    assert kb.store.count() == count
    assert not audit_path(kb.settings).exists()
    assert read_audit(kb.settings) == []


def test_a_ticket_without_an_id_gets_a_stable_one_from_its_text():
    ticket = Ticket(title="NCCL timeout", description="allreduce hung on node gpu-a001")
    same = Ticket(title="NCCL timeout", description="allreduce hung on node gpu-a001")
    other = Ticket(title="NCCL timeout", description="allreduce hung on node gpu-a002")
    assert incident_id_for(ticket) == incident_id_for(same) != incident_id_for(other)
    assert incident_id_for(ticket).startswith("ticket-")
    assert incident_id_for(Ticket(id=" OPS-1 ", title="x")) == "OPS-1"
    incident = ticket_incident(Ticket(description="first line\nsecond"), LabelSet(root_cause="gpu_lost"))
    assert incident.title == "first line" and incident.source == "pmkb-feedback"


def test_a_damaged_audit_log_is_reported_with_its_line(tmp_path):
    settings = make_settings(tmp_path / "kb")
    path = audit_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json}\n")
    with pytest.raises(FeedbackError, match=r"line 1: not a feedback record"):
        read_audit(settings)


def test_the_audit_log_is_private_whatever_the_umask(tmp_path):
    import os

    from kb.core.settings import Settings
    from kb.jobs.feedback import FeedbackRecord, append_audit

    record = FeedbackRecord(at=datetime(2025, 1, 1, tzinfo=timezone.utc), reviewer="a", ticket_id="t", incident_id="t",
                            action="accepted", suggested=LabelSet(root_cause="gpu_lost"),
                            new=LabelSet(root_cause="gpu_lost"))
    previous = os.umask(0o022)
    try:
        path = append_audit(Settings(home=tmp_path), record)
    finally:
        os.umask(previous)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
