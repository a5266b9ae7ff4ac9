"""Suggestion latency as the knowledge base grows: 100, 10,000 and 100,000 incidents, in an
embedded store and on a Chroma server that the bench starts.

    python bench/suggest_latency.py [--tickets 100] [--sizes 100,10000,100000] [--server-sizes 100,10000,100000]
                                    [--kb DIR]

The bundled incidents are embedded once with the real model (or their vectors are read from a
built knowledge base, ``--kb``). A store of N incidents holds the first N of them, or all of them
plus copies with the words shuffled within each line (new documents for BM25) and the source's
vector with Gaussian noise, re-normalised: embedding 100,000 texts on two cores would take hours
without changing what is measured, which is the search, the vote and the classifiers over a larger
store, all as in production. Each store is measured in a new process: the upsert, the first
snapshot (the corpus read from the store and the text classifiers fitted on it), then each ticket's
suggestion (bundled incident texts, left out of their own neighbours), with the query embedding and
the retrieval timed apart, and the process's peak memory (and the server's). The ratio to the
smallest store is what growing the knowledge base costs a suggestion.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
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


def base_corpus(out: Path, kb_dir: Path | None) -> None:
    """The bundled incidents with their vectors, written to ``out`` (npz) for the measuring processes."""
    import numpy as np

    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase

    if kb_dir is not None:
        kb = KnowledgeBase(Settings(home=kb_dir), read_only=True)
        ids, vectors = kb.store.incident_vectors()
        by_id = {i.id: i for i in kb.store.incidents()}
        incidents = [by_id[i] for i in ids]
    else:
        kb = KnowledgeBase(Settings(home=out.parent / "probe"))
        incidents = kb.bundled_incidents()
        print(f"embedding {len(incidents)} bundled incidents with {kb.embedder.model_id} ...", file=sys.stderr,
              flush=True)
        vectors = kb.embedder.embed_documents([i.text() for i in incidents])
    records = json.dumps([i.model_dump(mode="json") for i in incidents]).encode()
    np.savez(out, vectors=np.asarray(vectors, dtype=np.float32), records=np.frombuffer(records, dtype=np.uint8),
             model=np.frombuffer(kb.embedder.model_id.encode(), dtype=np.uint8))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_chroma(path: Path) -> tuple[subprocess.Popen, str]:
    """``chroma run`` on a free loopback port; the process and its URL."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "chroma"), "run", "--path", str(path),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("`chroma run` did not start")
        time.sleep(0.3)


