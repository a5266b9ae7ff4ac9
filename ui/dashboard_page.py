"""Dashboard page: what the knowledge base holds, over time, beside the published Platform-X split."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from kb.jobs.dashboard import (
    automation,
    collective_timeouts,
    dimension_comparison,
    distribution,
    incident_rows,
    over_time,
    published_source,
    summary,
)
from kb.jobs.feedback import audit_lines
from ui.highlight import escape_markdown as md
from ui.resources import all_incidents, loaded

DIMENSION_SCALE = alt.Scale(domain=["hardware", "platform", "user", "unlabelled"],
                            range=["#e45756", "#4c78a8", "#b279a2", "#bab0ac"])
KB_LABEL = "this knowledge base"
PUBLISHED_LABEL = "Platform-X (published)"


def _dimension_chart(comparison: list[dict]) -> alt.Chart:
    long = pd.DataFrame(
        [{"dimension": r["dimension"], "source": KB_LABEL, "share": r["knowledge_base"]} for r in comparison]
        + [{"dimension": r["dimension"], "source": PUBLISHED_LABEL, "share": r["published"]}
           for r in comparison if r["published"] is not None])
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("dimension:N", title=None, axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("source:N", sort=[KB_LABEL, PUBLISHED_LABEL]),
        y=alt.Y("share:Q", axis=alt.Axis(format="%"), title="share of labelled incidents"),
        color=alt.Color("source:N", sort=[KB_LABEL, PUBLISHED_LABEL],
                        scale=alt.Scale(range=["#4c78a8", "#bab0ac"]), legend=alt.Legend(orient="bottom")),
        tooltip=["dimension", "source", alt.Tooltip("share:Q", format=".1%")])


def _ranked_chart(rows: list[dict], field: str, names: dict[str, str],
                  dimensions: dict[str, str] | None = None) -> alt.Chart:
    frame = pd.DataFrame(distribution(rows, field))
    frame["name"] = frame[field].map(lambda label: names.get(label, label))
    encoding = {"x": alt.X("incidents:Q", title="incidents"),
                "y": alt.Y("name:N", sort="-x", title=None, axis=alt.Axis(labelLimit=240)),
                "tooltip": ["name", field, "incidents", alt.Tooltip("share:Q", format=".1%")]}
    if dimensions is not None:
        frame["dimension"] = frame[field].map(lambda c: dimensions.get(c, "unlabelled"))
        encoding["color"] = alt.Color("dimension:N", scale=DIMENSION_SCALE,
                                      legend=alt.Legend(orient="bottom"))
    return alt.Chart(frame).mark_bar().encode(**encoding).properties(height=alt.Step(20))


def _trend_chart(rows: list[dict]) -> alt.Chart | None:
    data = over_time(rows, "dimension", "month")
    if not data:
        return None
    frame = pd.DataFrame(data)
    frame["month"] = pd.to_datetime(frame["period"] + "-01")
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("yearmonth(month):T", title="month"), y=alt.Y("sum(incidents):Q", title="incidents"),
        color=alt.Color("dimension:N", scale=DIMENSION_SCALE, legend=alt.Legend(orient="bottom")),
        tooltip=["period", "dimension", "incidents"]).properties(height=260)


def _collective_timeouts(incidents) -> None:
    """Collective-timeout crashes per month and by job size, beside all crashes."""
    figures = collective_timeouts(incidents)
    st.subheader("Collective timeouts")
    if not figures["crashes"]:
        st.caption("No crash of this cluster yet (the bundled reports describe other clusters).")
        return
    st.metric("Collective timeouts among crashes", f"{figures['timeouts']} of {figures['crashes']}",
              help="Crashes whose ticket shows an NCCL or collective timeout (docs/nccl.md)")
    left, right = st.columns(2)
    for column, key, label in ((left, "by_month", "month"), (right, "by_size", "job size (GPUs as stated)")):
        table = pd.DataFrame(figures[key]).rename(columns={"key": label, "timeouts": "collective timeouts"})
        column.dataframe(table, hide_index=True, width="stretch")


def render() -> None:
    """The dashboard."""
    res = loaded()
    tax = res.kb.taxonomy
    st.title("Knowledge base dashboard")
    rows = incident_rows(all_incidents(res.kb), tax)
    if not rows:
        st.info("The knowledge base is empty: run `pmkb ingest` or `pmkb build`.")
        return
    head = summary(rows)
    cols = st.columns(4)
    cols[0].metric("Incidents", head["incidents"])
    cols[1].metric("Labelled", head["labelled"])
    cols[2].metric("Confirmed by engineers", head["confirmed"])
    cols[3].metric("Machine-suggested", head["machine_suggested"])

    comparison = dimension_comparison(rows, tax)
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader("Root-cause dimension")
        st.altair_chart(_dimension_chart(comparison), width="stretch")
    with right:
        st.subheader("Beside Platform-X")
        st.dataframe([{"dimension": r["name"], "incidents": r["incidents"],
                       "here": f"{r['knowledge_base']:.2%}",
                       "Platform-X": f"{r['published']:.2%}" if r["published"] is not None else "-"}
                      for r in comparison], hide_index=True, width="stretch")
        st.caption("Platform-X split as published in " + md(published_source(tax) or "the taxonomy") + ".")

    left, right = st.columns(2, gap="large")
    with left:
        st.subheader("By symptom")
        st.altair_chart(_ranked_chart(rows, "symptom", {x.id: x.name for x in tax.symptoms}),
                        width="stretch")
    with right:
        st.subheader("By root cause")
        st.altair_chart(_ranked_chart(rows, "root_cause", {c.id: c.name for c in tax.root_causes},
                                      {c.id: c.dimension for c in tax.root_causes}), width="stretch")

    st.subheader("Over time")
    trend = _trend_chart(rows)
    if trend is None:
        st.caption("No incident has a date.")
    else:
        st.altair_chart(trend, width="stretch")
        undated = head["incidents"] - head["dated"]
        if undated:
            st.caption(f"{undated} undated incident(s) are not in this chart.")

    incidents = all_incidents(res.kb)
    saved = automation(incidents, tax, res.settings.handling_minutes)
    st.subheader("What automating remediation would save")
    if not saved["total"]:
        st.caption("No labelled incident of this cluster yet (the bundled reports describe other clusters).")
    else:
        cols = st.columns(4)
        cols[0].metric("Retry-safe with a named node", f"{saved['plans']} of {saved['total']}")
        cols[1].metric("Plan precision", f"{saved['precision']:.0%}" if saved["precision"] is not None else "-",
                       help="Of those, mitigated by resubmission or node repair (the expert's label)")
        cols[2].metric("Distinct nodes", saved["distinct_nodes"],
                       help="Repeat offenders: " + (", ".join(f"{n} ({c})" for n, c in saved["repeat_offenders"])
                                                    or "none"))
        cols[3].metric("On-call hours saved", f"{saved['minutes_saved'] / 60:.1f}",
                       help=f"Right plans x {saved['minutes_per_incident']:g} min (PMKB_HANDLING_MINUTES)")

    _collective_timeouts(incidents)

    st.subheader("Provenance")
    st.bar_chart(pd.DataFrame(distribution(rows, "provenance")), x="provenance", y="incidents",
                 horizontal=True, height=140)
    recent = audit_lines(res.settings)
    if recent:
        st.subheader("Recent feedback")
        st.markdown("\n".join(f"- {md(line)}" for line in recent))


render()
