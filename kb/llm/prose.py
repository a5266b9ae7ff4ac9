"""What a model writes is checked like what it labels: the explanation's length and what it names.

``fit_explanation`` keeps an explanation to whole sentences within the limit; ``check_prose``
says why an explanation may not be shown on a card (it names another root cause or symptom than
the card shows, or an incident the suggestion does not cite or show).
"""

from __future__ import annotations

import re

from kb.core.suggestion import Suggestion
from kb.core.taxonomy import Taxonomy
from kb.llm.prompting import cited_ids

EXPLANATION_CHARS = 300
"""Longest explanation shown; the schema and the prompt both tell the model."""

_SENTENCE_END = re.compile(r"[.!?](?=[\s)]|$)")


def fit_explanation(text: str, limit: int = EXPLANATION_CHARS) -> tuple[str | None, str]:
    """(text to show or None, what was done: ``whole``, ``cut ...`` or ``rejected: ...``).

    An explanation within the limit that ends a sentence is shown whole; one over the limit or
    cut off mid-sentence is cut back to its last full sentence within the limit; without one,
    it is rejected (never cut mid-word).
    """
    text = " ".join(text.split())
    if not text:
        return None, "rejected: empty"
    if len(text) <= limit and _SENTENCE_END.search(text[-1:]):
        return text, "whole"
    ends = [m.end() for m in _SENTENCE_END.finditer(text) if m.end() <= limit]
    why = f"over {limit} characters ({len(text)})" if len(text) > limit else "ends mid-sentence"
    if not ends:
        return None, f"rejected: {why}, with no full sentence within {limit} characters"
    return text[:ends[-1]], f"cut at the last full sentence ({ends[-1]} of {len(text)} characters): {why}"


def _mentions(text: str, term: str) -> bool:
    """Whether ``term`` appears in ``text`` as a whole word or phrase (case and spacing ignored)."""
    words = r"\s+".join(re.escape(w) for w in term.split())
    return re.search(rf"(?<![\w-]){words}(?![\w-])", text, re.IGNORECASE) is not None


def _label_terms(taxonomy: Taxonomy) -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, id, terms naming it) for every root cause (id and name) and symptom (id)."""
    causes = [("root cause", c.id, (c.id, c.name)) for c in taxonomy.root_causes]
    return causes + [("symptom", s.id, (s.id,)) for s in taxonomy.symptoms]


_ID_LIKE = re.compile(r"(?<![\w.:-])[A-Za-z][\w.:-]*\d[\w.:-]*(?<![.:-])")


def check_prose(text: str, shown: Suggestion, taxonomy: Taxonomy, known_ids: set[str],
                cited: list[str]) -> str | None:
    """Why the explanation may not be shown on this card, or None when it may.

    It may name only the root cause and symptom the card shows (by id, or the cause by its
    taxonomy name), and only the incidents the answer cites or the card lists as similar;
    ``known_ids`` are the knowledge base's incident ids, so node names are not taken for them.
    """
    expected = {"root cause": shown.root_cause, "symptom": shown.symptom}
    for kind, label, terms in _label_terms(taxonomy):
        if label != expected[kind] and any(_mentions(text, term) for term in terms):
            return f"it names {kind} {label}, but the card shows {expected[kind]}"
    allowed = set(cited) | {h.id for h in shown.similar_incidents}
    mentioned = cited_ids(text) + [m for m in _ID_LIKE.findall(text) if m in known_ids]
    outside = [i for i in dict.fromkeys(mentioned) if i not in allowed]
    if outside:
        return f"it names incident {', '.join(outside)}, which the suggestion does not cite or show"
    return None
