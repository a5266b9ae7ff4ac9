"""``pmkb mcp`` end to end with the SDK's own client: the server runs as a subprocess, over stdio and
over streamable HTTP, on a copy of the bundled knowledge base."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import anyio
import httpx
import pytest

from kb.core.incidents import Incident
from kb.engine.knowledge import KnowledgeBase
from tests.conftest import ROOT, command_env, make_settings

XID_79 = {"title": "Xid 79 GPU has fallen off the bus on gpu-a17",
          "description": "Training job 4411 crashed at step 12000. dmesg on gpu-a17: NVRM: Xid (PCI:0000:3b:00): "
                         "79, pid=1234, GPU has fallen off the bus. nvidia-smi shows no devices."}
NODE = "gpu-a17"
TOKEN = "mcp-test-token-3f9a"
SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
MARKER = "quokka-marmalade-7731"
TOOLS = {"suggest", "search", "node_history", "remediation_plan", "taxonomy"}


def child_env(**extra: str) -> dict[str, str]:
    """The test process's environment without PMKB_* settings, on the CPU."""
    return command_env() | {
        "PMKB_EMBEDDING_DEVICE": "cpu", **extra}


def without_trace(suggestion: dict) -> dict:
    """A suggestion without its timings, which differ from run to run."""
    return {k: v for k, v in suggestion.items() if k != "trace"}


@pytest.fixture(scope="module")
def mcp_kb(tmp_path_factory, _built_kb_dir, embedder) -> tuple[Path, dict]:
    """The bundled knowledge base plus two incidents of this cluster naming gpu-a17, its classifier
    fitted by ``pmkb suggest --json`` for the Xid 79 ticket, and what that command printed."""
    home = tmp_path_factory.mktemp("mcp") / "kb"
    shutil.copytree(_built_kb_dir, home)
    kb = KnowledgeBase(make_settings(home), embedder=embedder)
    kb.add_incidents([
        Incident(id=f"ops-{n}", title=f"Node {NODE} lost a GPU", description=f"Xid 79 on {NODE}, job {n} died.",
                 resolution=f"Drained {NODE} and reseated the GPU.", symptom="job_crash", root_cause="gpu_lost",
                 mitigation="node_repair", source="ops-tickets", created_at=datetime(2026, 3, n, tzinfo=timezone.utc))
        for n in (3, 17)])
    kb.store.close()  # the subprocesses need the store's lock
    done = subprocess.run([sys.executable, "-m", "pmkb", "--kb", str(home), "suggest", "--title", XID_79["title"],
                           "--json", XID_79["description"]], env=child_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return home, json.loads(done.stdout)


@pytest.fixture
def kb_copy(mcp_kb, tmp_path) -> Path:
    home = tmp_path / "kb"
    shutil.copytree(mcp_kb[0], home)
    return home


async def exercise(session, cli_suggestion: dict) -> None:
    """Every tool once, and the errors a client can provoke, through an initialised session."""
    assert {t.name for t in (await session.list_tools()).tools} == TOOLS

    result = await session.call_tool("suggest", XID_79)
    assert not result.is_error, result.content
    assert without_trace(result.structured_content) == without_trace(cli_suggestion)
    assert json.loads(result.content[0].text)["root_cause"] == cli_suggestion["root_cause"]
    assert result.structured_content["node_history"]["total"] == 2
    owner = result.structured_content["owner"]  # who owns the ticket, as on the card
    assert owner["dimension"] == result.structured_content["root_cause_dimension"] and 0 < owner["confidence"] <= 1

    result = await session.call_tool("search", {"query": "GPU has fallen off the bus", "k": 3,
                                                "dimension": "hardware"})
    hits = result.structured_content["incidents"]
    assert not result.is_error and len(hits) == 3
    assert all(h["root_cause_dimension"] == "hardware" for h in hits)
    assert hits == sorted(hits, key=lambda h: -h["score"])

    result = await session.call_tool("node_history", {"node": NODE.upper()})
    assert result.structured_content["total"] == 2
    assert [i["id"] for i in result.structured_content["incidents"]] == ["ops-17", "ops-3"]  # newest first
    result = await session.call_tool("node_history", {"node": "gpu-zz99"})
    assert result.structured_content == {"node": "gpu-zz99", "total": 0, "incidents": []}

    result = await session.call_tool("remediation_plan", {**XID_79, "scheduler": "slurm", "ticket_id": "OPS-9"})
    assert not result.is_error, result.content
    plan = result.structured_content
    assert plan["node"] == NODE and plan["job"] == "4411" and plan["steps"][0]["argv"][:3] == [
        "scontrol", "update", f"NodeName={NODE}"] and "OPS-9" in plan["reason"]
    result = await session.call_tool("remediation_plan", {"scheduler": "kubernetes", "job": "train",
                                                          "description": "ModuleNotFoundError: No module named "
                                                                         "'apex' in my image"})
    assert result.is_error and "no remediation plan" in result.content[0].text

    result = await session.call_tool("taxonomy", {})
    causes = {c["id"]: c["dimension"] for c in result.structured_content["root_causes"]}
    assert causes["gpu_lost"] == "hardware" and result.structured_content["symptoms"]
    assert result.structured_content["mitigations"]

    result = await session.call_tool("suggest", {"title": " ", "description": ""})
    assert result.is_error and "the ticket is empty" in result.content[0].text
    result = await session.call_tool("search", {"query": "Xid 79", "root_cause": "gpu_gone"})
    assert result.is_error and "unknown root_cause 'gpu_gone'; allowed: " in result.content[0].text
    assert "gpu_lost" in result.content[0].text
    result = await session.call_tool("search", {"query": "Xid 79", "k": 0})
    assert result.is_error

    # Untrusted text: the secret is redacted from what comes back; neither it nor the text is logged.
    result = await session.call_tool("suggest", {"title": f"NCCL timeout {MARKER}",
                                                 "description": "Job hung in allreduce, then NCCL watchdog timeout.",
                                                 "log": f"export GITHUB_TOKEN={SECRET}\nNCCL WARN Timeout"})
    assert not result.is_error and SECRET not in result.content[0].text


def assert_clean_log(stderr: str) -> None:
    """The server's log names tools and outcomes but never the ticket text."""
    assert "suggest answered in" in stderr and "root_cause=gpu_lost" in stderr
    assert MARKER not in stderr and SECRET not in stderr and "fallen off the bus" not in stderr


def test_stdio_answers_every_tool_like_the_cli(mcp_kb, kb_copy, tmp_path):
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "pmkb", "--kb", str(kb_copy), "mcp"],
                                   env=child_env(), cwd=str(ROOT))
    stray: list[Exception] = []

    async def collect(message) -> None:
        if isinstance(message, Exception):  # a line on stdout that is not protocol
            stray.append(message)

    async def run() -> None:
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write, message_handler=collect) as session:
                info = await session.initialize()
                assert info.server_info.name == "pmkb"
                await exercise(session, mcp_kb[1])

    anyio.run(run)
    assert stray == []
    assert_clean_log((tmp_path / "stderr.log").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}


