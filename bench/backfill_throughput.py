"""Backfill throughput against the raw throughput of the embedding model, and peak memory.

    python bench/backfill_throughput.py                     # a few minutes on 2 cores
    python bench/backfill_throughput.py --memory-n 100000   # the 100,000-ticket memory run

Part 1 (real model): N tickets made from the bundled incident reports are embedded raw
(``embed_queries`` in batches, no pmkb code around it) and backfilled (no LLM) in the same
process; raw is measured before and after the backfill and averaged, so a machine that gets
busier half-way does not flatter either side. Part 2 (memory): a child process backfills
``--memory-n`` tickets with the embedder named by ``--memory-embedder`` (``hashing`` by default:
no model, so the run measures pmkb's own memory) and reports its peak RSS (ru_maxrss).
Each part runs in its own child process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_tickets(path: Path, n: int, offset: int = 0) -> list[str]:
    """Write n tickets (JSONL, no labels) made from the bundled incidents; returns their texts."""
    from kb.core.settings import Settings

    base = []
    for file in sorted(Path(Settings().bundled_incidents).glob("*.jsonl")):
        base += [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = []
    with path.open("w", encoding="utf-8") as sink:
        for k in range(offset, offset + n):
            src = base[k % len(base)]
            ticket = {"id": f"bench-{k}", "title": f"{src['title']} (case {k})",
                      "description": f"{src['description']}\nReported from node gpu-{k % 97:03d}."}
            sink.write(json.dumps(ticket) + "\n")
            texts.append(f"{ticket['title']}\n{ticket['description']}")
    return texts


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_throughput(n: int, batch_size: int, work: Path, rounds: int) -> dict:
    """Part 1, in a child process: raw embedding vs backfill on the same texts, interleaved.

    The tickets are cut into ``rounds`` parts; each part is embedded raw and backfilled (into its
    own output), alternating which goes first (ABBA), so a change in machine load hits both sides.
    Wall-clock and process CPU time (all threads) are summed for each side.
    """
    from ingest import read_paths
    from kb.core.settings import Settings
    from kb.core.suggestion import Ticket
    from kb.engine.knowledge import KnowledgeBase
    from kb.jobs.backfill import BackfillOptions, backfill_engine, run_backfill

    kb = KnowledgeBase(Settings(home=work / "kb", embedding_device="cpu"))
    kb.ensure_built()
    engine = backfill_engine(kb)
    embedder = kb.embedder
    size = -(-n // rounds)
    parts = []
    for r in range(rounds):
        source = work / f"tickets-{r}.jsonl"
        texts = make_tickets(source, min(size, n - r * size), offset=r * size)
        parts.append((source, texts))
    engine.suggest_batch([Ticket(id="warm-up", title="warm-up", description=parts[0][1][0])])
    embedder.embed_queries(parts[0][1][:batch_size])  # weights in cache, threads started
    totals = {"raw": [0.0, 0.0, 0], "backfill": [0.0, 0.0, 0]}

    def measure(side: str, call) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        count = call()
        totals[side][0] += time.perf_counter() - wall
        totals[side][1] += time.process_time() - cpu
        totals[side][2] += count

    def raw(texts: list[str]) -> int:
        for start in range(0, len(texts), batch_size):
            embedder.embed_queries(texts[start:start + batch_size])
        return len(texts)

    def backfill(r: int, source: Path) -> int:
        options = BackfillOptions(out=work / f"out-{r}.jsonl", batch_size=batch_size)
        return run_backfill(engine, read_paths([source]), options).annotated

    for r, (source, texts) in enumerate(parts):
        order = [("raw", lambda: raw(texts)), ("backfill", lambda: backfill(r, source))]
        for side, call in (order if r % 2 == 0 else order[::-1]):
            measure(side, call)
    rate = {side: count / wall for side, (wall, _, count) in totals.items()}
    cpu = {side: count / cpu for side, (_, cpu, count) in totals.items()}
    return {"n": n, "rounds": rounds, "model": embedder.model_id, "raw": rate["raw"],
            "backfill": rate["backfill"], "raw_cpu": cpu["raw"], "backfill_cpu": cpu["backfill"],
            "annotated": totals["backfill"][2], "peak_rss_mib": peak_rss_mib()}


def child_memory(n: int, batch_size: int, work: Path, embedder: str) -> dict:
    """Part 2, in a child process: one backfill of n tickets; peak memory."""
    from ingest import read_paths
    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase
    from kb.jobs.backfill import BackfillOptions, backfill_engine, run_backfill

    kb = KnowledgeBase(Settings(home=work / "kb", embedder=embedder, embedding_device="cpu"))
    kb.ensure_built()
    engine = backfill_engine(kb)
    source = work / "tickets.jsonl"
    make_tickets(source, n)
    before = peak_rss_mib()
    out = work / "out.jsonl"
    started = time.perf_counter()
    result = run_backfill(engine, read_paths([source]), BackfillOptions(out=out, batch_size=batch_size),
                          report=work / "out.report.md")
    seconds = time.perf_counter() - started
    return {"n": n, "model": kb.embedder.model_id, "annotated": result.annotated, "seconds": seconds,
            "rate": result.annotated / result.seconds, "peak_rss_mib": peak_rss_mib(),
            "rss_before_run_mib": before, "input_mib": source.stat().st_size / 2 ** 20,
            "output_mib": out.stat().st_size / 2 ** 20,
            "state_mib": (work / "out.state.sqlite3").stat().st_size / 2 ** 20}


def run_child(args: list[str], timeout: float) -> dict:
    """Run this script as a child process and return the JSON it prints last."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Parse arguments, run both parts, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=512, help="tickets for the real-model throughput part")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved raw/backfill rounds")
    parser.add_argument("--memory-n", type=int, default=10_000, help="tickets for the memory part (0: skip)")
    parser.add_argument("--memory-embedder", default="hashing")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--child", choices=["throughput", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "throughput":
        print(json.dumps(child_throughput(args.n, args.batch_size, args.work, args.rounds)))
        return
    if args.child == "memory":
        print(json.dumps(child_memory(args.memory_n, args.batch_size, args.work, args.memory_embedder)))
        return
    with tempfile.TemporaryDirectory(prefix="pmkb-bench-") as tmp:
        rows = []
        if args.n:
            work = Path(tmp) / "throughput"
            work.mkdir()
            t = run_child(["--child", "throughput", "--n", str(args.n), "--batch-size", str(args.batch_size),
                           "--rounds", str(args.rounds), "--work", str(work)], args.timeout)
            rows += [("tickets (real model, interleaved rounds)", f"{t['n']} ({t['rounds']} rounds)"),
                     ("embedding model", t["model"]),
                     ("raw embedding, tickets/s (wall)", f"{t['raw']:.1f}"),
                     ("backfill, tickets/s (wall, no LLM)", f"{t['backfill']:.1f}"),
                     ("backfill / raw embedding (wall)", f"{t['backfill'] / t['raw']:.3f} (target >= 0.9)"),
                     ("raw embedding, tickets per CPU-second", f"{t['raw_cpu']:.1f}"),
                     ("backfill, tickets per CPU-second", f"{t['backfill_cpu']:.1f}"),
                     ("backfill / raw embedding (CPU time)", f"{t['backfill_cpu'] / t['raw_cpu']:.3f}"),
                     ("peak RSS, real-model process (MiB)", f"{t['peak_rss_mib']:.0f}")]
        if args.memory_n:
            work = Path(tmp) / "memory"
            work.mkdir()
            m = run_child(["--child", "memory", "--memory-n", str(args.memory_n), "--batch-size",
                           str(args.batch_size), "--memory-embedder", args.memory_embedder,
                           "--work", str(work)], args.timeout)
            rows += [(f"tickets (memory run, {m['model']})", f"{m['n']}"),
                     ("memory run: backfill + report, seconds",
                      f"{m['seconds']:.0f} (backfill {m['rate']:.1f} tickets/s)"),
                     ("memory run: peak RSS (MiB)", f"{m['peak_rss_mib']:.0f} "
                      f"(before the run: {m['rss_before_run_mib']:.0f})"),
                     ("memory run: input / output / state file (MiB)",
                      f"{m['input_mib']:.0f} / {m['output_mib']:.0f} / {m['state_mib']:.0f}")]
        width = max(len(k) for k, _ in rows)
        print(f"| {'measure':{width}} | value |\n|{'-' * (width + 2)}|-------|")
        for key, value in rows:
            print(f"| {key:{width}} | {value} |")


if __name__ == "__main__":
    main()
