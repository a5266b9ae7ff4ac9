"""The reader: scope and change read from a ticket, learnt from expert-labelled reports.

Each reading is a text classifier (kb/engine/textclf.py: words, character n-grams and the
embedding) trained on the bundled reports' labelled readings; the words an expert quoted as the
reason count as a second, shorter sample, which teaches the classifier what a deciding sentence
looks like. A ticket's reading is the classifier's most probable value; its evidence is the
sentence of the ticket that the same classifier scores highest for that value.

A ticket-level classifier also learns which words go with which causes: "CUDA out of memory" is
nearly always one job, so a ticket that says so in its title and "every job on the cluster fails
the same way" later is read as one job. A second model per reading reads single sentences (its
words alone: the experts' quoted spans as samples of their value, the tickets' other sentences as
saying nothing) and states a value when a sentence says it. Its statement replaces the
ticket-level reading when it is sure (``STATED``) and the ticket-level reading is a value no
sentence states (one job, not said) or is unsure (``TICKET_SURE``); the reading is then that
sentence's, shown with it. The reading's distributions that feed the root-cause model stay the
ticket-level classifier's, on which its weight was fitted.

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
SAYS_NOTHING = "-"
"""The sentence models' label of a sentence that states no value (not a valid value id)."""
SENTENCE_MODEL = "{kind}_sentences"
"""Name of a reading's sentence model among the text classifiers."""
SENTENCE_MODEL_SETTINGS = {"strength": 8.0, "word_ngrams": 2}
"""A sentence model's words and pairs of words, more regularised than a ticket's classifier: a
sentence has few words, and "worked yesterday" says what neither word says alone."""
STATED = 0.5
"""How sure a reading's sentence model must be that a sentence states a value for it to count."""
TICKET_SURE = 0.8
"""A ticket-level reading of a stated value at least this sure is kept over a sentence's."""
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


def sentence_samples(incidents: list[Incident], labels: dict[str, ReadingLabel], vocabulary: ReadingVocabulary,
                     kind: str) -> tuple[list[str], list[str]]:
    """(sentences, labels) a reading's sentence model learns from: each expert span of a value a
    sentence can state, labelled with it, and each other sentence of the labelled tickets as
    ``SAYS_NOTHING`` (a sentence that holds or is held by the span is left out)."""
    stated = set(vocabulary.stated_ids(kind))
    texts, truths = [], []
    for incident in incidents:
        label = labels.get(incident.id)
        if label is None:
            continue
        value, span = getattr(label, kind), getattr(label, f"{kind}_span").strip()
        if span and value in stated:
            texts.append(span)
            truths.append(value)
        for _, piece in sentences(incident.text()):
            if not (span and (piece.lower() in span.lower() or span.lower() in piece.lower())):
                texts.append(piece)
                truths.append(SAYS_NOTHING)
    return texts, truths


def ticket_classifiers(classifiers: dict[str, TextClassifier]) -> dict[str, TextClassifier]:
    """The classifiers that read a whole ticket (causes, symptoms, readings): all but the sentence models."""
    sentence_models = {SENTENCE_MODEL.format(kind=kind) for kind in KINDS}
    return {name: c for name, c in classifiers.items() if name not in sentence_models}


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
        self.sentence_models = {kind: classifiers[name] for kind in KINDS
                                if (name := SENTENCE_MODEL.format(kind=kind)) in classifiers}

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
            value_id, confidence, span, start = value_ids[best], float(probs[best]), "", -1
            stated = self.stated(kind, pieces)
            if stated is not None and stated[0] != value_id and (
                    confidence < TICKET_SURE or value_id not in self.vocabulary.stated_ids(kind)):
                value_id, confidence, start, span = stated
            elif value_id != UNKNOWN and pieces:
                scores = self.classifiers[kind].log_proba([p for _, p in pieces], vectors)[:, best]
                start, span = pieces[int(np.argmax(scores))]
            value = self.vocabulary.value(kind, value_id)
            found.append(Reading(kind=kind, id=value.id, name=value.name, confidence=round(confidence, 4),
                                 span=span[:200], start=start, points_to=value.points_to))
        return found

    def stated(self, kind: str, pieces: list[tuple[int, str]]) -> tuple[str, float, int, str] | None:
        """(value, probability, start, sentence) of the sentence that most surely states a value of
        ``kind``; None when no sentence states one at least ``STATED`` sure (or there is no model)."""
        model = self.sentence_models.get(kind)
        if model is None or not pieces:
            return None
        probs = np.exp(model.log_proba([p for _, p in pieces], np.zeros((len(pieces), 0))))
        values = [n for n, label in enumerate(model.labels) if label != SAYS_NOTHING]
        row, column = np.unravel_index(int(np.argmax(probs[:, values])), (len(pieces), len(values)))
        p = float(probs[row, values[column]])
        if p < STATED:
            return None
        start, sentence = pieces[row]
        return model.labels[values[column]], p, start, sentence
