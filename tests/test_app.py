"""The chat page, driven headless with Streamlit's AppTest on a private copy of a built knowledge base."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import make_settings
from streamlit.testing.v1 import AppTest

from kb.core.suggestion import Evidence, Ticket
from kb.engine.knowledge import KnowledgeBase
from kb.engine.search import Retriever
from kb.engine.suggest import SuggestionEngine
from kb.jobs.feedback import AUDIT_FILE

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the page's helpers (ui/) live beside app.py, outside the package
    sys.path.insert(0, str(ROOT))

from ui.card import apply_threshold  # noqa: E402
from ui.highlight import (  # noqa: E402
    escape_markdown,
    evidence_span,
    highlight_evidence,
    merge_spans,
    safe_link,
)

TIMEOUT = 120
ECC_TICKET = {
    "title": "Megatron run on gpu-h100-0417 crashed at step 48k",
    "description": "Job 8812045 exited after 19h. Rank 211 raised RuntimeError: CUDA error: uncorrectable "
                   "ECC error encountered. <script>alert('x')</script> *not bold* $x$",
    "log": "NVRM: Xid (PCI:0000:9b:00): 94, pid=288113, name=python, Contained: CE User Channel",
}
VAGUE_TICKET = {"title": "", "description": "zebra banana purple otter quantum"}


@pytest.fixture(scope="module")
def built_home(_built_kb_dir, tmp_path_factory) -> Path:
    """A copy of the built knowledge base that the page's copies are made from (never opened by it)."""
    home = tmp_path_factory.mktemp("app") / "kb"
    shutil.copytree(_built_kb_dir, home)
    return home


@pytest.fixture(scope="module")
def read_only_home(built_home, tmp_path_factory) -> Path:
    """One copy shared by the tests that do not write, so the page's engine is built once for them."""
    home = tmp_path_factory.mktemp("app-read-only") / "kb"
    shutil.copytree(built_home, home)
    return home


def _point_app_at(home: Path, monkeypatch) -> Path:
    from ui.resources import app_settings

    monkeypatch.setenv("PMKB_HOME", str(home))
    app_settings.clear()  # settings are read once per process: read them again for this home
    return home


@pytest.fixture
def app_home(read_only_home, monkeypatch) -> Path:
    """PMKB_HOME on the shared copy (the test must not save feedback)."""
    yield _point_app_at(read_only_home, monkeypatch)
    assert not (read_only_home / AUDIT_FILE).exists(), "a read-only test wrote to the knowledge base"


@pytest.fixture
def writable_home(built_home, tmp_path, monkeypatch) -> Path:
    """PMKB_HOME on a private copy the test may write to."""
    home = tmp_path / "kb"
    shutil.copytree(built_home, home)
    return _point_app_at(home, monkeypatch)


def open_app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    if page:
        at.switch_page(page).run()
        assert not at.exception, at.exception
    return at


def submit(at: AppTest, ticket: dict) -> AppTest:
    at.text_input(key="ticket-title").set_value(ticket.get("title", ""))
    at.text_area(key="ticket-description").set_value(ticket.get("description", ""))
    at.text_area(key="ticket-log").set_value(ticket.get("log", ""))
    if ticket.get("id"):
        at.text_input(key="ticket-id").set_value(ticket["id"])
    button(at, "Suggest").click().run()
    assert not at.exception, at.exception
    return at


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


@pytest.fixture(scope="module")
def reference(built_home, embedder) -> SuggestionEngine:
    """The engine, outside the page, on the knowledge base the page's copies come from."""
    return SuggestionEngine(KnowledgeBase(make_settings(built_home), embedder=embedder))


