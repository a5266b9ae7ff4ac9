"""``pmkb mcp``: the knowledge base as a Model Context Protocol server (stdio, or streamable HTTP)."""

from __future__ import annotations

from typing import Optional

import typer


def mcp(
    http: Optional[int] = typer.Option(None, "--http", metavar="PORT",
                                       help="Serve streamable HTTP on this port (at /mcp) instead of stdio; "
                                            "needs PMKB_API_TOKEN."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on with --http "
                                                         "(0.0.0.0: all interfaces)."),
    llm: Optional[str] = typer.Option(None, "--llm", help="LLM backend: none | llamacpp | openai "
                                      "(overrides PMKB_LLM)."),
) -> None:
    """Serve suggest, search, node_history and taxonomy to MCP clients (Claude Desktop, HolmesGPT, IDEs).

    stdio by default: the client starts `pmkb mcp` and speaks the protocol on its stdin and stdout.

    With --http PORT, clients connect to http://HOST:PORT/mcp with `Authorization: Bearer $PMKB_API_TOKEN`.

    Progress and logs go to stderr (docs/mcp.md).
    """
    from kb.engine import store_lock
    from pmkb.cli import check_llm, echo_err, fail, settings

    cfg = settings(llm=check_llm(llm))
    if http is not None:
        from pmkb.mcp_server import token_problem

        problem = token_problem(cfg)
        if problem:
            fail(problem)
    lock = None
    if not cfg.chroma_url:  # an embedded store in use elsewhere: say so now, not on the first call
        try:
            lock = store_lock.acquire(cfg.store_dir)
        except store_lock.StoreLocked as exc:
            fail(str(exc))
    from pmkb.mcp_server import MCP_PATH, configure_logging, serve_http, serve_stdio

    configure_logging()
    try:
        if http is None:
            echo_err(f"pmkb mcp on stdio (knowledge base {cfg.home})")
            serve_stdio(cfg)
        else:
            echo_err(f"pmkb mcp on http://{host}:{http}{MCP_PATH} (knowledge base {cfg.home})")
            serve_http(cfg, host, http)
    finally:
        if lock is not None:
            store_lock.release(lock)


def register(app: typer.Typer) -> None:
    """Add the ``mcp`` command to the CLI."""
    app.command()(mcp)
