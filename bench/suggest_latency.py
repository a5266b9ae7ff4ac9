"""Suggest latency (p50 over 100 tickets) with about 100 and with 10,000 incidents in the store.

    python bench/suggest_latency.py [--tickets 100] [--large 10000]

The small store holds the first 100 bundled incidents. The large store holds all bundled
incidents plus perturbed copies up to --large: words shuffled within each line (so BM25 sees new
documents) and the source's vector with Gaussian noise, re-normalised (re-embedding 10,000 texts
on two CPU cores would dominate the run without changing what is measured: search and
classification over a larger store). Tickets are bundled incident texts, excluded from their own neighbours.
The ratio (large / small) is what growing the knowledge base costs a suggestion.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def perturb(text: str, rng: random.Random) -> str:
    """Shuffle words within each line: same vocabulary, different text."""
    lines = []
    for line in text.splitlines():
        words = line.split()
        rng.shuffle(words)
        lines.append(" ".join(words))
    return "\n".join(lines)


def build(home: Path, incidents, embedder, calibration=None, copies=()) -> "object":
    """A knowledge base holding the incidents (and noisy copies), and its engine."""
    import numpy as np

    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase
    from kb.engine.suggest import SuggestionEngine

    kb = KnowledgeBase(Settings(home=home), embedder=embedder)
    kb.sync_taxonomy()
    kb.add_incidents(incidents, batch_size=512)
    if copies:
        ids, vectors = kb.store.incident_vectors()
        by_id = dict(zip(ids, vectors))
        rng = np.random.default_rng(0)
        for start in range(0, len(copies), 1000):
            chunk = copies[start:start + 1000]
            vecs = np.stack([by_id[c.id.split("~")[0]] for c in chunk])
            vecs = vecs + rng.normal(scale=0.02, size=vecs.shape).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            kb.store.upsert_incidents(chunk, vecs, [kb.dimension_of(c.root_cause) for c in chunk])
    engine = SuggestionEngine(kb, calibration=calibration)
    engine.calibration
    return engine


def p50(engine, tickets) -> float:
    for t in tickets[:5]:
        engine.suggest(t)
    times = []
    for t in tickets:
        start = time.perf_counter()
        engine.suggest(t, exclude={t.id})
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    """Build both stores, time the suggestions, print a table."""
    from kb.core.settings import Settings
    from kb.core.suggestion import Ticket
    from kb.engine.embedding import SentenceTransformerEmbedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    args = parser.parse_args()
    embedder = SentenceTransformerEmbedder(Settings().embedding_model)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        from kb.engine.knowledge import KnowledgeBase

        bundled = KnowledgeBase(Settings(home=Path(tmp) / "probe"), embedder=embedder).bundled_incidents()
        tickets = [Ticket(id=i.id, title=i.title, description=i.description)
                   for i in rng.sample(bundled, min(args.tickets, len(bundled)))]
        small = build(Path(tmp) / "small", bundled[:100], embedder)
        copies = []
        while len(bundled) + len(copies) < args.large:
            src = bundled[len(copies) % len(bundled)]
            copies.append(src.model_copy(update={"id": f"{src.id}~{len(copies)}",
                                                 "description": perturb(src.description, rng)}))
        start = time.perf_counter()
        large = build(Path(tmp) / "large", bundled, embedder, small.calibration, copies)
        built = time.perf_counter() - start
        small_ms, large_ms = p50(small, tickets), p50(large, tickets)
    print(f"| store | incidents | suggest p50 (ms) over {len(tickets)} tickets | ratio |")
    print("|---|---|---|---|")
    print(f"| small | {small.kb.store.count()} | {small_ms:.0f} | 1.00 |")
    print(f"| large | {large.kb.store.count()} | {large_ms:.0f} | {large_ms / small_ms:.2f} |")
    print(f"\nbuilding the large store (embed + upsert + calibration fit) took {built:.0f} s")


if __name__ == "__main__":
    main()
