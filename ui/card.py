"""The suggestion card and incident details, rendered with Streamlit."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kb.core.abstain import TOO_LITTLE_ADVICE, TOO_LITTLE_TEXT, abstain_reason
from kb.core.incidents import Incident
from kb.core.roles import Store
from kb.core.suggestion import Suggestion, explain
from kb.core.taxonomy import Taxonomy
from ui.highlight import escape_markdown as md
from ui.highlight import safe_link


def apply_threshold(suggestion: Suggestion, threshold: float, taxonomy: Taxonomy) -> Suggestion:
    """The suggestion as shown under another abstain threshold (abstained and retry_safe redone)."""
    reason = abstain_reason(suggestion.root_cause_confidence, threshold,
                            suggestion.abstain_reason == TOO_LITTLE_TEXT)
    if reason == suggestion.abstain_reason:
        return suggestion
    abstained = reason is not None
    cause_safe = (taxonomy.root_cause(suggestion.root_cause).retry_safe
                  if suggestion.root_cause in taxonomy.cause_ids else False)
    shown = suggestion.model_copy(update={"abstained": abstained, "abstain_reason": reason,
                                          "retry_safe": cause_safe and not abstained,
                                          "remediation": None if abstained else suggestion.remediation})
    shown.explanation = explain(shown)
    return shown


def _name(taxonomy: Taxonomy, kind: str, label: str | None) -> str:
    if not label:
        return "-"
    try:
        return getattr(taxonomy, kind)(label).name
    except KeyError:
        return label


def label_line(taxonomy: Taxonomy, symptom: str | None, cause: str | None,
               mitigation: str | None) -> str:
    """Symptom, root cause (with dimension) and mitigation as one escaped markdown line."""
    dimension = taxonomy.dimension_of(cause) if cause in taxonomy.cause_ids else None
    return (f"**Symptom** {md(_name(taxonomy, 'symptom', symptom))} · "
            f"**Root cause** {md(_name(taxonomy, 'root_cause', cause))}"
            + (f" ({md(dimension)})" if dimension else "")
            + f" · **Mitigation** {md(_name(taxonomy, 'mitigation', mitigation))}")


def render_incident(incident: Incident, taxonomy: Taxonomy) -> None:
    """Labels, description, resolution and source of a stored incident."""
    st.markdown(label_line(taxonomy, incident.symptom, incident.root_cause, incident.mitigation))
    when = f"{incident.created_at:%Y-%m-%d}" if incident.created_at else "undated"
    link = safe_link(incident.source)
    source = f"[{md(incident.source)}]({link})" if link else md(incident.source or "unknown source")
    st.caption(f"{md(incident.id)} · {when} · {md(incident.provenance.value)} · source: {source}")
    st.markdown("**Description**")
    st.markdown(md(incident.description) or "_none_")
    st.markdown("**Resolution**")
    st.markdown(md(incident.resolution) or "_not recorded_")


def below_threshold(confidence: float, threshold: float) -> tuple[str, str]:
    """A confidence and the threshold it fell below, as percentages that show the difference
    (34.7% and 35.0%, where whole percentages would read 35% below 35%)."""
    for digits in range(3):
        shown, bar = f"{confidence:.{digits}%}", f"{threshold:.{digits}%}"
        if shown != bar:
            break
    return shown, bar


def _verdict(s: Suggestion, threshold: float, taxonomy: Taxonomy) -> None:
    dimension = s.root_cause_dimension
    if s.abstain_reason == TOO_LITTLE_TEXT:
        st.warning(f"**Not sure:** {md(TOO_LITTLE_ADVICE)}. The best guess would be {md(s.root_cause_name)} "
                   f"({md(dimension)}) at {s.root_cause_confidence:.0%}.", icon=":material/help:")
        return
    if s.abstained:
        shown, bar = below_threshold(s.root_cause_confidence, threshold)
        st.warning(f"**Not sure.** The best guess, {md(s.root_cause_name)} ({md(dimension)}), has "
                   f"{shown} confidence, below the abstain threshold of {bar}. Read the evidence and "
                   "similar incidents before acting, and record the real cause below once it is known.",
                   icon=":material/help:")
        return
    st.caption("Root cause")
    st.markdown(f"### {md(s.root_cause_name)}")
    st.badge(dimension, color=taxonomy.dimension_colour(dimension))
    st.caption(f"`{s.root_cause}`")
    st.progress(min(max(s.root_cause_confidence, 0.0), 1.0),
                text=f"confidence {s.root_cause_confidence:.0%}")


def _prediction_set(s: Suggestion, taxonomy: Taxonomy, on_answer: Callable[[str], None] | None = None) -> None:
    """"One of these N causes (90%)" with each member's dimension, and the question that decides:
    answered by the engineer, or with what the ticket's words say to it and a button per answer."""
    if len(s.root_cause_set) < 2:
        if s.root_cause_set:
            st.caption(f"The {s.set_level:.0%} prediction set holds this cause alone.")
        return
    st.markdown(f"**One of these {len(s.root_cause_set)} causes ({s.set_level:.0%}):**")
    for m in s.root_cause_set:
        st.markdown(f"- {md(_name(taxonomy, 'root_cause', m.id))} :{taxonomy.dimension_colour(m.dimension)}"
                    f"-badge[{md(m.dimension or '?')}] {m.confidence:.0%}")
    question = s.close_call
    if question is None:
        return
    first, second = question.causes
    if question.answered:
        st.success(f"**Answered:** {md(question.question)}\n\nyou answered: "
                   f"{md(question.answers.get(question.answered, ''))} → "
                   f"**{md(_name(taxonomy, 'root_cause', question.answered))}**", icon=":material/quiz:")
        return
    hint = (f"\n\nThe ticket says “{md(question.ticket_says.span)}”, which points to "
            f"**{md(_name(taxonomy, 'root_cause', question.ticket_points_to))}**: check it and answer."
            if question.ticket_says else "")
    st.info(f"**To decide:** {md(question.question)}\n\n"
            f"- {md(_name(taxonomy, 'root_cause', first))}: {md(question.answers[first])}\n"
            f"- {md(_name(taxonomy, 'root_cause', second))}: {md(question.answers[second])}{hint}",
            icon=":material/quiz:")
    if on_answer is not None:
        columns = st.columns(2)
        for column, cause in zip(columns, (first, second)):
            column.button(f"It is {_name(taxonomy, 'root_cause', cause)}", key=f"answer-{cause}",
                          help=question.answers[cause], on_click=on_answer, args=(cause,),
                          icon=":material/check:")


