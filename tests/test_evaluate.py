"""The evaluation computes its figures from predictions; checked on cases with known answers."""

import json

import pytest

from kb.evaluate import Case, confusion, evaluate, evaluate_kfold, load_cases, macro_f1, score
from kb.suggest import Candidate, Suggestion, SuggestionEngine, Ticket
from tests.conftest import DEV_INCIDENTS


def _pred(cause, dim, conf=0.9, abstained=False, symptom="job_crash"):
    return Suggestion(id="x", symptom=symptom, symptom_confidence=0.5, symptom_candidates=[],
                      root_cause=cause, root_cause_name=cause, root_cause_dimension=dim,
                      root_cause_confidence=conf, root_cause_candidates=[Candidate(id=cause, confidence=conf)],
                      abstained=abstained, mitigation="node_repair", mitigations=[], retry_safe=False,
                      similar_incidents=[], evidence=[])


def _case(cause, dim, alt=()):
    return Case(Ticket(title="t"), cause, dim, "job_crash", "node_repair", list(alt), {})


def test_macro_f1_known_values():
    assert macro_f1(["a", "a", "b"], ["a", "a", "b"]) == 1.0
    assert macro_f1(["a", "b"], ["b", "a"]) == 0.0
    assert macro_f1(["a", "a", "b", "b"], ["a", "b", "b", "b"]) == pytest.approx((2 / 3 + 0.8) / 2)


def test_score_counts_alternatives_abstention_and_dimension():
    cases = [_case("gpu_lost", "hardware"), _case("system_defect", "platform", alt=["gpu_lost"]),
             _case("buggy_code", "user")]
    preds = [_pred("gpu_lost", "hardware"), _pred("gpu_lost", "hardware", abstained=True),
             _pred("improper_configuration", "user", conf=0.3)]
    figures = score(cases, preds)
    assert figures["top1"] == pytest.approx(1 / 3) and figures["top1_alt"] == pytest.approx(2 / 3)
    assert figures["dimension"] == pytest.approx(2 / 3) and figures["coverage"] == pytest.approx(2 / 3)
    assert figures["precision_when_labelled"] == pytest.approx(1 / 2)
    assert confusion(cases, preds) == {"buggy_code": {"improper_configuration": 1},
                                       "system_defect": {"gpu_lost": 1}}


def test_load_cases_rejects_unlabelled(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": "a", "title": "t"}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        load_cases(path)


@pytest.mark.slow
def test_evaluate_and_kfold_on_labelled_tickets(shared_bundled_kb, tmp_path):
    cases = load_cases(DEV_INCIDENTS)[:20]
    result = evaluate(SuggestionEngine(shared_bundled_kb), cases)
    figures = result["figures"]
    assert figures["n"] == 20 and all(0 <= figures[k] <= 1 for k in ("top1", "top3", "macro_f1", "ece"))
    assert figures["top3"] >= figures["top1"]
    assert result["baselines"]["majority_class"]["label"] in shared_bundled_kb.taxonomy.cause_ids
    kfold = evaluate_kfold(shared_bundled_kb, cases, folds=2)
    assert kfold["figures"]["n"] == 20 and kfold["folds"] == 2
