"""``pmkb queue``: look at the webhook service's event queue and act on dead letters.

Works on the queue database of the knowledge base (``--kb``), also while ``pmkb serve`` runs:
the queue is SQLite in WAL mode, and a retried event is picked up by the running worker.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import List, Optional

import typer

queue_app = typer.Typer(no_args_is_help=True, help="Inspect the webhook event queue; retry or drop dead letters.")


def _open():
    from kb.tickets.queue import EventQueue
    from pmkb.cli import fail, settings
    from pmkb.server import QUEUE_FILE

    cfg = settings()
    path = cfg.home / QUEUE_FILE
    if not path.exists():
        fail(f"no event queue at {path}: `pmkb serve` creates it when it starts (check --kb or PMKB_HOME)")
    return EventQueue(path, max_attempts=cfg.queue_max_attempts, backoff=cfg.queue_backoff,
                      retry_budget=cfg.queue_retry_budget_hours * 3600), cfg


def _when(stamp: float | None) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if stamp else "-"


def _selection(ids: list[int] | None, all_dead: bool, verb: str) -> list[int] | None:
    from pmkb.cli import fail

    if bool(ids) == all_dead:
        fail(f"name the event ids to {verb}, or pass --all-dead (ids come from `pmkb queue list --status dead`)")
    return None if all_dead else ids


def _check_dead(queue, ids: list[int] | None) -> None:
    """Exit with an error naming every id that is not a dead-lettered event (nothing is changed)."""
    from pmkb.cli import fail

    problems = []
    for event_id in ids or []:
        event = queue.get(event_id)
        if event is None:
            problems.append(f"no event {event_id} in the queue")
        elif event.status != "dead":
            problems.append(f"event {event_id} is {event.status}, not dead")
    if problems:
        fail("; ".join(problems) + " (`pmkb queue list --status dead` lists the dead ones); nothing was changed")


@queue_app.command("list")
def list_events(
    status: Optional[str] = typer.Option(None, "--status", help="Only events in this status: queued, claimed, "
                                         "done, skipped or dead."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per event."),
) -> None:
    """Events in the queue, oldest first, with counts by status."""
    from kb.tickets.queue import STATUSES
    from pmkb.cli import echo_err, fail

    if status is not None and status not in STATUSES:
        fail(f"unknown status {status!r}; use one of: {', '.join(STATUSES)}")
    queue, _ = _open()
    events = queue.events(status)
    if as_json:
        for e in events:
            typer.echo(json.dumps({"id": e.id, "source": e.source, "ticket": e.ticket, "status": e.status,
                                   "attempts": e.attempts, "created_at": e.created_at, "finished_at": e.finished_at,
                                   "last_error": e.last_error, "result": e.result}, ensure_ascii=False))
        return
    echo_err(", ".join(f"{n} {s}" for s, n in queue.counts().items()))
    for e in events:
        detail = e.last_error or (e.result or {}).get("skipped") or (e.result or {}).get("comment") or ""
        typer.echo(f"{e.id:>6}  {e.status:<8} {e.source:<6} {e.ticket:<32} tries {e.attempts:<3} "
                   f"{_when(e.created_at)}  {str(detail)[:100]}")


@queue_app.command()
def retry(
    ids: Optional[List[int]] = typer.Argument(None, help="Dead event ids to retry."),
    all_dead: bool = typer.Option(False, "--all-dead", help="Retry every dead-lettered event."),
) -> None:
    """Give dead-lettered events a fresh set of attempts (after fixing what failed: token, outage)."""
    queue, _ = _open()
    selection = _selection(ids, all_dead, "retry")
    _check_dead(queue, selection)
    done = queue.retry_dead(selection)
    typer.echo(f"{done} event(s) queued again; a running `pmkb serve` picks them up within its poll interval")


@queue_app.command()
def drop(
    ids: Optional[List[int]] = typer.Argument(None, help="Dead event ids to delete."),
    all_dead: bool = typer.Option(False, "--all-dead", help="Delete every dead-lettered event."),
) -> None:
    """Delete dead-lettered events for good."""
    queue, _ = _open()
    selection = _selection(ids, all_dead, "drop")
    _check_dead(queue, selection)
    typer.echo(f"{queue.drop(selection)} dead event(s) deleted")


@queue_app.command()
def purge(
    older_than_days: Optional[float] = typer.Option(None, "--older-than-days", help="Age in days (default: the "
                                                    "queue_retention_days setting)."),
) -> None:
    """Delete done and skipped events now (the service also does this by itself, hourly)."""
    queue, cfg = _open()
    days = cfg.queue_retention_days if older_than_days is None else older_than_days
    typer.echo(f"{queue.purge(days * 86400)} finished event(s) older than {days:g} days deleted")


def register(app: typer.Typer) -> None:
    """Add the ``queue`` command group to the CLI."""
    app.add_typer(queue_app, name="queue")
