"""End to end in a real headless Chromium: `streamlit run app.py`, paste a ticket, read the root cause."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import make_settings
from page_server import PRELOADING, STREAMLIT_RUN, serve_page

from kb.core.suggestion import Ticket
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
PAGE_READY_S = 300  # the first page load opens the knowledge base and warms the engine up
TICKET = {
    "title": "Megatron pretraining on gpu-h100-0417 crashed at step 48k",
    "description": "Job 8812045 (64 nodes) exited with code 1 after 19h. Rank 211 raised RuntimeError: "
                   "CUDA error: uncorrectable ECC error encountered, then every other rank failed on "
                   "the NCCL abort. Can someone check the node? I'd like to restart from step 47500.",
    "log": "NVRM: Xid (PCI:0000:9b:00): 94, pid=288113, name=python, Contained: CE User Channel (0x1)",
}


def serve_app(home: Path, log_path: Path, launcher: list[str] = STREAMLIT_RUN):
    """The page with PMKB_HOME=home (tests/page_server.py); yields its URL."""
    return serve_page({**os.environ, "PMKB_HOME": str(home)}, log_path, launcher)


def fill_ticket(page, ticket: dict) -> None:
    """Type a ticket into the form and submit it."""
    page.get_by_label("Title").fill(ticket["title"])
    page.get_by_label("Description").fill(ticket["description"])
    page.get_by_label("Log excerpt (optional)").fill(ticket.get("log", ""))
    page.get_by_role("button", name="Suggest").click()


@pytest.fixture
def served_home(_built_kb_dir, tmp_path) -> Path:
    """A private copy of the built knowledge base for the served page."""
    home = tmp_path / "kb"
    shutil.copytree(_built_kb_dir, home)
    return home


@pytest.mark.parametrize("launcher", [STREAMLIT_RUN, PRELOADING], ids=["streamlit-run", "ui.serve"])
def test_a_ticket_typed_in_the_browser_shows_the_engines_root_cause(served_home, embedder, tmp_path, launcher):
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (install it with `make chromium`)")
    from playwright.sync_api import expect, sync_playwright

    kb = KnowledgeBase(make_settings(served_home), embedder=embedder)
    expected = SuggestionEngine(kb).suggest(Ticket(**TICKET))
    kb.store.close()  # the served page opens the store next: an embedded store serves one process at a time
    assert not expected.abstained
    with serve_app(served_home, tmp_path / "streamlit.log", launcher) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1400})
            page.goto(url)
            expect(page.get_by_label("Title")).to_be_visible(timeout=PAGE_READY_S * 1000)
            fill_ticket(page, TICKET)
            expect(page.get_by_role("heading", name=expected.root_cause_name)).to_be_visible(timeout=60_000)
            expect(page.get_by_text(f"confidence {expected.root_cause_confidence:.0%}")).to_be_visible()
            expect(page.locator("mark")).to_have_count(len(expected.evidence))
            expect(page.get_by_text("Similar past incidents")).to_be_visible()
            page.screenshot(path=str(tmp_path / "triage.png"), full_page=True)
        finally:
            browser.close()
