"""The knowledge base as a LangChain retriever (an adapter: it imports langchain when imported).

``KnowledgeRetriever`` returns past incidents and taxonomy entries as LangChain ``Document``s
whose metadata carries the labels, so any LangChain pipeline can use the knowledge base.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from kb.llm.chain import incident_document


def taxonomy_documents(kb, vector: np.ndarray, k: int) -> list[Document]:
    """The k taxonomy entries (root causes and symptoms) closest to a query vector."""
    vectors = kb.store.taxonomy_vectors()
    if not vectors or k <= 0:
        return []
    entries = {entry_id: (meta, doc) for entry_id, meta, doc in kb.store.taxonomy_entries()}
    scored = sorted(((float(np.dot(vector, vec)), key) for key, vec in vectors.items() if key in entries),
                    reverse=True)[:k]
    out = []
    for score, key in scored:
        meta, doc = entries[key]
        out.append(Document(page_content=doc, id=key, metadata={
            "kind": meta.get("kind"), "id": meta.get("label"), "name": meta.get("name"),
            "dimension": meta.get("dimension") or None, "score": round(score, 4)}))
    return out


class KnowledgeRetriever(BaseRetriever):
    """Past incidents (hybrid BM25 + dense) and taxonomy entries for a query, as Documents.

    Incident documents come first, best first, with ``metadata["kind"] == "incident"``;
    taxonomy documents follow with ``kind`` ``root_cause`` or ``symptom``.
    """

    engine: Any  # a SuggestionEngine: its knowledge base and retriever are reused
    k: int = 5
    taxonomy_k: int = 3
    where: dict | None = None  # label filter, as for Retriever.retrieve_similar
    exclude: set[str] | None = None

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        kb = self.engine.kb
        vector = kb.embedder.embed_query(query)
        hits = self.engine.retriever.retrieve_similar(query, k=self.k, where=self.where,
                                                      query_vector=vector, exclude=self.exclude)
        docs = []
        for hit in hits:
            stored = kb.store.get_incident(hit.id)
            docs.append(incident_document(hit, stored.description if stored else ""))
        return docs + taxonomy_documents(kb, vector, self.taxonomy_k)
