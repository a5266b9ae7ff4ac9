"""Write a suggestion back to its ticket: labels and one pmkb comment, on GitHub or Jira.

Idempotent: the comment carries a marker, so a second run (a redelivery, an edited ticket, a
restart mid-way) finds the comment it posted before and updates it instead of adding another.
Only a marked comment written by the account behind pmkb's token is pmkb's: anyone can type the
marker. The comment records, on its last line, the labels pmkb itself added; only those are ever
removed, so a label a person put on the ticket stays even when it equals one pmkb suggests.

``write_suggestion`` does this on any ``TicketSystem``: a GitHub or Jira client, or a dry run's
outbox, which records each intended call in a JSONL file instead of calling the API.
``write_back`` picks the system from the settings; ``write_back_retrying`` also retries it in
process on transient errors (tenacity), for callers without a durable queue.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from kb.core.abstain import TOO_LITTLE_ADVICE, TOO_LITTLE_TEXT
from kb.core.settings import Settings
from kb.core.suggestion import CAUSE_LABEL, DIMENSION_LABEL, Suggestion, labelling
from kb.tickets.api import TicketRef, TicketSystem, WriteBackError, ticket_api
from kb.tickets.markup import inert, inert_code, thread_link
from kb.tickets.outbox import OutboxTicketSystem

__all__ = ["GITHUB_MARKER", "JIRA_MARKER", "OutboxTicketSystem", "TicketRef", "TicketSystem", "WriteBackError",
           "labels_added_by_pmkb", "labels_in_comment", "render_comment", "suggestion_labels", "write_back",
           "write_back_retrying", "write_suggestion"]

GITHUB_MARKER = "<!-- pmkb:suggestion -->"
"""First line of the pmkb comment on GitHub (an HTML comment: invisible when rendered)."""
JIRA_MARKER = "{{pmkb:suggestion}}"
"""First line of the pmkb comment on Jira (wiki markup has no hidden text)."""
MARKER_TOKEN = "pmkb:suggestion"
LABEL_PREFIXES = ("rc:", "dim:", "symptom:")
_LABELS_LINE = re.compile(r"^\W*Labels:?\W*(.*)$", re.MULTILINE)
_LABEL = re.compile(r"\b(?:rc|dim|symptom):[A-Za-z0-9_.-]+")
# The record of the labels pmkb added: the comment's last line, which only pmkb writes (ticket text
# is quoted on lines of its own, never the last one).
_ADDED_LINE = re.compile(r"^(?:<!-- |\{\{)pmkb:added((?: (?:rc|dim|symptom):[A-Za-z0-9_.-]+)+)(?: -->|\}\})$")


def suggestion_labels(s: Suggestion) -> list[str]:
    """The labels the suggestion is sure of (``labelling``): cause, dimension and symptom when its
    prediction set holds one cause; the dimension (and the symptom when its set holds one) when the
    set's causes share a dimension or the owner is sure; none otherwise."""
    kind = labelling(s)
    symptom = [f"symptom:{s.symptom}"] if len(s.symptom_set) <= 1 else []
    if kind == CAUSE_LABEL:
        return [f"rc:{s.root_cause}", f"dim:{s.root_cause_dimension}", f"symptom:{s.symptom}"]
    if kind == DIMENSION_LABEL:
        return [f"dim:{s.root_cause_dimension}", *symptom]
    return []


