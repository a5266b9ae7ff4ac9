"""The MCP server: the knowledge base as tools for Model Context Protocol clients (a thin shell over kb/).

Tools: ``suggest`` (a ticket -> the Suggestion ``pmkb suggest --json`` prints), ``search`` (similar
incidents, with label filters), ``node_history`` (earlier incidents naming a node),
``remediation_plan`` (the steps that take the suspect node out and resubmit the job, nothing run)
and ``taxonomy`` (the label space). Transports: stdio, which desktop hosts launch, and streamable HTTP, where every
request carries the bearer token ``PMKB_API_TOKEN``.

The engine loads once per process, in a background thread as soon as the server starts, so the
handshake is instant and the first call waits for the load. Ticket text is untrusted: the engine
redacts it before anything is embedded, search queries are redacted the same way, and no ticket
text is ever logged (the log says which tool ran, how long it took and what it found).
"""

from __future__ import annotations

import hmac
import logging
import sys
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Callable, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from kb.core.redact import redact
from kb.core.remediation import RemediationPlan
from kb.core.roles import Suggester
from kb.core.settings import Settings
from kb.core.suggestion import EmptyTicket, NodeHistory, SimilarIncident, Suggestion, Ticket
from kb.core.taxonomy import Taxonomy, load_taxonomy
from kb.engine.history import node_history, node_index
from kb.engine.remediate import no_plan_reason, plan_for
from kb.engine.search import Retriever
from pmkb.ops import BodyLimit, ClientLimit, FairTurns

log = logging.getLogger("pmkb.mcp")

MCP_PATH = "/mcp"
"""Where the streamable HTTP endpoint is served."""
MAX_RESULTS = 50
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

INSTRUCTIONS = """\
pmkb is a knowledge base of past GPU-cluster incidents (Xid errors, NCCL timeouts, ECC faults, \
storage and scheduler failures ...). Call `suggest` with a new ticket's title, description and log \
excerpt to get the likely symptom, root cause (with its dimension and calibrated confidence), ranked \
mitigations with next steps, the evidence lines and similar past incidents; `abstained: true` means \
it is not sure. `search` finds past incidents for any text, optionally filtered by label ids from \
`taxonomy`. `node_history` lists earlier incidents that named a node."""


