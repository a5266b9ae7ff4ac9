"""Triage page: paste a ticket, read the suggestion, ask follow-ups, confirm or correct the labels."""

from __future__ import annotations

import streamlit as st

from kb.core.rank_logs import RankLogError, read_upload, sources_as_text
from kb.core.redact import redact
from kb.core.suggestion import EmptyTicket, Suggestion, Ticket
from kb.jobs.feedback import FeedbackError, LabelSet, incident_id_for, save_feedback
from kb.llm.chat import answer_followup
from ui.card import apply_threshold, render_card, render_evidence, render_similar
from ui.highlight import escape_markdown as md
from ui.highlight import highlight_evidence, tame_markdown
from ui.resources import Loaded, abstain_threshold, loaded, refresh_engine

RESULT = "triage"  # session-state key: the ticket, its suggestion, chat history, saved feedback


def _suggest(res: Loaded, ticket: Ticket) -> Suggestion:
    try:
        return res.suggester.suggest(ticket)
    except EmptyTicket:
        raise
    except Exception as exc:  # noqa: BLE001 - the model failed; the engine still answers
        if res.suggester is res.engine:
            raise
        st.warning(f"The LLM could not answer ({exc}); showing the retrieval engine's suggestion.")
        return res.engine.suggest(ticket)


def _ticket_form(res: Loaded) -> None:
    with st.form("ticket"):
        title = st.text_input("Title", key="ticket-title",
                              placeholder="e.g. 64-node pretrain crashed at step 48k")
        description = st.text_area("Description", height=180, key="ticket-description",
                                   placeholder="What happened, job id, nodes, what was tried")
        log = st.text_area("Log excerpt (optional)", height=110, key="ticket-log",
                           placeholder="Paste the error lines: Xid, NCCL, Traceback, dmesg ...")
        uploads = st.file_uploader("Job logs (optional)", accept_multiple_files=True, key="ticket-logs",
                                   help="The ranks' log files or a tarball of them: a collective timeout in "
                                        "them is traced to the ranks and node that never arrived")
        ticket_id = st.text_input("Ticket id (optional)", key="ticket-id", placeholder="e.g. OPS-1234")
        submitted = st.form_submit_button("Suggest", type="primary", icon=":material/troubleshoot:")
    if not submitted:
        return
    try:
        log = "\n".join(p for p in (log, _uploaded_logs(uploads)) if p)
    except RankLogError as exc:
        st.error(f"The job logs could not be read: {exc}")
        return
    ticket = Ticket(title=title, description=description, log=log)
    ticket = ticket.model_copy(update={"id": ticket_id.strip() or incident_id_for(ticket)})
    try:
        with st.spinner("Looking for similar incidents and evidence ..."):
            suggestion = _suggest(res, ticket)
    except EmptyTicket:
        st.warning("Paste a title, a description or a log excerpt first.")
        return
    previous = st.session_state.get(RESULT)
    st.session_state[RESULT] = {"ticket": ticket, "suggestion": suggestion, "chat": [], "saved": None,
                                "round": (previous["round"] + 1) if previous else 1}


def _uploaded_logs(uploads) -> str:
    """The uploaded job logs as one log text, each rank's file marked with its rank."""
    sources = [source for upload in uploads or () for source in read_upload(upload.name, upload.getvalue())]
    return sources_as_text(sources)


def _answer_close_call(res: Loaded, cause: str) -> None:
    """The engineer answered the card's close-call question: suggest again with the answer."""
    result = st.session_state.get(RESULT)
    if result is None:
        return
    ticket = result["ticket"].model_copy(update={"close_call_answer": cause})
    result["ticket"], result["suggestion"] = ticket, _suggest(res, ticket)
    result["round"] += 1  # a new feedback form, defaulting to the re-ranked labels


def _ticket_text(result: dict, shown: Suggestion) -> None:
    text = redact(result["ticket"].text())
    body, marked = highlight_evidence(text, shown.evidence)
    with st.expander(f"Ticket text ({marked} evidence line{'s' if marked != 1 else ''} highlighted)",
                     expanded=True):
        st.html(body)


