"""Several processes on one knowledge base: the embedded store admits one process at a time (with a
clear error for the next), and through a Chroma server a running engine sees what others write."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kb.core.incidents import Incident
from kb.engine import store_lock
from kb.engine.knowledge import KnowledgeBase
from kb.engine.store import ChromaStore
from kb.engine.store_lock import StoreLocked
from kb.engine.suggest import SuggestionEngine
from tests.conftest import ROOT, command_env, make_settings

HOLD_STORE = ("import sys\nfrom kb.engine.store import ChromaStore\n"
              "store = ChromaStore(sys.argv[1], path=sys.argv[2])\nprint('open', flush=True)\nsys.stdin.read()\n")
"""A second process that opens an embedded store and keeps it open until its stdin closes."""


def pmkb_env(**variables: str) -> dict:
    """The environment of a pmkb subprocess: no PMKB_* of the developer, CPU embedding."""
    env = command_env()
    return env | {"PMKB_EMBEDDING_DEVICE": "cpu", **variables}


def pmkb(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pmkb", *args], cwd=ROOT, env=env or pmkb_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, every: float = 0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def holder(path: Path, model_id: str):
    """Another process holding the embedded store at ``path`` open; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_STORE, model_id, str(path)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "open", proc.stderr.read()[-2000:]
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(60)


