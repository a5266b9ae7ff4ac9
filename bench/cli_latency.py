"""How long a command takes in a new process, as people run it: ``pmkb suggest``, ``search``,
``node`` and ``taxonomy`` on a built knowledge base, beside ``python -c pass`` and a bare import of
chromadb in the same run.

    python bench/cli_latency.py [--kb DIR] [--rounds 5]

Two query paths are timed: the ONNX export of the embedding model (what ``pmkb build`` prepares;
no torch, no scikit-learn in the process) and, as the baseline, the model on torch
(``PMKB_ONNX_QUERIES=false``). ``--kb`` names a built knowledge base (default: ``PMKB_HOME``, else a
copy of the bundled one is built first, which takes minutes). Last, a ``pmkb serve`` is started on
the knowledge base and ``pmkb suggest`` asks it (pmkb/local_service.py). Wall time, median of
``--rounds``.
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
    base = {k: v for k, v in os.environ.items() if not k.startswith("PMKB_")}
    home = args.kb or Path(tempfile.mkdtemp(prefix="pmkb-cli-bench-")) / "kb"
    env = base | {"PMKB_HOME": str(home)}
    print(f"preparing {home} (pmkb build) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pmkb", "build"], cwd=ROOT, env=env, check=True, capture_output=True)
    torch_env = env | {"PMKB_ONNX_QUERIES": "false"}
    pmkb = [sys.executable, "-m", "pmkb"]
    rows = [("python -c pass", [sys.executable, "-c", "pass"], env),
            ("python -c 'import chromadb'", [sys.executable, "-c", "import chromadb"], env),
            ("pmkb taxonomy", [*pmkb, "taxonomy"], env),
            ("pmkb node gpu-a17", [*pmkb, "node", "gpu-a17"], env),
            ("pmkb search (ONNX query)", [*pmkb, "search", TICKET], env),
            ("pmkb search (torch query, baseline)", [*pmkb, "search", TICKET], torch_env),
            ("pmkb suggest (ONNX query)", [*pmkb, "suggest", TICKET], env),
            ("pmkb suggest (torch query, baseline)", [*pmkb, "suggest", TICKET], torch_env)]
    results = []
    for name, command, run_env in rows:
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
    for command in ("search", "suggest"):
        onnx, torch = by_name[f"pmkb {command} (ONNX query)"], by_name[f"pmkb {command} (torch query, baseline)"]
        print(f"\npmkb {command}: ONNX query path {onnx:.2f} s vs torch {torch:.2f} s: {torch / onnx:.1f}x faster")


if __name__ == "__main__":
    main()
