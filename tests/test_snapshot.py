"""The corpus snapshot: one consistent view per store state, swapped whole, refitted in the background."""

import threading

from kb.core.suggestion import Ticket
from kb.engine.calibrate import Calibrator
from kb.engine.suggest import SuggestionEngine

TICKET = Ticket(title="job killed", description="slurmstepd: error: Detected 1 oom_kill event in step 4.0")


def _small_kb(kb, count: int = 40):
    kb.add_incidents(kb.bundled_incidents()[:count])
    return kb


def test_a_snapshot_is_built_once_per_store_state(empty_kb):
    engine = SuggestionEngine(_small_kb(empty_kb))
    first = engine.snapshot()
    assert engine.snapshot() is first  # nothing changed: the same object
    assert first.fingerprint == engine.calibrator.fingerprint(first.incidents)
    empty_kb.add_incidents(empty_kb.bundled_incidents()[40:45])
    second = engine.snapshot()
    assert second is not first and len(second.incidents) == len(first.incidents) + 5
    assert second.fingerprint == engine.calibrator.fingerprint(second.incidents)
    assert sum(second.priors["root_cause"].values()) > 0.999


def test_threads_never_see_classifiers_of_another_corpus(empty_kb):
    """Suggesting threads race a writer; every snapshot any of them reads is whole."""
    engine = SuggestionEngine(_small_kb(empty_kb, 30))
    engine.suggest(TICKET)
    seen, errors, done = [], [], threading.Event()

    def read():
        while not done.is_set():
            try:
                snapshot = engine.snapshot()
                seen.append((snapshot.fingerprint, engine.calibrator.fingerprint(snapshot.incidents)))
                engine.suggest(TICKET)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    bundled = empty_kb.bundled_incidents()
    for start in range(30, 42, 3):
        empty_kb.add_incidents(bundled[start:start + 3])
        engine.suggest(TICKET)
    done.set()
    for reader in readers:
        reader.join(60)
    assert errors == []
    assert seen and all(stored == computed for stored, computed in seen)
    assert len(engine.snapshot().incidents) == 42


def test_a_background_refit_does_not_hold_up_the_request_that_noticed_the_change(empty_kb, monkeypatch):
    engine = SuggestionEngine(_small_kb(empty_kb), refit_in_background=True)
    engine.suggest(TICKET)
    old = engine.snapshot()
    release, fitting = threading.Event(), threading.Event()
    fit = Calibrator.text_classifiers

    def slow_fit(self, voters, fingerprint):
        fitting.set()
        assert release.wait(60), "the fit was never released"
        return fit(self, voters, fingerprint)

    monkeypatch.setattr(Calibrator, "text_classifiers", slow_fit)
    empty_kb.add_incidents(empty_kb.bundled_incidents()[40:44])
    suggestion = engine.suggest(TICKET)  # answered while the fit is blocked
    current = engine.snapshot()
    assert fitting.wait(30) and suggestion.root_cause
    assert len(current.incidents) == 44 and current.classifiers is old.classifiers
    release.set()
    engine.snapshots.wait_for_refit()
    refitted = engine.snapshot()
    assert refitted.classifiers is not old.classifiers
    assert refitted.fingerprint == engine.calibrator.fingerprint(refitted.incidents)


def test_without_background_refit_the_change_is_fitted_before_answering(empty_kb):
    engine = SuggestionEngine(_small_kb(empty_kb))
    engine.suggest(TICKET)
    old = engine.snapshot()
    empty_kb.add_incidents(empty_kb.bundled_incidents()[40:44])
    engine.suggest(TICKET)
    assert engine.snapshot().classifiers is not old.classifiers


def test_the_classifiers_learn_from_a_sample_that_keeps_every_cause_when_the_corpus_is_large():
    from kb.core.incidents import Incident, Provenance
    from kb.engine.calibrate import training_sample

    common = [Incident(id=f"c{n}", title="t", root_cause="gpu_lost") for n in range(500)]
    rare = [Incident(id=f"r{n}", title="t", root_cause="service_outage") for n in range(7)]
    confirmed = [Incident(id=f"k{n}", title="t", root_cause="gpu_lost", provenance=Provenance.confirmed)
                 for n in range(3)]
    everything = common + rare + confirmed
    sample = training_sample(everything, 100)
    assert len(sample) == 100 and len({i.id for i in sample}) == 100
    assert sum(i.root_cause == "service_outage" for i in sample) == 7  # the rare cause keeps all its incidents
    assert {i.id for i in confirmed} <= {i.id for i in sample}  # confirmed ones come first in their cause
    assert training_sample(everything, 100) == sample  # the same sample every time
    assert training_sample(everything, 1000) == everything


def test_weights_and_sets_are_fitted_on_real_incidents_once_there_are_enough():
    from kb.core.incidents import Incident
    from kb.engine.calibrate import MIN_REAL_INCIDENTS, fitting_rows
    from kb.engine.history import BUNDLED_SOURCE

    written = [Incident(id=f"w{n}", title="t", root_cause="gpu_lost", source=BUNDLED_SOURCE) for n in range(50)]
    public = [Incident(id=f"p{n}", title="t", root_cause="gpu_lost", source=f"https://github.com/o/r/issues/{n}",
                       tags=[BUNDLED_SOURCE]) for n in range(MIN_REAL_INCIDENTS - 1)]
    own = Incident(id="own", title="t", root_cause="gpu_lost", source="jira:OPS-1")
    few = written + public
    assert fitting_rows(few) == list(range(len(few)))  # too few real ones: every incident
    enough = written + public + [own]
    rows = fitting_rows(enough)
    assert len(rows) == MIN_REAL_INCIDENTS and all(enough[n].source != BUNDLED_SOURCE for n in rows)
    assert enough.index(own) in rows  # a team's own ticket is a real incident

