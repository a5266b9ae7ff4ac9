"""Both HTTP services under slow and greedy clients, uvicorn alone (before) against the guarded
listener and fair turns (after), in the same run.

    .venv/bin/python bench/slow_clients.py --kb DIR [--slow 1100] [--probes 20] [--big-calls 3]

1. **A flood of slow connections.** Each service (``pmkb serve``'s app, ``pmkb mcp --http``'s app)
   runs in a child process with a 1,024 open-file limit, served by plain ``uvicorn.run`` (before)
   or by ``pmkb.listener.serve_app`` (after). ``--slow`` connections each send the start of a
   request and then one header byte every 10 s; meanwhile ``--probes`` requests go one at a time
   (a GitHub webhook queued on the webhook service, an MCP session and a ``search`` on the MCP one,
   each with a 5 s timeout): how soon the service is ready, p50 and p99 latency and how many
   failed (a failure counts as 5 s). The flood starts as soon as the child listens, while its
   knowledge base loads, as during a restart.
2. **One greedy MCP client.** ``pmkb mcp --http`` over the knowledge base: client A (from
   127.0.0.2) sends ``--big-calls`` concurrent ``suggest`` calls of 950 kB each; 0.5 s later client B
   (127.0.0.1) sends ``search`` calls one at a time until A is answered. B's search latency, with
   the engine lock that served callers in arrival order (before) and with fair turns (after), beside
   B's searches with nobody else calling (the baseline).

The ratio is after over before (lower is better) for the flood, and each against B alone for the
greedy client. Every child loads a copy of the knowledge base; expect 5 to 10 minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

TOKEN = "bench-token"
ACCEPT = "application/json, text/event-stream"
REQUEST_IDS = itertools.count(2)
"""JSON-RPC ids: unique per call, since a session routes each answer by its request's id."""
GITHUB_EVENT = {"action": "opened", "issue": {"number": 7, "title": "Xid 79 on gpu-a17", "body": "GPU fell off the bus",
                                               "labels": [], "updated_at": "2026-01-01T00:00:00Z"},
                "repository": {"full_name": "org/cluster"}}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "bench", "version": "0"}}}

CHILD = '''
import resource, sys, threading
from contextlib import contextmanager
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
service, guarded, port = sys.argv[1], sys.argv[2] == "after", int(sys.argv[3])
from kb.core.settings import load_settings
settings = load_settings()
if service == "webhook":
    from pmkb.server import create_app
    app = create_app(settings, insecure_dev=True)
else:
    from pmkb.mcp_server import build_server, http_app
    server, tools = build_server(settings)
    if not guarded:  # the engine lock before fair turns: callers in arrival order
        lock = threading.Lock()
        class ArrivalOrder:
            @contextmanager
            def turn(self, client):
                with lock:
                    yield
        tools._turns = ArrivalOrder()
    app = http_app(server, settings, "127.0.0.1")
    tools.start()
if guarded:
    from pmkb.listener import serve_app
    serve_app(app, "127.0.0.1", port, settings.header_timeout, settings.max_connections)
else:
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, server_header=False)
'''


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of the values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(service: str, variant: str, home: Path, logs: Path) -> tuple[subprocess.Popen, int]:
    """A child serving ``service`` as ``variant`` (before/after) over its own copy of the knowledge base."""
    copy = Path(tempfile.mkdtemp(prefix=f"slow-{service}-{variant}-")) / "kb"
    shutil.copytree(home, copy)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMKB_")} | {
        "PMKB_HOME": str(copy), "PMKB_API_TOKEN": TOKEN, "PMKB_EMBEDDING_DEVICE": "cpu",
        "PMKB_WRITEBACK_OUTBOX": str(copy.parent / "outbox.jsonl"), "OMP_WAIT_POLICY": "PASSIVE"}
    with (logs / f"{service}-{variant}.log").open("w") as errlog:
        child = subprocess.Popen([sys.executable, "-c", CHILD, service, variant, str(port)], env=env, cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=errlog)
    deadline = time.time() + 300
    while time.time() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the {service} child exited; see {logs / f'{service}-{variant}.log'}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return child, port
        except httpx.HTTPError:
            time.sleep(0.3)
    child.kill()
    raise RuntimeError(f"the {service} child did not listen")


def stop(child: subprocess.Popen) -> None:
    child.terminate()
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()


