"""Shared fixtures: settings on temporary directories, the real embedder, a built knowledge base."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kb.core.settings import Settings
from kb.engine.embedding import SentenceTransformerEmbedder
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
"""Development files kept beside the repository (the labelled dev file, the reference taxonomy);
a clone on its own has none of them, and the tests that need one skip."""
LABELLED = ROOT / "tests" / "data" / "labelled_incidents.jsonl"
"""Twenty labelled incidents written for the tests, for tests that need some labelled records."""


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
    """Tests never see a developer's PMKB_* variables."""
    import os

    for name in list(os.environ):
        if name.startswith("PMKB_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real bundled embedding model, loaded once per test session."""
    emb = SentenceTransformerEmbedder(Settings.model_fields["embedding_model"].default, device="cpu")
    emb.embed_query("warm up")
    return emb


def make_settings(home: Path, **kw) -> Settings:
    """Settings rooted in a temporary directory."""
    return Settings(home=home, **kw)


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
