"""The text classifiers and their cache: a cached classifier predicts exactly as the fitted one,
and nothing in the knowledge-base directory can run code when the cache is loaded."""

from __future__ import annotations

import logging
import pickle
import shutil
import stat

import numpy as np
import pytest

from kb.core.settings import Settings
from kb.core.suggestion import Ticket
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.engine.textclf import (
    CACHE_FILE,
    LEGACY_CACHE_FILES,
    TextClassifier,
    load_classifiers,
    save_classifiers,
)

TICKET = Ticket(title="job killed", description="slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0")


class _CreatesFile:
    """Unpickling this creates a file: proof that loading ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, embedder):
    """An engine over 40 bundled incidents whose text classifiers are fitted and cached."""
    kb = KnowledgeBase(Settings(home=tmp_path_factory.mktemp("textclf") / "kb"), embedder=embedder)
    kb.add_incidents(kb.bundled_incidents()[:40])
    engine = SuggestionEngine(kb)
    engine.suggest(TICKET)
    return engine


def test_a_cached_classifier_predicts_exactly_as_the_fitted_one(trained, tmp_path):
    fitted = trained.snapshot().classifiers
    path = tmp_path / CACHE_FILE
    save_classifiers(path, "digest", fitted)
    loaded = load_classifiers(path, "digest")
    assert loaded is not None and set(loaded) == set(fitted) == {"root_cause", "symptom", "scope", "change"}
    incidents, vectors = trained.calibrator.training_set(trained.snapshot().incidents)
    odd = ["", "a", "  spaced \t\n  out  ", "Ünïcödé ＧＰＵ 障害 Xid 79", "x" * 5000, "OOM_kill oom-kill 4242"]
    texts = [TICKET.text()] + [i.text() for i in incidents[:10]] + odd
    vectors = np.vstack([trained.kb.embedder.embed_queries([TICKET.text(), *odd]), vectors[:10]])
    texts = [texts[0], *odd, *texts[1:11]]
    for field, clf in fitted.items():
        assert clf._model is not None
        # the stored model answers in numpy (no scikit-learn) with scikit-learn's numbers
        assert np.allclose(loaded[field].log_proba(texts, vectors), clf.log_proba(texts, vectors), atol=1e-9)
        assert loaded[field].labels == clf.labels
    save_classifiers(tmp_path / "again.npz", "digest", loaded)  # a loaded classifier saves as it was read
    again = load_classifiers(tmp_path / "again.npz", "digest")
    assert all(np.array_equal(again[f].log_proba(texts, vectors), loaded[f].log_proba(texts, vectors))
               for f in fitted)
    assert load_classifiers(path, "another digest") is None  # trained on other data: refit


def test_a_two_class_classifier_is_stored_and_answers_as_fitted(embedder, tmp_path):
    texts = ["GPU fell off the bus Xid 79", "ModuleNotFoundError no module named apex",
             "ECC error on GPU 3", "ImportError in my container image"] * 3
    truths = ["hardware", "user"] * 6
    vectors = embedder.embed_documents(texts)
    fitted = TextClassifier(["hardware", "user", "platform"]).fit(texts, vectors, truths)
    save_classifiers(tmp_path / CACHE_FILE, "d", {"dimension": fitted})
    loaded = load_classifiers(tmp_path / CACHE_FILE, "d")["dimension"]
    probe = ["Xid 79 again on node 7", "no module named torch"]
    probe_vectors = embedder.embed_queries(probe)
    assert np.allclose(loaded.log_proba(probe, probe_vectors), fitted.log_proba(probe, probe_vectors), atol=1e-9)


def test_an_untrained_classifier_round_trips(tmp_path):
    labels = ["a", "b", "c"]
    untrained = TextClassifier(labels).fit(["only one label"], np.zeros((1, 4)), ["a"])
    save_classifiers(tmp_path / CACHE_FILE, "d", {"root_cause": untrained})
    loaded = load_classifiers(tmp_path / CACHE_FILE, "d")["root_cause"]
    assert np.array_equal(loaded.log_proba(["x"], np.zeros((1, 4))), untrained.log_proba(["x"], np.zeros((1, 4))))


def test_the_cache_is_written_atomically_for_the_owner_only(trained):
    path = trained.classifier_cache_path
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(path.parent.glob(f"{path.name}.*.tmp"))
    with path.open("rb") as fh:
        assert fh.read(4) == b"PK\x03\x04"  # a numpy archive, not a pickle


def test_a_planted_pickle_never_runs(trained, embedder, tmp_path, caplog):
    home = tmp_path / "kb"
    shutil.copytree(trained.settings.home, home)
    kb = KnowledgeBase(Settings(home=home), embedder=embedder)
    marker = tmp_path / "code-ran"
    planted = {home / name for name in (CACHE_FILE, *LEGACY_CACHE_FILES)}
    planted.add(SuggestionEngine(kb).classifier_cache_path)
    for path in planted:  # under this version's name and under earlier versions' names
        path.write_bytes(pickle.dumps({"fingerprint": "x", "classifiers": _CreatesFile(marker)}))
    with caplog.at_level(logging.WARNING, logger="kb.engine.textclf"):
        engine = SuggestionEngine(kb)
        suggestion = engine.suggest(TICKET)
    assert not marker.exists()
    assert suggestion.root_cause in kb.taxonomy.cause_ids
    assert "text-classifier cache" in caplog.text and "rebuilt" in caplog.text
    # rebuilt as data; a pickle left under an earlier version's name is gone
    assert load_classifiers(engine.classifier_cache_path, engine.snapshot().fingerprint) is not None
    for legacy in LEGACY_CACHE_FILES:
        assert (home / legacy) == engine.classifier_cache_path or not (home / legacy).exists()
    assert not marker.exists()


def test_a_pickle_inside_the_archive_never_runs(tmp_path, caplog):
    marker = tmp_path / "code-ran"
    path = tmp_path / CACHE_FILE
    with path.open("wb") as fh:
        np.savez(fh, header=np.array([_CreatesFile(marker)], dtype=object))
    with caplog.at_level(logging.WARNING, logger="kb.engine.textclf"):
        assert load_classifiers(path, "d") is None
    assert not marker.exists() and "text-classifier cache" in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "wrong shape", "foreign header"])
def test_a_damaged_archive_is_ignored(trained, tmp_path, caplog, damage):
    path = tmp_path / CACHE_FILE
    save_classifiers(path, "d", trained.snapshot().classifiers)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:5000])
    else:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        if damage == "wrong shape":
            arrays["root_cause.coef"] = arrays["root_cause.coef"][:, :10]
        else:
            arrays["header"] = np.frombuffer(b'{"format": 1, "fingerprint": "d", "classifiers": 3}', np.uint8)
        with path.open("wb") as fh:
            np.savez(fh, **arrays)
    with caplog.at_level(logging.WARNING, logger="kb.engine.textclf"):
        assert load_classifiers(path, "d") is None
    assert "text-classifier cache" in caplog.text
