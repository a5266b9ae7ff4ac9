"""A close call: what the ticket's own readings say to it, weighed by the knowledge base, and the
engineer's answer (kb/engine/settle.py); the close-calls file's ``settled_by`` checked when it is loaded."""

from __future__ import annotations

import pytest
import yaml

from kb.core.close_calls import CloseCallsError, load_close_calls
from kb.core.incidents import Incident
from kb.core.readings import Reading, ReadingLabel
from kb.core.settings import DATA_DIR
from kb.core.suggestion import CloseCallQuestion
from kb.core.taxonomy import load_taxonomy
from kb.engine.settle import ENGINEER_RATIO, answer_odds, settle_by_engineer, ticket_hint

TAXONOMY = load_taxonomy(DATA_DIR / "taxonomy.yaml")
PAIR = ["improper_permission", "platform_misconfiguration"]
ENTRY = {"causes": PAIR, "question": "Refused to everyone, or only to this user?",
         "answers": {"improper_permission": "Only this user.", "platform_misconfiguration": "Everyone."},
         "settled_by": {"platform_misconfiguration": ["scope:many_users", "scope:one_team"],
                        "improper_permission": ["scope:one_user"]}}


def _close_calls(tmp_path, entries):
    path = tmp_path / "close_calls.yaml"
    path.write_text(yaml.safe_dump(entries))
    return load_close_calls(path, TAXONOMY)


def _knowledge(counts: dict[tuple[str, str], int]):
    """Incidents of each (cause, scope) in the given numbers, with their labelled readings."""
    incidents, labels = [], {}
    for (cause, scope), n in counts.items():
        for k in range(n):
            incident = Incident(id=f"{cause}-{scope}-{k}", title="x", root_cause=cause)
            incidents.append(incident)
            labels[incident.id] = ReadingLabel(id=incident.id, scope=scope, change="unknown")
    return incidents, labels


def _reading(value: str, confidence: float = 0.9) -> Reading:
    return Reading(kind="scope", id=value, name=value, confidence=confidence, span="other users see the same")


QUESTION = CloseCallQuestion(causes=PAIR, question="?", answers={c: "a" for c in PAIR})


def test_odds_are_how_much_more_often_a_reading_goes_with_one_cause(tmp_path):
    calls = _close_calls(tmp_path, [ENTRY])
    incidents, labels = _knowledge({("platform_misconfiguration", "many_users"): 9,
                                    ("platform_misconfiguration", "one_user"): 1,
                                    ("improper_permission", "many_users"): 1,
                                    ("improper_permission", "one_user"): 9})
    odds = answer_odds(calls, incidents, labels)
    many = odds[(frozenset(PAIR), "platform_misconfiguration")]["scope:many_users"]
    assert many == pytest.approx((9.5 / 11) / (1.5 / 11))
    assert odds[(frozenset(PAIR), "improper_permission")]["scope:one_user"] == pytest.approx(many)
    assert odds[(frozenset(PAIR), "platform_misconfiguration")]["scope:one_team"] == pytest.approx(1.0)


ODDS = {(frozenset(PAIR), "platform_misconfiguration"): {"scope:many_users": 20.0, "scope:one_team": 1.2},
        (frozenset(PAIR), "improper_permission"): {"scope:one_user": 6.0}}


def test_a_sure_reading_the_knowledge_base_bears_out_points_to_its_cause_and_leaves_the_question_open(tmp_path):
    calls = _close_calls(tmp_path, [ENTRY])
    hinted = ticket_hint(QUESTION, calls, [_reading("many_users")], ODDS)
    assert hinted.ticket_points_to == "platform_misconfiguration" and hinted.ticket_says.id == "many_users"
    assert hinted.answered is None and hinted.causes == QUESTION.causes
    assert ticket_hint(QUESTION, calls, [_reading("one_user")], ODDS).ticket_points_to == "improper_permission"


