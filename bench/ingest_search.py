"""Ingest throughput and `pmkb search` cold start, each against a baseline in the same run.

    python bench/ingest_search.py [--limit N]

1. Ingest: the bundled incident reports into a fresh knowledge base (redact, hash, embed,
   upsert into Chroma), against the raw throughput of the same embedding model on the same
   texts (the part no ingest can avoid).
2. Cold start: wall time of a fresh `pmkb search` process, against `pmkb --help` (the
   interpreter and CLI start-up alone).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _time_process(args: list[str], repeat: int) -> float:
    best = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pmkb", *args], cwd=ROOT, check=True, capture_output=True)
        best.append(time.perf_counter() - start)
    return sorted(best)[len(best) // 2]


def main() -> None:
    """Run both measurements and print a table."""
    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="use only the first N bundled incidents")
    parser.add_argument("--repeat", type=int, default=3, help="cold-start runs (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(Settings(home=Path(tmp) / "kb"))
        incidents = kb.bundled_incidents()
        if args.limit:
            incidents = incidents[:args.limit]
        kb.embedder.embed_query("warm up")
        texts = [i.text() for i in incidents]
        start = time.perf_counter()
        kb.embedder.embed_documents(texts)
        raw = len(texts) / (time.perf_counter() - start)
        kb.sync_taxonomy()
        start = time.perf_counter()
        report = kb.add_incidents(incidents)
        ingest = report.added / (time.perf_counter() - start)
        start = time.perf_counter()
        again = kb.add_incidents(incidents)
        reingest = again.unchanged / (time.perf_counter() - start)
        home = str(Path(tmp) / "kb")
        helpt = _time_process(["--help"], args.repeat)
        search = _time_process(["--kb", home, "search", "NCCL watchdog timeout after InfiniBand port flap"],
                               args.repeat)
    print(f"| measurement ({len(incidents)} incidents) | value | baseline | ratio |")
    print("|---|---|---|---|")
    print(f"| ingest (incidents/s) | {ingest:.1f} | raw embedding {raw:.1f}/s | {ingest / raw:.2f} |")
    print(f"| re-ingest unchanged (incidents/s) | {reingest:.0f} | ingest {ingest:.1f}/s | {reingest / ingest:.1f} |")
    print(f"| `pmkb search` cold start (s) | {search:.2f} | `pmkb --help` {helpt:.2f} s | {search / helpt:.1f} |")


if __name__ == "__main__":
    main()
