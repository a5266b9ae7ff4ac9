"""Prediction sets where people decide: the engine's sets, the labelling rule, the close-call
question, the bot's labels and comment, the evaluation's and the backfill report's figures."""

import pytest
from test_writeback import make_suggestion

from kb.core.suggestion import (
    CAUSE_LABEL,
    COMMENT_ONLY,
    DIMENSION_LABEL,
    Candidate,
    CloseCallQuestion,
    Ticket,
    labelling,
)
from kb.engine.conformal import SetCalibration
from kb.engine.sets import close_call
from kb.engine.suggest import SuggestionEngine
from kb.jobs.evaluate import Case
from kb.jobs.report import summarise
from kb.jobs.set_eval import format_sweep, level_sweep, set_figures
from kb.tickets.writeback import render_comment, suggestion_labels

XID_79 = Ticket(title="GPU has fallen off the bus on gpu-a-17",
                description="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus. Job died.")
VAGUE = Ticket(title="Training job failed overnight",
               description="My distributed training run failed overnight with an error after a few hours, "
                           "it worked last week with the same code and config on the shared partition.")


def _set(*members: tuple[str, str]) -> list[Candidate]:
    return [Candidate(id=c, confidence=round(0.5 / (n + 1), 3), dimension=d) for n, (c, d) in enumerate(members)]


@pytest.fixture(scope="module")
def engine(shared_bundled_kb):
    return SuggestionEngine(shared_bundled_kb)


def test_every_suggestion_carries_sets_at_the_configured_level(engine):
    s = engine.suggest(XID_79)
    assert s.set_level == pytest.approx(1 - engine.settings.set_alpha)
    assert s.root_cause_set[0].id == s.root_cause and s.symptom_set[0].id == s.symptom
    tax = engine.kb.taxonomy
    assert all(m.dimension == tax.dimension_of(m.id) for m in s.root_cause_set)
    assert [m.id for m in s.root_cause_set] == [c.id for c in s.root_cause_candidates][:len(s.root_cause_set)] \
        or len(s.root_cause_set) > len(s.root_cause_candidates)


def test_a_vague_ticket_gets_a_wider_set_than_a_clear_one(engine):
    clear, vague = engine.suggest(XID_79), engine.suggest(VAGUE)
    assert len(clear.root_cause_set) < len(vague.root_cause_set)


def test_a_lower_alpha_never_gives_a_smaller_set(engine, monkeypatch):
    wide = engine.suggest(VAGUE)
    monkeypatch.setattr(engine.settings, "set_alpha", 0.3)
    narrow = engine.suggest(VAGUE)
    assert len(narrow.root_cause_set) <= len(wide.root_cause_set) and narrow.set_level == 0.7


def test_a_labelling_level_of_its_own_moves_the_labels_and_not_the_shown_set(engine, monkeypatch):
    shown = engine.suggest(VAGUE)
    assert shown.label_set is None and shown.label_level is None  # unset: labels follow the shown set
    monkeypatch.setattr(engine.settings, "label_alpha", 0.6)
    s = engine.suggest(VAGUE)
    assert [m.id for m in s.root_cause_set] == [m.id for m in shown.root_cause_set] and s.set_level == 0.9
    assert s.label_level == 0.4 and s.label_set
    assert [m.id for m in s.label_set] == [m.id for m in s.root_cause_set][:len(s.label_set)]
    assert len(s.label_set) < len(s.root_cause_set)
    assert labelling(s) == labelling(make_suggestion(root_cause=s.root_cause, dimension=s.root_cause_dimension,
                                                     root_cause_set=s.label_set, set_level=0.4))


def test_the_close_call_question_decides_between_the_top_cause_and_another_dimension(engine):
    ranking = [("platform_misconfiguration", 0.41), ("improper_configuration", 0.33), ("buggy_code", 0.1)]
    tax, calls = engine.kb.taxonomy, engine.close_calls
    call = close_call(tax, calls, ranking, ["platform_misconfiguration", "improper_configuration", "buggy_code"])
    assert call is not None and call.causes == ["platform_misconfiguration", "improper_configuration"]
    assert call.question.endswith("?") and set(call.answers) == set(call.causes)
    assert close_call(tax, calls, [("gpu_lost", 0.95), ("node_outage", 0.03)], ["gpu_lost"]) is None  # not close


@pytest.mark.parametrize("members, kind", [
    ([("gpu_lost", "hardware")], CAUSE_LABEL),
    ([("gpu_lost", "hardware"), ("node_outage", "hardware")], DIMENSION_LABEL),
    ([("platform_misconfiguration", "platform"), ("improper_configuration", "user")], COMMENT_ONLY),
])
def test_the_bot_labels_what_the_set_allows(members, kind):
    s = make_suggestion(root_cause=members[0][0], dimension=members[0][1], root_cause_set=_set(*members),
                        set_level=0.9)
    assert labelling(s) == kind
    labels = suggestion_labels(s)
    expected = {CAUSE_LABEL: [f"rc:{members[0][0]}", f"dim:{members[0][1]}", "symptom:job_crash"],
                DIMENSION_LABEL: [f"dim:{members[0][1]}", "symptom:job_crash"], COMMENT_ONLY: []}[kind]
    assert labels == expected