class Trickle:
    """``count`` connections sending the start of a request, then a header byte every 10 s."""

    def __init__(self, port: int, count: int):
        self.socks: list[socket.socket] = []
        for _ in range(count):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                self.socks.append(sock)
            except OSError:
                pass
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self) -> None:
        while not self.done.wait(10):
            for sock in self.socks:
                try:
                    sock.send(b"X")
                except OSError:
                    pass

    def close(self) -> None:
        self.done.set()
        for sock in self.socks:
            sock.close()


def probe(service: str, port: int) -> float | None:
    """Seconds one unit of real work took, None when it failed: a GitHub webhook queued (202) on the
    webhook service, an MCP session initialised and a ``search`` answered on the MCP one."""
    started = time.perf_counter()
    try:
        if service == "webhook":
            ok = httpx.post(f"http://127.0.0.1:{port}/webhooks/github", timeout=5, json=GITHUB_EVENT, headers={
                "X-GitHub-Event": "issues", "X-GitHub-Delivery": f"probe-{time.time_ns()}"}).status_code == 202
        else:
            asyncio.run(_search_once(port, timeout=5))
            ok = True
    except (httpx.HTTPError, ValueError, KeyError, AssertionError):
        ok = False
    return time.perf_counter() - started if ok else None


def ready(service: str, port: int, within: float) -> float | None:
    """Seconds until the service's knowledge base answered (None: not within ``within``)."""
    started = time.perf_counter()
    while time.perf_counter() - started < within:
        try:
            if service == "webhook":
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - started
            else:
                asyncio.run(_search_once(port, timeout=60))
                return time.perf_counter() - started
        except (httpx.HTTPError, ValueError, KeyError, AssertionError):
            pass
        time.sleep(1)
    return None


async def _search_once(port: int, timeout: float) -> None:
    async with httpx.AsyncClient(timeout=timeout) as client:
        url = f"http://127.0.0.1:{port}/mcp"
        await call(client, url, await mcp_session(client, url), "search", {"query": "Xid 79 GPU fell off the bus"})


def flood(home: Path, logs: Path, slow: int, probes: int) -> list[tuple]:
    """Per service and listener: the flood starts as soon as the child listens (its knowledge base
    still loading), then how soon it is ready and how its probes fare."""
    rows = []
    for service in ("webhook", "mcp"):
        for variant in ("before", "after"):
            child, port = start(service, variant, home, logs)
            try:
                trickle = Trickle(port, slow)
                became_ready = ready(service, port, 120)
                times = [probe(service, port) for _ in range(probes)]
                trickle.close()
            finally:
                stop(child)
            counted = [t if t is not None else 5.0 for t in times]
            rows.append((service, variant, len(trickle.socks), became_ready, percentile(counted, 50) * 1000,
                         percentile(counted, 99) * 1000, sum(t is None for t in times)))
            print(f"  {service} {variant}: done", file=sys.stderr)
    return rows


async def mcp_session(client: httpx.AsyncClient, url: str) -> dict:
    """Headers of an initialised MCP session."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": ACCEPT}
    first = await client.post(url, json=INITIALIZE, headers=headers)
    first.raise_for_status()
    headers["mcp-session-id"] = first.headers["mcp-session-id"]
    headers["mcp-protocol-version"] = "2025-06-18"
    await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


async def call(client: httpx.AsyncClient, url: str, headers: dict, tool: str, arguments: dict) -> float:
    started = time.perf_counter()
    message = {"jsonrpc": "2.0", "id": next(REQUEST_IDS), "method": "tools/call",
               "params": {"name": tool, "arguments": arguments}}
    answer = await client.post(url, headers=headers, json=message)
    answer.raise_for_status()
    lines = [line[5:] for line in answer.text.splitlines() if line.startswith("data:")] or [answer.text]
    data = json.loads(lines[0])
    assert "result" in data and not data["result"].get("isError"), str(data)[:300]
    return time.perf_counter() - started


async def greedy(port: int, big_calls: int, alone: bool) -> list[float]:
    """B's search latencies while A's big suggests run (or with nobody else, when ``alone``)."""
    url = f"http://127.0.0.1:{port}/mcp"
    line = "RuntimeError: NCCL watchdog timeout on rank 3 host gpu-a12 collective ALLREDUCE seq 1234 after 600000 ms\n"
    big = {"title": "job crashed", "description": line * (950_000 // len(line))}
    query = {"query": "NCCL watchdog timeout after an InfiniBand port flap", "k": 5}
    async with httpx.AsyncClient(timeout=600, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")) as a, \
            httpx.AsyncClient(timeout=600) as b:
        a_headers, b_headers = await mcp_session(a, url), await mcp_session(b, url)
        await call(b, url, b_headers, "search", query)  # warm
        if alone:
            return [await call(b, url, b_headers, "search", query) for _ in range(10)]
        calls = [asyncio.create_task(call(a, url, a_headers, "suggest", big)) for _ in range(big_calls)]
        await asyncio.sleep(0.5)
        waits = []
        while not all(c.done() for c in calls) or not waits:
            waits.append(await call(b, url, b_headers, "search", query))
        await asyncio.gather(*calls)
        return waits


def wait_loaded(port: int) -> None:
    """Until the MCP child's engine answers (its first call waits for the load)."""
    async def once():
        async with httpx.AsyncClient(timeout=600) as client:
            headers = await mcp_session(client, f"http://127.0.0.1:{port}/mcp")
            await call(client, f"http://127.0.0.1:{port}/mcp", headers, "search", {"query": "warm up"})
    asyncio.run(once())


