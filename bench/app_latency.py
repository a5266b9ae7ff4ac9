"""How long the chat page takes to show a suggestion after warm-up (no LLM), headless.

    python bench/app_latency.py              # a private copy of a KB built from the bundled data
    python bench/app_latency.py --home DIR   # an existing knowledge base (read; feedback not used)

The page runs under Streamlit's AppTest in this process: one run loads the model, the
knowledge base and the engine (the cold start, reported apart), then each ticket is
typed in and submitted, and the time of the whole rerun (suggestion plus rendering of
the card, evidence and similar incidents) is measured. Tickets are the bundled
incident reports' titles and descriptions, so their evidence and neighbours are real.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bundled_tickets(n: int) -> list[dict]:
    """n tickets (title, description) spread over the bundled incident files."""
    from kb.core.settings import Settings

    rows = []
    for file in sorted(Path(Settings().bundled_incidents).glob("*.jsonl")):
        rows += [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    step = max(1, len(rows) // n)
    return [{"title": r["title"], "description": r["description"]} for r in rows[::step][:n]]


def main() -> None:
    """Run the benchmark and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path,
                        help="knowledge-base directory (default: build one in a temp dir)")
    parser.add_argument("--tickets", type=int, default=20, help="tickets to submit")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pmkb-bench-") as scratch:
        home = args.home or Path(scratch) / "kb"
        os.environ["PMKB_HOME"] = str(home)
        from streamlit.testing.v1 import AppTest

        started = time.perf_counter()
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
        cold = time.perf_counter() - started
        if at.exception:
            raise SystemExit(f"the page failed to start: {at.exception}")
        times, engine_ms = [], []
        for ticket in bundled_tickets(args.tickets):
            at.text_input(key="ticket-title").set_value(ticket["title"])
            at.text_area(key="ticket-description").set_value(ticket["description"])
            submit = next(b for b in at.button if b.label == "Suggest")
            started = time.perf_counter()
            submit.click().run()
            times.append(time.perf_counter() - started)
            if at.exception:
                raise SystemExit(f"the page failed on {ticket['title']!r}: {at.exception}")
            engine_ms.append(at.session_state["triage"]["suggestion"].trace["latency_ms"])
        times_ms = sorted(t * 1000 for t in times)
        print(json.dumps({
            "knowledge_base": str(home), "tickets": len(times_ms), "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
            "cold_start_s": round(cold, 2),
            "submit_to_rendered_ms": {"median": round(statistics.median(times_ms), 1),
                                      "p90": round(times_ms[int(0.9 * (len(times_ms) - 1))], 1),
                                      "max": round(times_ms[-1], 1)},
            "engine_suggest_ms_median": round(statistics.median(engine_ms), 1),
        }, indent=2))


if __name__ == "__main__":
    main()
