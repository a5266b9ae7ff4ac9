"""The guarded HTTP listener (pmkb.listener) and the per-client limits (pmkb.ops): slow and greedy
clients against real uvicorn on loopback, with a small ASGI app (the services' own wiring is
tested in test_server_hardening and test_mcp)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from test_server import free_port, wait_until

from pmkb.listener import FILES_KEPT_FREE, connection_cap, guarded_protocol, raise_file_limit
from pmkb.ops import ClientLimit, FairTurns
from tests.conftest import ROOT

APP_SOURCE = '''
import asyncio

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(float(scope["query_string"] or b"2"))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})
'''
namespace: dict = {}
exec(APP_SOURCE, namespace)  # the same app in this process and in the subprocess below
app = namespace["app"]


class Serving:
    """uvicorn in a thread with the guard's protocol (or uvicorn's own with ``guarded=False``)."""

    def __init__(self, asgi, header_timeout: float = 1.0, max_connections: int = 1000, guarded: bool = True):
        self.port = free_port()
        http = guarded_protocol(header_timeout, max_connections) if guarded else "httptools"
        self.protocol = http
        self.server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_config=None,
                                                    http=http))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn to start")
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)

    def all_in_hand(self, count: int) -> bool:
        """Whether ``count`` connections are open and every one has a request in hand."""
        connections = list(self.server.server_state.connections)
        return len(connections) == count and all(c._waiting_since is None for c in connections)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def trickle(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each sent the start of a request line and nothing more."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(sock)
    return socks


def closed(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing the connection, or None when it stayed open."""
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        pass
    return data


def test_headers_that_trickle_in_are_cut_at_the_header_timeout():
    with Serving(app, header_timeout=1.0) as served:
        sock = socket.create_connection(("127.0.0.1", served.port))
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\n")
        answer = None
        for n in range(12):  # a header byte every 0.25 s never ends the header phase
            time.sleep(0.25)
            try:
                sock.sendall(b"X"[:1])
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = closed(sock, 3)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started < 4
        assert served.protocol.cuts.counts["header_timeout"] == 1


def test_the_header_timeout_spares_requests_in_hand_and_kept_alive_connections():
    with Serving(app, header_timeout=1.0) as served, httpx.Client(base_url=served.url) as client:
        assert client.get("/slow").status_code == 200  # 2 s in the app
        time.sleep(0.5)
        assert client.get("/healthz").status_code == 200  # the same kept-alive connection
        assert served.protocol.cuts.counts == {}


def test_uvicorn_alone_keeps_a_trickling_connection_open():
    """The failure the guard exists for: without it, a byte now and then holds the connection."""
    with Serving(app, guarded=False) as served:
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(b"GET / HTTP/1.1\r\n")
        for _ in range(8):
            time.sleep(1)
            sock.sendall(b"X")
        assert closed(sock, 1) is None
        sock.close()


