"""Latency of ``suggest`` through the MCP server (stdio, streamable HTTP) against the engine in-process.

    .venv/bin/python bench/mcp_latency.py [--kb DIR] [--calls 20] [--keep DIR]

Three paths answer the same tickets (bundled incident texts, every 75th), each on its own copy of
the knowledge base (the embedded store admits one process at a time): the engine in this process
(the suggester every shell gets), as the baseline; ``pmkb mcp`` as a subprocess over stdio; and
``pmkb mcp --http`` with a bearer token. All three are warm before timing starts: each answers
every ticket once untimed (the servers' first call waits for their engine to load; first calls
fill caches). Then each ticket goes through the
three paths in turn, a different one first each time, so a machine busy with other work slows
them alike. The three processes run with OMP_WAIT_POLICY=PASSIVE: taking turns on a few cores, the
OpenMP workers of the process that just answered would otherwise spin on while the next one works
(that inflated every p50 three- to sixfold on two cores); a lone server never meets that. The timed
span of an MCP call is the client's ``call_tool`` round trip: argument validation, JSON both ways
and the transport. The ratio is a path's p50 over the in-process p50. Without --kb, a knowledge
base is built from the bundled incidents first (minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads, here and in the servers

import anyio  # noqa: E402

TOKEN = "bench-token"
PATHS = ("engine in-process (baseline)", "MCP over stdio", "MCP over streamable HTTP")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of the values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def tickets(count: int) -> list[dict]:
    """``count`` tickets (title and description) from the bundled incident reports, spread over the files."""
    lines = [line for f in sorted((ROOT / "data" / "incidents").glob("*.jsonl"))
             for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    picked = [json.loads(line) for line in lines[::75]][:count]
    return [{"title": r["title"], "description": r["description"]} for r in picked]


def child_env(**extra: str) -> dict[str, str]:
    """This environment without PMKB_* settings, on the CPU."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PMKB_")} | {
        "PMKB_EMBEDDING_DEVICE": "cpu", **extra}


def build(home: Path) -> None:
    """Build a knowledge base from the bundled incidents."""
    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase

    kb = KnowledgeBase(Settings(home=home, embedding_device="cpu"))
    kb.ensure_built(log=lambda line: print(line, file=sys.stderr))
    kb.store.close()


def in_process_suggester(home: Path):
    """The suggester every shell gets, over the knowledge base at ``home``, in this process."""
    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase
    from kb.engine.suggest import SuggestionEngine
    from kb.llm.suggester import make_suggester

    return make_suggester(SuggestionEngine(KnowledgeBase(Settings(home=home, embedding_device="cpu"))))


def start_http(home: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """``pmkb mcp --http`` on a free loopback port, once it listens; (process, URL)."""
    import httpx2

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    with log.open("w") as errlog:
        server = subprocess.Popen([sys.executable, "-m", "pmkb", "--kb", str(home), "mcp", "--http", str(port)],
                                  env=child_env(PMKB_API_TOKEN=TOKEN), cwd=ROOT, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=errlog)
    deadline = time.time() + 300
    while True:  # listening once anything answers (401 without the token)
        try:
            httpx2.get(url, timeout=5)
            return server, url
        except httpx2.TransportError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                raise RuntimeError(f"pmkb mcp --http did not start; see {log}") from None
            time.sleep(0.2)


async def measure(homes: list[Path], url: str, batch: list[dict], logs: Path) -> list[list[float]]:
    """Seconds per suggestion on each path, the paths taking turns ticket by ticket."""
    import httpx2
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    from kb.core.suggestion import Ticket

    suggester = in_process_suggester(homes[0])
    params = StdioServerParameters(command=sys.executable, args=["-m", "pmkb", "--kb", str(homes[1]), "mcp"],
                                   env=child_env(), cwd=str(ROOT))
    async with AsyncExitStack() as stack:
        errlog = stack.enter_context((logs / "stdio.log").open("w"))
        stdio = await stack.enter_async_context(ClientSession(*await stack.enter_async_context(
            stdio_client(params, errlog=errlog))))
        http_client = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600))
        http = await stack.enter_async_context(ClientSession(*await stack.enter_async_context(
            streamable_http_client(url, http_client=http_client))))
        await stdio.initialize()
        await http.initialize()

        async def over_mcp(session, ticket: dict) -> None:
            result = await session.call_tool("suggest", ticket)
            assert not result.is_error, result.content

        async def in_process(ticket: dict) -> None:
            suggester.suggest(Ticket(**ticket))

        paths = [in_process, lambda t: over_mcp(stdio, t), lambda t: over_mcp(http, t)]
        for ticket in batch:  # untimed: the engine loads, then warms to these tickets
            for call in paths:
                await call(ticket)
        times: list[list[float]] = [[] for _ in paths]
        for n, ticket in enumerate(batch):
            for path in (n % 3, (n + 1) % 3, (n + 2) % 3):  # each path goes first as often as the others
                started = time.perf_counter()
                await paths[path](ticket)
                times[path].append(time.perf_counter() - started)
        return times


def main() -> None:
    """Time the three paths on copies of one knowledge base and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=Path, help="a built knowledge base to copy (default: build one)")
    parser.add_argument("--calls", type=int, default=20, help="timed suggest calls per path")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (the servers' logs)")
    args = parser.parse_args()
    batch = tickets(args.calls)
    with tempfile.TemporaryDirectory(prefix="pmkb-bench-mcp-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        source = args.kb
        if source is None:
            source = work / "source"
            build(source)
        homes = [work / name for name in ("in-process", "stdio", "http")]
        for home in homes:
            shutil.copytree(source, home, ignore=shutil.ignore_patterns("pmkb.lock"))
        server, url = start_http(homes[2], work / "http.log")
        try:
            times = anyio.run(measure, homes, url, batch, work)
        finally:
            server.terminate()
            server.wait(timeout=30)
    base = percentile(times[0], 50)
    print(f"suggest latency over {len(batch)} tickets per path, after an untimed pass over them (ms)\n")
    print(f"| {'path':30} | {'p50':>7} | {'p95':>7} | {'p50 / baseline':>14} |")
    print(f"|{'-' * 32}|{'-' * 9}|{'-' * 9}|{'-' * 16}|")
    for name, values in zip(PATHS, times):
        p50, p95 = percentile(values, 50), percentile(values, 95)
        print(f"| {name:30} | {p50 * 1000:7.1f} | {p95 * 1000:7.1f} | {p50 / base:14.2f} |")


if __name__ == "__main__":
    main()
