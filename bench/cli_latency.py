"""How long a command takes in a new process, as people run it: ``pmkb suggest``, ``search``,
``node`` and ``taxonomy`` on a built knowledge base, beside ``python -c pass`` and a bare import of
chromadb in the same run.

    python bench/cli_latency.py [--kb DIR] [--rounds 5]

Each command runs three ways: as shipped (the store read from its copy, kb/engine/replica.py, and
the query embedded on the ONNX export that ``pmkb build`` prepares: no chromadb, torch or
scikit-learn in the process); with the store opened through chromadb (``PMKB_READ_COPY=false``);
and, as the baseline, also with the model on torch (``PMKB_ONNX_QUERIES=false``), which is how
every command ran before either. ``--kb`` names a built knowledge base (default: ``PMKB_HOME``,
else a copy of the bundled one is built first, which takes minutes). Last, a ``pmkb serve`` is
started on the knowledge base and ``pmkb suggest`` asks it (pmkb/local_service.py). Python writes
its bytecode caches as on an installed system (``PYTHONDONTWRITEBYTECODE`` is dropped) and each
command runs once unmeasured first. Wall time, median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKET = "Xid 79: GPU has fallen off the bus on gpu-a17 during step 4411; job 8812045 died"


def wall(command: list[str], env: dict, rounds: int) -> float:
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=600)  # bytecode written, files cached
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return statistics.median(times)


def asking_a_service(command: list[str], env: dict, rounds: int) -> float:
    """The command's time while a ``pmkb serve`` on the same knowledge base runs (it asks the service)."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = env | {"PMKB_API_TOKEN": "bench-token"}
    service = subprocess.Popen([sys.executable, "-m", "pmkb", "serve", "--host", "127.0.0.1", "--port", str(port)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("pmkb serve did not become ready")
            time.sleep(0.5)
        wall(command, env, 1)  # the service's first answer warms it
        return wall(command, env, rounds)
    finally:
        service.terminate()
        service.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=Path, default=os.environ.get("PMKB_HOME"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("PMKB_") and k != "PYTHONDONTWRITEBYTECODE"}
    home = args.kb or Path(tempfile.mkdtemp(prefix="pmkb-cli-bench-")) / "kb"
    env = base | {"PMKB_HOME": str(home)}
    print(f"preparing {home} (pmkb build) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pmkb", "build"], cwd=ROOT, env=env, check=True, capture_output=True)
    store_env = env | {"PMKB_READ_COPY": "false"}
    torch_env = store_env | {"PMKB_ONNX_QUERIES": "false"}
    pmkb = [sys.executable, "-m", "pmkb"]
    rows = [("python -c pass", [sys.executable, "-c", "pass"], env),
            ("python -c 'import chromadb'", [sys.executable, "-c", "import chromadb"], env),
            ("pmkb taxonomy", [*pmkb, "taxonomy"], env)]
    for command in (["node", "gpu-a17"], ["stats"], ["search", TICKET], ["suggest", TICKET]):
        name = f"pmkb {command[0]}"
        rows += [(f"{name} (as shipped)", [*pmkb, *command], env),
                 (f"{name} (store opened through chromadb)", [*pmkb, *command], store_env),
                 (f"{name} (store opened, query on torch: baseline)", [*pmkb, *command], torch_env)]
    results = []
    for name, command, run_env in rows:
        if "query on torch" in name and command[3] in ("node", "stats"):
            continue  # no query to embed: the same as the row before
        results.append((name, wall(command, run_env, args.rounds)))
        print(f"  {name}: {results[-1][1]:.2f} s", file=sys.stderr, flush=True)
    results.append(("pmkb suggest (asking a running pmkb serve)", asking_a_service(pmkb + ["suggest", TICKET], env,
                                                                            args.rounds)))
    print(f"  {results[-1][0]}: {results[-1][1]:.2f} s", file=sys.stderr, flush=True)
    floor = results[0][1]
    print(f"| command (new process, median of {args.rounds}) | wall s | vs python -c pass |")
    print("|---|---|---|")
    for name, seconds in results:
        print(f"| {name} | {seconds:.2f} | {seconds / floor:.0f}x |")
    by_name = dict(results)
    print()
    for command in ("node", "stats", "search", "suggest"):
        shipped = by_name[f"pmkb {command} (as shipped)"]
        store = by_name[f"pmkb {command} (store opened through chromadb)"]
        baseline = by_name.get(f"pmkb {command} (store opened, query on torch: baseline)", store)
        print(f"pmkb {command}: {shipped:.2f} s as shipped, {store / shipped:.1f}x faster than opening the store, "
              f"{baseline / shipped:.1f}x faster than the baseline ({baseline:.2f} s)")


if __name__ == "__main__":
    main()
