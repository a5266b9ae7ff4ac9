"""The read-only copy of an embedded store (kb/engine/replica.py): it answers as the store does, is
used only while current, goes stale on any write (also one cut short), refuses writes and other
models, and a damaged copy costs only speed."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kb.core.incidents import Incident
from kb.engine.knowledge import KnowledgeBase
from kb.engine.replica import ReplicaReadOnly, open_replica, replica_path, save_replica, where_matches
from kb.engine.search import Retriever, chroma_where
from kb.engine.store import STATE_FILE, ChromaStore, StoreModelMismatch

QUERIES = ["Xid 79: GPU has fallen off the bus on gpu-a17", "NCCL watchdog timeout after an IB port flap",
           "ModuleNotFoundError: No module named 'apex'", "pods stay Pending: insufficient nvidia.com/gpu"]


def _copy(kb: KnowledgeBase):
    save_replica(kb.store)
    replica = open_replica(kb.settings.store_dir, kb.embedder.model_id)
    assert replica is not None
    return replica


def test_the_copy_answers_as_the_store(bundled_kb):
    store = bundled_kb.store
    replica = _copy(bundled_kb)
    assert replica.count() == store.count()
    assert {i.id: i for i in replica.incidents()} == {i.id: i for i in store.incidents()}
    assert replica.taxonomy_entries() == store.taxonomy_entries()
    assert replica.incident_hashes() == store.incident_hashes()
    where = chroma_where({"root_cause": ["gpu_lost", "infiniband_failure"], "provenance": "human_labelled"})
    for text in QUERIES:
        vector = bundled_kb.embedder.embed_query(text)
        for filter_ in (None, where):
            exact = replica.query_incidents(vector, 10, filter_)
            approximate = store.query_incidents(vector, 10, filter_)
            assert exact[0].id == approximate[0].id
            assert len({h.id for h in exact} & {h.id for h in approximate}) >= 9
            shared = {h.id: h.score for h in approximate}
            assert all(abs(h.score - shared[h.id]) < 1e-4 for h in exact if h.id in shared)
            assert all(h.metadata["root_cause"] in ("gpu_lost", "infiniband_failure") for h in exact if filter_)
        pool = replica.query_incident_scores(np.stack([vector]), 10)[0]
        assert list(pool) == [h.id for h in replica.query_incidents(vector, 10)]


def test_retrieval_on_the_copy_ranks_as_on_the_store(bundled_kb):
    on_store = Retriever(bundled_kb)
    on_copy = Retriever(KnowledgeBase(bundled_kb.settings, embedder=bundled_kb.embedder, read_only=True))
    bundled_kb.save_replica()
    assert not isinstance(on_copy.kb.store, ChromaStore)
    for text in QUERIES:
        assert [h.id for h in on_copy.retrieve_similar(text, k=5)] == [h.id for h in on_store.retrieve_similar(text, k=5)]


def test_a_write_makes_the_copy_stale_and_a_reading_knowledge_base_leaves_a_fresh_one(bundled_kb):
    _copy(bundled_kb)
    bundled_kb.add_incidents([Incident(id="OPS-NEW", title="Xid 79 on gpu-b3", description="fell off the bus",
                                       root_cause="gpu_lost")])
    assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None
    reader = KnowledgeBase(bundled_kb.settings, embedder=bundled_kb.embedder, read_only=True)
    assert isinstance(reader.store, ChromaStore)  # no current copy: the store itself
    reader.save_replica()
    fresh = open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id)
    assert fresh is not None and fresh.get_incident("OPS-NEW").title == "Xid 79 on gpu-b3"


def test_a_write_cut_short_leaves_the_copy_stale(bundled_kb, monkeypatch):
    _copy(bundled_kb)
    store = bundled_kb.store

    def crash(**_kwargs):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(store._incidents, "upsert", crash)
    with pytest.raises(RuntimeError):
        bundled_kb.add_incidents([Incident(id="OPS-CUT", title="Xid 48 on gpu-c1", root_cause="gpu_memory_error")])
    assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None


def test_a_copy_made_during_a_write_is_stale(bundled_kb, monkeypatch):
    store = bundled_kb.store
    real_upsert = store._incidents.upsert

    def copy_midway(**kwargs):  # another thread of the same process copies the store mid-write
        save_replica(store)
        real_upsert(**kwargs)

    monkeypatch.setattr(store._incidents, "upsert", copy_midway)
    bundled_kb.add_incidents([Incident(id="OPS-MID", title="Xid 48 on gpu-c1", root_cause="gpu_memory_error")])
    assert replica_path(bundled_kb.settings.store_dir).exists()
    assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None


def test_the_copy_refuses_writes_and_another_model(bundled_kb):
    replica = _copy(bundled_kb)
    with pytest.raises(ReplicaReadOnly, match="read-only"):
        replica.upsert_incidents([], np.zeros((0, 384), np.float32))
    with pytest.raises(ReplicaReadOnly):
        replica.reset()
    with pytest.raises(StoreModelMismatch, match="built with embedding model"):
        open_replica(bundled_kb.settings.store_dir, "hashing-384")


def test_a_damaged_or_missing_copy_costs_only_speed(bundled_kb, caplog):
    _copy(bundled_kb)
    path = replica_path(bundled_kb.settings.store_dir)
    path.write_bytes(path.read_bytes()[:5000])
    with caplog.at_level(logging.WARNING, logger="kb.engine.replica"):
        assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None
    assert "cannot be read" in caplog.text
    path.unlink()
    (bundled_kb.settings.store_dir / STATE_FILE).unlink()
    reader = KnowledgeBase(bundled_kb.settings, embedder=bundled_kb.embedder, read_only=True)
    assert isinstance(reader.store, ChromaStore)
    reader.save_replica()  # a store from before the copies existed gets its token now
    assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is not None
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_empty_store_has_no_copy(empty_kb):
    empty_kb.sync_taxonomy()
    save_replica(empty_kb.store)
    assert open_replica(empty_kb.settings.store_dir, empty_kb.embedder.model_id) is None


def test_a_store_without_its_taxonomy_entries_is_not_read_from_its_copy(empty_kb):
    empty_kb.add_incidents([Incident(id="OPS-1", title="Xid 79 on gpu-b3", root_cause="gpu_lost")])
    assert save_replica(empty_kb.store) is not None  # the reader that opens the store adds the entries
    assert open_replica(empty_kb.settings.store_dir, empty_kb.embedder.model_id) is None


@pytest.mark.parametrize(("where", "expected"), [
    (None, True), ({"root_cause": "gpu_lost"}, True), ({"root_cause": "oom"}, False),
    ({"root_cause": {"$in": ["oom", "gpu_lost"]}}, True), ({"root_cause": {"$nin": ["gpu_lost"]}}, False),
    ({"$and": [{"root_cause": "gpu_lost"}, {"provenance": {"$in": ["confirmed"]}}]}, False),
    ({"$or": [{"root_cause": "oom"}, {"provenance": {"$eq": "human_labelled"}}]}, True),
    ({"provenance": {"$ne": "human_labelled"}}, False)])
def test_filters_follow_chromas_syntax(where, expected):
    assert where_matches({"root_cause": "gpu_lost", "provenance": "human_labelled"}, where) is expected


def test_an_unknown_filter_operator_is_named():
    with pytest.raises(ValueError, match=r"\$gt"):
        where_matches({"root_cause": "gpu_lost"}, {"root_cause": {"$gt": 1}})


def test_a_copy_whose_parts_disagree_is_ignored(bundled_kb, caplog):
    _copy(bundled_kb)
    path = replica_path(bundled_kb.settings.store_dir)
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["vectors"] = arrays["vectors"][:-1]  # one incident without its vector
    with path.open("wb") as fh:
        np.savez(fh, **arrays)
    with caplog.at_level(logging.WARNING, logger="kb.engine.replica"):
        assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None
    assert "ids but" in caplog.text


def test_a_copy_others_could_have_written_is_not_read(bundled_kb, caplog):
    _copy(bundled_kb)
    path = replica_path(bundled_kb.settings.store_dir)
    path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="kb.engine.replica"):
        assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is None
    assert "not private" in caplog.text
    reader = KnowledgeBase(bundled_kb.settings, embedder=bundled_kb.embedder, read_only=True)
    assert isinstance(reader.store, ChromaStore)
    reader.save_replica()  # written afresh, private again
    assert path.stat().st_mode & 0o777 == 0o600
    assert open_replica(bundled_kb.settings.store_dir, bundled_kb.embedder.model_id) is not None