def test_a_ticket_shows_the_engines_root_cause_with_evidence_highlighted(app_home, reference):
    expected = reference.suggest(Ticket(**ECC_TICKET))
    assert not expected.abstained
    at = submit(open_app(), ECC_TICKET)

    text = markdown(at)
    assert f"### {escape_markdown(expected.root_cause_name)}" in text
    assert abs(at.progress[0].value - expected.root_cause_confidence * 100) <= 1
    others = (f"One of these {len(expected.root_cause_set)} causes" if len(expected.root_cause_set) > 1
              else "Next candidates")  # the prediction set lists the other causes when it has them
    assert others in text and "Retry safe" in text
    assert "**Owner:** :" in text and f"[{expected.owner.dimension}] {expected.owner.confidence:.0%}" in text
    assert "gpu\\-h100\\-0417" in text  # the suspect node
    assert "#### Mitigations" in text and "#### Evidence" in text
    assert not at.warning  # not abstained
    ticket_html = at.html[0].proto.body
    assert ticket_html.count("<mark") == len(expected.evidence) > 0
    assert "<script>" not in ticket_html and "&#60;script&#62;" in ticket_html
    labels = [e.label for e in at.expander]
    assert any(expected.similar_incidents[0].id.replace("-", "\\-") in label for label in labels)
    assert "Resolution" in text  # similar incidents open on their full record


def test_an_unsure_engine_says_not_sure_and_the_slider_changes_what_is_shown(app_home, reference):
    assert reference.suggest(Ticket(**VAGUE_TICKET)).abstained, "pick a vaguer ticket: the engine is sure"
    at = submit(open_app(), VAGUE_TICKET)
    assert at.warning and "Not sure" in at.warning[0].value
    assert not at.progress

    at.slider(key="abstain_threshold").set_value(0.0).run()
    assert not at.warning and at.progress  # nothing is below a zero threshold
    at.slider(key="abstain_threshold").set_value(1.0).run()
    assert "Not sure" in at.warning[0].value


def test_a_ticket_that_says_too_little_asks_for_more_at_any_threshold(app_home):
    at = submit(open_app(), {"title": "Job failed", "description": "please take a look"})
    assert at.warning and "says too little" in at.warning[0].value and not at.progress
    at.slider(key="abstain_threshold").set_value(0.0).run()
    assert at.warning and "says too little" in at.warning[0].value and not at.progress


def test_an_empty_ticket_asks_for_text_instead_of_suggesting(app_home):
    at = submit(open_app(), {"title": "  ", "description": ""})
    assert "Paste a title" in at.warning[0].value
    assert "triage" not in at.session_state and not at.progress


def test_feedback_is_saved_audited_and_found_by_the_next_search(writable_home, embedder):
    app_home = writable_home
    ticket = {**ECC_TICKET, "id": "OPS-4242"}
    at = submit(open_app(), ticket)
    at.selectbox(key="fb-cause-1").set_value("gpu_lost")
    at.text_input(key="fb-reviewer-1").set_value("Grace")
    at.text_area(key="fb-resolution-1").set_value("GPU 3 fell off the bus; node drained.")
    button(at, "Save as confirmed incident").click().run()
    assert not at.exception, at.exception

    assert "OPS\\-4242" in at.success[0].value and "Grace" in at.success[0].value
    record = json.loads((app_home / AUDIT_FILE).read_text().splitlines()[-1])
    assert (record["reviewer"], record["incident_id"], record["action"]) == ("Grace", "OPS-4242", "corrected")
    assert record["new"]["root_cause"] == "gpu_lost" and "root_cause" in record["changed"]
    hits = Retriever(KnowledgeBase(make_settings(app_home), embedder=embedder)).retrieve_similar(
        Ticket(**ECC_TICKET).text(), k=3)
    assert (hits[0].id, hits[0].provenance, hits[0].root_cause) == ("OPS-4242", "confirmed", "gpu_lost")

    at = submit(at, {**ECC_TICKET, "id": "OPS-4243"})  # the page's own engine finds it too
    assert "OPS\\-4242" in at.expander[1].label
    assert "**Seen before:** gpu\\-h100\\-0417 appears in 1 earlier incident\\: OPS\\-4242 \\(gpu\\_lost" \
        in markdown(at)  # the same node, named again