def _valid_unicode(value: str | None) -> str | None:
    try:
        if value is not None:
            value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (it holds a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
Label = Annotated[str | None, AfterValidator(_valid_unicode)]


class SearchResult(BaseModel):
    """What ``search`` returns."""

    model_config = ConfigDict(extra="forbid")

    incidents: list[SimilarIncident]  # best first; score is the fused similarity in [0, 1]


def token_problem(settings: Settings) -> str | None:
    """Why the HTTP transport must not start with these settings (None when it may)."""
    if settings.api_token is None:
        return "--http needs a bearer token: set PMKB_API_TOKEN (clients send `Authorization: Bearer <token>`)"
    if not settings.api_token.get_secret_value().strip():
        return "PMKB_API_TOKEN is set but empty: give it a value"
    return None


def same_secret(expected: str, given: str | None) -> bool:
    """Constant-time comparison; an empty expected secret never matches."""
    return bool(expected) and given is not None and hmac.compare_digest(expected.encode(), given.encode(
        "utf-8", "replace"))


@dataclass(frozen=True)
class _Loaded:
    """Everything the tools need from the engine, built whole before anyone sees it."""

    engine: object  # kb.engine.suggest.SuggestionEngine
    suggester: Suggester  # make_suggester's, as in every shell: the engine, or the model over it
    retriever: Retriever  # all stored incidents, like `pmkb search`


class KnowledgeTools:
    """The tools' side of the knowledge base: loaded once per process, serialised across callers."""

    def __init__(self, settings: Settings, engine=None):
        self.settings = settings
        self._engine = engine  # tests pass one to skip loading the model again
        self._loaded: _Loaded | None = None
        self.load_error: str | None = None
        self._ready = threading.Event()
        self._started = False
        self._start_lock = threading.Lock()
        self._turns = FairTurns()  # one call at a time (the engine is not known to be thread-safe), clients in turn
        self._nodes: tuple[tuple, dict] = ((), {})

    @cached_property
    def taxonomy(self) -> Taxonomy:
        """The taxonomy in use (read without loading the engine)."""
        return load_taxonomy(self.settings.taxonomy)

    def start(self) -> None:
        """Load the engine in a background thread (once; later calls do nothing)."""
        with self._start_lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._load, name="pmkb-mcp-load", daemon=True).start()

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            loaded = self._build()
        except Exception as exc:  # noqa: BLE001 - every later call reports it
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("the knowledge base failed to load: %s", self.load_error)
        else:
            self._loaded = loaded
            log.info("ready in %.1f s: %d incidents, LLM %s", time.perf_counter() - started,
                     loaded.engine.kb.store.count(), self.settings.llm)
        finally:
            if self._loaded is None and self.load_error is None:
                self.load_error = "loading stopped unexpectedly; see the server log"
            self._ready.set()

    def _build(self) -> _Loaded:
        from kb.engine.knowledge import KnowledgeBase
        from kb.engine.suggest import SuggestionEngine
        from kb.llm.suggester import make_suggester

        log.info("loading the knowledge base at %s", self.settings.home)
        engine = self._engine or SuggestionEngine(KnowledgeBase(self.settings), refit_in_background=True)
        engine.kb.ensure_built(log=log.info)
        engine.load_calibration(on_fit=lambda: log.info("fitting the classifier on the knowledge base (once)"))
        # One throw-away suggestion builds the lazy parts (model, lexical index, text classifiers),
        # so the first caller's ticket is not the slow one.
        engine.suggest(Ticket(id="warm-up", title="warm up", description="GPU job crashed"))
        retriever = Retriever(engine.kb)
        retriever.refresh()
        return _Loaded(engine, make_suggester(engine), retriever)

    def loaded(self) -> _Loaded:
        """The loaded engine, waiting for the load if it is still running."""
        self.start()
        self._ready.wait()
        if self._loaded is None:
            raise ToolError(f"the knowledge base could not be loaded: {self.load_error}")
        return self._loaded

    def suggest(self, ticket: Ticket, client: str = "local") -> Suggestion:
        """The suggestion for one ticket (the engine redacts its text first); a ticket with nothing
        left to read is a tool error."""
        loaded = self.loaded()
        with self._turns.turn(client):
            try:
                return loaded.suggester.suggest(ticket)
            except EmptyTicket as exc:
                raise ToolError(str(exc)) from None

    def search(self, query: str, k: int, where: dict | None, client: str = "local") -> list[SimilarIncident]:
        """The k stored incidents most similar to the (redacted) query."""
        loaded = self.loaded()
        with self._turns.turn(client):
            return loaded.retriever.retrieve_similar(redact(query), k=k, where=where)

    def node_history(self, node: str, limit: int, client: str = "local") -> NodeHistory | None:
        """Earlier incidents naming the node; the index is rebuilt only when the store changed."""
        kb = self.loaded().engine.kb
        with self._turns.turn(client):
            state = (kb.store.state(), kb.generation)
            if self._nodes[0] != state:
                self._nodes = (state, node_index(kb.store.incidents()))
            return node_history(self._nodes[1], node, shown=limit)

    def filters(self, **values: str | None) -> dict | None:
        """The label filters as a ``where`` mapping; an unknown value is a tool error naming the allowed ones."""
        tax = self.taxonomy
        allowed = {"root_cause": tax.cause_ids, "symptom": tax.symptom_ids,
                   "dimension": [d.id for d in tax.dimensions], "mitigation": tax.mitigation_ids}
        where = {}
        for name, value in values.items():
            if value is None:
                continue
            if value not in allowed[name]:
                shown = redact(value)[:80]
                raise ToolError(f"unknown {name} {shown!r}; allowed: {', '.join(allowed[name])} "
                                f"(see the taxonomy tool)")
            where[name] = value
        return where or None


def tool_ticket(ticket_id: str, title: str, description: str, log: str) -> Ticket:
    """A tool's ticket; an empty one is a tool error."""
    ticket = Ticket(id=ticket_id, title=title, description=description, log=log)
    if not ticket.text().strip():
        raise ToolError("the ticket is empty: give a title, a description or a log excerpt")
    return ticket


def caller(ctx: Context | None) -> str:
    """Who is calling: the client address over HTTP, "stdio" for the one stdio client."""
    request = getattr(ctx.request_context, "request", None) if ctx is not None else None
    client = getattr(request, "client", None)
    return client.host if client else "stdio"


