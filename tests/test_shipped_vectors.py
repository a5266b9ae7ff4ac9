"""The bundled reports' shipped vectors: current, the model's own, and used only where text and model match."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

from kb.core.incidents import Incident
from kb.core.settings import DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL
from kb.engine.knowledge import KnowledgeBase
from kb.engine.shipped_vectors import ShippedVectors
from tests.conftest import LABELLED, make_settings


class CountingEmbedder:
    """The real model, noting every document text it is asked to embed."""

    def __init__(self, inner):
        self.inner, self.model_id, self.embedded = inner, inner.model_id, []

    def embed_documents(self, texts):
        self.embedded += texts
        return self.inner.embed_documents(texts)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, embedder):
    kb = KnowledgeBase(make_settings(tmp_path_factory.mktemp("kb")), embedder=embedder)
    incidents, errors = kb.prepare(kb.bundled_incidents())
    assert errors == []
    return kb, incidents


@pytest.mark.parametrize("model", [DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL])
def test_the_shipped_files_cover_every_bundled_report_for_both_bundled_models(bundled, model):
    kb, incidents = bundled
    model_id = f"sentence-transformers:{model}"
    shipped = ShippedVectors.load(kb.settings.bundled_vectors, model_id)
    assert shipped is not None, f"{kb.settings.bundled_vectors} has no file of {model_id}'s"
    stale = [i.id for i in incidents if shipped.get(i.text()) is None]
    assert stale == [], f"{len(stale)} bundled reports have no shipped vector (e.g. {stale[:5]}): run `make vectors`"
    assert kb.settings.bundled_vectors.is_dir() and len(list(kb.settings.bundled_vectors.glob("*.npz"))) == 2


def test_a_folder_holds_a_file_per_model_and_each_model_reads_its_own(tmp_path):
    folder = tmp_path / "vectors"
    for model_id, value in (("sentence-transformers:package:a", 1.0), ("sentence-transformers:/models/b", -1.0)):
        written = ShippedVectors.write(folder, model_id, ["one text"], np.full((1, 4), value))
        assert written.parent == folder and written.suffix == ".npz"
    assert len(list(folder.iterdir())) == 2
    assert ShippedVectors.load(folder, "sentence-transformers:package:a").get("one text")[0] == 1.0
    assert ShippedVectors.load(folder, "sentence-transformers:/models/b").get("one text")[0] == -1.0
    assert ShippedVectors.load(folder, "sentence-transformers:package:c") is None


def test_shipped_vectors_are_what_the_model_gives(bundled, embedder):
    kb, incidents = bundled
    sample = random.Random(7).sample(incidents, 12)
    fresh = embedder.embed_documents([i.text() for i in sample])
    shipped = np.vstack([kb.shipped_vectors.get(i.text()) for i in sample]).astype(np.float32)
    cosines = np.sum(fresh * shipped, axis=1) / np.linalg.norm(shipped, axis=1)
    assert cosines.min() > 0.999, cosines


def _reports(n: int) -> list[Incident]:
    lines = LABELLED.read_text().splitlines()[:n]
    keep = set(Incident.model_fields)
    return [Incident(**{k: v for k, v in json.loads(line).items() if k in keep}) for line in lines]


def _build(tmp_path, embedder, reports, shipped_for, model_id=None, name="kb"):
    """A knowledge base built from ``reports`` as its bundled data, with vectors shipped for the
    first ``shipped_for`` of them (under ``model_id``, the embedder's by default)."""
    folder = tmp_path / f"{name}-bundled"
    folder.mkdir()
    (folder / "reports.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reports))
    vectors = tmp_path / f"{name}-vectors.npz"
    texts = [r.text() for r in reports[:shipped_for]]
    ShippedVectors.write(vectors, model_id or embedder.model_id, texts, embedder.embed_documents(texts))
    counting = CountingEmbedder(embedder)
    kb = KnowledgeBase(make_settings(tmp_path / name, bundled_incidents=folder, bundled_vectors=vectors),
                       embedder=counting)
    assert kb.ensure_built()
    return kb, counting, vectors


def test_a_build_embeds_only_the_reports_without_a_shipped_vector(tmp_path, embedder):
    reports = _reports(6)
    kb, counting, _ = _build(tmp_path, embedder, reports, shipped_for=4)
    report_texts = {r.text() for r in reports}
    assert [t for t in counting.embedded if t in report_texts] == [r.text() for r in reports[4:]]
    ids, vectors = kb.store.incident_vectors()
    assert sorted(ids) == sorted(r.id for r in reports)
    fresh = dict(zip((r.id for r in reports), embedder.embed_documents([r.text() for r in reports])))
    for incident_id, vector in zip(ids, vectors):
        assert float(np.dot(vector, fresh[incident_id])) > 0.999, incident_id


def test_an_edited_report_is_embedded_again(tmp_path, embedder):
    reports = _reports(3)
    _, _, vectors = _build(tmp_path, embedder, reports, shipped_for=3)
    edited = reports[1].model_copy(update={"description": reports[1].description + " It happened twice."})
    folder = tmp_path / "edited"
    folder.mkdir()
    (folder / "reports.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in (reports[0], edited, reports[2])))
    counting = CountingEmbedder(embedder)
    kb = KnowledgeBase(make_settings(tmp_path / "kb2", bundled_incidents=folder, bundled_vectors=vectors),
                       embedder=counting)
    kb.ensure_built()
    assert [t for t in counting.embedded if t in {r.text() for r in reports} | {edited.text()}] == [edited.text()]
    assert kb.store.count() == 3


def test_another_models_vectors_are_not_used(tmp_path, embedder, caplog):
    reports = _reports(3)
    with caplog.at_level(logging.INFO, logger="kb.engine.shipped_vectors"):
        kb, counting, _ = _build(tmp_path, embedder, reports, shipped_for=3, model_id="sentence-transformers:other")
    assert all(r.text() in counting.embedded for r in reports)
    assert "are sentence-transformers:other's" in caplog.text


@pytest.mark.parametrize("damage", ["garbage", "truncated", "mismatched"])
def test_a_damaged_file_is_ignored_with_a_warning_and_the_build_loses_nothing(tmp_path, embedder, caplog, damage):
    reports = _reports(3)
    folder = tmp_path / "bundled"
    folder.mkdir()
    (folder / "reports.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reports))
    vectors = tmp_path / "vectors.npz"
    if damage == "garbage":
        vectors.write_bytes(b"not a numpy archive")
    else:
        texts = [r.text() for r in reports]
        ShippedVectors.write(vectors, embedder.model_id, texts, embedder.embed_documents(texts))
        if damage == "truncated":
            vectors.write_bytes(vectors.read_bytes()[:200])
        else:
            np.savez_compressed(vectors, model_id=np.array(embedder.model_id),
                                digests=np.zeros((2, 16), np.uint8), vectors=np.zeros((3, 384), np.float16))
    counting = CountingEmbedder(embedder)
    kb = KnowledgeBase(make_settings(tmp_path / "kb", bundled_incidents=folder, bundled_vectors=vectors),
                       embedder=counting)
    with caplog.at_level(logging.WARNING, logger="kb.engine.shipped_vectors"):
        kb.ensure_built()
    assert "make vectors" in caplog.text and str(vectors) in caplog.text
    assert all(r.text() in counting.embedded for r in reports)
    assert kb.store.count() == 3
