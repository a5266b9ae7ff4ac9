"""What the pages share: settings, embedder, engine and model loaded once per process, the sidebar."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from kb.core.incidents import Incident
from kb.core.roles import Suggester
from kb.core.settings import Settings, load_settings
from kb.core.suggestion import Ticket
from kb.core.taxonomy import TaxonomyError
from kb.engine.embedding import make_embedder
from kb.engine.knowledge import KnowledgeBase
from kb.engine.store import StoreModelMismatch
from kb.engine.store_lock import StoreLocked
from kb.engine.suggest import SuggestionEngine
from kb.llm.suggester import make_suggester

THRESHOLD_KEY = "abstain_threshold"
"""Session-state key of the sidebar's abstain-threshold slider."""
WARM_UP = Ticket(id="warm-up", title="warm up",
                 description="NCCL watchdog timeout on node gpu-a001, Xid 79 in dmesg")


@dataclass
class Loaded:
    """Everything a page works with, shared by all sessions of this process."""

    settings: Settings
    engine: SuggestionEngine
    suggester: Suggester  # make_suggester's, as in every shell: the engine, or the model over it
    llm_note: str  # what produces suggestions, in words
    lock: threading.Lock  # held while feedback writes to the knowledge base

    @property
    def kb(self) -> KnowledgeBase:
        """The knowledge base behind the engine."""
        return self.engine.kb


@st.cache_resource(show_spinner=False)
def app_settings() -> Settings:
    """Settings from defaults, PMKB_CONFIG and PMKB_* variables, read once per process."""
    return load_settings()


def _settings_key(settings: Settings) -> str:
    return settings.model_dump_json()


def describe_model(suggester: Suggester) -> str:
    """What produces suggestions, in words, from the suggester's own description."""
    llm = suggester.describe().get("llm")
    if not llm:
        return "none: suggestions come from retrieval and evidence (no LLM configured)"
    note = f"{llm['backend']}: {llm['model']}"
    return f"{note} (unavailable: {llm['error']}; the engine answers alone)" if llm.get("error") else note


def open_everything(settings: Settings) -> Loaded:
    """Open (and if empty, build) the knowledge base, the engine and the model, and warm them up."""
    kb = KnowledgeBase(settings, embedder=make_embedder(settings))
    kb.ensure_built()
    engine = SuggestionEngine(kb, refit_in_background=True)
    engine.calibration
    engine.suggest(WARM_UP)  # loads the model weights, lexical index and taxonomy vectors now
    suggester = make_suggester(engine)
    return Loaded(settings=settings, engine=engine, suggester=suggester,
                  llm_note=describe_model(suggester), lock=threading.Lock())


_preloads: dict[str, tuple[threading.Thread, list]] = {}
"""Loads started as the server started (``preload``), by settings key: the thread and, once it
ended, what it made (a ``Loaded`` or the exception it raised)."""


def preload(settings: Settings) -> threading.Thread:
    """Start opening everything in the background, before any page is visited (ui/serve.py), so that
    the first visitor does not wait for it; the page takes it over (``load_everything``)."""
    outcome: list = []

    def work() -> None:
        try:
            outcome.append(open_everything(settings))
        except BaseException as exc:  # noqa: BLE001 - the page opens it again and shows the error
            outcome.append(exc)

    thread = threading.Thread(target=work, name="pmkb-preload", daemon=True)
    _preloads[_settings_key(settings)] = (thread, outcome)
    thread.start()
    return thread


@st.cache_resource(show_spinner="Opening the knowledge base and warming up the engine ...")
def load_everything(_settings: Settings, key: str) -> Loaded:
    """Everything, once per process: what ``preload`` made when the server started with these
    settings (waiting for it to finish), else opened now."""
    started = _preloads.pop(key, None)
    if started is not None:
        thread, outcome = started
        thread.join()
        if outcome and isinstance(outcome[0], Loaded):
            return outcome[0]
    return open_everything(_settings)


def refresh_engine(res: Loaded) -> None:
    """After the knowledge base changed: reload retrieval and refit what the engine derives from it.

    Done right after a save, so the next ticket does not pay for it.
    """
    res.engine.retriever.refresh()
    res.engine.suggest(WARM_UP)


def loaded() -> Loaded:
    """The shared resources; on a configuration problem, show what to fix and stop the page."""
    try:
        settings = app_settings()
        return load_everything(settings, _settings_key(settings))
    except (TaxonomyError, StoreModelMismatch, StoreLocked, ValueError, ImportError, OSError) as exc:
        st.error(f"pmkb cannot start: {exc}")
        st.stop()


def kb_fingerprint(kb: KnowledgeBase) -> tuple[int, float]:
    """Changes whenever incidents are written: the count and the store file's modification time."""
    sqlite = Path(kb.settings.store_dir) / "chroma.sqlite3"
    mtime = sqlite.stat().st_mtime if not kb.settings.chroma_url and sqlite.exists() else 0.0
    return kb.store.count(), mtime


@st.cache_resource(show_spinner="Reading incidents ...", max_entries=4)
def _incidents(_kb: KnowledgeBase, key: str, fingerprint: tuple[int, float]) -> list[Incident]:
    return _kb.store.incidents()


def all_incidents(kb: KnowledgeBase) -> list[Incident]:
    """Every stored incident, read again only when the knowledge base changed (do not mutate)."""
    return _incidents(kb, _settings_key(kb.settings), kb_fingerprint(kb))


def abstain_threshold(settings: Settings) -> float:
    """The abstain threshold chosen in the sidebar (the configured one until it is moved)."""
    return float(st.session_state.get(THRESHOLD_KEY, settings.abstain_threshold))


def render_sidebar(res: Loaded) -> None:
    """Knowledge base and model in use, and the abstain threshold applied to what is shown."""
    kb, settings = res.kb, res.settings
    with st.sidebar:
        st.subheader("Knowledge base")
        st.metric("Incidents", kb.store.count())
        st.caption(f"Location: `{kb.store.location}`")
        st.caption(f"Embedding model: `{kb.embedder.model_id}`")
        st.caption(f"Taxonomy: `{kb.taxonomy.name}`")
        st.subheader("Model")
        st.caption(f"LLM: {res.llm_note}")
        st.subheader("Suggestions")
        st.slider("Abstain threshold", min_value=0.0, max_value=1.0, step=0.05,
                  value=float(settings.abstain_threshold), key=THRESHOLD_KEY,
                  help="A root cause whose confidence is below this is shown as 'not sure'.")
