"""A close call's question: what the ticket's own words say to it, and the engineer's answer.

The question between improper_permission and platform_misconfiguration is "refused to everyone,
or only to this user?"; a ticket that says "other users in my team see the same" speaks to it.
The close-calls file names, for each cause of a pair, the readings that give its answer
(``settled_by``: "scope:many_users"). The knowledge base says how far to trust each: among its
labelled incidents of the two causes, how much more often the reading goes with the one cause
than with the other (a likelihood ratio). When the ticket's reading matches and the ratio is
worth acting on, the question carries the cause the ticket points to and the words that do
(``ticket_hint``); the card quotes them beside the question.

That hint does not move the ranking. The readings already count in the root-cause model (the
reading feature, kb/engine/readings.py); counting them again in the pair's odds was measured to
lower top-1 and the owner on the knowledge base's own reports (docs/readings.md, "What the ticket
says to a close call"). Only the engineer's answer, checked on the cluster, moves the ranking
(``settle_by_engineer``).
"""

from __future__ import annotations

from kb.core.close_calls import CloseCalls
from kb.core.incidents import Incident
from kb.core.readings import Reading, ReadingLabel
from kb.core.suggestion import CloseCallQuestion

MIN_READING_CONFIDENCE = 0.6
"""A reading less sure than this says nothing to the question."""
MIN_RATIO = 2.0
"""A reading whose likelihood ratio is below this in the knowledge base does not point to either cause."""
ENGINEER_RATIO = 50.0
"""How far an engineer's own answer to the question moves them: it is checked on the cluster."""

AnswerOdds = dict[tuple[frozenset[str], str], dict[str, float]]
"""(pair, cause) -> reading ("scope:many_users") -> likelihood ratio for that cause over the other."""


def answer_odds(close_calls: CloseCalls, incidents: list[Incident], labels: dict[str, ReadingLabel]) -> AnswerOdds:
    """For every ``settled_by`` reading of every pair: P(reading | cause) / P(reading | other cause)
    over the labelled incidents of the two causes, with half a count added to each side."""
    by_cause: dict[str, list[set[str]]] = {}
    for incident in incidents:
        label = labels.get(incident.id)
        if label is not None and incident.root_cause:
            by_cause.setdefault(incident.root_cause, []).append({f"scope:{label.scope}", f"change:{label.change}"})
    odds: AnswerOdds = {}
    for entry in close_calls.entries:
        for cause, readings in entry.settled_by.items():
            other = next(c for c in entry.causes if c != cause)
            mine, theirs = by_cause.get(cause, []), by_cause.get(other, [])
            odds[(entry.pair, cause)] = {
                reading: ((sum(reading in r for r in mine) + 0.5) / (len(mine) + 1))
                / ((sum(reading in r for r in theirs) + 0.5) / (len(theirs) + 1))
                for reading in readings}
    return odds


def ticket_hint(question: CloseCallQuestion, close_calls: CloseCalls, readings: list[Reading],
                odds: AnswerOdds) -> CloseCallQuestion | None:
    """``question`` with the cause the ticket's sure readings point to and the reading that does;
    None when they point to neither cause, or to both."""
    entry = close_calls.question_for(*question.causes)
    if entry is None or not entry.settled_by:
        return None
    sure = {f"{r.kind}:{r.id}": r for r in readings if r.confidence >= MIN_READING_CONFIDENCE}
    pointed_by = {cause: sure[reading] for cause in question.causes
                  for reading, value in odds.get((entry.pair, cause), {}).items()
                  if reading in sure and value >= MIN_RATIO}
    if len(pointed_by) != 1:
        return None
    (cause, reading), = pointed_by.items()
    return question.model_copy(update={"ticket_points_to": cause, "ticket_says": reading})


def settle_by_engineer(causes: list[tuple[str, float]], question: CloseCallQuestion,
                       answer: str) -> tuple[list[tuple[str, float]], CloseCallQuestion | None]:
    """The ranking after an engineer answered ``question`` for the cause ``answer``; unchanged (and
    None) when the answer is not one of the question's two causes."""
    if answer not in question.causes:
        return causes, None
    first, second = question.causes
    ratio = ENGINEER_RATIO if answer == first else 1 / ENGINEER_RATIO
    return _reweigh(causes, first, second, ratio), question.model_copy(update={"answered": answer})


def _reweigh(causes: list[tuple[str, float]], first: str, second: str, ratio: float) -> list[tuple[str, float]]:
    """The ranking with the odds of ``first`` over ``second`` multiplied by ``ratio`` (their sum kept)."""
    p = dict(causes)
    total, pair_odds = p[first] + p[second], p[first] / max(p[second], 1e-9) * ratio
    p[first] = total * pair_odds / (1 + pair_odds)
    p[second] = total - p[first]
    return sorted(p.items(), key=lambda item: -item[1])