def test_the_ranks_logs_in_the_log_box_give_the_collective_verdict_on_the_card(app_home):
    posted = ROOT / "tests" / "data" / "collectives" / "posted" / "ace348-perlmutter-4gpu-first-rank-silent.log"
    log = posted.read_text(encoding="utf-8").split("\n\n", 1)[1]
    at = submit(open_app(), {"title": "4-GPU DDP job hangs at the end of an epoch, then dies",
                             "description": "Same code ran fine last week.", "log": log})
    text = markdown(at)
    assert r"**Collective timeout:** one node: rank 0 never arrived at ALLREDUCE \#1132079" in text
    assert any("ProcessGroupNCCL" in c.value for c in at.code)


def test_uploaded_rank_logs_are_traced_to_the_rank_that_never_arrived(app_home):
    log = (ROOT / "tests" / "data" / "collectives" / "gloo-stall-interleaved.log").read_bytes()
    at = open_app()
    at.file_uploader(key="ticket-logs").set_value([("slurm-4411.out", log, "text/plain")])
    at = submit(at, {"title": "4-rank job hangs at step 3, then dies", "description": "Nothing changed."})
    assert r"**Collective timeout:** one node: rank 2 \(localhost\) never arrived" in markdown(at)


def test_a_follow_up_question_gets_the_retrieval_answer_without_a_model(app_home):
    at = submit(open_app(), ECC_TICKET)
    at.chat_input[0].set_value("Is it safe to resubmit?").run()
    assert not at.exception, at.exception
    roles = [m.name for m in at.chat_message]
    assert roles == ["user", "assistant"]
    answer = "\n".join(m.value for m in at.chat_message[1].markdown)
    assert "No language model is configured" in answer
    at.chat_input[0].set_value("Which node should be drained?").run()
    assert [m.name for m in at.chat_message] == ["user", "assistant"] * 2


def test_the_dashboard_renders_beside_the_published_split(app_home, shared_bundled_kb):
    at = open_app("ui/dashboard_page.py")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Incidents"] == metrics["Labelled"] == str(shared_bundled_kb.store.count())
    split = at.dataframe[0].value
    assert list(split["Platform-X"]) == ["28.33%", "28.33%", "43.34%"]
    assert "Gao et al" in " ".join(c.value for c in at.caption)
    assert len(at.get("vega_lite_chart")) == 5  # dimension, symptom, root cause, over time, provenance


def test_browsing_filters_by_dimension_and_text(app_home, shared_bundled_kb):
    total = shared_bundled_kb.store.count()
    users = shared_bundled_kb.stats()["dimension"]["user"]
    at = open_app("ui/incidents_page.py")
    assert f"{total} of {total} incidents" in " ".join(c.value for c in at.caption)
    at.multiselect(key="browse-dimension").set_value(["user"]).run()
    assert f"{users} of {total} incidents" in " ".join(c.value for c in at.caption)
    assert set(at.dataframe[0].value["dimension"]) == {"user"}
    at.multiselect(key="browse-dimension").set_value([]).run()
    at.text_input(key="browse-text").set_value("gpu-h100-0417 row remap").run()
    assert list(at.dataframe[0].value["id"]) == ["hw-gpu-001"]
    assert "row remap pending" in markdown(at)  # the chosen incident opens with its resolution


def test_a_broken_configuration_is_named_on_the_page(writable_home, monkeypatch, tmp_path):
    monkeypatch.setenv("PMKB_TAXONOMY", str(tmp_path / "missing.yaml"))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert "pmkb cannot start" in at.error[0].value and "missing.yaml" in at.error[0].value


def _evidence(text: str, start: int, end: int, line: str) -> Evidence:
    return Evidence(signal="xid_79", text=line, category="gpu_lost", causes={"gpu_lost": 2.0},
                    explanation="GPU fell off the bus", start=start, end=end)


