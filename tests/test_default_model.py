"""The default embedding model end to end, as a user's first `pmkb build` and `pmkb suggest` run it:
the bundled reports' vectors and the classifier weights come with pmkb, so the build embeds none of
the reports, and queries run on the model's ONNX export. The other tests run on the light model
(tests/conftest.py, TEST_MODEL)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from kb.core.settings import DEFAULT_EMBEDDING_MODEL, Settings
from kb.engine.replica import open_replica
from kb.engine.shipped_vectors import ShippedVectors
from tests.conftest import ROOT, TEST_MODEL, command_env

pytestmark = pytest.mark.slow


def test_the_default_model_builds_from_what_ships_and_answers_a_ticket(tmp_path):
    assert DEFAULT_EMBEDDING_MODEL != TEST_MODEL
    env = command_env() | {"PMKB_HOME": str(tmp_path / "kb"), "PMKB_EMBEDDING_DEVICE": "cpu"}
    del env["PMKB_EMBEDDING_MODEL"]  # the default, as on a user's machine

    def pmkb(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "pmkb", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    built = pmkb("build")
    shipped = re.search(r"(\d+) of the (\d+) reports' vectors were shipped for (\S+); (\d+) embedded", built.stderr)
    assert shipped, built.stderr[-3000:]
    assert shipped.group(1) == shipped.group(2) and int(shipped.group(2)) > 3000 and shipped.group(4) == "0"
    model_id = shipped.group(3)
    assert model_id == f"sentence-transformers:{DEFAULT_EMBEDDING_MODEL}"

    answer = json.loads(pmkb("suggest", "--json", "Xid 79 on gpu-a17: GPU has fallen off the bus, "
                                                   "nvidia-smi shows 7 of 8 GPUs and the job died").stdout)
    assert answer["root_cause"] == "gpu_lost" and answer["root_cause_dimension"] == "hardware"
    stats = json.loads(pmkb("stats", "--json").stdout)
    assert stats["embedding_model"] == model_id
    # The weights shipped for this model answered: nothing was fitted into the knowledge base.
    assert not (tmp_path / "kb" / "calibration.json").exists()

    # The store holds the shipped vectors (768 dimensions, the default model's).
    replica = open_replica(Settings(home=tmp_path / "kb").store_dir, model_id)
    assert replica is not None
    ids, vectors = replica.incident_vectors()
    assert vectors.shape[1] == 768
    vectors_of = ShippedVectors.load(Settings.model_fields["bundled_vectors"].default, model_id)
    texts = {i.id: i.text() for i in replica.incidents()}
    sample = [n for n in range(0, len(ids), 97)]
    for n in sample:
        assert float(np.dot(vectors[n], vectors_of.get(texts[ids[n]]))) > 0.999
