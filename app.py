"""Streamlit page: paste a ticket, see similar past incidents from the knowledge base."""

from __future__ import annotations

import streamlit as st

from kb.knowledge import KnowledgeBase
from kb.search import Retriever
from kb.settings import load_settings


@st.cache_resource(show_spinner="Loading the knowledge base ...")
def load_retriever() -> Retriever:
    """Open (and if empty, build) the knowledge base once per process."""
    knowledge = KnowledgeBase(load_settings())
    knowledge.ensure_built()
    return Retriever(knowledge)


st.set_page_config(page_title="pmkb", layout="wide")
st.title("pmkb: postmortem knowledge base")
retriever = load_retriever()
st.caption(f"{retriever.kb.store.count()} incidents in {retriever.kb.store.location}")
ticket = st.text_area("Ticket", placeholder="Paste the ticket title, description and log excerpt")
if st.button("Find similar incidents") and ticket.strip():
    for hit in retriever.retrieve_similar(ticket, k=5):
        with st.expander(f"{hit.score:.2f}  {hit.id}: {hit.title}"):
            st.write(f"**{hit.root_cause}** ({hit.root_cause_dimension}), symptom {hit.symptom}")
            st.write(hit.resolution)
