"""The retriever -> prompt -> model -> parse chain of an LLM-assisted answer, as LangChain Runnables.

``structured_chain`` composes the four steps pmkb runs for an LLM-assisted answer; each step
is a plain function, so each can be called and tested alone. langchain is imported when a chain
or a document is first built, not with this module: ``pmkb suggest`` without a model never
loads it. (The knowledge base as a LangChain retriever is ``kb.llm.retriever``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from kb.core.suggestion import SimilarIncident
from kb.llm.backends import Generator, ResponseCache, request_key
from kb.llm.prompting import PromptTemplate

if TYPE_CHECKING:
    from langchain_core.documents import Document
    from langchain_core.runnables import Runnable


def incident_document(hit: SimilarIncident, description: str = "") -> Document:
    """A retrieved incident as a Document: its text, and its labels and scores as metadata."""
    from langchain_core.documents import Document

    text = "\n".join(p for p in (hit.title, description, f"Resolution: {hit.resolution}"
                                 if hit.resolution else "") if p)
    return Document(page_content=text, id=hit.id, metadata={
        "kind": "incident", "id": hit.id, "title": hit.title, "score": hit.score, "dense": hit.dense,
        "lexical": hit.lexical, "symptom": hit.symptom, "root_cause": hit.root_cause,
        "root_cause_dimension": hit.root_cause_dimension, "mitigation": hit.mitigation,
        "resolution": hit.resolution, "provenance": hit.provenance, "source": hit.source})


Prepare = Callable[[dict], dict]
"""Turns the chain input plus ``documents`` into template variables and a JSON schema."""
Parse = Callable[[str, dict], Any]
"""Validates the raw answer against the prepared request; raises ValueError when invalid."""


def call_model(generator: Generator, template: PromptTemplate, cache: ResponseCache | None,
               request: dict, max_tokens: int) -> dict:
    """The model's raw answer for a rendered request, from the cache when the same request was seen."""
    key = request_key(template.record(), generator.describe(), request["messages"], request["schema"],
                      max_tokens)
    raw, where = cache.get(key) if cache else (None, None)
    if raw is None:
        raw = generator.generate_json(request["messages"], request["schema"], max_tokens)
    return {**request, "raw": raw, "cache": where, "cache_key": key}


def parse_step(parse: Parse, cache: ResponseCache | None, generator: Generator,
               template: PromptTemplate, result: dict) -> dict:
    """Validate the raw answer; a valid answer is cached, an invalid one is reported, not raised."""
    try:
        answer = parse(result["raw"], result)
    except ValueError as exc:
        return {**result, "answer": None, "error": str(exc)}
    if cache is not None and result["cache"] is None:
        cache.put(result["cache_key"], result["raw"], {"template": template.record(),
                                                      "model": generator.describe()})
    return {**result, "answer": answer, "error": None}


def structured_chain(retrieve: Callable[[dict], list[Document]], prepare: Prepare, generator: Generator,
                     template: PromptTemplate, parse: Parse, cache: ResponseCache | None = None,
                     max_tokens: int = 320) -> Runnable:
    """retriever -> prompt -> model -> structured output, as one LangChain Runnable.

    The output is the input plus ``documents``, ``messages``, ``schema``, ``raw``, ``cache``
    ("memory", "disk" or None), ``answer`` (the parsed answer or None) and ``error``.
    Backend failures (server down, timeout) raise ``LLMError``.
    """
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    def render(state: dict) -> dict:
        """Prepared variables rendered into chat messages."""
        prepared = prepare(state)
        messages = template.render(**prepared["variables"])
        return {**state, **prepared, "messages": messages}

    return (RunnablePassthrough.assign(documents=RunnableLambda(retrieve))
            | RunnableLambda(render)
            | RunnableLambda(lambda request: call_model(generator, template, cache, request, max_tokens))
            | RunnableLambda(lambda result: parse_step(parse, cache, generator, template, result)))

