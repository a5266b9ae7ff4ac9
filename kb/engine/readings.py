"""The reader: scope and change read from a ticket, learnt from expert-labelled reports.

Each reading is a text classifier (kb/engine/textclf.py: words, character n-grams and the
embedding) trained on the bundled reports' labelled readings; the words an expert quoted as the
reason count as a second, shorter sample, which teaches the classifier what a deciding sentence
looks like. A ticket's reading is the classifier's most probable value; its evidence is the
sentence of the ticket that the same classifier scores highest for that value.

The readings reach the root-cause model as one feature (``reading_feature``): how much more
likely each cause is given the ticket's reading distributions than without them, from how
causes and readings co-occur in the labelled knowledge base.
"""

from __future__ import annotations

import re

import numpy as np

from kb.core.incidents import Incident
from kb.core.readings import KINDS, UNKNOWN, Reading, ReadingLabel, ReadingVocabulary
from kb.engine.textclf import TextClassifier

SMOOTHING = 20.0
"""Pseudo-count pulling P(cause | reading value) toward P(cause): a value seen with few
incidents says little about the cause."""
MAX_SENTENCES = 60
"""Sentences scored for the evidence span; a long log adds lines, not readings."""
_SENTENCE = re.compile(r"[^.!?;\n]+(?:[.!?;]+|$)", re.MULTILINE)


def reading_truths(incidents: list[Incident], labels: dict[str, ReadingLabel], kind: str) -> list[str | None]:
    """Each incident's labelled value of one reading (None when it has no label)."""
    return [getattr(labels[i.id], kind) if i.id in labels else None for i in incidents]


def reading_spans(incidents: list[Incident], labels: dict[str, ReadingLabel], kind: str) -> list[str]:
    """Each incident's labelled evidence span of one reading ("" when none)."""
    return [getattr(labels[i.id], f"{kind}_span") if i.id in labels else "" for i in incidents]


def reading_table(incidents: list[Incident], labels: dict[str, ReadingLabel], vocabulary: ReadingVocabulary,
                  cause_ids: list[str]) -> dict[str, np.ndarray]:
    """For each reading, a (values, causes) matrix of P(cause | value) / P(cause) from the labelled
    incidents, smoothed toward 1 (no information) by ``SMOOTHING``."""
    labelled = [i for i in incidents if i.id in labels and i.root_cause in cause_ids]
    column = {c: n for n, c in enumerate(cause_ids)}
    base = np.ones(len(cause_ids))
    for i in labelled:
        base[column[i.root_cause]] += 1
    base /= base.sum()
    table = {}
    for kind in KINDS:
        values = vocabulary.ids(kind)
        counts = np.zeros((len(values), len(cause_ids)))
        for i in labelled:
            value = getattr(labels[i.id], kind)
            if value in values:
                counts[values.index(value), column[i.root_cause]] += 1
        given = (counts + SMOOTHING * base) / (counts.sum(axis=1, keepdims=True) + SMOOTHING)
        table[kind] = given / base
    return table


def reading_feature(distributions: dict[str, np.ndarray], table: dict[str, np.ndarray]) -> np.ndarray:
    """Per cause: the log of how much more likely it is given the readings (sum over readings of
    log sum_v p(v | ticket) * P(cause | v) / P(cause)); zeros without readings."""
    out = None
    for kind, ratios in table.items():
        if kind in distributions:
            term = np.log(np.clip(distributions[kind] @ ratios, 1e-9, None))
            out = term if out is None else out + term
    return out if out is not None else np.zeros(next(iter(table.values())).shape[1] if table else 0)


def sentences(text: str) -> list[tuple[int, str]]:
    """(start, sentence) pieces of a ticket, cut at sentence ends, semicolons and line breaks."""
    found = []
    for match in _SENTENCE.finditer(text):
        piece = match.group(0).strip()
        if len(piece.split()) >= 2:
            found.append((match.start() + match.group(0).index(piece), piece))
        if len(found) >= MAX_SENTENCES:
            break
    return found


class Reader:
    """Takes the scope and change readings of a ticket (see the module doc)."""

    def __init__(self, vocabulary: ReadingVocabulary, classifiers: dict[str, TextClassifier]):
        self.vocabulary = vocabulary
        self.classifiers = {kind: classifiers[kind] for kind in KINDS if kind in classifiers}

    def distributions(self, log_probas: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each reading's probability distribution over its values, from the classifiers' output."""
        return {kind: np.exp(log_probas[kind]) for kind in self.classifiers if kind in log_probas}

    def read(self, text: str, vector: np.ndarray, log_probas: dict[str, np.ndarray]) -> list[Reading]:
        """The readings of one ticket, each with the sentence it was read from."""
        found = []
        pieces = sentences(text)
        vectors = np.repeat(np.asarray(vector)[None, :], len(pieces), axis=0)
        for kind, probs in self.distributions(log_probas).items():
            value_ids = self.classifiers[kind].labels
            best = int(np.argmax(probs))
            value = self.vocabulary.value(kind, value_ids[best])
            span, start = "", -1
            if value.id != UNKNOWN and pieces:
                scores = self.classifiers[kind].log_proba([p for _, p in pieces], vectors)[:, best]
                start, span = pieces[int(np.argmax(scores))]
            found.append(Reading(kind=kind, id=value.id, name=value.name, confidence=round(float(probs[best]), 4),
                                 span=span[:200], start=start, points_to=value.points_to))
        return found