def fairness(home: Path, logs: Path, big_calls: int) -> list[tuple]:
    rows = []
    for variant, alone in (("alone", True), ("before", False), ("after", False)):
        child, port = start("mcp", "after" if variant == "alone" else variant, home, logs)
        try:
            wait_loaded(port)
            waits = asyncio.run(greedy(port, big_calls, alone))
        finally:
            stop(child)
        rows.append((variant, len(waits), percentile(waits, 50) * 1000, percentile(waits, 99) * 1000))
        print(f"  greedy client {variant}: done", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=Path, required=True, help="a built knowledge base (copied, not changed)")
    parser.add_argument("--slow", type=int, default=1100, help="slow connections in the flood")
    parser.add_argument("--probes", type=int, default=20, help="probe requests per service during the flood")
    parser.add_argument("--big-calls", type=int, default=3, help="client A's concurrent 950 kB suggests")
    parser.add_argument("--parts", default="flood,greedy", help="which parts to run (comma-separated)")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="slow-clients-logs-"))
    if "flood" in args.parts:
        print_flood(args, flood(args.kb, logs, args.slow, args.probes))
    if "greedy" in args.parts:
        print_greedy(args, fairness(args.kb, logs, args.big_calls))
    print(f"\nlogs: {logs}")


def print_flood(args, rows: list[tuple]) -> None:
    print(f"\nA flood of {args.slow} slow connections from the moment the child listens (its knowledge base "
          f"loading), child limited to 1,024 open files; then {args.probes} probes each (a failed probe counts as "
          f"5 s)\n")
    print("| service | listener | slow connections opened | ready after s | probe p50 ms | probe p99 ms | "
          "probes failed | p99 after/before |")
    print("|---|---|---|---|---|---|---|---|")
    for n, (service, variant, opened, became_ready, p50, p99, failed) in enumerate(rows):
        before = rows[n - 1][5] if variant == "after" else p99
        name = "uvicorn alone" if variant == "before" else "guarded (pmkb.listener)"
        shown = f"{became_ready:.1f}" if became_ready is not None else "not in 120"
        print(f"| {service} | {name} | {opened} | {shown} | {p50:.1f} | {p99:.1f} | {failed}/{args.probes} | "
              f"{p99 / before:.3f} |")


def print_greedy(args, fair: list[tuple]) -> None:
    alone = fair[0]
    print(f"\nClient B's MCP search while client A has {args.big_calls} concurrent 950 kB suggests in hand\n")
    print("| engine lock | B's searches | p50 ms | p99 ms | p50 / B alone | p99 / B alone |")
    print("|---|---|---|---|---|---|")
    names = {"alone": "B alone (baseline)", "before": "arrival order (before)", "after": "fair turns (after)"}
    for variant, count, p50, p99 in fair:
        print(f"| {names[variant]} | {count} | {p50:.0f} | {p99:.0f} | {p50 / alone[2]:.1f} | {p99 / alone[3]:.1f} |")


if __name__ == "__main__":
    main()