@contextmanager
def chroma_server(path: Path):
    """``chroma run`` on ``path`` on a free loopback port; yields its URL (skips when it cannot start)."""
    chroma = Path(sys.executable).parent / "chroma"
    if not chroma.exists():
        pytest.skip(f"the chroma command is not installed beside {sys.executable}")
    port = free_port()
    log = path.parent / f"chroma-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(chroma), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.skip(f"`chroma run` did not start: {log.read_text()[-1000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def write_jsonl(path: Path, incidents: list[Incident]) -> Path:
    path.write_text("".join(i.model_dump_json() + "\n" for i in incidents), encoding="utf-8")
    return path


MARKER = Incident(id="zx-fabric-9931", title="quasarlink fabric manager wedged all NVLink planes on zx-node-9931",
                  description="nv-fabricmanager on zx-node-9931 logged quasarlink plane 3 training failure; every "
                              "job on the node hung in the first all-reduce until the fabric manager was restarted",
                  resolution="restarted nv-fabricmanager and reset the NVSwitch trays; the node passed dcgmi diag",
                  symptom="job_hang", root_cause="gpu_nvlink_error", mitigation="node_repair")
"""A new incident no bundled report resembles, so a search for its words finds it alone."""


# --- the embedded store: one process at a time --------------------------------------------------------


def test_a_second_process_gets_a_clear_error_naming_the_holder_and_the_way_out(empty_kb, tmp_path):
    assert empty_kb.store.count() == 0  # this test process has the store open
    home = empty_kb.settings.home
    reports = write_jsonl(tmp_path / "new.jsonl", [MARKER])
    for args in (["ingest", str(reports)], ["search", "nvlink"], ["stats"], ["suggest", "Xid 79 on gpu-a17"]):
        run = pmkb("--kb", str(home), *args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert f"in use by process {os.getpid()}" in run.stderr
        assert "PMKB_CHROMA_URL" in run.stderr and f"chroma run --path {empty_kb.settings.store_dir}" in run.stderr
        assert "stop that process" in run.stderr and "Traceback" not in run.stderr
    empty_kb.store.close()  # once this process lets go, the other may open it
    run = pmkb("--kb", str(home), "ingest", str(reports))
    assert run.returncode == 0 and "added 1" in run.stdout, run.stderr


def test_opening_a_store_another_process_holds_raises_store_locked_with_its_pid(tmp_path):
    path = tmp_path / "chroma"
    with holder(path, "m1") as pid:
        with pytest.raises(StoreLocked, match=f"in use by process {pid} .*python -c"):
            ChromaStore("m1", path=str(path))
        assert not store_lock.is_held(path)
    store = ChromaStore("m1", path=str(path))  # the lock died with the holder; its file stays, harmless
    assert (path / store_lock.LOCK_FILE).exists() and store.count() == 0


def test_one_process_may_open_the_same_store_many_times(tmp_path, embedder):
    settings = make_settings(tmp_path / "kb")
    first, second = KnowledgeBase(settings, embedder=embedder), KnowledgeBase(settings, embedder=embedder)
    first.add_incidents([MARKER])
    (tmp_path / "link").symlink_to(settings.store_dir)
    third = ChromaStore(embedder.model_id, path=str(tmp_path / "link"))  # the same directory by another name
    assert second.store.count() == third.count() == 1
    first.store.close()
    third.close()
    assert store_lock.is_held(settings.store_dir)  # the second knowledge base still has it open
    assert second.store.get_incident(MARKER.id).title == MARKER.title
    second.store.close()
    assert not store_lock.is_held(settings.store_dir)


def test_a_copy_of_an_open_store_opens_in_another_process(tmp_path, embedder):
    settings = make_settings(tmp_path / "kb")
    kb = KnowledgeBase(settings, embedder=embedder)
    kb.add_incidents([MARKER])
    copy = tmp_path / "copy"
    shutil.copytree(settings.home, copy)  # the lock file comes along; the lock does not
    assert (copy / "chroma" / store_lock.LOCK_FILE).exists()
    run = pmkb("--kb", str(copy), "node", "zx-node-9931", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["incidents"][0]["id"] == MARKER.id


def test_the_service_says_why_it_cannot_open_a_store_in_use(tmp_path, embedder):
    from fastapi.testclient import TestClient

    from pmkb.server import create_app

    settings = make_settings(tmp_path / "kb", api_token="t")
    with holder(settings.store_dir, embedder.model_id) as pid:
        run = pmkb("serve", "--port", str(free_port()), env=pmkb_env(PMKB_HOME=str(settings.home),
                                                                      PMKB_API_TOKEN="t"))
        assert run.returncode == 2 and f"in use by process {pid}" in run.stderr, run.stderr
        assert "PMKB_CHROMA_URL" in run.stderr and "Traceback" not in run.stderr
        engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
        with TestClient(create_app(settings, engine=engine)) as client:
            ready = wait_until(lambda: (r := client.get("/readyz")).json().get("error") and r, 60, "/readyz error")
    assert ready.status_code == 503
    assert f"in use by process {pid}" in ready.json()["error"] and "PMKB_CHROMA_URL" in ready.json()["error"]


# --- a Chroma server shared by several processes --------------------------------------------------------


def test_an_update_by_another_process_reaches_a_running_engine_within_the_refresh_time(
        _built_kb_dir, embedder, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(_built_kb_dir / "chroma", served)
    with chroma_server(served) as url:
        settings = make_settings(tmp_path / "service", chroma_url=url, chroma_refresh_seconds=1.0)
        engine = SuggestionEngine(KnowledgeBase(settings, embedder=embedder))
        before = engine.retriever.corpus()
        changed = before.incidents[0]
        retitled = changed.model_copy(update={"title": f"{changed.title} (quasarlink retitled)"})
        run = pmkb("ingest", str(write_jsonl(tmp_path / "update.jsonl", [retitled])),
                   env=pmkb_env(PMKB_HOME=str(tmp_path / "job"), PMKB_CHROMA_URL=url))
        assert run.returncode == 0 and "updated 1" in run.stdout, run.stderr
        written = time.monotonic()
        seen = wait_until(lambda: engine.retriever.incidents()[
            engine.retriever.corpus().position[changed.id]].title == retitled.title, 60, "the update")
        waited = time.monotonic() - written
        # read while the server still runs: past the refresh time the engine asks it for the store's state
        after = len(engine.retriever.incidents())
    assert seen and after == len(before.incidents)  # same count: the token told
    assert waited < settings.chroma_refresh_seconds + 30


@pytest.mark.slow
def test_a_service_keeps_answering_while_another_process_ingests_and_then_sees_the_new_incidents(
        _built_kb_dir, tmp_path):
    """The reported failure, through a Chroma server: `pmkb serve` answers /v1/annotate while `pmkb ingest`
    adds incidents from another process; no request fails and the new incidents reach the suggestions."""
    home = tmp_path / "service"
    shutil.copytree(_built_kb_dir, home)  # serve the existing embedded store, as docs/deployment.md says
    bundled = KnowledgeBase(make_settings(home)).bundled_incidents()
    new = [i.model_copy(update={"id": f"load-{n:04d}", "source": "load"}) for n, i in enumerate(bundled[:INGESTED])]
    reports = write_jsonl(tmp_path / "new.jsonl", [*new, MARKER])
    tickets = [{"title": i.title, "description": i.description} for i in bundled[INGESTED:INGESTED + 40]]
    marker_ticket = {"title": MARKER.title, "description": MARKER.description}
    with chroma_server(home / "chroma") as url:
        port = free_port()
        service_env = pmkb_env(PMKB_HOME=str(home), PMKB_CHROMA_URL=url, PMKB_API_TOKEN="t")
        service_log = tmp_path / "service.log"
        with service_log.open("w") as log:
            service = subprocess.Popen([sys.executable, "-m", "pmkb", "serve", "--port", str(port)], cwd=ROOT,
                                       env=service_env, stdout=subprocess.DEVNULL, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:
            def ready():
                assert service.poll() is None, service_log.read_text()[-2000:]
                try:
                    return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, 600, "pmkb serve to become ready", every=1)
            figures = {"ingested": len(new) + 1, "suggestions": 0, "errors": [], "slowest": 0.0}
            client = httpx.Client(base_url=base, headers={"Authorization": "Bearer t"}, timeout=600)

            def annotate(ticket: dict) -> dict | None:
                asked = time.monotonic()
                try:
                    answer = client.post("/v1/annotate", json=ticket)
                except httpx.HTTPError as exc:
                    figures["errors"].append(repr(exc))
                    return None
                finally:
                    figures["slowest"] = max(figures["slowest"], time.monotonic() - asked)
                if answer.status_code != 200:
                    figures["errors"].append(f"{answer.status_code}: {answer.text[:300]}")
                    return None
                figures["suggestions"] += 1
                return answer.json()

            def finds(suggestion: dict | None, incident: Incident) -> bool:
                return bool(suggestion) and any(h["id"] == incident.id and h["title"] == incident.title
                                                for h in suggestion["similar_incidents"])

            started = time.monotonic()
            ingest = subprocess.Popen([sys.executable, "-m", "pmkb", "ingest", str(reports), "--json"], cwd=ROOT,
                                      env=pmkb_env(PMKB_HOME=str(tmp_path / "job"), PMKB_CHROMA_URL=url),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            done = threading.Event()
            threading.Thread(target=lambda: (ingest.wait(), done.set()), daemon=True).start()
            n = 0
            while not done.is_set():
                annotate(tickets[n % len(tickets)])
                n += 1
            report = json.loads(ingest.stdout.read())
            assert ingest.returncode == 0 and report["added"] == len(new) + 1, ingest.stderr.read()[-2000:]
            ingest_seconds = time.monotonic() - started
            during = figures["suggestions"]
            written = time.monotonic()
            wait_until(lambda: finds(annotate(marker_ticket), MARKER), VISIBLE_WITHIN, "the new incident", every=0.2)
            figures["seconds_until_visible"] = round(time.monotonic() - written, 1)

            retitled = MARKER.model_copy(update={"title": f"{MARKER.title}, fabric manager retitled"})
            update = pmkb("ingest", str(write_jsonl(tmp_path / "update.jsonl", [retitled])),
                          env=pmkb_env(PMKB_HOME=str(tmp_path / "job"), PMKB_CHROMA_URL=url))
            assert update.returncode == 0 and "updated 1" in update.stdout, update.stderr
            written = time.monotonic()
            wait_until(lambda: finds(annotate(marker_ticket | {"title": retitled.title}), retitled),
                       VISIBLE_WITHIN, "the updated incident", every=0.2)
            figures["seconds_until_update_visible"] = round(time.monotonic() - written, 1)
            assert httpx.get(f"{base}/readyz", timeout=5).status_code == 200
        finally:
            stop(service)
    print(f"\nconcurrency through a Chroma server: {figures['ingested']} incidents ingested in "
          f"{ingest_seconds:.1f} s while {during} suggestions were made, {figures['suggestions']} suggestions "
          f"in all (slowest {figures['slowest']:.1f} s), {len(figures['errors'])} errors; new incident visible "
          f"{figures['seconds_until_visible']} s after the ingest ended, update "
          f"{figures['seconds_until_update_visible']} s after it was written (refresh every 5 s)")
    assert figures["errors"] == []
    assert during > 0


INGESTED = 200
"""Incidents the concurrent ingest adds (copies of bundled reports under new ids), plus the marker."""
VISIBLE_WITHIN = 600
"""Seconds allowed for a write to reach the service: the refresh interval (5 s) plus reloading the
corpus and refitting the text classifiers, which takes a minute on a loaded two-core machine."""
