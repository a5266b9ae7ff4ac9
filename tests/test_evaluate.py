"""The evaluation computes its figures from predictions; checked on cases with known answers."""

import json
import math
import random

import pytest

from kb.core.settings import Settings
from kb.core.suggestion import Candidate, Suggestion, Ticket
from kb.core.taxonomy import load_taxonomy
from kb.engine.suggest import SuggestionEngine
from kb.jobs.evaluate import (
    Case,
    accuracy,
    confusion,
    evaluate,
    evaluate_kfold,
    fill_dimensions,
    format_report,
    label_figures,
    load_cases,
    macro_f1,
    per_class,
    risk_coverage,
    score,
    second_expert,
)
from tests.conftest import LABELLED


def _pred(cause, dim, conf=0.9, abstained=False, symptom="job_crash"):
    return Suggestion(id="x", symptom=symptom, symptom_confidence=0.5, symptom_candidates=[],
                      root_cause=cause, root_cause_name=cause, root_cause_dimension=dim,
                      root_cause_confidence=conf, root_cause_candidates=[Candidate(id=cause, confidence=conf)],
                      abstained=abstained, mitigation="node_repair", mitigations=[], retry_safe=False,
                      similar_incidents=[], evidence=[])


def _case(cause, dim, alt=(), symptom="job_crash", record=None):
    return Case(Ticket(title="t"), cause, dim, symptom, "node_repair", list(alt), record or {})


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


