"""Follow-up questions about a suggestion: streamed from the model, or answered from the knowledge base.

Every answer is grounded in a fresh retrieval (the question plus the ticket's context) and
cites incidents by id. Without a model the same retrieval is rendered as a plain answer.

What people write here (the question and the conversation so far) is redacted like a ticket
before it is embedded or put in a prompt: an engineer pasting a log with a token in it does not
send the token to the model.
"""

from __future__ import annotations

from typing import Iterator

from langchain_core.documents import Document

from kb.core.redact import redact
from kb.core.untrusted import neutralise
from kb.llm.backends import Generator, LLMError, LLMUnavailable, shared_generator
from kb.llm.chain import incident_document
from kb.llm.prompting import cited_ids, load_prompt
from kb.llm.retriever import KnowledgeRetriever

CHAT_TOKENS = 384
"""Longest answer the model may write; always reserved in the context window."""
HISTORY_TURNS = 6
NO_MODEL = ("No language model is configured (PMKB_LLM=none), so this answer is put together "
            "from the knowledge base without one.")


def ticket_context(suggestion) -> str:
    """What the suggestion knows about the ticket, as retrieval text (labels, evidence, suspect)."""
    parts = [suggestion.root_cause_name, suggestion.root_cause, suggestion.symptom]
    parts += [e.text for e in suggestion.evidence[:5]]
    if suggestion.suspect:
        parts += list(suggestion.suspect.values())
    return "\n".join(p for p in parts if p)


def retrieve_for_question(engine, suggestion, question: str, k: int = 5) -> list[Document]:
    """Incidents and taxonomy entries for the question in the ticket's context.

    Incidents retrieved for the question come first, then the suggestion's own similar
    incidents not already there; taxonomy entries last.
    """
    found = KnowledgeRetriever(engine=engine, k=k, taxonomy_k=2).invoke(
        f"{question}\n{ticket_context(suggestion)}")
    incidents = [d for d in found if d.metadata["kind"] == "incident"]
    seen = {d.metadata["id"] for d in incidents}
    incidents += [incident_document(h) for h in suggestion.similar_incidents if h.id not in seen][:3]
    return incidents + [d for d in found if d.metadata["kind"] != "incident"]


def _first_sentence(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    text = text[:end + 1] if 0 < end < limit else text
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def retrieval_answer(suggestion, documents: list[Document], note: str = NO_MODEL) -> Iterator[str]:
    """A plain answer from the retrieved documents, one line per chunk, citing incident ids."""
    yield note + "\n\n"
    yield (f"For ticket {suggestion.id} the engine suggests {suggestion.root_cause} "
           f"({suggestion.root_cause_name}, {suggestion.root_cause_confidence:.0%}); next step: "
           f"{suggestion.mitigations[0].next_step if suggestion.mitigations else suggestion.mitigation}\n\n")
    incidents = [d for d in documents if d.metadata["kind"] == "incident"]
    if incidents:
        yield "Past incidents that bear on the question:\n"
    for doc in incidents:
        meta = doc.metadata
        fix = f" Resolved: {_first_sentence(meta['resolution'])}" if meta.get("resolution") else ""
        yield f"- [{meta['id']}] {meta['title']} (root cause {meta['root_cause'] or 'unlabelled'}).{fix}\n"
    entries = [d for d in documents if d.metadata["kind"] != "incident"]
    if entries:
        yield "\nTaxonomy entries:\n"
    for doc in entries:
        yield f"- {doc.metadata['id']} ({doc.metadata['kind']}): {_first_sentence(doc.page_content)}\n"


def chat_variables(suggestion, documents: list[Document], question: str, history: list[dict],
                   resolution_chars: int = 400) -> dict:
    """Template variables for the chat prompt; people's text is redacted and neutralised."""
    incidents = [d.metadata for d in documents if d.metadata["kind"] == "incident"]
    return {
        "example_id": incidents[0]["id"] if incidents else "incident-id",
        "ticket_id": suggestion.id, "root_cause": suggestion.root_cause,
        "root_cause_name": suggestion.root_cause_name,
        "confidence_pct": f"{suggestion.root_cause_confidence:.0%}", "symptom": suggestion.symptom,
        "mitigation": suggestion.mitigation,
        "evidence": [{"signal": e.signal, "text": neutralise(e.text)} for e in suggestion.evidence[:5]],
        "documents": [{**m, "resolution": neutralise(m.get("resolution") or "")[:resolution_chars]}
                      for m in incidents],
        "taxonomy": [{"kind": d.metadata["kind"], "id": d.metadata["id"],
                      "text": _first_sentence(d.page_content, 300)}
                     for d in documents if d.metadata["kind"] != "incident"],
        "history": [{"role": h.get("role", "user"),
                     "content": neutralise(redact(str(h.get("content", ""))))[:1500]}
                    for h in history[-HISTORY_TURNS:]],
        "question": neutralise(redact(question)),
    }


def chat_messages(generator: Generator, suggestion, documents: list[Document], question: str,
                  history: list[dict]) -> list[dict]:
    """Rendered chat prompt that fits the model's context with room for the answer."""
    template = load_prompt("chat")
    room = generator.context - CHAT_TOKENS
    docs = list(documents)
    while True:
        messages = template.render(**chat_variables(suggestion, docs, question, history))
        used = sum(generator.count_tokens(m["content"]) for m in messages) + 16
        if used <= room or (not docs and not history):
            return messages
        if history:
            history = history[1:]
        else:
            docs = docs[:-1]


def answer_followup(engine, suggestion, question: str, history: list[dict] | None = None,
                    generator: Generator | None = None) -> Iterator[str]:
    """Answer a follow-up question about a suggestion, yielding the answer in chunks.

    With a model (``generator``, or the one ``engine.settings`` configures) the answer is
    streamed token by token; without one (``llm: none``) it is a retrieval answer. If the
    model fails mid-way the retrieval answer follows a note saying why.
    """
    question = redact((question or "").strip())
    if not question:
        raise ValueError("ask a question about the ticket (the question is empty)")
    documents = retrieve_for_question(engine, suggestion, question)
    if generator is None and engine.settings.llm != "none":
        try:
            generator = shared_generator(engine.settings)
        except LLMUnavailable as exc:  # not set up (no model path or URL): say so, answer without it
            yield from retrieval_answer(suggestion, documents, note=f"The model is not available ({exc}).")
            return
    if generator is None:
        yield from retrieval_answer(suggestion, documents)
        return
    allowed = {d.metadata["id"] for d in documents if d.metadata["kind"] == "incident"}
    written = []
    try:
        messages = chat_messages(generator, suggestion, documents, question, list(history or []))
        for piece in generator.stream(messages, CHAT_TOKENS):
            written.append(piece)
            yield piece
    except LLMError as exc:
        yield "\n\n" if written else ""
        yield from retrieval_answer(suggestion, documents, note=f"The model failed ({exc}).")
        return
    unknown = [i for i in cited_ids("".join(written)) if i not in allowed]
    if unknown:
        yield (f"\n\n(Note: {', '.join(f'[{i}]' for i in unknown)} is not among the incidents retrieved "
               "for this question; disregard that reference.)")
