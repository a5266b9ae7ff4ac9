"""The webhook service: GitHub and Jira call it when a ticket is opened or edited (a thin shell over kb/).

Webhooks are verified (the signature before anything else, so unsigned traffic cannot use up a
sender's rate limit), parsed (pmkb.payloads), redacted, committed to the durable queue (kb.tickets.queue)
and acknowledged with 202; a background worker suggests and writes back (kb.tickets.writeback), never
applying an older version of a ticket after a newer one. ``/v1/annotate`` answers synchronously.
Operations: ``/healthz``, ``/readyz``, ``/metrics``, JSON logs on stderr.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import sqlite3
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from kb.core.redact import redact
from kb.core.roles import Suggester
from kb.core.settings import Settings
from kb.core.suggestion import EmptyTicket, Suggestion, Ticket
from kb.tickets.queue import Event, EventQueue, PermanentError, RetryLater, Skipped
from kb.tickets.worker import Worker
from pmkb.api_models import (
    GITHUB_BODY,
    JIRA_BODY,
    Accepted,
    AnnotateRequest,
    error_responses,
)
from pmkb.ops import BodyLimit, ClientLimit, FairTurns, Metrics, TokenBucket, client_of, configure_logging
from pmkb.payloads import (
    BadPayload,
    Ignored,
    TicketEvent,
    github_event,
    jira_event,
    parse_json_object,
)

log = logging.getLogger("pmkb.server")

QUEUE_FILE = "queue.sqlite3"
"""The queue database, under the knowledge-base home."""


SECRET_SETTINGS = ("github_webhook_secret", "jira_webhook_secret", "api_token", "github_token", "jira_token")


def startup_problems(settings: Settings, insecure_dev: bool) -> list[str]:
    """Why the service must not start with these settings (empty when it may).

    A secret set to the empty string is a mistake, not a choice: it would accept a signature
    keyed with "" or an empty header, so the service refuses to start, even with --insecure-dev.
    """
    empty = [f"PMKB_{name.upper()}" for name in SECRET_SETTINGS
             if (value := getattr(settings, name)) is not None and not value.get_secret_value().strip()]
    if empty:
        return [f"{', '.join(empty)} {'is' if len(empty) == 1 else 'are'} set but empty: give "
                f"{'it a value' if len(empty) == 1 else 'them values'} or unset {'it' if len(empty) == 1 else 'them'}"]
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


def state_dir_problem(home: Path) -> str | None:
    """Why the service cannot write its state under ``home`` (None when it can)."""
    probe = Path(home) / f".pmkb-ready-{os.getpid()}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as exc:
        return f"cannot write to the state directory {home}: {exc.strerror or exc}"
    return None


class Service:
    """State behind the app: queue, worker, engine and suggester (loaded in the background), limits, metrics.

    Tickets get their suggestion from ``make_suggester`` over the engine, as in every other shell:
    with a model configured, the comment written back is the suggestion the page shows.
    """

    def __init__(self, settings: Settings, engine=None, insecure_dev: bool = False, poll: float = 1.0):
        self.settings, self.engine, self.insecure_dev = settings, engine, insecure_dev
        self.suggester: Suggester | None = None  # set once loaded, before the worker starts
        self.queue = EventQueue(settings.home / QUEUE_FILE, max_attempts=settings.queue_max_attempts,
                                backoff=settings.queue_backoff,
                                retry_budget=settings.queue_retry_budget_hours * 3600)
        self.metrics = Metrics()
        self.worker = Worker(self.queue, self.handle, poll=poll, on_outcome=self._outcome,
                             retention=settings.queue_retention_days * 86400)
        self.buckets = {s: TokenBucket(settings.rate_limit_per_second, settings.rate_limit_burst)
                        for s in ("github", "jira", "api")}
        self.ready = threading.Event()
        self.load_error: str | None = None
        self._http = None  # one connection pool for all write-backs
        self._turns = FairTurns()  # one suggestion at a time (the engine is not known to be thread-safe)
        self._remediation = None  # (policy, cluster, audit log) once read
        self.cluster_factory = _cluster_for  # the scheduler's cluster client (tests give their own)

    def start(self) -> None:
        """Open the knowledge base in the background, then start the worker."""
        threading.Thread(target=self._load, name="pmkb-loader", daemon=True).start()

    def _load(self) -> None:
        from kb.engine.knowledge import KnowledgeBase
        from kb.engine.suggest import SuggestionEngine
        from kb.llm.suggester import make_suggester

        started = time.perf_counter()
        try:
            if self.engine is None:
                self.engine = SuggestionEngine(KnowledgeBase(self.settings), refit_in_background=True)
            self.engine.kb.ensure_built(log=log.info)
            self.engine.calibration
            # One throw-away suggestion builds the lazy parts (model, lexical index, taxonomy vectors),
            # so the first ticket after /readyz is not the slow one.
            self.engine.suggest(Ticket(id="warm-up", title="warm up", description="GPU job crashed"))
            self.suggester = make_suggester(self.engine)
        except Exception as exc:  # noqa: BLE001 - reported on /readyz and in the log
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("knowledge base failed to open", extra={"error": self.load_error})
            return
        self.worker.start()
        self.ready.set()
        log.info("ready", extra={"incidents": self.engine.kb.store.count(), "home": str(self.settings.home),
                                 "seconds": round(time.perf_counter() - started, 2), "llm": self.engine.settings.llm,
                                 "dry_run": str(self.settings.writeback_outbox or "")})

    def stop(self) -> None:
        """Stop the worker after the event in hand; the queue's write-ahead log is folded in, and the
        service's announcement to the command line (pmkb/local_service.py) is withdrawn."""
        from pmkb.local_service import withdraw

        withdraw(self.settings)  # here, not after the listener returns: uvicorn re-raises SIGTERM
        self.worker.stop()
        if self._http is not None:
            self._http.close()
        try:
            self.queue.checkpoint()
        except sqlite3.Error as exc:  # a full or read-only disk: the next start folds it in
            log.warning("could not checkpoint the event queue on shutdown: %s", exc)

    def suggest(self, ticket: Ticket, client: str = "queue worker") -> Suggestion:
        """One suggestion from the shared suggester, serialised with other callers (clients in turn)."""
        with self._turns.turn(client):
            return self.suggester.suggest(ticket)

    def handle(self, event: Event) -> dict:
        """Worker handler: suggest for the queued ticket and write the result back."""
        from kb.jobs.remediate import act_unattended
        from kb.tickets.attachments import attached_logs
        from kb.tickets.writeback import TicketRef, WriteBackError, write_back

        if self.queue.stale(event):  # e.g. a replayed delivery of an older version of the ticket
            raise Skipped("a newer version of the ticket was already applied")
        if self.queue.superseded(event):  # e.g. a retried "opened" after the "edited" that followed it
            raise Skipped("a newer event for the ticket supersedes this one")
        if event.content_hash and self.queue.last_done_hash(event.ticket) == event.content_hash:
            raise Skipped("ticket text unchanged since the last write-back")
        try:
            attached = attached_logs(self.settings, event.payload["system"], event.payload["ticket"], self.http)
            suggestion = self.suggest(Ticket(**event.payload["ticket"], log=attached.text))
            if suggestion.remediation is not None and (acting := self.remediator()) is not None:
                suggestion.remediation = act_unattended(suggestion.remediation, *acting, actor="pmkb serve")
            ref = TicketRef(system=event.payload["system"], key=event.ticket)
            done = write_back(self.settings, ref, suggestion,
                              client=None if self.settings.writeback_outbox else self.http)
            return done | {"root_cause": suggestion.root_cause, "abstained": suggestion.abstained}
        except EmptyTicket as exc:  # nothing to suggest from: not a failure anyone can fix by retrying
            raise Skipped(str(exc)) from exc
        except WriteBackError as exc:
            if not exc.retryable:
                raise PermanentError(str(exc)) from exc
            raise RetryLater(str(exc), exc.retry_after) from exc

    @property
    def http(self):
        """The HTTP client of the ticket systems' APIs, made on first use."""
        if self._http is None:
            import httpx

            self._http = httpx.Client()
        return self._http

    def remediator(self):
        """(policy, cluster, audit log) when the policy lets the bot act on its own, else None; a policy
        that cannot be read is logged once and never acts."""
        from kb.core.remediation import load_policy
        from kb.jobs.remediate import AUDIT_FILE, AuditLog

        if self.settings.remediation_policy is None or not self.settings.scheduler:
            return None
        if self._remediation is None:
            try:
                policy = load_policy(self.settings.remediation_policy, self.engine.kb.taxonomy.cause_ids)
                cluster = self.cluster_factory(self.settings.scheduler) if policy.bot_may_act else None
                self._remediation = (policy, cluster, AuditLog(self.settings.home / AUDIT_FILE))
            except Exception as exc:  # noqa: BLE001 - a policy or cluster that cannot be set up never acts
                log.error("the bot will not remediate: %s (fix PMKB_REMEDIATION_POLICY or the scheduler's "
                          "client configuration, then restart)", exc)
                self._remediation = (None, None, None)
        policy, cluster, audit = self._remediation
        return (policy, cluster, audit) if policy is not None and policy.bot_may_act else None

    def _outcome(self, event: Event, outcome: str, seconds: float) -> None:
        self.metrics.processing.labels(event.source).observe(seconds)
        if outcome == "done":
            self.metrics.latency.labels(event.source).observe(max(0.0, time.time() - event.created_at))
        elif outcome != "skipped":
            self.metrics.failures.labels(event.source, outcome).inc()

    def accept(self, source: str, delivery: str, event: TicketEvent) -> JSONResponse:
        """Redact the ticket text, commit the event to the queue, then acknowledge it (202).

        A redelivery is not queued again. Called in a worker thread: the commit waits for the disk,
        and the event loop should not.
        """
        from kb.tickets.writeback import TicketRef

        try:
            TicketRef(system=event.system, key=event.key)
        except ValueError as exc:
            return self.reject(source, 400, "bad_request", str(exc))
        # Only redacted text is stored: the engine redacts anyway, so nothing it needs is lost.
        ticket = {k: redact(v) if isinstance(v, str) and k != "id" else v for k, v in event.ticket.items()}
        extra = {"action": event.action} | ({"url": event.url} if event.url else {})
        event_id, created = self.queue.enqueue(source, delivery, event.key,
                                               {"system": event.system, "ticket": ticket, **extra},
                                               content_hash=_ticket_hash(ticket), version=event.version)
        outcome = "queued" if created else "duplicate"
        self.metrics.received.labels(source, outcome).inc()
        if created:
            self.worker.notify()
        log.info("webhook %s", outcome, extra={"source": source, "event_id": event_id, "ticket": event.key,
                                               "delivery": delivery[:100]})
        return JSONResponse({"event_id": event_id, "status": outcome, "ticket": event.key}, status_code=202)

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


