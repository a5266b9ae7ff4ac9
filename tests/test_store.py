"""Store contract (embedded and client/server Chroma), idempotent ingest, model guard."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kb.core.incidents import Incident
from kb.engine.embedding import HashingEmbedder
from kb.engine.knowledge import KnowledgeBase
from kb.engine.store import ChromaStore, StoreModelMismatch
from tests.conftest import make_settings


def _incidents(n=4):
    return [Incident(id=f"i-{k}", title=f"ticket {k}", description=f"Xid 79 fallen off the bus on gpu-{k}",
                     resolution="cordoned the node", symptom="job_crash", root_cause="gpu_lost",
                     mitigation="node_repair") for k in range(n)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory):
    """A real Chroma server on loopback."""
    port = _free_port()
    chroma = Path(sys.executable).parent / "chroma"
    proc = subprocess.Popen([str(chroma), "run", "--path", str(tmp_path_factory.mktemp("srv")),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("chroma server did not start")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


class StoreContract:
    """Behaviour every store backend must show."""

    def make_store(self, model_id: str) -> ChromaStore:
        raise NotImplementedError

    def test_upsert_query_and_hashes(self):
        store = self.make_store("m1")
        incidents = _incidents()
        vectors = HashingEmbedder().embed_documents([i.text() for i in incidents])
        store.upsert_incidents(incidents, vectors, ["hardware"] * 4)
        assert store.count() == 4
        hits = store.query_incidents(vectors[2], k=2)
        assert hits[0].id == "i-2" and hits[0].score == pytest.approx(1.0, abs=1e-4)
        assert store.incident_hashes(["i-1"]) == {"i-1": incidents[1].content_hash()}
        assert {i.id for i in store.incidents()} == {i.id for i in incidents}
        assert [h.id for h in store.query_incidents(vectors[0], 4, where={"root_cause": "nope"})] == []

    def test_asking_for_more_neighbours_than_are_stored_gives_them_all(self):
        store = self.make_store("m1")
        incidents = _incidents()
        vectors = HashingEmbedder().embed_documents([i.text() for i in incidents])
        assert store.query_incidents(vectors[0], 50) == [] and store.query_incident_scores(vectors[:2], 50) == [{}, {}]
        store.upsert_incidents(incidents, vectors, ["hardware"] * 4)
        assert {h.id for h in store.query_incidents(vectors[0], 50)} == {i.id for i in incidents}
        assert [set(pool) for pool in store.query_incident_scores(vectors[:2], 50)] == [{i.id for i in incidents}] * 2

    def test_refuses_other_model(self):
        self.make_store("m1")
        with pytest.raises(StoreModelMismatch, match="built with embedding model 'm1'"):
            self.make_store("m2")


class TestPersistentChroma(StoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path):
        self.path = str(tmp_path / "chroma")

    def make_store(self, model_id):
        return ChromaStore(model_id, path=self.path)


class TestHttpChroma(StoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, chroma_server):
        self.url = chroma_server
        probe = ChromaStore.__new__(ChromaStore)
        import chromadb

        client = chromadb.HttpClient(host="127.0.0.1", port=int(chroma_server.rsplit(":", 1)[1]))
        for col in client.list_collections():
            client.delete_collection(col.name if hasattr(col, "name") else col)
        del probe

    def make_store(self, model_id):
        return ChromaStore(model_id, url=self.url)


def test_reingest_is_idempotent_and_updates_in_place(empty_kb):
    first = empty_kb.add_incidents(_incidents())
    assert (first.added, first.updated, first.unchanged) == (4, 0, 0)
    again = empty_kb.add_incidents(_incidents())
    assert (again.added, again.updated, again.unchanged) == (0, 0, 4)
    changed = _incidents()
    changed[1] = changed[1].model_copy(update={"resolution": "replaced the GPU"})
    third = empty_kb.add_incidents(changed)
    assert (third.added, third.updated, third.unchanged) == (0, 1, 3)
    assert empty_kb.store.count() == 4
    assert empty_kb.store.get_incident("i-1").resolution == "replaced the GPU"


def test_secrets_are_redacted_before_storage(empty_kb):
    leaky = Incident(id="leak", title="pull fails for alice@example.com",
                     description="docker login -p hunter2secret registry at 10.0.0.5 failed",
                     root_cause="improper_permission")
    empty_kb.add_incidents([leaky])
    stored = empty_kb.store.get_incident("leak")
    assert "alice@example.com" not in stored.title and "10.0.0.5" not in stored.description
    raw = empty_kb.store._incidents.get(ids=["leak"], include=["documents", "metadatas"])
    assert "hunter2secret" not in raw["documents"][0] + raw["metadatas"][0]["record"]


def test_unknown_labels_are_rejected_by_name(empty_kb):
    bad = _incidents(1)[0].model_copy(update={"root_cause": "gremlins"})
    report = empty_kb.add_incidents([bad])
    assert report.added == 0 and "unknown root_cause 'gremlins'" in report.errors[0]


def test_switching_model_is_refused_on_an_existing_store(tmp_path, embedder):
    home = tmp_path / "kb"
    KnowledgeBase(make_settings(home), embedder=embedder).add_incidents(_incidents())
    other = KnowledgeBase(make_settings(home, embedder="hashing"))
    with pytest.raises(StoreModelMismatch, match=r"pmkb build --kb NEW_DIR") as refused:
        other.store
    assert "reindex" not in str(refused.value)  # no such command
    # It names the setting that keeps the model the store was built with.
    assert f"(PMKB_EMBEDDING_MODEL={embedder.model_id.removeprefix('sentence-transformers:')})" in str(refused.value)
    back = KnowledgeBase(make_settings(tmp_path / "kb2", embedder="hashing"))
    back.add_incidents(_incidents())
    with pytest.raises(StoreModelMismatch, match=r"\(PMKB_EMBEDDER=hashing\)"):
        KnowledgeBase(make_settings(tmp_path / "kb2"), embedder=embedder).store
    assert back.store.count() == 4 and back.embedder.model_id == "hashing:384"


def test_real_model_ranks_the_matching_incident_first(empty_kb):
    empty_kb.add_incidents(_incidents(1) + [
        Incident(id="oom", title="pod OOMKilled", description="Exit Code 137 container memory limit",
                 root_cause="improper_configuration"),
        Incident(id="ib", title="allreduce hang", description="mlx5 port down, NCCL watchdog timeout",
                 root_cause="infiniband_failure")])
    vector = empty_kb.embedder.embed_query("my container got killed with exit code 137, out of memory")
    assert empty_kb.store.query_incidents(vector, 3)[0].id == "oom"
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-3)