def _readings(s: Suggestion, taxonomy: Taxonomy) -> None:
    """The owner, then scope and change as read from the ticket, the words they were read from, and
    where they point."""
    if s.owner:
        sure = (f" · sure enough to route (right {s.owner.precision:.0%} of the time at this probability)"
                if s.owner.labelled and s.owner.precision else "")
        st.markdown(f"**Owner:** :{taxonomy.dimension_colour(s.owner.dimension)}-badge[{md(s.owner.dimension)}] "
                    f"{s.owner.confidence:.0%}{sure}")
    for r in s.readings:
        line = f"**{md(r.kind.capitalize())}:** {md(r.name)} {r.confidence:.0%}"
        if r.span:
            line += f", from “{md(r.span)}”"
        if r.points_to:
            line += f" → points to :{taxonomy.dimension_colour(r.points_to)}-badge[{md(r.points_to)}]"
        st.markdown(line)


def _collective(s: Suggestion) -> None:
    """The verdict on the ranks' logs pasted with the ticket: which ranks never arrived, and where."""
    verdict = s.collective
    if verdict is None:
        return
    st.markdown(f"**Collective timeout:** {md(verdict.kind.replace('_', ' '))}: {md(verdict.summary)}")
    if verdict.evidence:
        st.code("\n".join(verdict.evidence[:6]), language=None)


def _candidates(s: Suggestion, taxonomy: Taxonomy) -> None:
    if len(s.root_cause_set) > 1:
        return  # the prediction set shows them
    others = s.root_cause_candidates[1:3]
    if not others:
        return
    items = []
    for c in others:
        dim = taxonomy.dimension_of(c.id) if c.id in taxonomy.cause_ids else "?"
        items.append(f"{md(_name(taxonomy, 'root_cause', c.id))} ({md(dim)}) {c.confidence:.0%}")
    st.markdown("**Next candidates:** " + " · ".join(items))


def _safety(s: Suggestion) -> None:
    left, right = st.columns(2)
    left.markdown("**Retry safe:** " + ("yes, resubmit" if s.retry_safe else "no, find the cause first"))
    if s.suspect:
        right.markdown("**Suspect:** " + ", ".join(f"{md(k)} **{md(v)}**" for k, v in s.suspect.items()))
    else:
        right.markdown("**Suspect:** none named")
    if s.node_history:
        right.markdown(f"**Seen before:** {md(s.node_history.summary())}")