def _logged(tool: str, call: Callable, outcome: Callable = lambda result: {}):
    """Run a tool body, log what it did without its text, and turn a crash into a plain tool error."""
    started = time.perf_counter()
    try:
        result = call()
    except ToolError:
        raise  # the SDK logs its message, which never quotes the ticket
    except Exception as exc:  # noqa: BLE001 - the message may quote the ticket: log it redacted only
        log.error("%s failed: %s: %s", tool, type(exc).__name__, redact(str(exc))[:300])
        raise ToolError(f"{tool} failed ({type(exc).__name__}); the server log has the details") from None
    found = " ".join(f"{key}={value}" for key, value in outcome(result).items())
    log.info("%s answered in %.0f ms %s", tool, (time.perf_counter() - started) * 1000, found)
    return result


def build_server(settings: Settings, engine=None) -> tuple[MCPServer, KnowledgeTools]:
    """The MCP server with its tools over the knowledge base named by ``settings``."""
    tools = KnowledgeTools(settings, engine)

    @asynccontextmanager
    async def lifespan(_server: MCPServer):
        tools.start()  # once per process: stdio has one session, HTTP enters this once for all
        yield {}

    server = MCPServer("pmkb", title="pmkb: GPU-cluster incident knowledge base", instructions=INSTRUCTIONS,
                       version=_version(), lifespan=lifespan)

    @server.tool(annotations=READ_ONLY, structured_output=True)
    def suggest(
        title: Annotated[Text, Field(description="The ticket's title.", max_length=2_000)] = "",
        description: Annotated[Text, Field(description="The ticket's text as the reporter wrote it.")] = "",
        log: Annotated[Text, Field(description="Optional log excerpt (error lines, nvidia-smi, dmesg, "
                                               "scheduler output). The ranks' logs of a collective timeout "
                                               "(watchdog, NCCL_DEBUG, torchelastic lines) add a `collective` "
                                               "verdict: the ranks that never arrived and their node.")] = "",
        ticket_id: Annotated[Text, Field(description="Optional ticket key, echoed as the suggestion's id.",
                                         max_length=200)] = "ticket",
        ctx: Context = None,
    ) -> Suggestion:
        """Suggest the symptom, root cause, mitigations and similar past incidents for a new ticket.

        Returns the same Suggestion as `pmkb suggest --json`: labels are ids from the taxonomy, each
        with a calibrated confidence; `abstained: true` means the engine is not sure (the reason is in
        `abstain_reason`). Secrets and personal data in the text are redacted before it is used.
        """
        ticket, client = tool_ticket(ticket_id, title, description, log), caller(ctx)
        return _logged("suggest", lambda: tools.suggest(ticket, client),
                       lambda s: {"root_cause": s.root_cause, "abstained": s.abstained})

    @server.tool(annotations=READ_ONLY, structured_output=True)
    def search(
        query: Annotated[Text, Field(description="Ticket text or keywords, e.g. 'NCCL watchdog timeout after "
                                                 "InfiniBand port flap'.", min_length=1)],
        k: Annotated[int, Field(description="How many incidents to return.", ge=1, le=MAX_RESULTS)] = 5,
        root_cause: Annotated[Label, Field(description="Only incidents with this root-cause id "
                                                            "(see the taxonomy tool).")] = None,
        symptom: Annotated[Label, Field(description="Only incidents with this symptom id.")] = None,
        dimension: Annotated[Label, Field(description="Only incidents whose root cause is in this "
                                                           "dimension (hardware, platform or user).")] = None,
        mitigation: Annotated[Label, Field(description="Only incidents mitigated this way.")] = None,
        ctx: Context = None,
    ) -> SearchResult:
        """Find the past incidents most similar to a text (BM25 and dense similarity fused), with scores.

        Each incident carries its labels (symptom, root cause and its dimension, mitigation), its
        resolution and whether a person confirmed the labels (`provenance`).
        """
        if not query.strip():
            raise ToolError("the query is empty: give ticket text or keywords")
        client = caller(ctx)
        where = tools.filters(root_cause=root_cause, symptom=symptom, dimension=dimension, mitigation=mitigation)
        return _logged("search", lambda: SearchResult(incidents=tools.search(query, k, where, client)),
                       lambda r: {"hits": len(r.incidents), "filters": sorted(where or {})})

    @server.tool(annotations=READ_ONLY, structured_output=True)
    def node_history(
        node: Annotated[Text, Field(description="The node as tickets name it: gpu-a17, cn125, "
                                                "ip-10-0-3-17 ...", min_length=1, max_length=200)],
        limit: Annotated[int, Field(description="How many incidents to list, newest first.",
                                    ge=1, le=MAX_RESULTS)] = 20,
        ctx: Context = None,
    ) -> NodeHistory:
        """Earlier incidents of this cluster that name a node, newest first (like `pmkb node NODE --json`).

        A node that keeps turning up is one to drain and repair rather than exclude once more.
        `total` is 0 when no incident names it; the bundled seed reports never count.
        """
        name = node.strip()
        if not name:
            raise ToolError("the node name is empty")
        client = caller(ctx)
        return _logged("node_history",
                       lambda: tools.node_history(name, limit, client) or NodeHistory(node=name, total=0, incidents=[]),
                       lambda h: {"total": h.total})

    @server.tool(annotations=READ_ONLY, structured_output=True)
    def remediation_plan(
        scheduler: Annotated[Literal["slurm", "kubernetes"], Field(description="The cluster's scheduler.")],
        title: Annotated[Text, Field(description="The ticket's title.", max_length=2_000)] = "",
        description: Annotated[Text, Field(description="The ticket's text as the reporter wrote it.")] = "",
        log: Annotated[Text, Field(description="Optional log excerpt.")] = "",
        ticket_id: Annotated[Text, Field(description="The ticket's key, cited in the drain reason or taint.",
                                         max_length=200)] = "ticket",
        job: Annotated[Label, Field(description="The job to resubmit (Slurm: default the job id the ticket "
                                                "names; Kubernetes: the Job or PyTorchJob name).",
                                    max_length=253)] = None,
        namespace: Annotated[Text, Field(description="Kubernetes namespace of the job.", max_length=63)] = "default",
        kind: Annotated[Literal["Job", "PyTorchJob"], Field(description="Kubernetes: the job's kind.")] = "Job",
        ctx: Context = None,
    ) -> RemediationPlan:
        """The steps that take the ticket's suspect node out and resubmit its job without it, for Slurm
        (scontrol lines) or Kubernetes (calls of the official client), each with what it changes and
        how to undo it. Nothing runs: `pmkb remediate --apply` runs a plan when the team's policy
        allows. A tool error says why there is no plan (not retry-safe, no node named, not sure)."""
        ticket, client = tool_ticket(ticket_id, title, description, log), caller(ctx)

        def run() -> RemediationPlan:
            suggestion = tools.suggest(ticket, client)
            plan = plan_for(suggestion, scheduler, ticket.text(), job=job, namespace=namespace, kind=kind)
            if plan is None:
                raise ToolError(no_plan_reason(suggestion))
            return plan

        return _logged("remediation_plan", run, lambda p: {"node": p.node, "steps": len(p.steps)})

    @server.tool(annotations=READ_ONLY, structured_output=True)
    def taxonomy() -> Taxonomy:
        """The label space in use: symptoms, root causes (each with its dimension and default
        mitigations) and mitigations, with definitions. Its ids are the values `suggest` returns and
        `search` filters on."""
        return _logged("taxonomy", lambda: tools.taxonomy)

    return server, tools


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pmkb")
    except PackageNotFoundError:
        return ""