def _feedback(res: Loaded, result: dict) -> None:
    tax = res.kb.taxonomy
    s: Suggestion = result["suggestion"]
    n = result["round"]
    saved = result.get("saved")
    with st.expander("Accept or correct the labels: saves the ticket to the knowledge base",
                     icon=":material/rule:"):
        with st.form(f"feedback-{n}"):
            c1, c2, c3 = st.columns(3)
            symptom = c1.selectbox("Symptom", tax.symptom_ids, key=f"fb-symptom-{n}",
                                   index=_index(tax.symptom_ids, s.symptom),
                                   format_func=lambda i: f"{tax.symptom(i).name} ({i})")
            cause = c2.selectbox("Root cause", tax.cause_ids, key=f"fb-cause-{n}",
                                 index=_index(tax.cause_ids, s.root_cause),
                                 format_func=lambda i: f"{tax.root_cause(i).name} · {tax.dimension_of(i)}")
            mitigation = c3.selectbox("Mitigation", tax.mitigation_ids, key=f"fb-mitigation-{n}",
                                      index=_index(tax.mitigation_ids, s.mitigation),
                                      format_func=lambda i: f"{tax.mitigation(i).name} ({i})")
            reviewer = st.text_input("Your name (optional)", key=f"fb-reviewer-{n}")
            resolution = st.text_area("What fixed it (optional)", key=f"fb-resolution-{n}", height=80)
            if s.abstained:
                st.caption("The engine was not sure: check the root cause before saving.")
            save = st.form_submit_button("Save as confirmed incident", icon=":material/check:")
        if save:
            labels = LabelSet(symptom=symptom, root_cause=cause, mitigation=mitigation)
            try:
                with res.lock, st.spinner("Adding the ticket to the knowledge base ..."):
                    record = save_feedback(res.kb, result["ticket"], s, labels, reviewer, resolution)
                    refresh_engine(res)
            except FeedbackError as exc:
                st.error(str(exc))
            else:
                result["saved"] = record
                saved = record
    if saved is not None:
        changes = ", ".join(f"{name}: {getattr(saved.suggested, name)} → {getattr(saved.new, name)}"
                            for name in saved.changed) or "labels as suggested"
        replaced = ""
        if saved.previous is not None:
            before = " / ".join(str(getattr(saved.previous, name)) for name in ("symptom", "root_cause",
                                                                               "mitigation"))
            replaced = f" It replaced the stored incident with this id (labels were {md(before)})."
        st.success(f"Saved **{md(saved.incident_id)}** as a confirmed incident "
                   f"({saved.action} by {md(saved.reviewer)}: {md(changes)}).{replaced} "
                   "The next search will find it.", icon=":material/task_alt:")


def _index(ids: list[str], value: str | None) -> int:
    return ids.index(value) if value in ids else 0


def _chat(res: Loaded, result: dict, shown: Suggestion) -> None:
    st.markdown("#### Ask about this suggestion")
    history: list[dict] = result["chat"]
    conversation = st.container()
    with conversation:
        for message in history:
            with st.chat_message(message["role"]):
                st.markdown(md(message["content"]) if message["role"] == "user" else message["content"])
    question = st.container().chat_input("Ask a follow-up, e.g. 'is it safe to resubmit?'")
    if not question:
        return
    with conversation, st.chat_message("user"):
        st.markdown(md(question))
    with conversation, st.chat_message("assistant"):
        chunks = answer_followup(res.engine, shown, question, history=list(history))
        answer = st.write_stream(tame_markdown(chunk) for chunk in chunks)
    history.append({"role": "user", "content": question})
    history.append({"role": "assistant", "content": answer if isinstance(answer, str) else
                    "".join(str(part) for part in answer)})


def render() -> None:
    """The triage page."""
    res = loaded()
    threshold = abstain_threshold(res.settings)
    st.title("Triage a ticket")
    left, right = st.columns([5, 6], gap="large")
    with left:
        _ticket_form(res)
    result = st.session_state.get(RESULT)
    if result is None:
        right.info("Paste a ticket on the left: title, description and, if you have it, the error "
                   "lines from the log. pmkb suggests the root cause, what to do next and the "
                   "past incidents that looked like it.", icon=":material/arrow_back:")
        return
    shown = apply_threshold(result["suggestion"], threshold, res.kb.taxonomy)
    with left:
        _ticket_text(result, shown)
        render_evidence(shown)
        render_similar(shown, res.kb.taxonomy, res.kb.store)
    with right:
        render_card(shown, res.kb.taxonomy, threshold, on_answer=lambda cause: _answer_close_call(res, cause))
        _feedback(res, result)
        _chat(res, result, shown)


render()