def test_labels_follow_the_labelling_set_when_there_is_one():
    wide = _set(("platform_misconfiguration", "platform"), ("improper_configuration", "user"))
    s = make_suggestion(root_cause="platform_misconfiguration", dimension="platform", root_cause_set=wide,
                        set_level=0.9, label_set=wide[:1], label_level=0.6)
    assert labelling(s) == CAUSE_LABEL
    assert suggestion_labels(s) == ["rc:platform_misconfiguration", "dim:platform", "symptom:job_crash"]
    body = render_comment(s, threshold_note=True)
    assert "One of these 2 causes (90%)" in body and "labels follow the 60% prediction set" in body
    hardware = _set(("gpu_lost", "hardware"), ("node_outage", "hardware"))
    s = make_suggestion(root_cause="gpu_lost", root_cause_set=hardware + _set(("buggy_code", "user")),
                        set_level=0.9, label_set=hardware, label_level=0.7)
    assert labelling(s) == DIMENSION_LABEL and suggestion_labels(s) == ["dim:hardware", "symptom:job_crash"]


def test_a_shown_cause_outside_the_set_is_never_labelled():
    # A model may re-rank the top cause within a margin; the set (cut from the engine's ranking) then
    # no longer holds it, and a label from either would contradict the card.
    s = make_suggestion(root_cause="node_outage", root_cause_set=_set(("gpu_lost", "hardware")), set_level=0.9)
    assert labelling(s) == COMMENT_ONLY and suggestion_labels(s) == []
    both = _set(("gpu_lost", "hardware"), ("node_outage", "hardware"))
    s = make_suggestion(root_cause="node_outage", root_cause_set=both, set_level=0.9, label_set=both[:1],
                        label_level=0.6)
    assert labelling(s) == COMMENT_ONLY


def test_a_ticket_that_says_too_little_is_never_labelled_even_with_a_set_of_one():
    s = make_suggestion(abstained=True, abstain_reason="too_little_text", root_cause_set=_set(("gpu_lost", "hardware")))
    assert labelling(s) == COMMENT_ONLY and suggestion_labels(s) == []


def test_the_comment_lists_the_set_and_the_question():
    call = CloseCallQuestion(causes=["platform_misconfiguration", "improper_configuration"],
                             question="Does every job on the partition fail, or only this user's?",
                             answers={"platform_misconfiguration": "every job", "improper_configuration": "only theirs"})
    s = make_suggestion(root_cause="platform_misconfiguration", dimension="platform", set_level=0.9, close_call=call,
                        root_cause_set=_set(("platform_misconfiguration", "platform"), ("improper_configuration", "user")))
    body = render_comment(s, threshold_note=True)
    assert "One of these 2 causes (90%):** `platform_misconfiguration` (platform), `improper_configuration` (user)" in body
    assert "**To decide:** Does every job on the partition fail, or only this user's?" in body
    assert "labels follow the 90% prediction set" in body and "**Labels:** none" in body
    assert "The ticket says" not in body


@pytest.mark.parametrize("system", ["github", "jira"])
def test_the_comment_quotes_what_the_ticket_says_to_the_question_inert(system):
    """The quoted words come from the ticket: they are rendered inert, and the question stays open."""
    from kb.core.readings import Reading
    from kb.tickets.markup import inert

    says = Reading(kind="scope", id="many_users", name="many users", confidence=0.8,
                   span="Every user sees it @oncall [x](http://evil.example) <b>now</b>")
    call = CloseCallQuestion(causes=["platform_misconfiguration", "improper_configuration"], question="Everyone?",
                             answers={"platform_misconfiguration": "yes", "improper_configuration": "no"},
                             ticket_points_to="platform_misconfiguration", ticket_says=says)
    s = make_suggestion(root_cause="platform_misconfiguration", dimension="platform", set_level=0.9, close_call=call,
                        root_cause_set=_set(("platform_misconfiguration", "platform"), ("improper_configuration", "user")))
    body = render_comment(s, threshold_note=True, system=system)
    assert "To decide:" in body and "Answered" not in body
    assert "The ticket says" in body and "which points to" in body and "platform_misconfiguration" in body
    assert f'The ticket says "{inert(says.span, system, 160)}"' in body and "http://evil" not in body


def _case(truth: str, dimension: str, alternatives: tuple[str, ...] = ()) -> Case:
    return Case(Ticket(title="t"), truth, dimension, "job_crash", None, list(alternatives), {})


