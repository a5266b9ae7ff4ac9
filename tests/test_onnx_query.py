"""Queries embedded on ONNX Runtime without torch (kb/engine/onnx_query.py): the export of the real
bundled model, its vectors against the model's own, a damaged or diverging export, and a new
``pmkb suggest`` process that imports neither torch, sentence-transformers nor scikit-learn."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kb.core.settings import Settings
from kb.engine import onnx_query
from kb.engine.embedding import SentenceTransformerEmbedder
from tests.conftest import TEST_MODEL, command_env

ROOT = Path(__file__).resolve().parent.parent
MODEL = TEST_MODEL
TEXTS = ["Xid 79: GPU has fallen off the bus on gpu-a17", "", "a", "Ünïcödé ＧＰＵ 障害 — CUDA error: out of memory",
         "0/64 nodes are available: 64 Insufficient nvidia.com/gpu. " * 80, "NCCL WARN\n\n\tNET/IB : Got completion"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, embedder) -> Path:
    """A model cache holding the bundled model's checked ONNX export."""
    path = tmp_path_factory.mktemp("model-cache")
    assert onnx_query.export(embedder.model, embedder.model_dir, path) is not None
    return path


def test_onnx_query_vectors_equal_the_models_own(embedder, cache):
    fresh = SentenceTransformerEmbedder(MODEL, device="cpu", cache=cache, batch_size=4)
    got = fresh.embed_queries(TEXTS * 2)  # more than one batch
    assert fresh._onnx is not None and fresh._model is None, "the query path must not load torch"
    expected = embedder._encode(TEXTS * 2)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.min(np.sum(got * expected, axis=1)) >= onnx_query.MIN_COSINE
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert fresh.dimension == embedder.dimension and fresh._model is None
    manifest = (onnx_query.export_dir(embedder.model_dir, cache) / "manifest.json").read_text()
    assert '"min_cosine"' in manifest


def test_a_damaged_export_costs_only_speed(embedder, cache, tmp_path, caplog):
    broken = tmp_path / "cache"
    shutil.copytree(cache, broken)
    model = onnx_query.export_dir(embedder.model_dir, broken) / "model.onnx"
    model.write_bytes(model.read_bytes()[:5000])
    fresh = SentenceTransformerEmbedder(MODEL, device="cpu", cache=broken)
    with caplog.at_level(logging.WARNING):
        vector = fresh.embed_query(TEXTS[0])
    assert fresh._onnx is None and "cannot be used" in caplog.text
    assert float(vector @ embedder.embed_query(TEXTS[0])) >= onnx_query.MIN_COSINE


def test_an_export_others_could_have_written_is_not_used(embedder, cache, tmp_path, caplog):
    shared = tmp_path / "cache"
    shutil.copytree(cache, shared)
    path = onnx_query.export_dir(embedder.model_dir, shared)
    assert (path.stat().st_mode & 0o777) == 0o700
    path.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert onnx_query.load(embedder.model_dir, shared) is None
    assert "not private to this user" in caplog.text


def test_an_export_that_differs_from_the_model_is_not_kept(embedder, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(onnx_query, "MIN_COSINE", 1.5)  # no export can pass: as if it diverged
    with caplog.at_level(logging.WARNING):
        assert onnx_query.export(embedder.model, embedder.model_dir, tmp_path) is None
    assert "differs from the model" in caplog.text
    assert not onnx_query.export_dir(embedder.model_dir, tmp_path).exists()
    assert [p.name for p in (tmp_path / "onnx").iterdir()] == []  # no work directory left behind


HEAVY = ("torch", "sentence_transformers", "transformers", "sklearn", "chromadb")


@pytest.mark.slow
def test_after_pmkb_build_a_new_suggest_process_imports_neither_torch_chromadb_nor_scikit_learn(_built_kb_dir, tmp_path,
                                                                                               embedder):
    home, cache = tmp_path / "kb", tmp_path / "models"
    shutil.copytree(_built_kb_dir, home)
    env = command_env() | {
        "PMKB_HOME": str(home), "PMKB_MODEL_CACHE": str(cache)}
    built = subprocess.run([sys.executable, "-m", "pmkb", "build"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0 and "knowledge base ready" in built.stdout, built.stderr[-2000:]
    assert list((cache / "onnx").glob("*/manifest.json")) and (home / "text_classifiers.npz").exists()
    assert (home / "chroma" / "pmkb-replica.npz").exists()
    for ticket in ("Xid 79: GPU has fallen off the bus on gpu-a17, job 4411 died", "my job died"):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "pmkb", "suggest", ticket],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "root cause: gpu_lost" in done.stdout or ticket == "my job died"
        imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                    if line.startswith("import time:")}
        assert not imported & set(HEAVY), (ticket, sorted(imported & set(HEAVY)))
    # Another process holding the store (here: this one) does not stop a reader while the copy is current ...
    from kb.core.incidents import Incident
    from kb.engine.knowledge import KnowledgeBase

    holder = KnowledgeBase(Settings(home=home), embedder=embedder)
    assert holder.store.count() > 0
    suggest = [sys.executable, "-m", "pmkb", "suggest", "Xid 79: GPU has fallen off the bus on gpu-a17"]
    done = subprocess.run(suggest, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "root cause: gpu_lost" in done.stdout, done.stderr[-2000:]
    # ... and once it writes, the copy is stale: the reader needs the store, and says who holds it.
    holder.add_incidents([Incident(id="OPS-NEW", title="Xid 79 on gpu-b3", description="fell off the bus",
                                   root_cause="gpu_lost")])
    done = subprocess.run(suggest, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and f"process {os.getpid()}" in done.stderr, done.stderr[-2000:]
    holder.store.close()


def test_bfloat16_weights_give_the_float32_vectors_and_make_no_export(embedder, tmp_path):
    half = SentenceTransformerEmbedder(MODEL, device="cpu", cache=tmp_path, dtype="bfloat16")
    got = half.embed_documents(TEXTS)
    assert next(half.model.parameters()).dtype.is_floating_point and str(next(half.model.parameters()).dtype) == \
        "torch.bfloat16"
    assert got.dtype == np.float32
    assert np.min(np.sum(got * embedder._encode(TEXTS), axis=1)) >= 0.99
    assert not half.prepare_fast_queries(), "an export is made from float32 weights only"
    assert not (onnx_query.export_dir(half.model_dir, tmp_path) / "manifest.json").exists()


def test_an_unknown_number_format_is_refused_by_name():
    with pytest.raises(ValueError, match="embedding_dtype"):
        Settings(embedding_dtype="int4")