def test_http_needs_the_bearer_token(mcp_kb, kb_copy, tmp_path):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    errlog = (tmp_path / "stderr.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "pmkb", "--kb", str(kb_copy), "mcp", "--http", str(port)],
                              env=child_env(PMKB_API_TOKEN=TOKEN, PMKB_REQUEST_READ_TIMEOUT="1",
                                            PMKB_HEADER_TIMEOUT="1", PMKB_MAX_CALLS_PER_CLIENT="1"),
                              cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, (tmp_path / "stderr.log").read_text()[-2000:]
            try:
                refused = httpx.post(url, json=INITIALIZE, timeout=5)
                break
            except httpx.TransportError:
                assert time.time() < deadline, "pmkb mcp --http did not listen"
                time.sleep(0.2)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
        for header in (f"Bearer {TOKEN}x", "Bearer", f"Basic {TOKEN}", TOKEN):
            wrong = httpx.post(url, json=INITIALIZE, headers={"Authorization": header}, timeout=5)
            assert wrong.status_code == 401, header

        async def run() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300) as client, \
                    streamable_http_client(url, http_client=client) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await exercise(session, mcp_kb[1])

        anyio.run(run)
        slow_clients_are_cut(port)
    finally:
        server.terminate()
        server.wait(timeout=30)
        errlog.close()
    assert_clean_log((tmp_path / "stderr.log").read_text())


def slow_clients_are_cut(port: int) -> None:
    """Headers and an authenticated body that trickle in are cut at 1 s (408), and while one call
    is in hand (the trickling body) the same client's next call is refused (429)."""
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    with socket.create_connection(("127.0.0.1", port)) as headers:
        headers.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        headers.settimeout(5)
        assert headers.recv(4096).startswith(b"HTTP/1.1 408") and time.monotonic() - started < 3
    with socket.create_connection(("127.0.0.1", port)) as body:
        body.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"Content-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\nContent-Length: 500\r\n\r\n{")
        time.sleep(0.2)
        second = httpx.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, timeout=5,
                            headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"})
        assert second.status_code == 429 and second.headers["Retry-After"] == "1"
        body.settimeout(5)
        assert body.recv(4096).startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("token, message", [(None, "--http needs a bearer token: set PMKB_API_TOKEN"),
                                            ("  ", "PMKB_API_TOKEN is set but empty")])
def test_http_refuses_to_start_without_a_token(tmp_path, token, message):
    env = child_env(**({"PMKB_API_TOKEN": token} if token is not None else {}))
    command = [sys.executable, "-m", "pmkb", "--kb", str(tmp_path / "kb"), "mcp", "--http", str(free_port())]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""
    assert not (tmp_path / "kb").exists()  # refused before anything was opened