def test_set_figures_count_coverage_sizes_and_the_bots_precision():
    cases = [_case("gpu_lost", "hardware"), _case("node_outage", "hardware", ("gpu_lost",)),
             _case("buggy_code", "user"),
             _case("service_outage", "platform")]
    preds = [
        make_suggestion(root_cause="gpu_lost", root_cause_set=_set(("gpu_lost", "hardware")), set_level=0.9),
        make_suggestion(root_cause="gpu_lost", root_cause_set=_set(("gpu_lost", "hardware")), set_level=0.9),
        make_suggestion(root_cause="gpu_lost", set_level=0.9,
                        root_cause_set=_set(("gpu_lost", "hardware"), ("node_outage", "hardware"))),
        make_suggestion(root_cause="resource_overload", dimension="platform", set_level=0.9,
                        root_cause_set=_set(("resource_overload", "platform"), ("service_outage", "platform"),
                                            ("buggy_code", "user"))),
    ]
    figures = set_figures(cases, preds)
    assert figures["coverage"] == 0.5 and figures["mean_size"] == 1.75 and figures["singletons"] == 0.5
    assert figures["coverage_accepted"] == 0.75  # the second ticket's set holds an accepted alternative
    assert figures["singleton_precision"] == 0.5
    assert figures["coverage_by_dimension"] == {"hardware": 0.5, "platform": 1.0, "user": 0.0}
    assert figures["bot"][CAUSE_LABEL] == {"share": 0.5, "precision": 0.5}
    assert figures["bot"][DIMENSION_LABEL] == {"share": 0.25, "precision": 0.0}
    assert figures["bot"][COMMENT_ONLY]["share"] == 0.25


def test_the_backfill_report_counts_set_sizes(engine):
    from kb.jobs.annotate import annotation_record

    records = [annotation_record(engine.suggest(t)) for t in (XID_79, VAGUE)]
    figures = summarise(records, engine.kb.taxonomy)
    sizes = [len(r["root_cause_set"]) for r in records]
    assert sum(figures.set_sizes.values()) == 2
    assert figures.set_sizes["1"] == sizes.count(1) and figures.set_sizes["3+"] == sum(n > 2 for n in sizes)


def test_a_close_calls_file_that_does_not_fit_the_taxonomy_turns_the_questions_off(shared_bundled_kb, tmp_path,
                                                                                   caplog):
    foreign = tmp_path / "close_calls.yaml"
    foreign.write_text('- causes: [rc00, rc01]\n  question: "Is it?"\n  answers: {rc00: "yes", rc01: "no"}\n')
    engine = SuggestionEngine(shared_bundled_kb)
    engine.settings = engine.settings.model_copy(update={"close_calls": foreign})
    with caplog.at_level("WARNING"):
        assert len(engine.close_calls) == 0
    assert "close-call questions are off" in caplog.text and "PMKB_CLOSE_CALLS" in caplog.text
    assert engine.suggest(XID_79).close_call is None


SWEEP_RANKINGS = [
    [("gpu_lost", 0.9), ("node_outage", 0.06), ("buggy_code", 0.04)],  # sure and right
    [("gpu_lost", 0.6), ("node_outage", 0.3), ("buggy_code", 0.1)],  # the truth second, same dimension
    [("buggy_code", 0.4), ("service_outage", 0.4), ("gpu_lost", 0.2)],  # truth second, another dimension
    [("gpu_lost", 0.7), ("node_outage", 0.2), ("buggy_code", 0.1)],  # wrong, an accepted alternative
]


def test_the_level_sweep_trades_coverage_for_labels_and_counts_their_precision(engine):
    cases = [_case("gpu_lost", "hardware"), _case("node_outage", "hardware"), _case("service_outage", "platform"),
             _case("node_outage", "hardware", ("gpu_lost",))]
    preds = [make_suggestion() for _ in cases]
    calibration = SetCalibration(scores=[0.5, 0.7, 0.85, 0.92, 0.97], weights=[1.0] * 5, penalty=0.0)
    rows = level_sweep(cases, preds, SWEEP_RANKINGS, calibration, engine.kb.taxonomy, levels=(0.95, 0.5))
    wide, narrow = rows
    assert wide["level"] == 0.95 and wide["coverage"] == 1.0 and wide["cause_labels"] == 0.0
    # At 0.5 the threshold is 0.85: sets of one for the first, second and fourth ticket, two for the third.
    assert narrow["mean_size"] == 1.25 and narrow["coverage"] == 0.5
    assert narrow["cause_labels"] == 0.75 and narrow["cause_precision"] == pytest.approx(1 / 3)
    assert narrow["cause_accepted"] == pytest.approx(2 / 3)  # gpu_lost is accepted for the fourth
    assert narrow["dimension_labels"] == 0.0 and narrow["dimension_precision"] != narrow["dimension_precision"]
    preds[0] = make_suggestion(abstained=True, abstain_reason="too_little_text")
    assert level_sweep(cases, preds, SWEEP_RANKINGS, calibration, engine.kb.taxonomy,
                       levels=(0.5,))[0]["cause_labels"] == 0.5  # a ticket that says too little stays unlabelled
    lines = format_sweep(rows)
    assert lines[1].startswith("| set level | coverage | mean size | cause labels") and len(lines) == 5
    assert lines[3] == "| 0.95 | 1.000 | 3.00 | 0.000 | - | - | 0.000 | - |"
    assert lines[4] == "| 0.50 | 0.500 | 1.25 | 0.750 | 0.333 | 0.667 | 0.000 | - |"
