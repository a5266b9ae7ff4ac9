"""Load test of ``pmkb serve`` on loopback: webhook acceptance and webhook-to-write-back latency.

Runs the service in-process (uvicorn on a free 127.0.0.1 port, write-back in dry-run mode to a
temporary outbox) over a copy of a knowledge base, then measures:

* baseline: synchronous ``POST /v1/annotate`` calls, one at a time;
* a burst of signed GitHub ``issues`` webhooks from several clients: how fast they are accepted
  (202) and how long each takes to reach the write-back;
* the same webhooks one at a time (no queueing): webhook-to-write-back latency at rest.

Bounded by ``--events`` and ``--max-seconds``. Usage:
    .venv/bin/python bench/webhook_load.py [--kb DIR] [--events 100] [--clients 8]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from kb.core.settings import Settings, load_settings  # noqa: E402
from kb.engine.knowledge import KnowledgeBase  # noqa: E402
from kb.engine.suggest import SuggestionEngine  # noqa: E402
from pmkb.server import create_app  # noqa: E402

SECRET, TOKEN = "bench-secret", "bench-token"
TICKETS = [
    ("Xid 48 double-bit ECC error on gpu-a-{n}, training crashed",
     "NVRM: Xid (PCI:0000:3b:00): 48, DBE (double bit error) ECC error. The job died at step {n}00."),
    ("Job {n} cannot import torch", "ModuleNotFoundError: No module named torch after I changed my conda env"),
    ("NCCL watchdog timeout on run {n}",
     "Watchdog caught collective operation timeout on rank 3; mlx5_0 link down on node gpu-b-0{n}"),
    ("Jobs stuck pending since this morning ({n})", "All my jobs stay Pending; the scheduler says no nodes available."),
]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of the values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def ticket(n: int) -> tuple[str, str]:
    title, body = TICKETS[n % len(TICKETS)]
    return title.format(n=n), body.format(n=n)


def issues_event(n: int) -> bytes:
    title, body = ticket(n)
    return json.dumps({"action": "opened", "issue": {
        "number": n, "title": title, "body": body, "html_url": f"https://github.com/bench/ops/issues/{n}",
        "labels": [], "state": "open"}, "repository": {"full_name": "bench/ops"}}).encode()


def post_webhook(client: httpx.Client, url: str, n: int) -> tuple[float, float, int]:
    """(send time, seconds to the 202, event id) for issue n."""
    body = issues_event(n)
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    sent = time.time()
    response = client.post(f"{url}/webhooks/github", content=body, headers={
        "X-GitHub-Event": "issues", "X-GitHub-Delivery": f"bench-{n}", "X-Hub-Signature-256": signature,
        "Content-Type": "application/json"})
    response.raise_for_status()
    return sent, time.time() - sent, response.json()["event_id"]


def wait_done(queue, ids: list[int], deadline: float) -> dict[int, float]:
    """finished_at of each handled event, once all are handled (or the deadline passes)."""
    wanted = set(ids)
    while True:
        events = [e for e in queue.events() if e.id in wanted]
        if all(e.status in ("done", "dead") for e in events) or time.time() > deadline:
            return {e.id: e.finished_at for e in events if e.status == "done"}
        time.sleep(0.05)


def row(name: str, rate: float, latencies: list[float]) -> dict:
    return {"name": name, "rate": rate, "p50": percentile(latencies, 50) * 1000,
            "p99": percentile(latencies, 99) * 1000, "n": len(latencies)}


def run(home: Path, events: int, clients: int, baseline_calls: int, max_seconds: float) -> list[dict]:
    """Start the service on ``home`` and take the measurements."""
    settings = Settings(home=home, github_webhook_secret=SECRET, api_token=TOKEN, rate_limit_per_second=1e6,
                        rate_limit_burst=1_000_000, writeback_outbox=home / "outbox.jsonl")
    app = create_app(settings, engine=SuggestionEngine(KnowledgeBase(settings)), poll=0.05)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    url, queue = f"http://127.0.0.1:{port}", app.state.service.queue
    stop_at = time.time() + max_seconds
    with httpx.Client(timeout=60) as client:
        while time.time() < stop_at:
            try:
                if client.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for n in range(4 * len(TICKETS)):  # warm-up: caches, and kernels for new input lengths
            title, body = ticket(20_000 + n)
            client.post(f"{url}/v1/annotate", json={"title": title, "description": body}, headers=auth)
        # Baseline and paced webhooks take turns, so both see the same machine load.
        annotate, paced = [], []
        for n in range(baseline_calls):
            title, body = ticket(10_000 + n)
            started = time.perf_counter()
            client.post(f"{url}/v1/annotate", json={"title": title, "description": body},
                        headers=auth).raise_for_status()
            annotate.append(time.perf_counter() - started)
            t, _, event_id = post_webhook(client, url, 10_000 + n)
            done = wait_done(queue, [event_id], stop_at)
            if event_id in done:
                paced.append(done[event_id] - t)
        results = [row("baseline: POST /v1/annotate (sync)", len(annotate) / sum(annotate), annotate)]
        if paced:
            results.append(row("webhook -> write-back, one at a time", len(paced) / sum(paced), paced))

        started = time.time()
        with ThreadPoolExecutor(clients) as pool:
            sent = list(pool.map(lambda n: post_webhook(client, url, n), range(1, events + 1)))
        accept_wall = time.time() - started
        results.append(row(f"webhook accept, burst of {events} from {clients} clients", events / accept_wall,
                           [s[1] for s in sent]))
        finished = wait_done(queue, [s[2] for s in sent], stop_at)
        e2e = [finished[i] - t for t, _, i in sent if i in finished]
        if e2e:
            results.append(row("webhook -> write-back, same burst", len(e2e) / (max(finished.values()) - started),
                               e2e))
    server.should_exit = True
    return results


def render(results: list[dict]) -> str:
    """The results as a Markdown table, each figure also as a ratio to the baseline."""
    base = results[0]
    lines = ["| path | n | events/s | p50 ms | p99 ms | events/s vs baseline | p50 vs baseline | p99 vs baseline |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ratios = " | ".join(f"{r[k] / base[k]:.2f}x" for k in ("rate", "p50", "p99"))
        lines.append(f"| {r['name']} | {r['n']} | {r['rate']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | {ratios} |")
    return "\n".join(lines)


def main() -> None:
    """Parse options, prepare a knowledge base copy, run and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=Path, help="a built knowledge base to copy (default: build one from the "
                                                "bundled incidents in a temporary directory)")
    parser.add_argument("--events", type=int, default=100, help="webhooks in the burst (default 100)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent senders (default 8)")
    parser.add_argument("--baseline", type=int, default=20, help="annotate calls and paced webhooks (default 20)")
    parser.add_argument("--max-seconds", type=float, default=300, help="stop waiting after this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pmkb-bench-") as tmp:
        home = Path(tmp) / "kb"
        if args.kb:
            shutil.copytree(args.kb, home, ignore=shutil.ignore_patterns("queue.sqlite3*", "outbox.jsonl"))
        settings = load_settings(home=home)
        knowledge = KnowledgeBase(settings)
        if knowledge.ensure_built():
            print(f"built a knowledge base in {home}", file=sys.stderr)
        SuggestionEngine(knowledge).calibration
        results = run(home, args.events, args.clients, args.baseline, args.max_seconds)
    print(f"pmkb serve on loopback, dry-run write-back; {settings.embedder} {settings.embedding_model}")
    print(render(results))


if __name__ == "__main__":
    main()