def _cluster_for(scheduler: str):
    from kb.jobs.remediate import KubernetesCluster, SlurmCluster

    return SlurmCluster() if scheduler == "slurm" else KubernetesCluster()


def _same(expected: str, given: str | None) -> bool:
    """Constant-time comparison; an empty expected secret never matches."""
    return bool(expected) and given is not None and hmac.compare_digest(expected.encode(), given.encode(
        "utf-8", "replace"))


def _configured(secret) -> bool:
    return secret is not None and bool(secret.get_secret_value())


def create_app(settings: Settings, engine=None, insecure_dev: bool = False, poll: float = 1.0) -> FastAPI:
    """The FastAPI app; ``engine`` may be given (tests) to skip loading one (its settings pick the model)."""
    svc = Service(settings, engine=engine, insecure_dev=insecure_dev, poll=poll)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc.start()
        yield
        svc.stop()

    app = FastAPI(title="pmkb", summary="Ticket triage suggestions for GPU clusters", lifespan=lifespan)
    app.state.service = svc
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes, read_timeout=settings.request_read_timeout,
                       on_reject=lambda path, outcome: svc.metrics.received.labels(_source(path), outcome).inc())
    app.add_middleware(ClientLimit, per_client=settings.max_calls_per_client,
                       guards=lambda scope: scope["path"] == "/v1/annotate",
                       on_reject=lambda path, outcome: svc.metrics.received.labels("api", outcome).inc())

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        status = 400 if any(e.get("type") == "json_invalid" for e in exc.errors()) else 422
        return JSONResponse({"detail": jsonable_errors(exc)}, status_code=status)

    _webhook_routes(app, svc, settings, insecure_dev)
    _annotate_route(app, svc, settings, insecure_dev)
    _probe_routes(app, svc, settings)
    return app


