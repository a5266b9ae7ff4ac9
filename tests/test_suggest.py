"""The engine's suggestions: labels from the taxonomy, evidence, abstention, mitigations."""

import pytest

from kb.core.abstain import LOW_CONFIDENCE, TOO_LITTLE_TEXT
from kb.core.incidents import Incident
from kb.core.suggestion import EmptyTicket, Ticket
from kb.engine.suggest import SuggestionEngine


@pytest.fixture(scope="module")
def engine(shared_bundled_kb):
    return SuggestionEngine(shared_bundled_kb)


def test_fallen_off_the_bus_ticket(engine):
    s = engine.suggest(Ticket(id="t1", title="training died on gpu-b07",
                              description="dmesg: NVRM: Xid (PCI:0000:3b:00): 79, pid=4411, GPU has fallen off "
                                          "the bus. nvidia-smi now shows 7 GPUs."))
    assert s.root_cause == "gpu_lost" and s.root_cause_dimension == "hardware"
    assert any(e.signal.startswith("xid_79") or "bus" in e.signal for e in s.evidence)
    assert s.suspect and s.suspect["node"] == "gpu-b07"
    assert s.retry_safe and "node_repair" in [m.id for m in s.mitigations[:2]]


def test_oom_killed_ticket_is_user_configuration(engine):
    s = engine.suggest(Ticket(title="pod keeps dying", description="kubectl describe: Last State: Terminated, "
                              "Reason: OOMKilled, Exit Code: 137. The container memory limit is 8Gi."))
    assert s.root_cause == "improper_configuration" and s.root_cause_dimension == "user"
    assert not s.retry_safe


def test_probabilities_are_ranked_and_labels_valid(engine):
    s = engine.suggest(Ticket(title="NCCL timeout", description="Watchdog caught collective operation "
                              "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 1800000 milliseconds"))
    tax = engine.kb.taxonomy
    probs = [c.confidence for c in s.root_cause_candidates]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    assert all(c.id in tax.cause_ids for c in s.root_cause_candidates)
    assert s.symptom in tax.symptom_ids and s.mitigation in tax.mitigation_ids
    assert s.root_cause_confidence == probs[0] and len(s.similar_incidents) == 5
    assert {h.id for h in s.similar_incidents} <= {i.id for i in engine.retriever.incidents()}


def test_abstains_under_the_threshold(shared_bundled_kb):
    strict = shared_bundled_kb.settings.model_copy(update={"abstain_threshold": 0.999})
    from kb.engine.knowledge import KnowledgeBase

    kb = KnowledgeBase(strict, embedder=shared_bundled_kb.embedder)
    s = SuggestionEngine(kb).suggest(Ticket(title="training on gpu-3 behaves strangely",
                                            description="loss spikes every few hundred steps since Monday"))
    assert s.abstained and not s.retry_safe and "Not sure" in s.explanation
    assert s.abstain_reason == LOW_CONFIDENCE


@pytest.mark.parametrize("title,description", [
    ("Job failed", ""), ("Something is off", "Not sure what happened, please take a look."),
    ("it broke again", "same as last week")])
def test_a_ticket_that_says_too_little_is_never_labelled(engine, title, description):
    s = engine.suggest(Ticket(title=title, description=description))
    assert s.abstained and s.abstain_reason == TOO_LITTLE_TEXT and not s.retry_safe
    assert "says too little" in s.explanation and "error message" in s.explanation


def test_a_short_ticket_with_a_log_signature_is_not_too_vague(engine):
    s = engine.suggest(Ticket(title="Xid 79 on gpu-b07"))
    assert s.evidence and s.abstain_reason != TOO_LITTLE_TEXT and s.root_cause == "gpu_lost"
    full = engine.suggest(Ticket(title="pod OOMKilled", description="kubectl describe shows Reason: OOMKilled, "
                                 "Exit Code: 137; the container limit is 8Gi and the loader holds the dataset"))
    assert full.abstain_reason in (None, LOW_CONFIDENCE) and full.abstained == (full.abstain_reason is not None)


