"""Collective-timeout triage (kb/core/rank_logs.py, collective_logs.py, collective_triage.py and
``pmkb nccl``): on logs written by a real torch.distributed job (gloo on the CPU) in which one rank
stalls, dies, raises or diverges, on excerpts people posted in public threads, and on hostile input."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kb.core.collective_logs import read_job
from kb.core.collective_triage import triage
from kb.core.rank_logs import RankLogError, rank_from_name, read_sources
from tests.conftest import command_env

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "collectives"
JOB = ROOT / "tests" / "collective_job.py"


def verdict_of(*paths):
    return triage(read_job(read_sources(list(paths))))


def test_the_stalled_rank_is_found_in_the_interleaved_output_and_dumps_of_a_real_gloo_job():
    verdict = verdict_of(DATA / "gloo-stall-interleaved.log", DATA / "gloo-stall-dumps")
    assert (verdict.kind, verdict.suspects, verdict.collective, verdict.sequence) == ("one_node", [2], "ALL_REDUCE", 3)
    assert verdict.world_size == 4 and verdict.retry_safe and verdict.dimension == "hardware"
    healthy = next(g for g in verdict.groups if g.healthy)
    assert healthy.ranks == [0, 1, 3] and healthy.state == "waiting in #3"
    assert any("Timed out waiting" in line for line in verdict.evidence)


def test_without_the_dumps_the_rank_is_still_found_but_the_collective_is_not_numbered():
    verdict = verdict_of(DATA / "gloo-stall-interleaved.log")
    assert verdict.suspects == [2] and verdict.sequence is None and verdict.collective is None


# What each posted excerpt shows (tests/data/collectives/posted/README.md: source, what the thread
# established). Kind, suspects (None: not asserted) and the first cause the verdict points to.
POSTED = [
    ("ace348-perlmutter-4gpu-first-rank-silent.log", "one_node", [0], None),
    ("f5tts346-allreduce-vs-broadcast.log", "diverging", None, "buggy_code"),
    ("frtrace-analyzer-missing-ranks.log", "undetermined", [3, 4, 5, 6, 7], None),
    ("llamafactory2902-seqnum-skew.log", "diverging", None, "buggy_code"),
    ("llamafactory6269-reducescatter-8rank.log", "undetermined", [1, 5], None),  # the excerpt shows 5 ranks of 8
    ("milabench-dinov2-2node-reduce-vs-allreduce.log", "diverging", [6], "buggy_code"),
    ("nccl1409-accelerate-broadcast-vs-allreduce-elastic.log", "diverging", None, "buggy_code"),
    ("nccl1439-elastic-root-cause-2gpu.log", "one_node", [1], None),
    ("nccl1610-two-thread-alltoall.log", "diverging", None, "buggy_code"),  # established: user code
    ("nccl1814-roce-64rank-ib-completion-error.log", "one_node", [36], "infiniband_failure"),
    ("nccl1911-ncclras-opcount-mismatch.log", "undetermined", [], None),  # RAS lists the ranks ahead, not culprits
    ("nccltests252-h100-2node-ib-error4.log", "one_node", [4], "infiniband_failure"),
    ("primerl-ep-alltoall-dump-signal.log", "undetermined", [], None),  # a sub-group; its members are not shown
    ("speechbrain2401-fingerprint-allreduce-vs-broadcast.log", "diverging", None, "buggy_code"),
]


@pytest.mark.parametrize("name, kind, suspects, cause", POSTED, ids=[row[0].split("-")[0] for row in POSTED])
def test_logs_people_posted_get_the_verdict_they_show(name, kind, suspects, cause, tmp_path):
    text = (DATA / "posted" / name).read_text(encoding="utf-8")
    assert text.startswith("# source: https://"), "every posted fixture cites its thread"
    path = tmp_path / name  # the log alone, without the fixture's header
    path.write_text(text.split("\n\n", 1)[1], encoding="utf-8")
    verdict = verdict_of(path)
    assert verdict.kind == kind, verdict.summary
    if suspects is not None:
        assert verdict.suspects == suspects, verdict.summary
    if cause is not None:
        assert verdict.causes[0] == cause
    assert verdict.kind == "undetermined" or verdict.evidence


def test_the_posted_fixtures_cite_no_held_out_thread():
    import hashlib

    from tests.test_bundled_data import HELD_OUT_HEADER, shared_file, thread_key

    listing = shared_file("data/heldout_threads.sha256").read_text(encoding="utf-8")
    assert listing.startswith(HELD_OUT_HEADER)
    held_out = {line.strip() for line in listing.splitlines() if line.strip() and not line.startswith("#")}
    sources = [p.read_text(encoding="utf-8").splitlines()[0].removeprefix("# source: ")
               for p in sorted((DATA / "posted").glob("*.log"))]
    assert len(sources) == len(POSTED)
    assert [s for s in sources if hashlib.sha256(thread_key(s).encode()).hexdigest() in held_out] == []


def test_rank_from_a_file_name_never_reads_a_slurm_job_id_as_a_rank():
    assert rank_from_name("logs/rank3.log") == 3
    assert rank_from_name("run/attempt_0/12/stderr.log") == 12
    assert rank_from_name("out_rank-7.txt") == 7
    assert rank_from_name("slurm-123456.out") is None
    assert rank_from_name("train-2024-05-01.log") is None


def test_a_flight_recorder_dump_that_names_a_class_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Exploit()]}))
    sources = read_sources([tmp_path])
    assert not marker.exists()
    assert sources[0].dump is None and "posix.system" in sources[0].notes[0] or "system" in sources[0].notes[0]


def test_an_empty_or_truncated_dump_loses_only_itself(tmp_path):
    good = (DATA / "gloo-stall-dumps" / "nccl_trace_rank_0").read_bytes()
    (tmp_path / "nccl_trace_rank_0").write_bytes(good)
    (tmp_path / "nccl_trace_rank_1").write_bytes(good[: len(good) // 2])
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"")
    job = read_job(read_sources([tmp_path]))
    assert job.ranks[0].ops and 1 not in job.ranks and 2 not in job.ranks
    assert len(job.notes) == 2 and all("nccl_trace_rank_" in note for note in job.notes)


def test_a_tarball_is_read_in_memory_and_its_links_are_skipped(tmp_path):
    archive = tmp_path / "job-logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(DATA / "gloo-stall-interleaved.log", arcname="job/all-ranks.log")
        for dump in sorted((DATA / "gloo-stall-dumps").iterdir()):
            tar.add(dump, arcname=f"job/dumps/{dump.name}")
        link = tarfile.TarInfo("job/../../escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    before = set(tmp_path.iterdir())
    verdict = verdict_of(archive)
    assert verdict.suspects == [2] and verdict.sequence == 3
    assert set(tmp_path.iterdir()) == before  # nothing extracted


def test_missing_paths_and_damaged_tarballs_name_the_path(tmp_path):
    with pytest.raises(RankLogError, match="no such file"):
        read_sources([tmp_path / "nope.log"])
    bad = tmp_path / "logs.tar"
    with tarfile.open(bad, "w") as tar:
        data = b"x" * 5000
        info = tarfile.TarInfo("rank0.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bad.write_bytes(bad.read_bytes()[:1500])
    with pytest.raises(RankLogError, match="logs.tar"):
        read_sources([bad])


def test_a_log_with_no_collective_state_is_undetermined_and_the_command_says_so(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("epoch 1 loss 0.3\nepoch 2 loss 0.2\n")
    assert verdict_of(log).kind == "undetermined"
    done = subprocess.run([sys.executable, "-m", "pmkb", "nccl", str(log)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "No collective timeout found" in done.stdout


def test_hostile_lines_cost_linear_time(tmp_path):
    worst = tmp_path / "rank0.log"
    rows = ["[PG " + " (" * 20000 + "Rank 1", "a:1:1 [0] NCCL INFO comm 0x" + "f" * 30000,
            "WorkNCCL(SeqNum=" + "9" * 30000, "last enqueued work: " + "1" * 30000, " " * 60000 + "0: x"]
    worst.write_text("\n".join(rows * 200))
    started = time.perf_counter()
    verdict_of(worst)
    assert time.perf_counter() - started < 10


WATCHDOG = ("[rank{r}]: [E ProcessGroupNCCL.cpp:457] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800035 "
            "milliseconds before timing out.")


def test_two_jobs_interleaved_in_one_output_are_named_not_guessed(tmp_path):
    log = tmp_path / "slurm-77.out"  # job A stuck at #5 without rank 2; job B at #900 on every rank
    log.write_text("\n".join([WATCHDOG.format(r=r, seq=5, op="ALLREDUCE") for r in (0, 1, 3)]
                             + [WATCHDOG.format(r=r, seq=900, op="BROADCAST") for r in range(4)]))
    verdict = verdict_of(log)
    assert verdict.kind == "undetermined" and "more than one run" in verdict.summary
    assert "ALLREDUCE #5" in verdict.summary and "BROADCAST #900" in verdict.summary
    close = tmp_path / "rank0.log"  # works in flight time out together: one run
    close.write_text("\n".join(WATCHDOG.format(r=0, seq=seq, op="ALLREDUCE") for seq in (40, 41)))
    assert "more than one run" not in verdict_of(close).summary


def test_a_stray_rank_number_is_not_taken_for_a_million_silent_ranks(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(WATCHDOG.format(r=999999, seq=5, op="ALLREDUCE") + "\nNCCL INFO nranks 999999\n")
    started = time.perf_counter()
    verdict = verdict_of(log)
    assert time.perf_counter() - started < 2 and verdict.kind == "undetermined"
    assert len(verdict.ranks) == 1 and any("only 1 wrote lines" in note for note in verdict.notes)


def test_binary_garbage_a_log_past_the_limit_and_a_tarball_bomb_are_skipped_with_notes(tmp_path, monkeypatch):
    import kb.core.rank_logs as rank_logs

    monkeypatch.setattr(rank_logs, "MAX_TOTAL_BYTES", 2**20)
    (tmp_path / "core.bin").write_bytes(os.urandom(64 * 1024))
    (tmp_path / "rank0.log").write_text(WATCHDOG.format(r=0, seq=5, op="ALLREDUCE") + "\n")
    (tmp_path / "rank1.log").write_bytes(b"step\n" * 300_000)  # 1.5 MiB: past the limit
    bomb = tmp_path / "dumps.tar.gz"
    with tarfile.open(bomb, "w:gz") as tar:
        info = tarfile.TarInfo("rank2.log")
        info.size = 4 * 2**20
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    assert bomb.stat().st_size < 20_000
    sources = read_sources([tmp_path])
    notes = [note for source in sources for note in source.notes]
    assert any("core.bin: binary, skipped" in n for n in notes)
    assert any("rank1.log: skipped, past" in n for n in notes)
    assert any("rank2.log: skipped, past the size limit" in n for n in notes)
    assert triage(read_job(sources)).ranks[0].state.startswith("waiting")


def test_the_command_prints_json_with_the_suspects():
    done = subprocess.run([sys.executable, "-m", "pmkb", "nccl", "--json", str(DATA / "gloo-stall-interleaved.log"),
                           str(DATA / "gloo-stall-dumps")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["suspects"] == [2] and payload["kind"] == "one_node" and payload["sequence"] == 3


def _run_job(tmp_path: Path, mode: str, culprit: int, step: int = 3):
    logs, dumps = tmp_path / "logs", tmp_path / "dumps"
    dumps.mkdir()
    # loopback only: gloo binds where the hostname resolves, which a CI container may not have
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           "--log-dir",
                           str(logs), "--tee", "3", str(JOB), mode, str(culprit), str(step), str(dumps)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0, "the job was meant to fail"
    console = tmp_path / "torchrun.out"
    console.write_text(done.stdout + done.stderr)
    return verdict_of(logs, dumps, console)


@pytest.mark.slow
@pytest.mark.parametrize("mode, culprit, kind", [("stall", 2, "one_node"), ("die", 1, "one_node"),
                                                 ("raise", 3, "diverging"), ("diverge", 1, "diverging")])
def test_a_real_job_whose_rank_misbehaves_is_traced_to_that_rank(tmp_path, mode, culprit, kind):
    verdict = _run_job(tmp_path, mode, culprit)
    assert verdict.kind == kind, verdict.summary
    assert verdict.suspects == [culprit], verdict.summary
    if mode == "raise":
        assert "ValueError: batch 17" in verdict.summary and not verdict.retry_safe
    if mode == "stall":
        assert (verdict.collective, verdict.sequence) == ("ALL_REDUCE", 3)


@pytest.fixture(scope="module")
def engine(shared_bundled_kb):
    from kb.engine.suggest import SuggestionEngine

    return SuggestionEngine(shared_bundled_kb)


def _posted_log(name: str) -> str:
    return (DATA / "posted" / name).read_text(encoding="utf-8").split("\n\n", 1)[1]


def test_a_ticket_with_the_ranks_logs_gets_the_verdict_and_its_node_follows_it(engine):
    from kb.core.suggestion import Ticket
    from kb.tickets.writeback import render_comment

    ticket = Ticket(id="OPS-88", title="64-rank pretrain died after 2 h on the RoCE pool",
                    description="Job 4411 crashed; all ranks logs attached.",
                    log=_posted_log("nccl1814-roce-64rank-ib-completion-error.log"))
    s = engine.suggest(ticket)
    assert s.collective is not None and s.collective.kind == "one_node" and s.collective.suspects == [36]
    assert s.suspect == {"node": "hostname-test", "rank": "36"}
    assert s.root_cause_dimension == "hardware" and s.retry_safe == (not s.abstained)
    plain = engine.suggest(ticket.model_copy(update={"log": ""}))
    assert plain.collective is None
    assert s.root_cause_confidence >= plain.root_cause_confidence or plain.root_cause != s.root_cause
    for system in ("github", "jira"):
        assert "Collective timeout:" in render_comment(s, False, system)


def test_diverging_ranks_point_to_the_users_code_and_are_not_retry_safe(engine):
    from kb.core.suggestion import Ticket

    s = engine.suggest(Ticket(title="training hangs at the end of an epoch then NCCL timeout",
                              description="8 GPUs, DDP; happens every epoch end.",
                              log=_posted_log("speechbrain2401-fingerprint-allreduce-vs-broadcast.log")))
    assert s.collective.kind == "diverging" and not s.retry_safe
    assert s.root_cause_dimension == "user"


def test_the_terminal_card_shows_the_verdict_on_the_logs_it_is_given(_built_kb_dir, tmp_path):
    import shutil

    home = tmp_path / "kb"
    shutil.copytree(_built_kb_dir, home)  # the module's engine holds the shared store open
    env = command_env() | {"PMKB_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "pmkb", "suggest", "--logs", str(DATA / "gloo-stall-interleaved.log"),
                           "--logs", str(DATA / "gloo-stall-dumps"), "4-rank job hangs at step 3 then dies"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Collective timeout: one node: rank 2 (localhost) never arrived" in done.stdout


def test_a_decisive_verdict_decides_the_owner_and_the_text_the_cause_within_it():
    from kb.core.collective_triage import CollectiveVerdict
    from kb.engine.collective import follow_verdict

    dims = {"improper_configuration": "user", "buggy_code": "user", "infiniband_failure": "hardware",
            "nic_failure": "hardware", "gpu_lost": "hardware"}
    causes = [("improper_configuration", 0.8), ("buggy_code", 0.1), ("gpu_lost", 0.06), ("infiniband_failure", 0.03),
              ("nic_failure", 0.01)]
    node = CollectiveVerdict(kind="one_node", summary="", dimension="hardware",
                             causes=["infiniband_failure", "nic_failure"])
    ranked = follow_verdict(causes, node, dims)
    assert ranked[0][0] == "infiniband_failure" and ranked[0][1] >= 2 * ranked[1][1] - 1e-9
    assert abs(sum(p for _, p in ranked) - 1) < 1e-9
    everything = node.model_copy(update={"kind": "everything", "dimension": None})
    assert follow_verdict(causes, everything, dims)[0][0] == "improper_configuration"  # not decisive


def test_a_hostile_64_kib_ticket_costs_linear_time_in_the_engines_log_reader():
    from kb.engine.collective import read_collective

    hostile = ["missing ranks: {" + "1," * 32000, "WorkNCCL(SeqNum=" + "9" * 65000,
               "[PG " + "(" * 65000 + " Rank 1]", "x:1:1 [0] " + "a" * 65000 + " NCCL WARN"]
    for body in hostile:
        started = time.perf_counter()
        read_collective(body[:65536])
        assert time.perf_counter() - started < 5, body[:30]
