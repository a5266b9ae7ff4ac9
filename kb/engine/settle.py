"""A close call settled by the ticket itself, when its text already answers the deciding question.

The question between improper_permission and platform_misconfiguration is "refused to everyone,
or only to this user?"; a ticket that says "other users in my team see the same" has answered it.
The close-calls file names, for each cause of a pair, the readings that give its answer
(``settled_by``: "scope:many_users"). The knowledge base says how far to trust each: among its
labelled incidents of the two causes, how much more often the reading goes with the one cause
than with the other (a likelihood ratio). When the ticket's reading matches and the ratio is
worth acting on, the pair's odds are multiplied by it (capped): the ranking moves, the question
is marked answered, and the card shows the words that answered it.
"""

from __future__ import annotations

from kb.core.close_calls import CloseCalls
from kb.core.incidents import Incident
from kb.core.readings import Reading, ReadingLabel
from kb.core.suggestion import CloseCallQuestion

MIN_READING_CONFIDENCE = 0.6
"""A reading less sure than this answers nothing."""
MIN_RATIO = 2.0
"""A reading whose likelihood ratio is below this in the knowledge base does not settle the call."""
MAX_RATIO = 8.0
"""The most one answer read from the ticket moves the odds between the two causes."""
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


def settle(causes: list[tuple[str, float]], question: CloseCallQuestion, close_calls: CloseCalls,
           readings: list[Reading], odds: AnswerOdds) -> tuple[list[tuple[str, float]], CloseCallQuestion | None]:
    """The ranking after the ticket's readings answer ``question``, and the question marked
    answered; the ranking as it was and None when the readings do not answer it."""
    entry = close_calls.question_for(*question.causes)
    if entry is None or not entry.settled_by:
        return causes, None
    sure = {f"{r.kind}:{r.id}": r for r in readings if r.confidence >= MIN_READING_CONFIDENCE}
    first, second = question.causes
    ratio, answered_by = 1.0, {}
    for cause, sign in ((first, 1), (second, -1)):
        for reading, value in odds.get((entry.pair, cause), {}).items():
            if reading in sure and value >= MIN_RATIO:
                ratio *= min(value, MAX_RATIO) ** sign
                answered_by[cause] = sure[reading]
    if max(ratio, 1 / ratio) < MIN_RATIO:
        return causes, None
    winner = first if ratio > 1 else second
    return _reweigh(causes, first, second, ratio), question.model_copy(
        update={"answered": winner, "answered_by": answered_by[winner], "answered_from": "ticket"})


def settle_by_engineer(causes: list[tuple[str, float]], question: CloseCallQuestion,
                       answer: str) -> tuple[list[tuple[str, float]], CloseCallQuestion | None]:
    """The ranking after an engineer answered ``question`` for the cause ``answer``; unchanged (and
    None) when the answer is not one of the question's two causes."""
    if answer not in question.causes:
        return causes, None
    first, second = question.causes
    ratio = ENGINEER_RATIO if answer == first else 1 / ENGINEER_RATIO
    return _reweigh(causes, first, second, ratio), question.model_copy(
        update={"answered": answer, "answered_from": "engineer"})


def _reweigh(causes: list[tuple[str, float]], first: str, second: str, ratio: float) -> list[tuple[str, float]]:
    """The ranking with the odds of ``first`` over ``second`` multiplied by ``ratio`` (their sum kept)."""
    p = dict(causes)
    total, pair_odds = p[first] + p[second], p[first] / max(p[second], 1e-9) * ratio
    p[first] = total * pair_odds / (1 + pair_odds)
    p[second] = total - p[first]
    return sorted(p.items(), key=lambda item: -item[1])