def test_evidence_offsets_are_used_or_the_line_is_found_again():
    text = "job died\nNVRM: Xid 79, GPU has fallen off the bus\nbye"
    start = text.index("Xid 79")
    good = _evidence(text, start, start + 6, "NVRM: Xid 79, GPU has fallen off the bus")
    assert evidence_span(text, good) == (start, start + 6)
    shifted = _evidence(text, 0, 6, "...NVRM: Xid 79, GPU has fallen off the bus...")
    assert evidence_span(text, shifted) == (text.index("NVRM"), text.index("\nbye"))
    assert evidence_span(text, _evidence(text, 0, 3, "not in the ticket")) is None
    body, marked = highlight_evidence(text, [good, shifted])
    assert marked == 1 and body.count("<mark") == 1 and "\n" not in body  # overlaps merged
    assert merge_spans([(5, 9, "b"), (0, 6, "a"), (20, 22, "c")]) == [(0, 9, "a; b"), (20, 22, "c")]


def test_untrusted_text_is_escaped_and_only_web_links_are_linked():
    assert escape_markdown("**x** <b> [a](javascript:1) $y$") == (
        "\\*\\*x\\*\\* \\<b\\> \\[a\\]\\(javascript\\:1\\) \\$y\\$")
    body, _ = highlight_evidence("<img src=x onerror=alert(1)> `code` # head", [])
    assert "<img" not in body and "&#60;img" in body
    assert "`code`" not in body and "# head" not in body and "&#35; head" in body
    assert safe_link("https://github.com/org/repo/issues/7") == "https://github.com/org/repo/issues/7"
    assert safe_link("javascript:alert(1)") is None and safe_link("pmkb-bundled") is None


def test_the_threshold_is_applied_to_what_is_shown(reference):
    taxonomy = reference.kb.taxonomy
    s = reference.suggest(Ticket(**ECC_TICKET))
    assert not s.abstained and s.retry_safe == taxonomy.root_cause(s.root_cause).retry_safe
    strict = apply_threshold(s, 1.0, taxonomy)
    assert strict.abstained and not strict.retry_safe and strict.explanation.startswith("Not sure")
    assert apply_threshold(strict, 0.0, taxonomy).retry_safe == s.retry_safe
    assert apply_threshold(s, 0.0, taxonomy) is s
    vague = reference.suggest(Ticket(title="Job failed"))
    assert vague.abstain_reason == "too_little_text"
    assert apply_threshold(vague, 0.0, taxonomy).abstained  # no threshold makes a vague ticket labelled


PERMISSION_TICKET = {"title": "Job fails with permission denied on /shared/datasets",
                     "description": "My job fails reading /shared/datasets/imagenet: PermissionError: [Errno 13] "
                                    "Permission denied. It worked yesterday. Other users in my team see the same."}


def test_a_close_call_shows_its_set_and_the_question_that_decides(app_home, reference):
    expected = reference.suggest(Ticket(**PERMISSION_TICKET))
    assert len(expected.root_cause_set) >= 2 and expected.close_call is not None
    at = submit(open_app(), PERMISSION_TICKET)
    text = markdown(at)
    assert f"One of these {len(expected.root_cause_set)} causes (90%)" in text
    assert all(escape_markdown(reference.kb.taxonomy.root_cause(m.id).name) in text for m in expected.root_cause_set)
    assert "Next candidates" not in text  # the set shows them
    decide = "\n".join(i.value for i in at.info)
    assert "To decide" in decide and escape_markdown(expected.close_call.question) in decide


def test_a_confidence_just_below_the_threshold_never_reads_as_equal_to_it():
    from ui.card import below_threshold

    assert below_threshold(0.2, 0.35) == ("20%", "35%")
    assert below_threshold(0.347, 0.35) == ("34.7%", "35.0%")
    assert below_threshold(0.3499, 0.35) == ("34.99%", "35.00%")


