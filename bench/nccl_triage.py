"""Collective-timeout triage at scale: ``pmkb nccl``'s reading and triage (read_sources, read_job,
triage) on a job of N ranks, against reading the same bytes and splitting them into lines.

    python bench/nccl_triage.py [--ranks 100 1000 10000 100000] [--rounds 3]

The job is synthetic volume around a real sample: every rank writes the lines a rank of
tests/data/collectives/posted/ace348-perlmutter-4gpu-first-rank-silent.log wrote (a training line,
the ProcessGroupNCCL watchdog's timeout at one sequence number, the "Some NCCL operations have
failed" line), with the NCCL_DEBUG INFO line that maps the rank to its host and GPU, eight GPUs a
host; one rank writes nothing (the culprit). Two layouts: one file per rank in a directory, and
one Slurm output with every rank's lines interleaved. Each row checks that the silent rank and its
host are found, and prints the time against the baseline as a ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WATCHDOG = ("[E ProcessGroupNCCL.cpp:457] [Rank {rank}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1132079, OpType=ALLREDUCE, NumelIn=304640, NumelOut=304640, Timeout(ms)=1800000) "
            "ran for 1800035 milliseconds before timing out.")
LINES = ("{host}:{pid}:{pid} [{gpu}] NCCL INFO comm 0x55d1c2f0 rank {rank} nranks {world} cudaDev {gpu} "
         "busId {gpu}000 - Init COMPLETE",
         "2024-05-07 15:51:09,140 - root - INFO - Starting training step on epoch 3",
         WATCHDOG,
         "[E ProcessGroupNCCL.cpp:471] Some NCCL operations have failed or timed out. Due to the asynchronous "
         "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")


def rank_lines(rank: int, world: int) -> list[str]:
    host, gpu = f"gpu-n{rank // 8:05d}", rank % 8
    return [line.format(rank=rank, world=world, host=host, gpu=gpu, pid=10_000 + rank) for line in LINES]


def write_job(root: Path, world: int, culprit: int) -> tuple[Path, Path]:
    """(directory of per-rank files, interleaved Slurm output) for a job of ``world`` ranks."""
    per_rank = root / "ranks"
    per_rank.mkdir()
    lines = {r: rank_lines(r, world) for r in range(world)}
    for r in range(world):  # the culprit's communicator line is all it wrote before it hung
        text = lines[r][:1] if r == culprit else lines[r]
        (per_rank / f"rank{r}.log").write_text("\n".join(text) + "\n")
    interleaved = root / f"slurm-{world}.out"
    with interleaved.open("w") as out:
        for step in range(len(LINES)):
            out.writelines(f"[rank{r}]: {lines[r][step]}\n" for r in range(world) if r != culprit or step == 0)
    return per_rank, interleaved


def baseline(path: Path) -> None:
    """Read every byte under ``path`` and split it into lines: the floor of any log reader."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        file.read_bytes().decode("utf-8", "replace").splitlines()


def triage_of(path: Path):
    from kb.core.collective_logs import read_job
    from kb.core.collective_triage import triage
    from kb.core.rank_logs import read_sources

    return triage(read_job(read_sources([path])))


def timed(fn, rounds: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import kb.core.collective_triage  # noqa: F401 - imported before any timing

    rows = []
    for world in args.ranks:
        culprit = world * 3 // 7
        root = Path(tempfile.mkdtemp(prefix="pmkb-nccl-bench-"))
        try:
            for layout, path in zip(("one file per rank", "interleaved"), write_job(root, world, culprit)):
                size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.iterdir()))
                floor, _ = timed(lambda: baseline(path), args.rounds)  # noqa: B023 - called at once
                took, verdict = timed(lambda: triage_of(path), args.rounds)  # noqa: B023
                found = verdict.suspects == [culprit] and verdict.suspect_hosts == [f"gpu-n{culprit // 8:05d}"]
                rows.append((world, layout, size / 2**20, floor, took, took / floor, verdict.kind, found))
                print(f"  {world} ranks, {layout}: {took:.2f} s", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print("| ranks | layout | MiB | read + split lines (s) | pmkb nccl triage (s) | ratio | verdict | culprit found |")
    print("|---|---|---|---|---|---|---|---|")
    for world, layout, mib, floor, took, ratio, kind, found in rows:
        print(f"| {world:,} | {layout} | {mib:.1f} | {floor:.3f} | {took:.3f} | {ratio:.1f}x | {kind} | "
              f"{'yes' if found else 'NO'} |")


if __name__ == "__main__":
    main()
