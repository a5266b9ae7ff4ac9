"""The webhook service: GitHub and Jira call it when a ticket is opened or edited (a thin shell over kb/).

Webhooks are verified, committed to the durable queue (kb.queue) and acknowledged with 202; a
background worker suggests (kb.suggest) and writes back (kb.writeback). ``/v1/annotate`` answers
synchronously. Operations: ``/healthz``, ``/readyz``, ``/metrics``, JSON logs on stderr.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from kb.queue import Event, EventQueue, PermanentError, Worker
from kb.settings import Settings
from kb.suggestion import EmptyTicket, Suggestion, Ticket
from pmkb.ops import BodyLimit, Metrics, TokenBucket, configure_logging

log = logging.getLogger("pmkb.server")

GITHUB_ACTIONS = {"opened", "edited", "reopened"}
JIRA_EVENTS = {"jira:issue_created", "jira:issue_updated"}
JIRA_TEXT_FIELDS = {"summary", "description"}
QUEUE_FILE = "queue.sqlite3"
"""The queue database, under the knowledge-base home."""


class AnnotateRequest(BaseModel):
    """A ticket for ``POST /v1/annotate``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    title: str = ""
    description: str = ""
    log: str = ""  # optional log excerpt


def startup_problems(settings: Settings, insecure_dev: bool) -> list[str]:
    """Why the service must not start with these settings (empty when it may)."""
    secrets = (settings.github_webhook_secret, settings.jira_webhook_secret, settings.api_token)
    problems = []
    if not insecure_dev and not any(secrets):
        problems.append("no PMKB_GITHUB_WEBHOOK_SECRET, PMKB_JIRA_WEBHOOK_SECRET or PMKB_API_TOKEN is set: "
                        "set the ones for the endpoints you use (or pass --insecure-dev on a laptop)")
    if settings.writeback_outbox is None and not insecure_dev:
        if settings.github_webhook_secret and settings.github_token is None:
            problems.append("PMKB_GITHUB_WEBHOOK_SECRET is set but PMKB_GITHUB_TOKEN is not: pmkb could not "
                            "write back to GitHub; set it, or use --dry-run OUTBOX.jsonl")
        if settings.jira_webhook_secret and not (settings.jira_url and settings.jira_token):
            problems.append("PMKB_JIRA_WEBHOOK_SECRET is set but PMKB_JIRA_URL or PMKB_JIRA_TOKEN is not: "
                            "set them, or use --dry-run OUTBOX.jsonl")
    return problems