def peak_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(size: int, base: Path, tickets: int, server: bool) -> dict:
    """One store of ``size`` incidents in this process: build it, then time the suggestions."""
    import numpy as np

    from kb.core.incidents import Incident
    from kb.core.settings import Settings
    from kb.core.suggestion import Ticket
    from kb.engine.embedding import make_embedder
    from kb.engine.knowledge import KnowledgeBase
    from kb.engine.suggest import SuggestionEngine

    data = np.load(base)
    vectors = data["vectors"]
    incidents = [Incident.model_validate(r) for r in json.loads(data["records"].tobytes())]
    rng = random.Random(0)
    tickets_of = [Ticket(id=i.id, title=i.title, description=i.description)
                  for i in rng.sample(incidents, min(tickets, len(incidents)))]
    noise = np.random.default_rng(0)
    home = Path(tempfile.mkdtemp(prefix=f"pmkb-latency-{size}-"))
    chroma = None
    settings = Settings(home=home / "kb")
    if server:
        chroma, url = start_chroma(home / "chroma-server")
        settings = Settings(home=home / "kb", chroma_url=url)
    try:
        kb = KnowledgeBase(settings, embedder=make_embedder(settings))
        assert kb.embedder.model_id == data["model"].tobytes().decode(), "the base vectors are of another model"
        started = time.perf_counter()
        kb.sync_taxonomy()
        chunk = 2000
        for start in range(0, size, chunk):
            rows = range(start, min(size, start + chunk))
            batch, vecs = [], []
            for n in rows:
                source = incidents[n % len(incidents)]
                vector = vectors[n % len(incidents)]
                if n >= len(incidents):
                    source = source.model_copy(update={"id": f"{source.id}~{n}",
                                                       "description": perturb(source.description, rng)})
                    vector = vector + noise.normal(scale=0.02, size=vector.shape).astype(np.float32)
                    vector = vector / np.linalg.norm(vector)
                batch.append(source)
                vecs.append(vector)
            kb.store.upsert_incidents(batch, np.stack(vecs), [kb.dimension_of(i.root_cause) for i in batch])
            print(f"  {size}{' (server)' if server else ''}: {rows.stop:,} incidents stored", file=sys.stderr,
                  flush=True)
        upsert_s = time.perf_counter() - started
        engine = SuggestionEngine(kb)
        engine.load_calibration()
        started = time.perf_counter()
        engine.snapshot()
        snapshot_s = time.perf_counter() - started
        spent: dict[str, float] = defaultdict(float)

        def timed(owner, name: str, key: str) -> None:
            inner = getattr(owner, name)

            def wrapper(*args, **kwargs):
                began = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    spent[key] += time.perf_counter() - began
            setattr(owner, name, wrapper)

        timed(kb.embedder, "embed_queries", "embed")  # embed_query goes through it
        timed(engine.retriever, "retrieve_similar", "retrieve")
        for ticket in tickets_of[:5]:
            engine.suggest(ticket, exclude={ticket.id})
        rows_ms: dict[str, list[float]] = defaultdict(list)
        for ticket in tickets_of:
            spent.clear()
            began = time.perf_counter()
            engine.suggest(ticket, exclude={ticket.id})
            total = (time.perf_counter() - began) * 1000
            rows_ms["total"].append(total)
            rows_ms["embed"].append(spent["embed"] * 1000)
            rows_ms["retrieve"].append(spent["retrieve"] * 1000)
            rows_ms["rest"].append(total - (spent["embed"] + spent["retrieve"]) * 1000)
        result = {"size": kb.store.count(), "server": server, "upsert_s": upsert_s, "snapshot_s": snapshot_s,
                  **{f"p50_{k}": statistics.median(v) for k, v in rows_ms.items()},
                  "p95_total": sorted(rows_ms["total"])[int(0.95 * (len(rows_ms["total"]) - 1))],
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if chroma is not None:
            result["server_peak_mib"] = peak_mib(chroma.pid)
        return result
    finally:
        if chroma is not None:
            chroma.terminate()
            chroma.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=100)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--server-sizes", default="100,10000,100000")
    parser.add_argument("--kb", type=Path, help="read the incidents' vectors from this built knowledge base")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.base, args.tickets, args.server)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.npz"
        base_corpus(base, args.kb)
        runs = [(int(n), False) for n in args.sizes.split(",") if n] + \
               [(int(n), True) for n in args.server_sizes.split(",") if n]
        results = []
        for size, server in runs:
            command = [sys.executable, __file__, "--one", str(size), "--base", str(base), "--tickets",
                       str(args.tickets)] + (["--server"] if server else [])
            done = subprocess.run(command, capture_output=True, text=True,
                                  env={k: v for k, v in os.environ.items() if not k.startswith("PMKB_")}
                                  | {"PMKB_MODEL_CACHE": os.environ.get("PMKB_MODEL_CACHE", "~/.cache/pmkb")})
            sys.stderr.write(done.stderr[-3000:] if done.returncode else "")
            if done.returncode:
                raise SystemExit(f"the run at {size} incidents failed")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{results[-1]}", file=sys.stderr, flush=True)
    print("| store | incidents | suggest p50 ms | p95 ms | query embedding p50 | retrieval p50 | the rest p50 "
          "| vs the smallest | peak memory MiB | upsert s | first snapshot s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for server in (False, True):
        rows = [r for r in results if r["server"] == server]
        for r in rows:
            memory = f"{r['peak_mib']:.0f}" + (f" (+ server {r['server_peak_mib']:.0f})" if server else "")
            print(f"| {'Chroma server' if server else 'embedded'} | {r['size']:,} | {r['p50_total']:.1f} | "
                  f"{r['p95_total']:.1f} | {r['p50_embed']:.1f} | {r['p50_retrieve']:.1f} | {r['p50_rest']:.1f} | "
                  f"{r['p50_total'] / rows[0]['p50_total']:.2f}x | {memory} | {r['upsert_s']:.0f} | "
                  f"{r['snapshot_s']:.1f} |")


if __name__ == "__main__":
    main()