@pytest.mark.parametrize("readings", [
    [_reading("many_users", confidence=0.4)],  # not sure enough
    [_reading("one_team")],  # the knowledge base does not bear this reading out
    [_reading("one_job")],  # not an answer to this question
    [_reading("many_users"), _reading("one_user", 0.95)],  # points to both causes: no answer
])
def test_no_hint_without_one_sure_reading_the_knowledge_base_bears_out(tmp_path, readings):
    assert ticket_hint(QUESTION, _close_calls(tmp_path, [ENTRY]), readings, ODDS) is None


def test_the_engineers_answer_moves_the_ranking_and_keeps_the_pairs_share():
    causes = [("improper_permission", 0.6), ("platform_misconfiguration", 0.3), ("service_outage", 0.1)]
    ranked, answered = settle_by_engineer(causes, QUESTION, "platform_misconfiguration")
    p = dict(ranked)
    assert answered.answered == "platform_misconfiguration" and ranked[0][0] == "platform_misconfiguration"
    assert p["platform_misconfiguration"] / p["improper_permission"] == pytest.approx(0.5 * ENGINEER_RATIO)
    assert p["service_outage"] == 0.1 and sum(p.values()) == pytest.approx(1.0)
    assert settle_by_engineer(causes, QUESTION, "service_outage") == (causes, None)


def test_what_the_ticket_says_to_its_close_call_is_shown_and_never_moves_the_ranking(shared_bundled_kb):
    """The readings already count in the cause model; the hint quotes the words and leaves the
    question, the ranking and the owner as they were."""
    from kb.core.suggestion import Ticket
    from kb.engine.suggest import SuggestionEngine

    ticket = Ticket(title="Permission denied on /shared/datasets since this morning",
                    description="PermissionError: [Errno 13] Permission denied: '/shared/datasets/imagenet/train' "
                                "when my job starts. Users in three other teams report the same error. It worked "
                                "yesterday and nobody changed their jobs.")
    engine = SuggestionEngine(shared_bundled_kb)
    hinted = engine.suggest(ticket)
    engine.hint_close_calls = False
    plain = engine.suggest(ticket)
    question = hinted.close_call
    assert question is not None and question.answered is None and plain.close_call.ticket_points_to is None
    assert question.ticket_points_to in question.causes and question.ticket_says.span in ticket.text()
    assert question.ticket_says.kind == "scope" and question.ticket_says.id == "many_users"
    assert hinted.root_cause_candidates == plain.root_cause_candidates and hinted.owner == plain.owner


@pytest.mark.parametrize(("settled_by", "message"), [
    ({"service_outage": ["scope:many_users"]}, "settled_by may name only"),
    ({"improper_permission": ["scope:one_user"], "platform_misconfiguration": ["scope:one_user"]}, "for both causes"),
    ({"improper_permission": ["one_user"]}, "settled_by"),
])
def test_a_bad_settled_by_names_the_entry(tmp_path, settled_by, message):
    with pytest.raises(CloseCallsError, match=message) as failed:
        _close_calls(tmp_path, [{**ENTRY, "settled_by": settled_by}])
    assert "entry 1" in str(failed.value)


def test_the_bundled_settled_by_readings_exist_in_the_bundled_vocabulary():
    from kb.core.readings import load_vocabulary

    vocabulary = load_vocabulary(DATA_DIR / "readings.yaml", TAXONOMY)
    calls = load_close_calls(DATA_DIR / "close_calls.yaml", TAXONOMY)
    named = {r for entry in calls.entries for readings in entry.settled_by.values() for r in readings}
    assert len(named) >= 8
    assert {r for r in named if r.split(":")[1] not in vocabulary.ids(r.split(":")[0])} == set()


def test_a_ticket_about_one_job_never_answers_who_else_is_affected():
    calls = load_close_calls(DATA_DIR / "close_calls.yaml", TAXONOMY)
    assert all("scope:one_job" not in readings for entry in calls.entries for readings in entry.settled_by.values())
