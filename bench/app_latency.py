"""How long the chat page takes to show a suggestion, in a real headless Chromium.

    python bench/app_latency.py [--kb DIR] [--tickets 10]

``streamlit run app.py`` serves a prebuilt knowledge base (``--kb``, default ``PMKB_HOME``, else a
copy of the bundled one that ``pmkb build`` prepares first; minutes). Three times are taken, each
to the moment the page has finished its run with the suggestion card on it:

* the first suggestion of the first visit, the page opened as soon as the server answers: with
  ``streamlit run app.py`` the model and the knowledge base load during that visit; ``make run``
  (``python -m ui.serve``) starts loading them with the server;
* the first suggestion of a second browser, which finds them loaded (shared across sessions);
* each later suggestion of that browser: from the click on Suggest.

A ticket is typed (title and description) as soon as the form shows, and each card is checked
against ``pmkb suggest --json`` on the same ticket. The whole run is made three times: as ``make
run`` serves the page, as ``streamlit run app.py`` does, and, as the baseline, as the page ran
before: ``streamlit run app.py`` with the model on torch (``PMKB_ONNX_QUERIES=false``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]

WATCH_RUN = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  window.__pmkbRun = {running: false, done: false};
  if (window.__pmkbObserver) window.__pmkbObserver.disconnect();
  window.__pmkbObserver = new MutationObserver(() => {
    const state = app.getAttribute('data-test-script-state');
    if (state === 'running') window.__pmkbRun.running = true;
    else if (window.__pmkbRun.running && state === 'notRunning') window.__pmkbRun.done = true;
  });
  window.__pmkbObserver.observe(app, {attributes: true});
}"""
"""Watches the page's script state, so that a run is seen end to end however short it is."""


def bench_tickets(n: int) -> list[dict]:
    """n bundled incident reports as tickets (title and description), spread over the files."""
    files = sorted((ROOT / "data" / "incidents").glob("*.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    picked = random.Random(7).sample(records, n)
    return [{"title": r["title"][:200], "description": r["description"][:3000]} for r in picked]


def expected_cause(ticket: dict, env: dict) -> tuple[str, bool]:
    """What the card must show of the root cause ``pmkb suggest`` gives the ticket, and whether as
    the whole text of an element: its id, or, when the suggestion abstains, its name inside the
    "not sure" line."""
    done = subprocess.run([sys.executable, "-m", "pmkb", "suggest", "--local", "--json", "--title", ticket["title"],
                           ticket["description"]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"pmkb suggest failed:\n{done.stderr[-2000:]}")
    answer = json.loads(done.stdout)
    return ((f"The best guess, {answer['root_cause_name']}", False) if answer["abstained"]
            else (answer["root_cause"], True))


def suggest_on(page, ticket: dict, cause: tuple[str, bool]) -> float:
    """Type the ticket, press Suggest, wait for the run to end and check the card's cause; the
    time (s) of the click at the performance counter."""
    page.get_by_label("Title").fill(ticket["title"])
    page.get_by_label("Description").fill(ticket["description"])
    page.evaluate(WATCH_RUN)
    clicked = time.perf_counter()
    page.get_by_role("button", name="Suggest").click()
    page.wait_for_function("() => window.__pmkbRun.done", timeout=300_000, polling="raf")
    text, exact = cause
    page.get_by_text(text, exact=exact).first.wait_for(state="visible", timeout=10_000)
    return clicked


def run(env: dict, launcher: list[str], tickets: list[dict], causes: list[tuple[str, bool]], log: Path) -> dict:
    """The three times (seconds) with one server on ``env``, started by ``launcher``."""
    from playwright.sync_api import sync_playwright

    from tests.page_server import serve_page

    with serve_page(env, log, launcher) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM) if CHROMIUM.exists() else None,
                                    args=CHROMIUM_ARGS)
        try:
            times = {}
            for visit in ("cold", "warm"):
                page = browser.new_context().new_page()
                started = time.perf_counter()
                page.goto(url)
                page.get_by_label("Title").wait_for(state="visible", timeout=300_000)
                page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=300_000)
                suggest_on(page, tickets[0], causes[0])
                times[visit] = time.perf_counter() - started
            later = []
            for ticket, cause in zip(tickets[1:], causes[1:]):
                clicked = suggest_on(page, ticket, cause)
                later.append(time.perf_counter() - clicked)
            times["later_p50"], times["later_max"] = statistics.median(later), max(later)
            return times
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=Path, default=os.environ.get("PMKB_HOME"))
    parser.add_argument("--tickets", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pmkb-app-bench-"))
    home = work / "kb"
    if args.kb:
        shutil.copytree(args.kb, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMKB_") and k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PMKB_HOME": str(home), "PMKB_LLM": "none"}
    if "PMKB_MODEL_CACHE" in os.environ:
        env["PMKB_MODEL_CACHE"] = os.environ["PMKB_MODEL_CACHE"]
    print(f"preparing {home} (pmkb build) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pmkb", "build"], cwd=ROOT, env=env, check=True, capture_output=True)
    tickets = bench_tickets(args.tickets + 1)
    causes = [expected_cause(t, env) for t in tickets]
    from tests.page_server import PRELOADING, STREAMLIT_RUN

    runs = {"as shipped (make run: loading starts with the server)": (env, PRELOADING),
            "streamlit run app.py (loading starts at the first visit)": (env, STREAMLIT_RUN),
            "baseline: streamlit run app.py, query on torch": (env | {"PMKB_ONNX_QUERIES": "false"}, STREAMLIT_RUN)}
    results = {}
    for name, (run_env, launcher) in runs.items():
        results[name] = run(run_env, launcher, tickets, causes, work / f"streamlit-{len(results)}.log")
        print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    names = list(results)
    print(f"| the page in a real headless Chromium ({args.tickets} later tickets), seconds | "
          + " | ".join(names) + " | baseline / as shipped |")
    print("|---|" + "---|" * (len(names) + 1))
    for key, label in (("cold", "first suggestion, first visit once the server answers (from opening the page)"),
                       ("warm", "first suggestion, a second browser (from opening the page)"),
                       ("later_p50", "each later suggestion, p50 (from the click)"),
                       ("later_max", "each later suggestion, slowest (from the click)")):
        row = [results[name][key] for name in names]
        print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {row[-1] / row[0]:.1f}x |")


if __name__ == "__main__":
    main()
