"""A running ``pmkb serve`` answers ``pmkb suggest`` (pmkb/local_service.py): what its announcement
must be to be trusted, and the real service asked by a real command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import command_env
from test_server import free_port, wait_until

from kb.core.settings import Settings
from pmkb.local_service import SERVICE_FILE, announce, running_service, withdraw

ROOT = Path(__file__).resolve().parent.parent


def test_an_announcement_is_trusted_only_when_it_is_ours_local_alive_and_alike(tmp_path):
    settings = Settings(home=tmp_path)
    path = announce(settings, "0.0.0.0", 8080)
    assert path is not None and (path.stat().st_mode & 0o777) == 0o600
    assert running_service(settings) == "http://127.0.0.1:8080"
    assert running_service(Settings(home=tmp_path, embedding_model="package:other")) is None  # not alike
    assert running_service(Settings(home=tmp_path, llm="openai")) is None
    record = json.loads(path.read_text())
    for change in ({"url": "http://10.0.0.5:8080"}, {"url": "https://127.0.0.1.evil.example:80"},
                   {"pid": 2**22 + 12345}, {"pid": "x"}):
        path.write_text(json.dumps(record | change))
        assert running_service(settings) is None, change
    path.write_text(json.dumps(record))
    path.chmod(0o620)  # writable by the group: anyone there could point the token elsewhere
    assert running_service(settings) is None
    path.chmod(0o600)
    assert announce(settings, "10.1.2.3", 8080) is None  # a service on another interface is not announced
    path.write_text(json.dumps(record | {"pid": 1}))
    withdraw(settings)  # another process's announcement stays
    assert path.exists()
    announce(settings, "127.0.0.1", 9)
    withdraw(settings)
    assert not path.exists()


def _ready(url: str, service: subprocess.Popen, log: Path) -> bool:
    assert service.poll() is None, log.read_text()[-2000:]
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_pmkb_suggest_asks_the_running_service_and_answers_itself_once_it_is_gone(_built_kb_dir, tmp_path):
    home = tmp_path / "kb"
    shutil.copytree(_built_kb_dir, home)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = command_env() | {
        "PMKB_HOME": str(home), "PMKB_API_TOKEN": "local-token", "PMKB_EMBEDDING_DEVICE": "cpu"}
    ticket = "Xid 79: GPU has fallen off the bus on gpu-a17, job 4411 died"
    log = (tmp_path / "serve.log").open("wb")
    service = subprocess.Popen([sys.executable, "-m", "pmkb", "serve", "--host", "127.0.0.1", "--port", str(port)],
                               env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _ready(url, service, tmp_path / "serve.log"), 180, "pmkb serve to become ready")
        assert (home / SERVICE_FILE).exists()
        asked = subprocess.run([sys.executable, "-m", "pmkb", "suggest", "--json", ticket], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stderr[-2000:]
        direct = httpx.post(f"{url}/v1/annotate", json={"description": ticket}, timeout=60,
                            headers={"Authorization": "Bearer local-token"}).json()
        answer = json.loads(asked.stdout)
        assert answer["root_cause"] == direct["root_cause"] == "gpu_lost"
        assert [h["id"] for h in answer["similar_incidents"]] == [h["id"] for h in direct["similar_incidents"]]
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        assert 'pmkb_webhook_events_total{outcome="answered",source="api"} 2.0' in metrics \
            or 'pmkb_webhook_events_total{source="api",outcome="answered"} 2.0' in metrics, metrics[-3000:]
        wrong = subprocess.run([sys.executable, "-m", "pmkb", "suggest", ticket], cwd=ROOT, timeout=120,
                               env=env | {"PMKB_API_TOKEN": "wrong"}, capture_output=True, text=True)
        assert wrong.returncode != 0 and "refused this command's token" in wrong.stderr
        assert "in use" in wrong.stderr  # it answered itself, and the embedded store is the service's
    finally:
        service.terminate()
        service.wait(timeout=60)
        log.close()
    assert not (home / SERVICE_FILE).exists()
    alone = subprocess.run([sys.executable, "-m", "pmkb", "suggest", ticket], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0 and "root cause: gpu_lost" in alone.stdout, alone.stderr[-2000:]
