"""Operational parts of the HTTP services: rate limiting, metrics, request size limit, work per
client, JSON logs.

Used by pmkb.server and pmkb.mcp_server; nothing here knows about tickets or the knowledge base.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from datetime import datetime, timezone

from starlette.responses import JSONResponse

log = logging.getLogger("pmkb.server")


class TokenBucket:
    """Rate limit: ``rate`` tokens a second, up to ``burst``; each request takes one."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.stamp = float(burst), clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """0 when a token was taken, else the seconds until one will be there."""
        with self._lock:
            now = self.clock()
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return 0.0
            return (1 - self.tokens) / self.rate if self.rate > 0 else 60.0


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self):
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
        )

        self.registry = registry = CollectorRegistry()
        self.content_type = CONTENT_TYPE_LATEST
        self.received = Counter("pmkb_webhook_events", "Requests received, by source and outcome",
                                ["source", "outcome"], registry=registry)
        buckets = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
        self.latency = Histogram("pmkb_event_latency_seconds", "From webhook accepted to write-back done",
                                 ["source"], buckets=buckets, registry=registry)
        self.processing = Histogram("pmkb_event_processing_seconds", "Worker time per attempt (suggest and "
                                    "write-back)", ["source"], buckets=buckets, registry=registry)
        self.failures = Counter("pmkb_event_failures", "Failed attempts, by source and outcome (retry or dead)",
                                ["source", "outcome"], registry=registry)
        self.depth = Gauge("pmkb_queue_depth", "Events waiting or in hand", registry=registry)
        self.by_status = Gauge("pmkb_queue_events", "Events in the queue database by status", ["status"],
                               registry=registry)

    def render(self, counts: dict[str, int]) -> bytes:
        """The exposition text, with the queue gauges refreshed from ``counts``."""
        from prometheus_client import generate_latest

        self.depth.set(counts["queued"] + counts["claimed"])
        for status, number in counts.items():
            self.by_status.labels(status).set(number)
        return generate_latest(self.registry)


class BodyLimit:
    """ASGI middleware: the whole request body, read before the app sees it, within limits.

    413 for a body over ``limit`` bytes (declared or streamed), 408 when it has not fully arrived
    ``read_timeout`` seconds after the request started (a client trickling bytes cannot hold a
    connection open), and nothing but an info log line when the client goes away mid-body.
    """

    def __init__(self, app, limit: int, read_timeout: float = 10.0, on_reject=None):
        self.app, self.limit, self.read_timeout, self.on_reject = app, limit, read_timeout, on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._reject(scope, receive, send, 413, "too_large", f"request body over {self.limit} bytes")
        chunks, size, outcome = [], 0, None
        try:
            # One deadline for the whole body; asyncio.timeout adds no task per message, so the
            # common one-message body costs no extra turn of the event loop.
            async with asyncio.timeout(self.read_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        outcome = "disconnect"
                        break
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.limit:
                        outcome = "too_large"
                        break
                    if not message.get("more_body"):
                        break
        except TimeoutError:
            return await self._reject(scope, receive, send, 408, "read_timeout",
                                      f"request body not received within {self.read_timeout:g} s")
        if outcome == "disconnect":
            log.info("client disconnected before sending the whole body", extra={"path": scope["path"]})
            return
        if outcome == "too_large":
            return await self._reject(scope, receive, send, 413, "too_large", f"request body over {self.limit} bytes")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send, status: int, outcome: str, detail: str):
        if self.on_reject:
            self.on_reject(scope["path"], outcome)
        await JSONResponse({"detail": detail}, status_code=status,
                           headers={"Connection": "close"})(scope, receive, send)


def client_of(scope) -> str:
    """The client address of an ASGI scope (uvicorn puts the forwarded one there behind a trusted proxy)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class ClientLimit:
    """ASGI middleware: at most ``per_client`` requests in hand at once from one client address on
    the guarded requests (more: 429 with Retry-After), so one client cannot queue its work ahead of
    everyone else's."""

    def __init__(self, app, per_client: int, guards=lambda scope: True, on_reject=None):
        self.app, self.per_client, self.guards, self.on_reject = app, per_client, guards, on_reject
        self.in_hand: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.guards(scope):
            return await self.app(scope, receive, send)
        client = client_of(scope)
        if self.in_hand.get(client, 0) >= self.per_client:
            log.warning("429 for %s: %d requests already in hand from this client (PMKB_MAX_CALLS_PER_CLIENT)",
                        client, self.per_client)
            if self.on_reject:
                self.on_reject(scope["path"], "client_busy")
            detail = (f"{self.per_client} requests from this client are already in hand; retry when one "
                      f"has answered")
            return await JSONResponse({"detail": detail}, status_code=429, headers={"Retry-After": "1"})(
                scope, receive, send)
        self.in_hand[client] = self.in_hand.get(client, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_hand[client] -= 1
                if not self.in_hand[client]:
                    del self.in_hand[client]

        async def sending(message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                release()  # answered: the client may send its next call, even before the app returns

        try:
            await self.app(scope, receive, sending)
        finally:
            release()


class FairTurns:
    """A lock that serves its waiters by client in turn: the next turn goes to the waiting client
    served longest ago, so a client with many calls queued cannot keep another's one call waiting
    behind all of them (it waits for at most one call of each other client)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: dict[str, deque] = {}
        self._served: dict[str, int] = {}  # client -> the turn it was last served at
        self._turns = 0

    @contextmanager
    def turn(self, client: str):
        """Hold the lock for ``client``, once its turn has come."""
        me = object()
        with self._cond:
            self._waiting.setdefault(client, deque()).append(me)
            while self._busy or self._next() is not me:
                self._cond.wait()
            self._waiting[client].popleft()
            if not self._waiting[client]:
                del self._waiting[client]
            self._turns += 1
            self._served[client] = self._turns
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._served = {c: t for c, t in self._served.items() if c in self._waiting}
                self._cond.notify_all()

    def _next(self):
        client = min(self._waiting, key=lambda c: self._served.get(c, 0))
        return self._waiting[client][0]


_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName", "color_message"}
_SECRET_QUERY = re.compile(r"(secret=)[^&\s\"]*")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields become keys; query-string secrets are masked."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name,
               "message": _SECRET_QUERY.sub(r"\1***", record.getMessage())}
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, _, status = record.args
            out.update(client=client, method=method, path=_SECRET_QUERY.sub(r"\1***", str(path)), status=status)
        out.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: int = logging.INFO) -> None:
    """Send every log line, uvicorn's included, as JSON to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
