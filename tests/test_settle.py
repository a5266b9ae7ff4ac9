"""A close call settled by the ticket's own readings, weighed by the knowledge base (kb/engine/settle.py),
and the close-calls file's ``settled_by`` checked when it is loaded."""

from __future__ import annotations

import pytest
import yaml

from kb.core.close_calls import CloseCallsError, load_close_calls
from kb.core.incidents import Incident
from kb.core.readings import Reading, ReadingLabel
from kb.core.settings import DATA_DIR
from kb.core.suggestion import CloseCallQuestion
from kb.core.taxonomy import load_taxonomy
from kb.engine.settle import MAX_RATIO, answer_odds, settle

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


def test_a_matching_reading_settles_the_call_and_moves_the_ranking(tmp_path):
    calls = _close_calls(tmp_path, [ENTRY])
    odds = {(frozenset(PAIR), "platform_misconfiguration"): {"scope:many_users": 20.0, "scope:one_team": 1.2},
            (frozenset(PAIR), "improper_permission"): {"scope:one_user": 6.0}}
    causes = [("improper_permission", 0.6), ("platform_misconfiguration", 0.3), ("service_outage", 0.1)]
    ranked, answered = settle(causes, QUESTION, calls, [_reading("many_users")], odds)
    assert answered.answered == "platform_misconfiguration" and answered.answered_by.id == "many_users"
    p = dict(ranked)
    assert ranked[0][0] == "platform_misconfiguration" and p["service_outage"] == 0.1
    assert p["platform_misconfiguration"] / p["improper_permission"] == pytest.approx(0.5 * MAX_RATIO)
    assert sum(p.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("readings", [
    [_reading("many_users", confidence=0.4)],  # not sure enough
    [_reading("one_team")],  # the knowledge base does not bear this reading out
    [_reading("one_job")],  # not an answer to this question
    [_reading("many_users"), _reading("one_user", 0.95)],  # answers for both sides: 8 against 6 is no answer
])
def test_no_settlement_without_a_sure_reading_the_knowledge_base_bears_out(tmp_path, readings):
    calls = _close_calls(tmp_path, [ENTRY])
    odds = {(frozenset(PAIR), "platform_misconfiguration"): {"scope:many_users": 20.0, "scope:one_team": 1.2},
            (frozenset(PAIR), "improper_permission"): {"scope:one_user": 6.0}}
    causes = [("improper_permission", 0.6), ("platform_misconfiguration", 0.4)]
    assert settle(causes, QUESTION, calls, readings, odds) == (causes, None)


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