def _ticket_hash(ticket: dict) -> str:
    text = "\n".join(ticket.get(k) or "" for k in ("title", "description", "log"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Service:
    """State behind the app: queue, worker, engine (loaded in the background), limits, metrics."""

    def __init__(self, settings: Settings, engine=None, insecure_dev: bool = False, poll: float = 1.0):
        self.settings, self.engine, self.insecure_dev = settings, engine, insecure_dev
        self.queue = EventQueue(settings.home / QUEUE_FILE, max_attempts=settings.queue_max_attempts,
                                backoff=settings.queue_backoff)
        self.metrics = Metrics()
        self.worker = Worker(self.queue, self.handle, poll=poll, on_outcome=self._outcome)
        self.buckets = {s: TokenBucket(settings.rate_limit_per_second, settings.rate_limit_burst)
                        for s in ("github", "jira", "api")}
        self.ready = threading.Event()
        self.load_error: str | None = None
        self._http = None  # one connection pool for all write-backs
        self._suggest_lock = threading.Lock()  # the engine is not known to be thread-safe

    def start(self) -> None:
        """Open the knowledge base in the background, then start the worker."""
        threading.Thread(target=self._load, name="pmkb-loader", daemon=True).start()

    def _load(self) -> None:
        from kb.knowledge import KnowledgeBase
        from kb.suggest import SuggestionEngine

        started = time.perf_counter()
        try:
            if self.engine is None:
                self.engine = SuggestionEngine(KnowledgeBase(self.settings))
            self.engine.kb.ensure_built(log=log.info)
            self.engine.calibration
            # One throw-away suggestion builds the lazy parts (model, lexical index, taxonomy vectors),
            # so the first ticket after /readyz is not the slow one.
            self.engine.suggest(Ticket(id="warm-up", title="warm up", description="GPU job crashed"))
        except Exception as exc:  # noqa: BLE001 - reported on /readyz and in the log
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("knowledge base failed to open", extra={"error": self.load_error})
            return
        self.worker.start()
        self.ready.set()
        log.info("ready", extra={"incidents": self.engine.kb.store.count(), "home": str(self.settings.home),
                                 "seconds": round(time.perf_counter() - started, 2),
                                 "dry_run": str(self.settings.writeback_outbox or "")})

    def stop(self) -> None:
        """Stop the worker after the event in hand."""
        self.worker.stop()
        if self._http is not None:
            self._http.close()

    def suggest(self, ticket: Ticket) -> Suggestion:
        """One suggestion, serialised with other callers."""
        with self._suggest_lock:
            return self.engine.suggest(ticket)

    def handle(self, event: Event) -> dict:
        """Worker handler: suggest for the queued ticket and write the result back."""
        from kb.writeback import TicketRef, WriteBackError, write_back

        if self.queue.superseded(event):  # e.g. a retried "opened" after the "edited" that followed it
            return {"skipped": "a newer event for the ticket supersedes this one"}
        if event.content_hash and self.queue.last_done_hash(event.ticket) == event.content_hash:
            return {"skipped": "ticket text unchanged since the last write-back"}
        try:
            suggestion = self.suggest(Ticket(**event.payload["ticket"]))
            ref = TicketRef(system=event.payload["system"], key=event.ticket)
            if self._http is None and self.settings.writeback_outbox is None:
                import httpx

                self._http = httpx.Client()
            done = write_back(self.settings, ref, suggestion, client=self._http)
            return done | {"root_cause": suggestion.root_cause, "abstained": suggestion.abstained}
        except EmptyTicket as exc:
            raise PermanentError(str(exc)) from exc
        except WriteBackError as exc:
            if not exc.retryable:
                raise PermanentError(str(exc)) from exc
            raise

    def _outcome(self, event: Event, outcome: str, seconds: float) -> None:
        self.metrics.processing.labels(event.source).observe(seconds)
        if outcome == "done":
            self.metrics.latency.labels(event.source).observe(max(0.0, time.time() - event.created_at))
        else:
            self.metrics.failures.labels(event.source, outcome).inc()

    def accept(self, source: str, delivery: str, system: str, key: str, ticket: dict, extra: dict) -> JSONResponse:
        """Commit the event to the queue, then acknowledge it (202); a redelivery is not queued again.

        Called in a worker thread: the commit waits for the disk, and the event loop should not.
        """
        from kb.writeback import TicketRef

        try:
            TicketRef(system=system, key=key)
        except ValueError as exc:
            return self.reject(source, 400, "bad_request", str(exc))
        event_id, created = self.queue.enqueue(source, delivery, key, {"system": system, "ticket": ticket, **extra},
                                               content_hash=_ticket_hash(ticket))
        outcome = "queued" if created else "duplicate"
        self.metrics.received.labels(source, outcome).inc()
        if created:
            self.worker.notify()
        log.info("webhook %s", outcome, extra={"source": source, "event_id": event_id, "ticket": key,
                                               "delivery": delivery})
        return JSONResponse({"event_id": event_id, "status": outcome, "ticket": key}, status_code=202)

    def reject(self, source: str, status: int, outcome: str, detail: str, headers: dict | None = None):
        """Count and log a refused request, and build its response."""
        self.metrics.received.labels(source, outcome).inc()
        log.warning("webhook refused", extra={"source": source, "status": status, "detail": detail})
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    def ignore(self, source: str, reason: str) -> JSONResponse:
        """Acknowledge an event pmkb does not act on."""
        self.metrics.received.labels(source, "ignored").inc()
        return JSONResponse({"status": "ignored", "reason": reason}, status_code=200)

    def limited(self, source: str) -> JSONResponse | None:
        """A 429 response when the source's token bucket is empty, else None."""
        wait = self.buckets[source].take()
        if wait:
            return self.reject(source, 429, "rate_limited", f"too many {source} requests; retry later",
                               headers={"Retry-After": str(max(1, round(wait)))})
        return None


def _json_object(body: bytes) -> dict | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _text(value) -> str:
    """Plain text of a Jira field: a string, or the text nodes of an Atlassian Document Format tree."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("text") or "\n".join(filter(None, (_text(v) for v in value.get("content") or [])))
    if isinstance(value, list):
        return "\n".join(filter(None, (_text(v) for v in value)))
    return ""


def _same(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def create_app(settings: Settings, engine=None, insecure_dev: bool = False, poll: float = 1.0) -> FastAPI:
    """The FastAPI app; ``engine`` may be given (tests) to skip loading one."""
    svc = Service(settings, engine=engine, insecure_dev=insecure_dev, poll=poll)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc.start()
        yield
        svc.stop()

    app = FastAPI(title="pmkb", summary="Ticket triage suggestions for GPU clusters", lifespan=lifespan)
    app.state.service = svc
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes,
                       on_reject=lambda path: svc.metrics.received.labels(_source(path), "too_large").inc())
    bearer = HTTPBearer(auto_error=False)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        status = 400 if any(e.get("type") == "json_invalid" for e in exc.errors()) else 422
        return JSONResponse({"detail": jsonable_errors(exc)}, status_code=status)

    @app.post("/webhooks/github", status_code=202, summary="GitHub `issues` webhook")
    async def github_webhook(request: Request, x_github_event: str | None = Header(None),
                             x_github_delivery: str | None = Header(None),
                             x_hub_signature_256: str | None = Header(None)):
        secret = settings.github_webhook_secret
        if secret is None and not insecure_dev:
            raise HTTPException(404, "GitHub webhooks are not configured: set PMKB_GITHUB_WEBHOOK_SECRET")
        if (refused := svc.limited("github")) is not None:
            return refused
        body = await request.body()
        if secret is not None:
            digest = "sha256=" + hmac.new(secret.get_secret_value().encode(), body, hashlib.sha256).hexdigest()
            if not _same(digest, x_hub_signature_256):
                return svc.reject("github", 401, "unauthorized", "missing or wrong X-Hub-Signature-256")
        payload = _json_object(body)
        if payload is None:
            return svc.reject("github", 400, "bad_request", "the body is not a JSON object")
        if x_github_event == "ping":
            return svc.ignore("github", "ping")
        if x_github_event != "issues" or payload.get("action") not in GITHUB_ACTIONS:
            return svc.ignore("github", f"event {x_github_event}/{payload.get('action')} is not handled")
        issue, repo = payload.get("issue"), payload.get("repository")
        if not (isinstance(issue, dict) and isinstance(repo, dict) and issue.get("number")
                and repo.get("full_name")):
            return svc.reject("github", 400, "bad_request", "an issues event needs issue.number and "
                                                             "repository.full_name")
        key = f"{repo['full_name']}#{issue['number']}"
        ticket = {"id": key, "title": issue.get("title") or "", "description": issue.get("body") or ""}
        delivery = x_github_delivery or hashlib.sha256(body).hexdigest()
        return await run_in_threadpool(svc.accept, "github", delivery, "github", key, ticket,
                                       {"action": payload["action"], "url": issue.get("html_url")})

    @app.post("/webhooks/jira", status_code=202, summary="Jira issue webhook")
    async def jira_webhook(request: Request):
        secret = settings.jira_webhook_secret
        if secret is None and not insecure_dev:
            raise HTTPException(404, "Jira webhooks are not configured: set PMKB_JIRA_WEBHOOK_SECRET")
        if (refused := svc.limited("jira")) is not None:
            return refused
        body = await request.body()
        if secret is not None:
            given = (request.headers.get(settings.jira_secret_header) if settings.jira_secret_in == "header"
                     else request.query_params.get("secret"))
            if not _same(secret.get_secret_value(), given):
                where = settings.jira_secret_header if settings.jira_secret_in == "header" else "?secret="
                return svc.reject("jira", 401, "unauthorized", f"missing or wrong shared secret ({where})")
        payload = _json_object(body)
        if payload is None:
            return svc.reject("jira", 400, "bad_request", "the body is not a JSON object")
        event = payload.get("webhookEvent")
        if event not in JIRA_EVENTS:
            return svc.ignore("jira", f"event {event} is not handled")
        items = (payload.get("changelog") or {}).get("items")
        if event == "jira:issue_updated" and isinstance(items, list) and items and not any(
                isinstance(i, dict) and i.get("field") in JIRA_TEXT_FIELDS for i in items):
            return svc.ignore("jira", "neither summary nor description changed")
        issue = payload.get("issue")
        fields = issue.get("fields") if isinstance(issue, dict) else None
        if not (isinstance(fields, dict) and issue.get("key")):
            return svc.reject("jira", 400, "bad_request", "a Jira issue event needs issue.key and issue.fields")
        key = str(issue["key"])
        ticket = {"id": key, "title": _text(fields.get("summary")),
                  "description": _text(fields.get("description"))}
        delivery = (request.headers.get("X-Atlassian-Webhook-Identifier")
                    or (f"{event}:{key}:{payload['timestamp']}" if payload.get("timestamp") else None)
                    or hashlib.sha256(body).hexdigest())
        return await run_in_threadpool(svc.accept, "jira", delivery, "jira", key, ticket, {"action": event})

    @app.post("/v1/annotate", response_model=Suggestion, summary="Suggest for one ticket, synchronously")
    def annotate(req: AnnotateRequest, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if settings.api_token is None and not insecure_dev:
            raise HTTPException(404, "the annotate API is not configured: set PMKB_API_TOKEN")
        if settings.api_token is not None and not (credentials and _same(settings.api_token.get_secret_value(),
                                                                          credentials.credentials)):
            svc.metrics.received.labels("api", "unauthorized").inc()
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        if (refused := svc.limited("api")) is not None:
            return refused
        if not svc.ready.is_set():
            raise HTTPException(503, svc.load_error or "the knowledge base is still loading; retry shortly",
                                headers={"Retry-After": "5"})
        fields = req.model_dump(exclude_none=True)
        try:
            result = svc.suggest(Ticket(**fields))
        except EmptyTicket as exc:
            svc.metrics.received.labels("api", "bad_request").inc()
            raise HTTPException(400, str(exc)) from exc
        svc.metrics.received.labels("api", "answered").inc()
        return result

    @app.get("/healthz", summary="The process is up")
    def healthz():
        return {"status": "ok"}

    @app.get("/readyz", summary="Knowledge base open and worker running")
    def readyz():
        ok = svc.ready.is_set() and svc.worker.alive
        body = {"status": "ready" if ok else "not ready", "knowledge_base": svc.ready.is_set(),
                "worker": svc.worker.alive, "queue": svc.queue.counts()}
        if svc.load_error:
            body["error"] = svc.load_error
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics")
    def metrics():
        return Response(svc.metrics.render(svc.queue.counts()), media_type=svc.metrics.content_type)

    return app


def _source(path: str) -> str:
    return "github" if path.endswith("/github") else "jira" if path.endswith("/jira") else "api"


def jsonable_errors(exc: RequestValidationError) -> list[dict]:
    """Validation errors without the non-JSON parts (exceptions in ``ctx``)."""
    return [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]


def serve(settings: Settings, host: str, port: int, insecure_dev: bool) -> None:
    """Run the service with uvicorn until interrupted."""
    import uvicorn

    configure_logging()
    log.info("starting", extra={"host": host, "port": port, "home": str(settings.home),
                                "queue": str(Path(settings.home) / QUEUE_FILE)})
    uvicorn.run(create_app(settings, insecure_dev=insecure_dev), host=host, port=port, log_config=None,
                server_header=False)


if __name__ == "__main__":  # pragma: no cover - ``pmkb serve`` is the entry point
    sys.exit("run `pmkb serve`")