def render_comment(suggestion: Suggestion, threshold_note: bool, system: str = "github",
                   added: list[str] | tuple[str, ...] = (), link_hosts: Iterable[str] = ()) -> str:
    """The pmkb comment for a ticket: GitHub Markdown, or Jira wiki markup when ``system="jira"``.

    ``threshold_note`` adds a closing line explaining that labels are applied only above the
    confidence threshold. ``added`` are the labels pmkb itself put on the ticket; a last line
    records them (hidden on GitHub) for ``labels_added_by_pmkb``. Every text that comes from the
    knowledge base, the ticket or a model is rendered inert (``kb.tickets.markup``); a similar
    incident links its thread only when the source is on one of ``link_hosts``.
    """
    s, gh = suggestion, system == "github"
    text = lambda t, width=200: inert(t, system, width)  # noqa: E731
    code = (lambda t: f"`{t}`") if gh else (lambda t: "{{" + t + "}}")
    bold = (lambda t: f"**{t}**") if gh else (lambda t: f"*{t}*")
    lines = [GITHUB_MARKER if gh else JIRA_MARKER]
    heading = "### " if gh else "h3. "
    if s.abstained:
        lines.append(f"{heading}pmkb is not sure about the root cause")
        lines.append(f"No labels were applied: {TOO_LITTLE_ADVICE}. Candidates so far:"
                     if s.abstain_reason == TOO_LITTLE_TEXT else
                     f"The best guess is at {s.root_cause_confidence:.0%}, below the confidence threshold, "
                     "so no labels were applied. Candidates:")
        lines += [f"{'1.' if gh else '#'} {code(c.id)} {c.confidence:.0%}" for c in s.root_cause_candidates]
    else:
        lines.append(f"{heading}pmkb suggestion: {text(s.root_cause_name, 100)} ({code(s.root_cause)}, "
                     f"{s.root_cause_dimension}) at {s.root_cause_confidence:.0%}")
        others = ", ".join(f"{code(c.id)} {c.confidence:.0%}" for c in s.root_cause_candidates[1:3])
        if others:
            lines.append(f"Next candidates: {others}")
    if len(s.root_cause_set) > 1:
        lines.append(f"{bold(f'One of these {len(s.root_cause_set)} causes ({s.set_level:.0%}):')} "
                     + ", ".join(f"{code(m.id)} ({m.dimension})" for m in s.root_cause_set))
    if s.close_call and s.close_call.answered:
        lines.append(f"{bold('Answered:')} {text(s.close_call.question, 400)} answered on the page -> "
                     f"{code(s.close_call.answered)}: {text(s.close_call.answers[s.close_call.answered], 300)}")
    elif s.close_call:
        first, second = s.close_call.causes
        lines.append(f"{bold('To decide:')} {text(s.close_call.question, 400)} "
                     f"{code(first)}: {text(s.close_call.answers[first], 300)} "
                     f"{code(second)}: {text(s.close_call.answers[second], 300)}")
        if s.close_call.ticket_says:
            lines.append(f'The ticket says "{text(s.close_call.ticket_says.span, 160)}", which points to '
                         f"{code(s.close_call.ticket_points_to)} (check it)")
    if s.owner:
        lines.append(f"{bold('Owner:')} {text(s.owner.dimension, 40)} {s.owner.confidence:.0%}"
                     + (f" (sure enough to label: right {s.owner.precision:.0%} of the time at this probability)"
                        if s.owner.labelled and s.owner.precision else ""))
    for r in s.readings:
        read = f"{bold(r.kind.capitalize() + ':')} {text(r.name, 60)} {r.confidence:.0%}"
        read += f', from "{text(r.span, 160)}"' if r.span else ""
        lines.append(read + (f" -> points to {text(r.points_to, 40)}" if r.points_to else ""))
    if s.collective:
        lines.append(f"{bold('Collective timeout:')} {text(s.collective.kind.replace('_', ' '), 20)}: "
                     f"{text(s.collective.summary, 400)}")
        lines += [f"{code(inert_code(line, system, 200))}" for line in s.collective.evidence[:3]]
    suspect = ", ".join(f"{k} {text(v, 60)}" for k, v in (s.suspect or {}).items())
    lines.append(f"{bold('Symptom:')} {code(s.symptom)} {s.symptom_confidence:.0%}. "
                 f"{bold('Retry safe:')} {'yes' if s.retry_safe else 'no'}"
                 + (f". {bold('Suspect:')} {suspect}" if suspect else ""))
    if s.node_history:
        lines.append(f"{bold('Seen before:')} {text(s.node_history.summary(), 600)}")
    if s.remediation and s.remediation.outcome:
        lines.append(f"{bold('Remediation')} ({s.remediation.scheduler}): {text(s.remediation.outcome, 600)}")
    elif s.remediation:
        lines.append(f"{bold('Remediation plan')} ({s.remediation.scheduler}, not run: `pmkb remediate` runs it "
                     f"when the policy allows): " + "; ".join(
                         f"{n}. {text(step.summary, 160)} {code(inert_code(step.shown(), system, 300))}"
                         for n, step in enumerate(s.remediation.steps, 1)))
    labels = suggestion_labels(s)
    lines.append(f"{bold('Labels:')} " + (" ".join(code(label) for label in labels) if labels else "none"))
    if s.explanation:
        lines += ["", text(s.explanation, 600)]
    bullet = "-" if gh else "*"
    if s.evidence:
        lines += ["", bold("Evidence")]
        lines += [f"{bullet} {code(inert_code(e.signal, system, 80))}: {code(inert_code(e.text, system))} -> "
                  f"{text(e.points_to, 80)}: {text(e.explanation)}" for e in s.evidence[:6]]
    if s.similar_incidents:
        lines += ["", bold("Similar incidents")]
        lines += [f"{bullet} {bold(text(h.id, 80))} ({h.score:.2f}): {text(h.title, 120)} "
                  f"({text(h.root_cause or 'unlabelled', 60)} -> {text(h.mitigation or '-', 60)})"
                  f"{thread_link(h.source, system, link_hosts)}"
                  for h in s.similar_incidents]
    if s.mitigations:
        lines += ["", bold("Mitigation")]
        for m in s.mitigations:
            seen = f" (as in {', '.join(text(i, 80) for i in m.from_incidents[:3])})" if m.from_incidents else ""
            lines.append(f"{'1.' if gh else '#'} {bold(m.id)} {m.confidence:.0%}: "
                         f"{text(m.next_step, 300)}{seen}")
    if s.low_gpu_utilisation:
        lines += ["", bold("Low GPU utilisation checks")]
        lines += [f"{bullet} {text(h.name, 100)}: {text(h.fix, 300)}" for h in s.low_gpu_utilisation]
    footer = [s.trace.get("engine", "pmkb"), "this comment is updated when the ticket changes"]
    if threshold_note and s.root_cause_set:
        level = s.set_level if s.label_set is None else s.label_level
        footer.append(f"labels follow the {level:.0%} prediction set: the cause when it holds one cause, "
                      "the dimension when its causes share one, none otherwise")
    elif threshold_note:
        footer.append("labels are applied only when the top root cause reaches the confidence threshold; "
                      "below it pmkb lists candidates instead")
    lines += ["", f"<sub>{'; '.join(footer)}.</sub>" if gh else "_" + "; ".join(footer) + "._"]
    if added:
        lines.append(f"<!-- pmkb:added {' '.join(added)} -->" if gh else "{{pmkb:added " + " ".join(added) + "}}")
    return "\n".join(lines)


