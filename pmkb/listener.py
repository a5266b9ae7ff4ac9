"""The HTTP listener both services run on (``pmkb serve``, ``pmkb mcp --http``): uvicorn, guarded
against clients that hold connections without sending a request.

uvicorn alone lets a connection sit in its header phase for as long as a byte arrives now and
then, and accepts connections until the process runs out of file descriptors, after which every
new request fails. Here:

- **the header phase is bounded**: a request's headers must be complete ``header_timeout``
  seconds after the connection opened or the previous response ended (a byte now and then does
  not extend it); else 408 and the connection is closed;
- **the connection count is bounded**, below the open-file limit: when it is reached, the
  connection that has waited longest without a request in hand is closed to make room (an idle
  keep-alive or a slow sender), so a flood of slow connections cannot lock out new clients; only
  when every connection has a request in hand is the new one refused with 503;
- **the open-file limit is raised** to its hard limit at start.

Every cut is counted and logged (at most once a second), naming the setting to change.
"""

from __future__ import annotations

import logging
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("pmkb.listener")

FILES_KEPT_FREE = 128
"""Descriptors kept for everything but client connections (the store, logs, models, outbound calls)."""


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard limit where the platform allows; the soft limit after."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return soft


def connection_cap(wanted: int, file_limit: int) -> int:
    """The connection cap: ``wanted``, or fewer when the open-file limit would be reached first."""
    if file_limit <= 0:
        return wanted
    return max(1, min(wanted, file_limit - FILES_KEPT_FREE))


class Cuts:
    """What the guard cut, by reason; logs each reason at most once a second."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self._logged: dict[str, float] = {}

    def cut(self, reason: str, message: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(reason, -1.0) >= 1.0:
            self._logged[reason] = now
            log.warning("%s (%d so far)", message, self.counts[reason])


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded header phase and a bounded connection count
    (see the module doc); ``guarded_protocol`` sets the limits."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    cuts: Cuts = Cuts()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._header_timer = None
        self._waiting_since: float | None = None
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle until the next request (none pipelined)
            self._await_headers()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self._waiting_since = self.loop.time()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer, self._waiting_since = None, None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        self.cuts.cut("header_timeout", f"closed a connection whose request headers did not arrive within "
                                        f"{self.header_timeout:g} s (PMKB_HEADER_TIMEOUT)")
        self._close_with(408, "request headers not received in time")

    def _make_room(self) -> None:
        """Close the connection that has waited longest without a request in hand; this new one
        when none is waiting."""
        waiting = [c for c in self.connections if getattr(c, "_waiting_since", None) is not None and c is not self]
        if not waiting:
            self.cuts.cut("busy", f"refused a connection: all {self.max_connections} connections have a "
                                  f"request in hand (PMKB_MAX_CONNECTIONS)")
            self._close_with(503, "too many connections; retry later")
            return
        oldest = min(waiting, key=lambda c: c._waiting_since)
        self.cuts.cut("evicted", f"connection limit {self.max_connections} reached (PMKB_MAX_CONNECTIONS): closed "
                                 f"the connection that waited longest without sending a request")
        oldest._close_with(None, "")

    def _close_with(self, status: int | None, message: str) -> None:
        """Close the connection, first answering ``status`` with ``message`` when given."""
        self._headers_arrived()
        if status is not None and not self.transport.is_closing():
            body = message.encode()
            reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (status, reason, len(body), body))
        self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with these limits (and its own counts)."""
    return type("GuardedProtocol", (GuardedProtocol,), {
        "header_timeout": header_timeout, "max_connections": max_connections, "cuts": Cuts()})


def serve_app(app, host: str, port: int, header_timeout: float, max_connections: int) -> None:
    """Run an ASGI app with uvicorn behind the guard until interrupted."""
    import uvicorn

    cap = connection_cap(max_connections, raise_file_limit())
    if cap < max_connections:
        log.warning("serving at most %d connections, not %d: the open-file limit is too low (raise `ulimit -n`)",
                    cap, max_connections)
    uvicorn.run(app, host=host, port=port, log_config=None, server_header=False,
                http=guarded_protocol(header_timeout, cap))
