"""Shared fixtures: settings on temporary directories, the real embedder, a built knowledge base."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kb.core.settings import LIGHT_EMBEDDING_MODEL, Settings
from kb.engine.embedding import SentenceTransformerEmbedder
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
"""Development files kept beside the repository (the labelled dev file, the reference taxonomy);
a clone on its own has none of them, and the tests that need one skip."""
LABELLED = ROOT / "tests" / "data" / "labelled_incidents.jsonl"
"""Twenty labelled incidents written for the tests, for tests that need some labelled records."""
TEST_MODEL = LIGHT_EMBEDDING_MODEL
"""The embedding model the tests build and query with: the light bundled model, whose vectors and
weights ship like the default's. Knowledge bases the tests fill with their own incidents embed them
eight times faster with it; the engine does not depend on which model it is, and the tests marked
``default_model`` run the default one end to end. Commands the tests start get it through
``PMKB_EMBEDDING_MODEL``."""
os.environ["PMKB_EMBEDDING_MODEL"] = TEST_MODEL  # session fixtures and started commands, before any test


def shared_file(relative: str) -> Path:
    """A file under ../shared; skips the calling test, saying what is missing and where, when absent."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    path = SHARED / relative
    if not path.is_file():
        pytest.skip(f"{path} is not present: this test needs the development file shared/{relative} "
                    f"beside the repository ({SHARED})")
    return path


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    """Tests never see a developer's PMKB_* variables, only the tests' embedding model."""
    for name in list(os.environ):
        if name.startswith("PMKB_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMKB_EMBEDDING_MODEL", TEST_MODEL)


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real bundled embedding model, loaded once per test session."""
    emb = SentenceTransformerEmbedder(TEST_MODEL, device="cpu")
    emb.embed_query("warm up")
    return emb


def make_settings(home: Path, **kw) -> Settings:
    """Settings rooted in a temporary directory, on the tests' embedding model."""
    return Settings(home=home, **{"embedding_model": TEST_MODEL, **kw})


@pytest.fixture
def empty_kb(tmp_path, embedder) -> KnowledgeBase:
    """An empty knowledge base on a temporary directory with the real model."""
    return KnowledgeBase(make_settings(tmp_path / "kb"), embedder=embedder)


@pytest.fixture(scope="session")
def _built_kb_dir(tmp_path_factory, embedder) -> Path:
    """The bundled knowledge base, built once, with its text classifiers fitted and cached: every
    copy made of it answers without fitting them again."""
    home = tmp_path_factory.mktemp("bundled") / "kb"
    kb = KnowledgeBase(make_settings(home), embedder=embedder)
    kb.ensure_built()
    SuggestionEngine(kb).snapshot()
    return home


@pytest.fixture
def bundled_kb(tmp_path, _built_kb_dir, embedder) -> KnowledgeBase:
    """A private copy of a knowledge base built from the bundled incidents."""
    home = tmp_path / "kb"
    shutil.copytree(_built_kb_dir, home)
    return KnowledgeBase(make_settings(home), embedder=embedder)


@pytest.fixture(scope="session")
def shared_bundled_kb(_built_kb_dir, embedder) -> KnowledgeBase:
    """The bundled knowledge base, shared read-only across tests (do not write to it)."""
    return KnowledgeBase(make_settings(_built_kb_dir), embedder=embedder)


def command_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command a test starts: ``base`` (the test process's by default) without
    a developer's PMKB_* variables, on the tests' embedding model."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if not k.startswith("PMKB_")} | {"PMKB_EMBEDDING_MODEL": TEST_MODEL}