def labels_in_comment(body: str) -> list[str]:
    """The labels a pmkb comment says were applied (from its Labels line)."""
    match = _LABELS_LINE.search(body)
    return _LABEL.findall(match.group(1)) if match else []


def labels_added_by_pmkb(body: str) -> list[str]:
    """The labels a pmkb comment records pmkb itself added (from its last line; none if it has no record)."""
    lines = body.strip().splitlines()
    match = _ADDED_LINE.match(lines[-1].strip()) if lines else None
    return match.group(1).split() if match else []


def write_suggestion(system: TicketSystem, suggestion: Suggestion, link_hosts: Iterable[str] = ()) -> dict:
    """Label the ticket and create or update the one pmkb comment on it; returns what was done.
    The comment links a similar incident's thread only on ``link_hosts``.

    Raises WriteBackError when a call fails (see its ``retryable`` and ``retry_after``).
    """
    ref, labels = system.ref, suggestion_labels(suggestion)
    me = system.identity()
    existing = next((c for c in system.comments() if MARKER_TOKEN in (c.get("body") or "") and me.owns(c)), None)
    on_ticket = system.labels()
    ours = labels_added_by_pmkb(existing["body"]) if existing else []
    # A suggested label already on the ticket and not recorded as pmkb's was put there by a person.
    add = [x for x in labels if x not in on_ticket]
    removed = [x for x in ours if x in on_ticket and x not in labels]
    kept = [x for x in labels if x in add or x in ours]

    def body(record: list[str]) -> str:
        return render_comment(suggestion, threshold_note=True, system=ref.system, added=record, link_hosts=link_hosts)

    # The comment's record of pmkb's labels is written before the labels change, and still holds
    # the ones about to be removed: when a call fails in between, the retry finds every label of
    # pmkb's in the record. Once they are gone, the record drops them.
    planned = body(kept + removed)
    if existing and existing.get("body") == planned:
        outcome, comment_id = "unchanged", existing["id"]
    elif existing:
        system.update_comment(existing["id"], planned)
        outcome, comment_id = "updated", existing["id"]
    else:
        outcome, comment_id = "created", system.create_comment(planned)
    system.change_labels(add, removed)
    if removed:
        system.update_comment(comment_id, body(kept))
    done = {"system": ref.system, "ticket": ref.key, "dry_run": False, "labels_added": add,
            "labels_removed": removed, "comment": outcome, "comment_id": comment_id}
    return {**done, **system.outcome()}