def _remediation(s: Suggestion) -> None:
    plan = s.remediation
    if plan is None:
        return
    with st.expander(f"Remediation plan ({plan.scheduler}): take {plan.node} out"
                     + (f", resubmit job {plan.job}" if plan.job else ""), icon=":material/build:"):
        for n, step in enumerate(plan.steps, 1):
            st.markdown(f"{n}. **{md(step.summary)}**  \n{md(step.changes)}")
            st.code(step.shown(), language="bash" if step.argv else "python")
        if plan.note:
            st.caption(md(plan.note))
        st.caption(f"Nothing has run. `pmkb remediate --scheduler {plan.scheduler} --id {md(plan.ticket)}` "
                   "prints this plan; `--apply` runs it when the team's policy allows (docs/remediation.md).")


def _mitigations(s: Suggestion, taxonomy: Taxonomy) -> None:
    st.markdown("#### Mitigations")
    for rank, step in enumerate(s.mitigations, 1):
        seen = (f" (as in {', '.join(md(i) for i in step.from_incidents)})" if step.from_incidents else "")
        st.markdown(f"{rank}. **{md(_name(taxonomy, 'mitigation', step.id))}** {step.confidence:.0%}"
                    f"{seen}  \n{md(step.next_step)}")


def render_evidence(s: Suggestion) -> None:
    """The log signatures found in the ticket, what each points to and why."""
    if not s.evidence:
        st.caption("No known log signature in the ticket.")
        return
    st.markdown("#### Evidence")
    for item in s.evidence[:8]:
        st.markdown(f"`{item.signal}` → **{md(item.points_to)}**: {md(item.explanation)}")
        st.caption(f"“{md(item.text)}”")


def _low_util(s: Suggestion) -> None:
    if not s.low_gpu_utilisation:
        return
    lines = "\n".join(f"- **{md(h.name)}**: {md(h.fix)}" for h in s.low_gpu_utilisation)
    st.info("**Low GPU utilisation: check these**\n\n" + lines, icon=":material/speed:")


def render_similar(s: Suggestion, taxonomy: Taxonomy, store: Store) -> None:
    """Similar past incidents, each opening on its full stored record."""
    st.markdown("#### Similar past incidents")
    if not s.similar_incidents:
        st.caption("None in the knowledge base.")
    for hit in s.similar_incidents:
        label = (f"{hit.score:.2f} · {hit.id} · {hit.title[:90]} · "
                 f"{hit.root_cause or 'unlabelled'}")
        with st.expander(md(label)):
            incident = store.get_incident(hit.id)
            if incident is None:
                st.caption("This incident is no longer in the knowledge base.")
            else:
                render_incident(incident, taxonomy)


def render_card(shown: Suggestion, taxonomy: Taxonomy, threshold: float,
                on_answer: Callable[[str], None] | None = None) -> None:
    """Verdict, candidates, safety, mitigations and reasoning (the shown threshold already applied);
    ``on_answer(cause)`` is called when the engineer answers the close-call question."""
    with st.container(border=True):
        _verdict(shown, threshold, taxonomy)
        _prediction_set(shown, taxonomy, on_answer)
        _candidates(shown, taxonomy)
        _readings(shown, taxonomy)
        _collective(shown)
        st.markdown(f"**Symptom:** {md(_name(taxonomy, 'symptom', shown.symptom))} "
                    f"{shown.symptom_confidence:.0%}")
        _safety(shown)
    _remediation(shown)
    _low_util(shown)
    _mitigations(shown, taxonomy)
    st.caption(md(shown.explanation))
    st.caption(md(trace_line(shown.trace)))


def trace_line(trace: dict) -> str:
    """Engine, model and timing of a suggestion in one line."""
    llm = trace.get("llm")
    if isinstance(llm, dict):
        llm = "/".join(str(llm[k]) for k in ("backend", "model") if llm.get(k))
    parts = [trace.get("engine"), f"LLM {llm}" if llm else "no LLM", trace.get("embedding_model")]
    if trace.get("latency_ms") is not None:
        parts.append(f"{trace['latency_ms']:.0f} ms")
    if trace.get("llm_failed"):
        parts.append(f"the model failed ({trace.get('llm_error') or 'no answer'}): labels are the engine's")
    return " · ".join(str(p) for p in parts if p)
