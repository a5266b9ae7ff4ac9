"""``pmkb serve``: the webhook service for GitHub and Jira, and the synchronous annotate API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all interfaces)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    dry_run: Optional[Path] = typer.Option(None, "--dry-run", metavar="OUTBOX.jsonl",
                                           help="Write intended labels and comments to this JSONL file "
                                                "instead of calling GitHub or Jira."),
    insecure_dev: bool = typer.Option(False, "--insecure-dev",
                                      help="Start without webhook secrets or API token (never in production)."),
) -> None:
    """Serve webhooks (POST /webhooks/github, /webhooks/jira) and POST /v1/annotate."""
    from kb.engine import store_lock
    from pmkb.cli import echo_err, fail, settings
    from pmkb.local_service import announce, withdraw
    from pmkb.server import QUEUE_FILE, startup_problems
    from pmkb.server import serve as run_server

    cfg = settings(writeback_outbox=dry_run)
    problems = startup_problems(cfg, insecure_dev)
    if problems:
        for line in problems[:-1]:
            echo_err(f"error: {line}")
        fail(problems[-1])
    if insecure_dev:
        echo_err("warning: --insecure-dev: endpoints without a secret accept unauthenticated requests")
    lock = None
    if not cfg.chroma_url:  # an embedded store in use elsewhere: say so now rather than stay unready
        try:
            lock = store_lock.acquire(cfg.store_dir)
        except store_lock.StoreLocked as exc:
            fail(str(exc))
    echo_err(f"pmkb serve on http://{host}:{port} (queue {cfg.home / QUEUE_FILE}"
             + (f", dry run to {cfg.writeback_outbox})" if cfg.writeback_outbox else ")"))
    announce(cfg, host, port)  # so `pmkb suggest` asks this service instead of loading everything again
    try:
        run_server(cfg, host, port, insecure_dev)
    finally:
        withdraw(cfg)
        if lock is not None:
            store_lock.release(lock)


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the CLI."""
    app.command()(serve)