def write_back(settings: Settings, ref: TicketRef, suggestion: Suggestion, outbox: Path | None = None,
               client: httpx.Client | None = None) -> dict:
    """``write_suggestion`` on the ticket's system: GitHub or Jira over ``client`` (one of its own
    when None), or a dry run into ``outbox`` (or ``settings.writeback_outbox``) when one is set."""
    outbox, hosts = outbox or settings.writeback_outbox, settings.link_hosts(ref.system)
    if outbox is not None:
        return write_suggestion(OutboxTicketSystem(Path(outbox), ref), suggestion, hosts)
    own_client = client is None
    client = client or httpx.Client()
    try:
        return write_suggestion(ticket_api(settings, ref, client), suggestion, hosts)
    finally:
        if own_client:
            client.close()


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, WriteBackError) and exc.retryable


MAX_RETRY_WAIT = 900.0
"""The longest ``write_back_retrying`` waits for a rate limit to reset (seconds); a longer one is
raised at once, saying when to come back."""


def write_back_retrying(settings: Settings, ref: TicketRef, suggestion: Suggestion, outbox: Path | None = None,
                        attempts: int = 3, sleep: Callable[[float], None] = time.sleep,
                        max_wait: float = MAX_RETRY_WAIT) -> dict:
    """``write_back``, tried up to ``attempts`` times while the error is retryable, waiting 1 s,
    2 s, 4 s ... between tries, or as long as the ticket system asks (Retry-After, a rate-limit
    reset) up to ``max_wait``; the last error is raised as it is."""
    def waits_for(exc: BaseException) -> float:
        return exc.retry_after or 0.0 if isinstance(exc, WriteBackError) else 0.0

    def wait(state) -> float:
        return min(max(backoff(state), waits_for(state.outcome.exception())), max_wait)

    backoff = wait_exponential(multiplier=1, exp_base=2)
    retrying = Retrying(stop=stop_after_attempt(attempts), wait=wait, reraise=True, sleep=sleep,
                        retry=retry_if_exception(lambda exc: _transient(exc) and waits_for(exc) <= max_wait))
    return retrying(write_back, settings, ref, suggestion, outbox=outbox)