def _webhook_routes(app: FastAPI, svc: Service, settings: Settings, insecure_dev: bool) -> None:
    """POST /webhooks/github and /webhooks/jira: verify, rate-limit, parse, queue, 202."""

    async def receive(source: str, request: Request, secret, authentic, refusal: str) -> dict | JSONResponse:
        """The verified, rate-limited JSON body of a webhook, or the response refusing it.

        The signature is checked before the rate limit, so unsigned requests cannot spend the
        tokens of the sender's genuine deliveries.
        """
        if not _configured(secret) and not insecure_dev:
            return svc.reject(source, 404, "not_configured", f"{source} webhooks are not configured: set "
                                                             f"PMKB_{source.upper()}_WEBHOOK_SECRET")
        body = await request.body()
        if _configured(secret) and not authentic(secret.get_secret_value(), body):
            return svc.reject(source, 401, "unauthorized", refusal)
        if (refused := svc.limited(source)) is not None:
            return refused
        try:
            return parse_json_object(body)
        except BadPayload as exc:
            return svc.reject(source, 400, "bad_request", str(exc))

    async def queue_event(source: str, delivery: str, parse) -> JSONResponse:
        try:
            event = parse()
        except Ignored as exc:
            return svc.ignore(source, str(exc))
        except BadPayload as exc:
            return svc.reject(source, 400, "bad_request", str(exc))
        return await run_in_threadpool(svc.accept, source, delivery, event)

    webhook = {"status_code": 202, "response_model": Accepted}

    @app.post("/webhooks/github", summary="GitHub `issues` webhook", **webhook, openapi_extra=GITHUB_BODY,
              responses={200: {"description": "An event pmkb does not act on (ping, other actions)"},
                         **error_responses(400, 401, 404, 408, 413, 429)})
    async def github_webhook(request: Request, x_github_event: str | None = Header(None),
                             x_github_delivery: str | None = Header(None),
                             x_hub_signature_256: str | None = Header(None)):
        def signed(secret: str, body: bytes) -> bool:
            return _same("sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(), x_hub_signature_256)

        payload = await receive("github", request, settings.github_webhook_secret, signed,
                                "missing or wrong X-Hub-Signature-256")
        if isinstance(payload, JSONResponse):
            return payload
        delivery = x_github_delivery or hashlib.sha256(await request.body()).hexdigest()
        return await queue_event("github", delivery, lambda: github_event(x_github_event, payload))

    @app.post("/webhooks/jira", summary="Jira issue webhook", **webhook, openapi_extra=JIRA_BODY,
              responses={200: {"description": "An event pmkb does not act on"},
                         **error_responses(400, 401, 404, 408, 413, 429)})
    async def jira_webhook(request: Request):
        in_header = settings.jira_secret_in == "header"

        def shared(secret: str, body: bytes) -> bool:
            return _same(secret, request.headers.get(settings.jira_secret_header) if in_header
                         else request.query_params.get("secret"))

        where = settings.jira_secret_header if in_header else "?secret="
        payload = await receive("jira", request, settings.jira_webhook_secret, shared,
                                f"missing or wrong shared secret ({where})")
        if isinstance(payload, JSONResponse):
            return payload
        issue = payload.get("issue")
        key = issue.get("key") if isinstance(issue, dict) else None
        stamp = payload.get("timestamp")
        delivery = (request.headers.get("X-Atlassian-Webhook-Identifier")
                    or (f"{payload.get('webhookEvent')}:{key}:{stamp}" if stamp and key else None)
                    or hashlib.sha256(await request.body()).hexdigest())
        return await queue_event("jira", delivery, lambda: jira_event(payload))


def _annotate_route(app: FastAPI, svc: Service, settings: Settings, insecure_dev: bool) -> None:
    """POST /v1/annotate: one suggestion, synchronously, behind a bearer token."""
    bearer = HTTPBearer(auto_error=False)

    @app.post("/v1/annotate", response_model=Suggestion, summary="Suggest for one ticket, synchronously",
              responses=error_responses(400, 401, 404, 408, 413, 422, 429, 503))
    def annotate(req: AnnotateRequest, request: Request,
                 credentials: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if not _configured(settings.api_token) and not insecure_dev:
            raise HTTPException(404, "the annotate API is not configured: set PMKB_API_TOKEN")
        if _configured(settings.api_token) and not (credentials and _same(settings.api_token.get_secret_value(),
                                                                           credentials.credentials)):
            svc.metrics.received.labels("api", "unauthorized").inc()
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        if (refused := svc.limited("api")) is not None:
            return refused
        if not svc.ready.is_set():
            raise HTTPException(503, svc.load_error or "the knowledge base is still loading; retry shortly",
                                headers={"Retry-After": "5"})
        try:
            result = svc.suggest(Ticket(**req.model_dump(exclude_none=True)), client_of(request.scope))
        except EmptyTicket as exc:
            svc.metrics.received.labels("api", "bad_request").inc()
            raise HTTPException(400, str(exc)) from exc
        svc.metrics.received.labels("api", "answered").inc()
        return result


def _probe_routes(app: FastAPI, svc: Service, settings: Settings) -> None:
    """GET /healthz, /readyz and /metrics."""

    @app.get("/healthz", summary="The process is up")
    def healthz():
        return {"status": "ok"}

    @app.get("/readyz", summary="Knowledge base open, worker running, state directory writable",
             responses={503: {"description": "Not ready: the body says which part is not"}})
    def readyz():
        problem = state_dir_problem(settings.home) or svc.worker.write_error
        ok = svc.ready.is_set() and svc.worker.alive and problem is None
        body = {"status": "ready" if ok else "not ready", "knowledge_base": svc.ready.is_set(),
                "worker": svc.worker.alive, "state_dir_writable": problem is None, "queue": svc.queue.counts()}
        if svc.load_error or problem:
            body["error"] = svc.load_error or problem
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics")
    def metrics():
        return Response(svc.metrics.render(svc.queue.counts()), media_type=svc.metrics.content_type)


def _source(path: str) -> str:
    return "github" if path.endswith("/github") else "jira" if path.endswith("/jira") else "api"


def jsonable_errors(exc: RequestValidationError) -> list[dict]:
    """Validation errors without the non-JSON parts (exceptions in ``ctx``)."""
    return [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]


def serve(settings: Settings, host: str, port: int, insecure_dev: bool) -> None:
    """Run the service (pmkb.listener) until interrupted."""
    from pmkb.listener import serve_app

    configure_logging()
    log.info("starting", extra={"host": host, "port": port, "home": str(settings.home),
                                "queue": str(Path(settings.home) / QUEUE_FILE)})
    serve_app(create_app(settings, insecure_dev=insecure_dev), host, port, settings.header_timeout,
              settings.max_connections)


if __name__ == "__main__":  # pragma: no cover - ``pmkb serve`` is the entry point
    sys.exit("run `pmkb serve`")
