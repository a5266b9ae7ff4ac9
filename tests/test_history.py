"""Node history: earlier incidents of this cluster that name the suspect node."""

from datetime import datetime, timezone

from kb.core.incidents import Incident
from kb.core.suggestion import Ticket
from kb.engine.history import BUNDLED_SOURCE, node_history, node_index
from kb.engine.suggest import SuggestionEngine
from kb.jobs.annotate import annotation_record
from pmkb.cli import render_card

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."


def incident(id_, text, day=None, source="tracker", resolution="", **kw):
    """An incident of this cluster (or of the bundled seed with ``source=BUNDLED_SOURCE``)."""
    when = datetime(2026, 3, day, tzinfo=timezone.utc) if day else None
    return Incident(id=id_, title=text, description=text, resolution=resolution, source=source,
                    created_at=when, root_cause="gpu_lost", symptom="job_crash", mitigation="node_repair", **kw)


def test_history_lists_the_incidents_naming_the_node_newest_first():
    index = node_index([
        incident("t-1", "Xid 79 on node gpu-z42", day=3),
        incident("t-2", "job hung", day=9, resolution="gpu-z42 had a loose riser card; reseated"),
        incident("t-3", "Xid 79 on node gpu-z43", day=10),
        incident("t-4", "node GPU-Z42 rebooted by itself"),
        incident("seed-1", "Xid 79 on node gpu-z42", day=20, source=BUNDLED_SOURCE),
        incident("seed-2", "Xid 79 on node gpu-z42", day=21, source="https://github.com/org/cluster/issues/7",
                 tags=["xid", BUNDLED_SOURCE]),
    ])
    history = node_history(index, "gpu-z42")
    assert history.total == 3  # seed reports of other clusters (written or public) and the other node do not count
    assert [i.id for i in history.incidents] == ["t-2", "t-1", "t-4"]  # newest first, undated last
    assert "gpu-z42 appears in 3 earlier incidents: t-2 (gpu_lost, 2026-03-09)" in history.summary()
    assert node_history(index, "gpu-z42", exclude={"t-1", "t-2", "t-4"}) is None
    assert node_history(index, "gpu-z99") is None


def test_a_node_name_inside_another_is_not_a_match():
    index = node_index([incident("t-1", "Xid 79 on node gpu-z421")])
    assert node_history(index, "gpu-z42") is None


def test_the_suggestion_cites_the_node_history_and_follows_new_incidents(empty_kb):
    kb = empty_kb
    kb.add_incidents(kb.bundled_incidents()[:30] + [
        incident("t-1", f"Job died on node gpu-z42: {XID_79}", day=3),
        incident("t-2", "Training stalled on gpu-z42, NCCL watchdog after 30 min", day=9),
    ])
    engine = SuggestionEngine(kb)
    ticket = Ticket(id="t-new", title="Xid 79 again", description=f"on node gpu-z42: {XID_79}")
    s = engine.suggest(ticket)
    assert s.suspect["node"] == "gpu-z42"
    assert s.node_history.total == 2 and [i.id for i in s.node_history.incidents] == ["t-2", "t-1"]
    assert "gpu-z42 appears in 2 earlier incidents" in s.explanation
    assert "seen before: gpu-z42 appears in 2 earlier incidents: t-2 (gpu_lost, 2026-03-09)" in render_card(s)
    record = annotation_record(s)
    assert record["node_history"]["total"] == 2 and record["node_history"]["incidents"][0]["id"] == "t-2"

    kb.add_incidents([incident("t-3", "gpu-z42 drained by the health check", day=12)])
    again = engine.suggest(ticket)
    assert again.node_history.total == 3 and again.node_history.incidents[0].id == "t-3"
    own = engine.suggest(Ticket(id="t-3", title="Xid 79", description=f"node gpu-z42 {XID_79}"))
    assert own.node_history.total == 2  # a ticket is not its own history

    quiet = engine.suggest(Ticket(id="t-9", title="Xid 79", description=f"node gpu-y07 {XID_79}"))
    assert quiet.suspect["node"] == "gpu-y07" and quiet.node_history is None
