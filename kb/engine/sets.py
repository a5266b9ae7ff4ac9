"""A suggestion's prediction sets and, for a close call, the question that decides it.

The sets come from the calibration's conformal scores (``kb/engine/conformal.py``); the question
from the close-calls file (``kb/core/close_calls.py``), for the top cause and the first other
cause that is a close call: in the set and in another dimension, or within ``CLOSE_MARGIN`` of
the top.
"""

from __future__ import annotations

from kb.core.close_calls import CloseCalls
from kb.core.suggestion import Candidate, CloseCallQuestion
from kb.core.taxonomy import Taxonomy
from kb.engine.classify import Calibration

CLOSE_MARGIN = 0.15
"""Two causes whose probabilities are this close are a close call, whatever their dimensions."""


def prediction_sets(calibration: Calibration, taxonomy: Taxonomy, close_calls: CloseCalls, alpha: float,
                    causes: list[tuple[str, float]], symptoms: list[tuple[str, float]],
                    label_alpha: float | None = None) -> dict:
    """The Suggestion fields of the prediction sets for full rankings, best first (empty without
    set calibration); with a ``label_alpha`` other than ``alpha``, also the set that labels follow."""
    if calibration.root_cause_set is None or calibration.symptom_set is None:
        return {}
    p = dict(causes) | dict(symptoms)

    def members(ids: list[str]) -> list[Candidate]:
        return [Candidate(id=c, confidence=round(p[c], 4), dimension=taxonomy.dimension_of(c)) for c in ids]

    cause_set = calibration.root_cause_set.predict(causes, alpha)
    fields = {"root_cause_set": members(cause_set),
              "symptom_set": [Candidate(id=s, confidence=round(p[s], 4))
                              for s in calibration.symptom_set.predict(symptoms, alpha)],
              "set_level": round(1 - alpha, 4), "close_call": close_call(taxonomy, close_calls, causes, cause_set)}
    if label_alpha is not None and label_alpha != alpha:
        fields |= {"label_set": members(calibration.root_cause_set.predict(causes, label_alpha)),
                   "label_level": round(1 - label_alpha, 4)}
    return fields


def close_call(taxonomy: Taxonomy, close_calls: CloseCalls, causes: list[tuple[str, float]],
               cause_set: list[str]) -> CloseCallQuestion | None:
    """The question deciding between the top cause and the first other one that is a close call
    and has a question in the file; None when there is none."""
    (top, top_p), others = causes[0], causes[1:]
    for other, p in others:
        crosses = other in cause_set and taxonomy.dimension_of(other) != taxonomy.dimension_of(top)
        if crosses or top_p - p <= CLOSE_MARGIN:
            entry = close_calls.question_for(top, other)
            if entry is not None:
                return CloseCallQuestion(causes=[top, other], question=entry.question,
                                         answers={c: entry.answer_for(c) for c in (top, other)})
        if top_p - p > CLOSE_MARGIN and other not in cause_set:
            break
    return None