class BearerToken:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>`` (401 otherwise)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not same_secret(self.token, given.strip()):
                log.warning("401 for %s %s: missing or wrong bearer token", scope.get("method", ""),
                            scope.get("path", "")[:100])
                response = JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, settings: Settings, host: str):
    """The streamable HTTP app at ``MCP_PATH``, behind the bearer token (which must be configured)."""
    problem = token_problem(settings)
    if problem:
        raise ValueError(problem)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host,
                                     max_request_body_size=settings.max_request_bytes)
    app = BodyLimit(app, limit=settings.max_request_bytes, read_timeout=settings.request_read_timeout)
    app = ClientLimit(app, settings.max_calls_per_client, guards=lambda scope: scope["method"] == "POST")
    return BearerToken(app, settings.api_token.get_secret_value())


def configure_logging(level: int = logging.INFO) -> None:
    """Log lines on stderr, the SDK's and uvicorn's included (on stdio, stdout is the protocol's alone)."""
    logging.basicConfig(stream=sys.stderr, level=level, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def serve_stdio(settings: Settings) -> None:
    """Serve over stdin/stdout until the client closes them (nothing but protocol goes to stdout)."""
    server, _ = build_server(settings)
    server.run("stdio")


def serve_http(settings: Settings, host: str, port: int) -> None:
    """Serve streamable HTTP on host:port (pmkb.listener) until interrupted; the engine starts loading at once."""
    from pmkb.listener import serve_app

    server, tools = build_server(settings)
    app = http_app(server, settings, host)
    tools.start()
    serve_app(app, host, port, settings.header_timeout, settings.max_connections)
