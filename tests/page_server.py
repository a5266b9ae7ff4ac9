"""The chat page served by a real ``streamlit run app.py`` in a subprocess, for the browser tests
and bench/app_latency.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120


def free_port() -> int:
    """A TCP port nobody listens on right now (loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


STREAMLIT_RUN = ["-m", "streamlit", "run", "app.py"]
"""The page as ``streamlit run app.py`` serves it: everything is loaded at the first visit."""
PRELOADING = ["-m", "ui.serve"]
"""The page as ``make run`` serves it (ui/serve.py): loading starts with the server."""


@contextlib.contextmanager
def serve_page(env: dict, log_path: Path, launcher: list[str] = STREAMLIT_RUN):
    """The page on a free loopback port with these environment variables; yields its URL."""
    port = free_port()
    command = [sys.executable, *launcher, "--server.headless", "true",
               "--server.port", str(port), "--server.address", "127.0.0.1",
               "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"streamlit exited with {server.returncode}:\n"
                                       f"{log_path.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                        if answer.read().strip() == b"ok":
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not answer within {START_TIMEOUT_S}s:\n"
                                       f"{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