def test_per_class_risk_coverage_and_symptom_confusion():
    cases = [_case("gpu_lost", "hardware"), _case("gpu_lost", "hardware", symptom="job_hang"),
             _case("buggy_code", "user")]
    preds = [_pred("gpu_lost", "hardware", conf=0.9), _pred("buggy_code", "user", conf=0.35),
             _pred("buggy_code", "user", conf=0.6)]
    table = per_class(cases, preds)
    assert table["gpu_lost"] == {"support": 2, "precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3)}
    assert table["buggy_code"]["precision"] == 0.5 and table["buggy_code"]["recall"] == 1.0
    rows = {r["threshold"]: r for r in risk_coverage(cases, preds, thresholds=(0.0, 0.5, 0.95))}
    assert rows[0.0]["coverage"] == 1.0 and rows[0.0]["precision"] == pytest.approx(2 / 3)
    assert rows[0.5]["coverage"] == pytest.approx(2 / 3) and rows[0.5]["precision"] == 1.0
    assert rows[0.95]["coverage"] == 0.0
    assert confusion(cases, preds, "symptom") == {"job_hang": {"job_crash": 1}}


def test_second_expert_agreement_is_computed_from_the_file():
    dims = {"gpu_lost": "hardware", "gpu_processor_fault": "hardware", "buggy_code": "user"}
    cases = [_case("gpu_lost", "hardware", record={"second_opinion": {"root_cause": "gpu_lost",
                                                                       "symptom": "job_crash"}}),
             _case("gpu_lost", "hardware", alt=["gpu_processor_fault"],
                   record={"second_opinion": {"root_cause": "gpu_processor_fault", "symptom": "job_hang"}}),
             _case("buggy_code", "user", record={"second_opinion": {"root_cause": "gpu_lost",
                                                                     "symptom": "job_crash"}})]
    ref = second_expert(cases, dims.get)
    assert ref["n"] == 3 and ref["top1"] == pytest.approx(1 / 3) and "top1_alt" not in ref
    assert ref["dimension"] == pytest.approx(2 / 3) and ref["symptom"] == pytest.approx(2 / 3)
    assert second_expert([_case("gpu_lost", "hardware")]) is None


def test_report_shows_reference_thresholds_and_classes():
    cases = [_case("gpu_lost", "hardware", record={"second_opinion": {"root_cause": "gpu_lost"}})]
    preds = [_pred("buggy_code", "user", conf=0.45)]
    result = {"figures": score(cases, preds), "latency_ms_p50": 12.0,
              "baselines": {"majority_class": {"label": "gpu_lost", "top1": 1.0, "macro_f1": 1.0},
                            "neighbour_vote": {"top1": 0.0, "macro_f1": 0.0}},
              "confusion": confusion(cases, preds), "symptom_confusion": {},
              "per_class": per_class(cases, preds), "risk_coverage": risk_coverage(cases, preds, (0.0, 0.5)),
              "second_expert": second_expert(cases)}
    text = format_report(result, "x")
    assert "| root cause top-1 | 0.000 | 1.000 |" in text  # engine beside the second expert
    assert "| 0.5 | 0.000 | nan |" in text and "| gpu_lost | 1 | 0.00 | 0.00 | 0.00 |" in text
    assert "gpu_lost                         buggy_code: 1" in text


def test_missing_dimensions_come_from_the_taxonomy():
    taxonomy = load_taxonomy(Settings.model_fields["taxonomy"].default)
    cases = fill_dimensions([_case("gpu_lost", None), _case("buggy_code", "hardware"), _case("not_a_cause", None)],
                            taxonomy)
    assert [c.dimension for c in cases] == ["hardware", "hardware", None]  # a given dimension is kept


def test_load_cases_rejects_unlabelled(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": "a", "title": "t"}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        load_cases(path)


@pytest.mark.slow
def test_evaluate_and_kfold_on_labelled_tickets(shared_bundled_kb, empty_kb):
    cases = load_cases(LABELLED)
    result = evaluate(SuggestionEngine(shared_bundled_kb), cases)
    figures = result["figures"]
    assert figures["n"] == 20 and all(0 <= figures[k] <= 1 for k in ("top1", "top3", "macro_f1", "ece"))
    assert figures["top3"] >= figures["top1"]
    assert result["baselines"]["majority_class"]["label"] in shared_bundled_kb.taxonomy.cause_ids
    assert sum(row["support"] for row in result["per_class"].values()) == 20
    assert result["second_expert"]["n"] == 20 and 0 <= result["second_expert"]["dimension"] <= 1
    assert result["risk_coverage"][0]["coverage"] == 1.0
    sweep = {row["level"]: row for row in result["level_sweep"]}
    # The sweep cuts sets from full rankings; at the configured level they are the suggestions' own.
    assert sweep[0.9]["coverage"] == result["sets"]["coverage"]
    assert sweep[0.9]["mean_size"] == pytest.approx(result["sets"]["mean_size"])
    assert sweep[0.9]["cause_labels"] == result["sets"]["bot"]["cause"]["share"]
    rows = result["level_sweep"]  # nested sets: lower levels cover less and label more
    assert all(a["coverage"] >= b["coverage"] and a["cause_labels"] <= b["cause_labels"] for a, b in zip(rows, rows[1:]))
    assert "| set level | coverage | mean size | cause labels" in format_report(result, "t")
    # Beside the tickets' figures, the weights' own on the knowledge base's incidents scored as unseen.
    left_out = result["knowledge_base_left_out"]
    assert left_out["n"] > 1000 and f"| all | {left_out['n']} | {left_out['top1']:.3f} |" in format_report(result, "t")
    # Folds over a small knowledge base (the taxonomy alone): each fold copies it and adds the other fold.
    empty_kb.sync_taxonomy()
    kfold = evaluate_kfold(empty_kb, cases, folds=2)
    assert kfold["figures"]["n"] == 20 and kfold["folds"] == 2


def _counted_figures(truth, pred):
    """Per-label figures counted by hand: the reference scikit-learn's must equal."""
    out = {}
    for label in sorted(set(truth) | set(pred)):
        tp = sum(t == label == p for t, p in zip(truth, pred))
        n_pred, support = pred.count(label), truth.count(label)
        out[label] = {"support": support, "precision": tp / n_pred if n_pred else 0.0,
                      "recall": tp / support if support else 0.0, "f1": 2 * tp / (n_pred + support) if tp else 0.0}
    return out


def test_scikit_learn_figures_equal_the_counted_ones():
    rng = random.Random(7)
    for _ in range(200):
        labels = ["a", "b", "c", "d", "e"][:rng.randint(1, 5)]
        n = rng.randint(1, 30)
        truth, pred = [rng.choice(labels) for _ in range(n)], [rng.choice(labels + ["z"]) for _ in range(n)]
        counted = _counted_figures(truth, pred)
        assert label_figures(truth, pred) == counted
        assert macro_f1(truth, pred) == pytest.approx(sum(counted[x]["f1"] for x in set(truth)) / len(set(truth)))
        assert accuracy(truth, pred) == sum(t == p for t, p in zip(truth, pred)) / n


def test_accuracy_of_nothing_is_nan_and_a_missing_label_matches_only_a_missing_one():
    assert math.isnan(accuracy([], []))
    assert accuracy(["a", None, None], ["a", None, "b"]) == pytest.approx(2 / 3)


def test_confusion_rows_put_the_most_frequent_first_then_the_first_seen():
    causes = [("gpu_lost", "nic_failure"), ("gpu_lost", "disk_failure"), ("gpu_lost", "disk_failure"),
              ("gpu_lost", "buggy_code"), ("gpu_lost", "nic_failure"), ("gpu_lost", "buggy_code"),
              ("gpu_lost", "gpu_lost"), ("buggy_code", "system_defect")]
    cases = [_case(truth, "hardware") for truth, _ in causes]
    preds = [_pred(predicted, "hardware") for _, predicted in causes]
    table = confusion(cases, preds)
    assert list(table) == ["buggy_code", "gpu_lost"]
    assert list(table["gpu_lost"].items()) == [("nic_failure", 2), ("disk_failure", 2), ("buggy_code", 2)]
    assert confusion([], []) == {}


def test_the_lever_table_switches_one_lever_at_a_time(shared_bundled_kb):
    from kb.engine.owner import owner_masses
    from kb.jobs.owner_eval import LEVER_FIGURES, format_owner, levers, without_owner_first

    cases = load_cases(LABELLED)
    engine = SuggestionEngine(shared_bundled_kb)
    dimension_of = shared_bundled_kb.taxonomy.dimension_of
    ranked = engine.cause_rankings([c.ticket for c in cases])
    plain = without_owner_first(engine)
    for case, ranking, probable in zip(cases, ranked, plain.cause_rankings([c.ticket for c in cases])):
        masses = owner_masses(ranking, dimension_of)
        owner = engine.suggest(case.ticket)
        if owner.close_call is None or not owner.close_call.answered:  # an answered close call decides itself
            assert owner.root_cause_dimension == max(masses, key=masses.__getitem__)
        top = plain.suggest(case.ticket)
        if top.collective is None and (top.close_call is None or not top.close_call.answered):
            assert top.root_cause == probable[0][0] == max(probable, key=lambda c: c[1])[0]
    result = evaluate(engine, cases)
    rows = levers(engine, cases, lambda e: [e.suggest(c.ticket) for c in cases], result, with_sources=False)
    assert list(rows) == ["everything", "no scope/change readings", "top cause whatever its owner"]
    assert all(0 <= row[k] <= 1 for row in rows.values() for k in LEVER_FIGURES if not math.isnan(row[k]))
    assert rows["everything"]["top1"] == result["figures"]["top1"]
    assert "| top cause whatever its owner |" in "\n".join(format_owner({**result, "levers": rows}))


def test_the_owner_sweep_counts_the_owner_labels_each_wanted_precision_gives():
    from kb.core.suggestion import Owner
    from kb.engine.owner import OwnerCalibration
    from kb.jobs.owner_eval import format_owner, owner_sweep

    calibration = OwnerCalibration(confidences=[0.9 - n * 0.005 for n in range(100)],
                                   correct=[n < 60 or n % 2 == 1 for n in range(100)])
    cases = [_case("system_defect", "platform"), _case("gpu_lost", "hardware"), _case("buggy_code", "user")]
    preds = []
    for (cause, dim), confidence in zip([("system_defect", "platform"), ("buggy_code", "user"),
                                         ("buggy_code", "user")], (0.85, 0.8, 0.2)):
        pred = _pred(cause, dim)
        pred.owner = Owner(dimension=dim, confidence=confidence)
        preds.append(pred)
    rows = {row["wanted"]: row for row in owner_sweep(cases, preds, calibration, (0.99, 0.8))}
    assert rows[0.99]["threshold"] == pytest.approx(0.9 - 59 * 0.005)  # the first 60 are all right
    assert rows[0.99]["fitted_share"] == pytest.approx(0.6)
    assert rows[0.99]["share"] == pytest.approx(2 / 3) and rows[0.99]["precision"] == pytest.approx(0.5)
    assert rows[0.8]["threshold"] < rows[0.99]["threshold"] and rows[0.8]["fitted_share"] > 0.6
    assert "| owner label: wanted precision |" in "\n".join(format_owner({"owner_sweep": list(rows.values())}))
