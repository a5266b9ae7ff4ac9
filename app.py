"""The pmkb chat page: triage a ticket, browse the knowledge base, see its dashboard.

Run with ``make run`` (or ``streamlit run app.py``); settings come from PMKB_* variables.
The pages live in ui/; everything they compute comes from kb/.
"""

from __future__ import annotations

import streamlit as st

from ui.resources import loaded, render_sidebar

st.set_page_config(page_title="pmkb triage", page_icon=":material/troubleshoot:", layout="wide")

page = st.navigation([
    st.Page("ui/triage_page.py", title="Triage", icon=":material/troubleshoot:", default=True),
    st.Page("ui/incidents_page.py", title="Incidents", icon=":material/list_alt:", url_path="incidents"),
    st.Page("ui/dashboard_page.py", title="Dashboard", icon=":material/bar_chart:", url_path="dashboard"),
])
render_sidebar(loaded())
page.run()