def test_labels_of_the_input_are_never_read(engine):
    base = dict(id="x", title="ImagePullBackOff", description="Failed to pull image: pull access denied")
    plain = engine.suggest(Incident(**base))
    lying = engine.suggest(Incident(**base, root_cause="gpu_lost", symptom="data_loss", mitigation="node_repair"))
    assert plain.root_cause == lying.root_cause and plain.root_cause_confidence == lying.root_cause_confidence


def test_slowdown_ticket_gets_low_utilisation_hints(engine):
    s = engine.suggest(Ticket(title="training is slow, GPU utilization 15%",
                              description="nvidia-smi shows GPU util 10-20% all the time; DataLoader num_workers=0"))
    assert s.low_gpu_utilisation
    assert {h.id for h in s.low_gpu_utilisation} <= {c.id for c in engine.low_util.categories}


def test_empty_ticket_is_refused(engine):
    with pytest.raises(EmptyTicket, match="no title, description or log"):
        engine.suggest(Ticket(id="empty", title="  ", description="\n"))


def test_huge_ticket_still_finds_evidence_at_the_end(engine):
    log = "step ok\n" * 200_000 + "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE (double bit error) detected"
    s = engine.suggest(Ticket(title="job crashed", description="see log", log=log))
    assert any("gpu_memory_error" in e.causes for e in s.evidence)


def test_secrets_in_the_ticket_do_not_reach_the_output(engine):
    s = engine.suggest(Ticket(title="401 from registry", description="docker login -p Sup3rSecret! failed for "
                              "bob@example.com: unauthorized: authentication required"))
    dumped = s.model_dump_json()
    assert "Sup3rSecret!" not in dumped and "bob@example.com" not in dumped


def _small_kb(kb, count: int = 40):
    kb.add_incidents(kb.bundled_incidents()[:count])
    return kb


def test_trained_text_classifiers_are_cached_and_reused(empty_kb, monkeypatch):
    kb = _small_kb(empty_kb)
    ticket = Ticket(title="pods pending", description="0/4 nodes are available: 4 Insufficient nvidia.com/gpu")
    first = SuggestionEngine(kb)
    before = first.suggest(ticket)
    assert first.classifier_cache_path.exists()

    from kb.engine.textclf import TextClassifier

    def no_fit(*args, **kwargs):
        raise AssertionError("the cached classifiers should have been used")

    monkeypatch.setattr(TextClassifier, "fit", no_fit)
    after = SuggestionEngine(kb).suggest(ticket)
    assert [(c.id, c.confidence) for c in after.root_cause_candidates] == \
        [(c.id, c.confidence) for c in before.root_cause_candidates]


def test_changed_incidents_or_a_damaged_cache_refit(empty_kb, caplog):
    kb = _small_kb(empty_kb)
    engine = SuggestionEngine(kb)
    ticket = Ticket(title="job killed", description="slurmstepd: error: Detected 1 oom_kill event")
    engine.suggest(ticket)
    path = engine.classifier_cache_path
    stamp = path.stat().st_mtime_ns

    edited = kb.bundled_incidents()[0].model_copy(update={"description": "rewritten after review"})
    kb.add_incidents([edited])  # same id, same count, new content: the running engine sees it
    engine.suggest(ticket)
    assert path.stat().st_mtime_ns != stamp
    loaded = {i.id: i for i in engine.retriever.incidents()}
    assert loaded[edited.id].description == "rewritten after review"

    path.write_bytes(b"not a pickle")
    with caplog.at_level("WARNING"):
        again = SuggestionEngine(kb).suggest(ticket)
    assert "text-classifier cache" in caplog.text and again.root_cause in kb.taxonomy.cause_ids


def test_the_explanation_says_what_symptom_only_evidence_points_to(engine):
    s = engine.suggest(Ticket(title="DDP training hangs after epoch 3",
                              description="No output for 40 minutes while all eight GPUs sit at 100% utilisation."))
    assert "phrase_job_hangs -> symptom job_hang" in s.explanation and "-> None" not in s.explanation
