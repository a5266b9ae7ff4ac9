"""The corpus snapshot: what the engine derives from one state of the store, built once, read-only.

A suggestion reads one snapshot from start to end: the voting incidents and their lexical index,
the label priors, how each cause was mitigated, the node index and the trained text classifiers
all belong to the same store state. When the store changes, ``Snapshots`` builds the next one and
swaps it in with a single assignment, so a thread never sees one part new and another stale.

Refitting the text classifiers takes seconds. A long-running service can let it happen in the
background (``refit_in_background``): until it is done, suggestions use the new corpus with the
previous classifiers, and the request that noticed the change is not held up.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from kb.core.incidents import Incident
from kb.core.roles import Retriever
from kb.engine.calibrate import Calibrator
from kb.engine.history import node_index
from kb.engine.knowledge import KnowledgeBase
from kb.engine.mitigate import cause_mitigations
from kb.engine.readings import reading_table
from kb.engine.textclf import TextClassifier

log = logging.getLogger(__name__)

Classifiers = dict[str, TextClassifier]


def label_priors(incidents: list[Incident], field_name: str, labels: list[str]) -> dict[str, float]:
    """How often each label occurs among the incidents, Laplace-smoothed."""
    counts = Counter(getattr(i, field_name) for i in incidents)
    total = sum(counts[label] for label in labels)
    return {label: (counts[label] + 1) / (total + len(labels)) for label in labels}


@dataclass(frozen=True)
class CorpusSnapshot:
    """Everything the engine derives from one state of the store (see the module doc)."""

    incidents: list[Incident]  # the retriever's (voting) incidents; the list's identity keys the snapshot
    priors: dict[str, dict[str, float]]  # incident field -> label -> smoothed prior
    mitigations: dict[str, dict[str, float]]  # cause -> how its incidents were mitigated
    classifiers: Classifiers  # incident field -> trained text classifier
    fingerprint: str  # digest of the incidents the classifiers were trained on
    readings: dict = field(default_factory=dict)  # reading -> (values, causes) P(cause | value) / P(cause)
    nodes: Callable[[], dict[str, list[Incident]]] = field(repr=False, default=dict)
    """The node index (all incidents, labelled or not), computed on first use: most tickets name no node."""


class Snapshots:
    """The current snapshot of a retriever's incidents, rebuilt when the retriever reloads.

    Its text classifiers are the previous snapshot's when trained on the same incidents, else the
    calibrator's cached or freshly fitted ones.
    """

    def __init__(self, retriever: Retriever, kb: KnowledgeBase, calibrator: Calibrator,
                 refit_in_background: bool = False):
        self.retriever = retriever
        self.kb = kb
        self.calibrator = calibrator
        self.refit_in_background = refit_in_background
        self._current: CorpusSnapshot | None = None
        self._lock = threading.Lock()
        self._refitting: str | None = None  # fingerprint being fitted in the background
        self._refit_thread: threading.Thread | None = None

    def current(self) -> CorpusSnapshot:
        """The snapshot of the retriever's corpus as it is now (built on a change, once)."""
        incidents = self.retriever.incidents()  # a new list whenever the retriever reloads
        snapshot = self._current
        if snapshot is not None and snapshot.incidents is incidents:
            return snapshot
        with self._lock:
            snapshot = self._current
            if snapshot is None or snapshot.incidents is not incidents:
                snapshot = self._build(incidents, snapshot)
                self._current = snapshot  # one assignment: readers get the old or the new, never a mix
        return snapshot

    def _build(self, voters: list[Incident], previous: CorpusSnapshot | None) -> CorpusSnapshot:
        tax = self.kb.taxonomy
        fingerprint = self.calibrator.fingerprint(voters)
        if previous is not None and previous.fingerprint == fingerprint:
            classifiers = previous.classifiers
        elif previous is not None and self.refit_in_background:
            self._refit_later(voters, fingerprint)
            classifiers, fingerprint = previous.classifiers, previous.fingerprint
        else:
            classifiers = self.calibrator.text_classifiers(voters, fingerprint)
        return CorpusSnapshot(
            incidents=voters, fingerprint=fingerprint, classifiers=classifiers,
            priors={"root_cause": label_priors(voters, "root_cause", tax.cause_ids),
                    "symptom": label_priors(voters, "symptom", tax.symptom_ids)},
            mitigations=cause_mitigations(tax, voters),
            readings=({} if self.calibrator.readings is None else
                      reading_table(voters, self.calibrator.readings[1], self.calibrator.readings[0], tax.cause_ids)),
            nodes=functools.cache(lambda: node_index(self.kb.store.incidents())))

    def _refit_later(self, voters: list[Incident], fingerprint: str) -> None:
        """Fit classifiers for ``fingerprint`` in a thread, then swap them into the then-current
        snapshot if it still holds the same incidents."""
        if self._refitting == fingerprint:
            return
        self._refitting = fingerprint

        def refit() -> None:
            try:
                classifiers = self.calibrator.text_classifiers(voters, fingerprint)
            except Exception:  # noqa: BLE001 - the old classifiers keep serving; said in the log
                log.exception("refitting the text classifiers failed; the previous ones stay in use")
                return
            finally:
                self._refitting = None
            with self._lock:
                snapshot = self._current
                if snapshot is not None and snapshot.incidents is voters:  # no newer change since
                    self._current = replace(snapshot, classifiers=classifiers, fingerprint=fingerprint)
            log.info("text classifiers refitted on %d incidents", len(self._current.incidents))

        self._refit_thread = threading.Thread(target=refit, name="pmkb-refit", daemon=True)
        self._refit_thread.start()

    def wait_for_refit(self, timeout: float = 300.0) -> None:
        """Block until a background refit (if any) is done; for tests and orderly shutdown."""
        if self._refit_thread is not None:
            self._refit_thread.join(timeout)
