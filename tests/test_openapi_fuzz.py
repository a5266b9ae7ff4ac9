"""Schemathesis against the service's own /openapi.json: no generated request may get a 5xx.

Every operation is fuzzed with positive and negative cases (bounded examples), once with the
endpoints open (``--insecure-dev``: bodies reach the payload parsers and the engine) and once with
secrets and a token set (the refusal paths). Responses must also be documented in the schema.
"""

from __future__ import annotations

import shutil

import httpx
import pytest
from conftest import make_settings
from test_server import LiveServer, kb_home, wait_until  # noqa: F401

from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from pmkb.server import create_app

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

EXAMPLES = 25


def fuzz(url: str, headers: dict | None = None) -> dict[str, set[int]]:
    """Run every operation's cases against the server; returns the statuses seen per operation."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    seen: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        documented = {str(code) for code in operation.definition.raw.get("responses", {})} | {"422"}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case):
                extra = {"X-GitHub-Event": "issues"} if operation.path == "/webhooks/github" else {}
                response = case.call(base_url=url, headers={**(headers or {}), **extra}, timeout=60)
                seen.setdefault(operation.label, set()).add(response.status_code)
                assert response.status_code < 500, (operation.label, case.body, response.text[:500])
                assert str(response.status_code) in documented, (operation.label, response.status_code)

            try:
                check()
            except Unsatisfiable:
                # No invalid request exists for an operation without parameters or body (GET /healthz).
                assert mode == GenerationMode.NEGATIVE, operation.label
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["open", "secured"])
def test_no_generated_request_gets_a_server_error(mode, kb_home, embedder, tmp_path):  # noqa: F811
    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    secured = {"github_webhook_secret": "s3cret-gh", "jira_webhook_secret": "s3cret-jira", "api_token": "tok"}
    settings_ = make_settings(home, writeback_outbox=tmp_path / "outbox.jsonl", rate_limit_burst=100_000,
                              rate_limit_per_second=1000.0, **(secured if mode == "secured" else {}))
    engine = SuggestionEngine(KnowledgeBase(settings_, embedder=embedder))
    app = create_app(settings_, engine=engine, insecure_dev=mode == "open", poll=0.1)
    with LiveServer(app) as server:
        wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 120, "/readyz")
        seen = fuzz(server.url, {"Authorization": "Bearer tok"} if mode == "secured" else None)
    assert {"POST /webhooks/github", "POST /webhooks/jira", "POST /v1/annotate"} <= set(seen)
    if mode == "open":
        assert 202 in seen["POST /webhooks/github"] | seen["POST /webhooks/jira"]  # bodies got through
        assert 200 in seen["POST /v1/annotate"]
    else:
        assert seen["POST /webhooks/github"] == {401}