OTHER_TEAMS_TICKET = {"title": "Permission denied on /shared/datasets since this morning",
                      "description": "PermissionError: [Errno 13] Permission denied: '/shared/datasets/imagenet/train' "
                                     "when my job starts. Users in three other teams report the same error. It worked "
                                     "yesterday and nobody changed their jobs."}


def test_what_the_ticket_says_to_the_close_call_is_quoted_and_the_engineer_still_answers(app_home, reference):
    expected = reference.suggest(Ticket(**OTHER_TEAMS_TICKET)).close_call
    assert expected is not None and expected.ticket_says is not None and not expected.answered
    at = submit(open_app(), OTHER_TEAMS_TICKET)
    decide = "\n".join(i.value for i in at.info)
    assert "To decide" in decide and f"The ticket says “{escape_markdown(expected.ticket_says.span)}”" in decide
    assert escape_markdown(reference.kb.taxonomy.root_cause(expected.ticket_points_to).name) in decide
    for cause in expected.causes:
        button(at, f"It is {reference.kb.taxonomy.root_cause(cause).name}")


def test_answering_the_close_call_on_the_page_reranks_and_the_answer_is_audited(writable_home, reference):
    expected = reference.suggest(Ticket(**PERMISSION_TICKET))
    assert expected.close_call is not None and not expected.close_call.answered
    other = expected.close_call.causes[1]
    name = reference.kb.taxonomy.root_cause(other).name
    at = submit(open_app(), PERMISSION_TICKET)
    button(at, f"It is {name}").click().run()
    assert not at.exception, at.exception
    assert f"### {escape_markdown(name)}" in markdown(at)
    answered = "\n".join(s.value for s in at.success)
    assert "Answered" in answered and "you answered" in answered
    button(at, "Save as confirmed incident").click().run()
    record = json.loads((writable_home / AUDIT_FILE).read_text().splitlines()[-1])
    assert record["close_call"]["answered"] == other
    assert record["new"]["root_cause"] == other


def test_with_a_scheduler_set_the_card_shows_the_remediation_plan(app_home, monkeypatch):
    from ui.resources import app_settings

    monkeypatch.setenv("PMKB_SCHEDULER", "slurm")
    app_settings.clear()
    at = submit(open_app(), {"id": "OPS-7", **ECC_TICKET})
    plan = next((e for e in at.expander if e.label.startswith("Remediation plan (slurm)")), None)
    assert plan is not None, [e.label for e in at.expander]
    shown = [c.value for c in plan.code]
    assert shown[0].startswith("scontrol update NodeName=gpu-h100-0417 State=DRAIN 'Reason=pmkb OPS-7: ")
    assert "Nothing has run" in "\n".join(c.value for c in plan.caption)


def test_the_page_takes_over_what_was_loaded_as_the_server_started(app_home):
    from kb.core.settings import load_settings
    from ui.resources import _preloads, _settings_key, load_everything, preload

    settings = load_settings()
    key = _settings_key(settings)
    preload(settings).join()
    made = _preloads[key][1][0]
    load_everything.clear()
    open_app()
    assert key not in _preloads  # taken over by the page's first run
    assert load_everything(settings, key) is made


def test_a_start_that_failed_in_the_background_is_shown_on_the_page(app_home, tmp_path, monkeypatch):
    from kb.core.settings import load_settings
    from ui.resources import _preloads, _settings_key, app_settings, load_everything, preload

    broken = tmp_path / "taxonomy.yaml"
    broken.write_text("name: [unclosed\n", encoding="utf-8")
    monkeypatch.setenv("PMKB_TAXONOMY", str(broken))
    app_settings.clear()
    settings = load_settings()
    preload(settings).join()
    assert isinstance(_preloads[_settings_key(settings)][1][0], Exception)
    load_everything.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert any("pmkb cannot start" in e.value and "taxonomy" in e.value for e in at.error), [e.value for e in at.error]