def test_at_the_connection_cap_the_longest_waiting_connection_makes_room():
    with Serving(app, header_timeout=30, max_connections=20) as served:
        slow = trickle(served.port, 40)
        time.sleep(0.3)
        started = time.monotonic()
        assert httpx.get(f"{served.url}/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 2
        open_ones = sum(closed(s, 0.05) is None for s in slow)
        assert open_ones <= 20 and closed(slow[0], 0.05) is not None  # the oldest went first
        assert served.protocol.cuts.counts["evicted"] >= 20
        for s in slow:
            s.close()


def test_when_every_connection_has_a_request_in_hand_a_new_one_is_refused_with_503():
    with Serving(app, header_timeout=30, max_connections=16) as served:
        async def flood():
            async with httpx.AsyncClient(base_url=served.url, timeout=10,
                                         limits=httpx.Limits(max_connections=40)) as client:
                busy = [asyncio.create_task(client.get("/slow?4")) for _ in range(16)]
                deadline = time.monotonic() + 10
                while not served.all_in_hand(16):  # no connection still waiting to send its request
                    assert time.monotonic() < deadline, "the 16 requests never were all in hand"
                    await asyncio.sleep(0.05)
                refused = await client.get("/healthz")
                return refused, await asyncio.gather(*busy)

        refused, busy = asyncio.run(flood())
        assert refused.status_code == 503 and "retry" in refused.text
        assert [r.status_code for r in busy] == [200] * 16
        assert served.protocol.cuts.counts["busy"] >= 1


def test_the_cap_stays_below_the_open_file_limit():
    assert connection_cap(1000, 1024) == 1024 - FILES_KEPT_FREE
    assert connection_cap(1000, 65536) == 1000
    assert connection_cap(1000, 0) == 1000  # unknown limit


SERVE_WITH_FEW_FILES = APP_SOURCE + '''
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from pmkb.listener import serve_app
serve_app(app, "127.0.0.1", int(sys.argv[1]), header_timeout=30, max_connections=1000)
'''


def test_a_flood_of_slow_connections_past_the_open_file_limit_locks_nobody_out(tmp_path):
    """The service's own entry point with a 256-file limit: 400 slow connections, then a request."""
    raise_file_limit()  # this process holds the 400 client ends
    port = free_port()
    log = (tmp_path / "stderr.log").open("w")
    server = subprocess.Popen([sys.executable, "-c", SERVE_WITH_FEW_FILES, str(port)], cwd=ROOT, stderr=log)
    try:
        wait_until(lambda: _answers(port), 30, "the server to listen")
        slow = trickle(port, 400)
        time.sleep(0.5)
        for _ in range(3):
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        for s in slow:
            s.close()
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    text = (tmp_path / "stderr.log").read_text()
    assert f"serving at most {256 - FILES_KEPT_FREE} connections" in text and "PMKB_MAX_CONNECTIONS" in text


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_client_over_its_calls_in_hand_gets_429_and_others_are_not_counted():
    limited = ClientLimit(app, per_client=2, guards=lambda scope: scope["path"] == "/slow")
    with Serving(limited) as served:
        async def burst():
            async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
                calls = [asyncio.create_task(client.get("/slow")) for _ in range(3)]
                await asyncio.sleep(0.3)
                other = await client.get("/healthz")  # not a guarded path
                return other, await asyncio.gather(*calls)

        other, calls = asyncio.run(burst())
        codes = sorted(r.status_code for r in calls)
        assert codes == [200, 200, 429] and other.status_code == 200
        refused = next(r for r in calls if r.status_code == 429)
        assert refused.headers["Retry-After"] == "1" and "already in hand" in refused.json()["detail"]
        assert limited.in_hand == {}  # released once answered
        assert httpx.get(f"{served.url}/slow").status_code == 200


@pytest.mark.parametrize("rounds", [1, 3])
def test_fair_turns_serve_a_waiting_client_before_a_busy_clients_next_call(rounds):
    turns, order, holding = FairTurns(), [], threading.Event()
    release = threading.Event()

    def call(client: str, name: str, hold: bool = False):
        with turns.turn(client):
            order.append(name)
            if hold:
                holding.set()
                release.wait(10)

    threads = [threading.Thread(target=call, args=("a", "a0", True))]
    threads[0].start()
    holding.wait(5)
    for n in range(1, 4):  # client a queues three more calls, then b and c one each
        threads.append(threading.Thread(target=call, args=("a", f"a{n}")))
        threads[-1].start()
        time.sleep(0.05)
    for client in ("b", "c")[:rounds if rounds < 2 else 2]:
        threads.append(threading.Thread(target=call, args=(client, client)))
        threads[-1].start()
        time.sleep(0.05)
    release.set()
    for t in threads:
        t.join(10)
    if rounds == 1:
        assert order == ["a0", "b", "a1", "a2", "a3"]
    else:
        assert order == ["a0", "b", "c", "a1", "a2", "a3"]
