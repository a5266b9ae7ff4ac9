"""Incidents page: browse and filter the knowledge base, open one incident."""

from __future__ import annotations

import streamlit as st

from kb.core.incidents import Provenance
from kb.jobs.dashboard import UNLABELLED, IncidentFilter, filter_incidents
from ui.card import render_incident
from ui.highlight import escape_markdown as md
from ui.resources import all_incidents, loaded

COLUMNS = ["id", "title", "symptom", "root_cause", "dimension", "mitigation", "provenance",
           "created_at", "source"]


def _filters(tax) -> IncidentFilter:
    c1, c2, c3, c4 = st.columns(4)
    symptoms = c1.multiselect("Symptom", tax.symptom_ids + [UNLABELLED], key="browse-symptom")
    causes = c2.multiselect("Root cause", tax.cause_ids + [UNLABELLED], key="browse-cause")
    dimensions = c3.multiselect("Dimension", [d.id for d in tax.dimensions] + [UNLABELLED],
                                key="browse-dimension")
    provenances = c4.multiselect("Provenance", [p.value for p in Provenance], key="browse-provenance")
    text = st.text_input("Text", key="browse-text", placeholder="words that must all appear: "
                         "id, title, description, resolution, source or tags")
    return IncidentFilter(symptoms=symptoms, root_causes=causes, dimensions=dimensions,
                          provenances=provenances, text=text)


def render() -> None:
    """The incident browser."""
    res = loaded()
    tax = res.kb.taxonomy
    st.title("Incidents")
    incidents = all_incidents(res.kb)
    rows = filter_incidents(incidents, tax, _filters(tax))
    st.caption(f"{len(rows)} of {len(incidents)} incidents")
    if not rows:
        st.info("No incident matches these filters.")
        return
    st.dataframe([{k: r[k] for k in COLUMNS} for r in rows], hide_index=True, width="stretch", height=420,
                 column_config={"title": st.column_config.TextColumn(width="large"),
                                "created_at": st.column_config.TextColumn("created")})
    by_id = {i.id: i for i in incidents}
    chosen = st.selectbox("Open an incident", [r["id"] for r in rows], key="browse-open",
                          format_func=lambda i: f"{i}: {by_id[i].title[:100]}")
    if chosen:
        with st.container(border=True):
            st.markdown(f"#### {md(by_id[chosen].title or chosen)}")
            render_incident(by_id[chosen], tax)


render()
