"""``pmkb backfill``: annotate many old tickets, resumably (a thin shell over kb.jobs.backfill)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

EXIT_FAILED_RECORDS = 1
EXIT_STOPPED = 3


def backfill(
    inputs: list[Path] = typer.Argument(..., help="JSONL, JSON, CSV (Jira export), Markdown folders or "
                                        "GitHub issue exports."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL: one annotation per input id."),
    write_back: Optional[str] = typer.Option(None, "--write-back", help="Also write results to: kb (as "
                                             "machine-suggested incidents), github or jira."),
    dry_run: Optional[Path] = typer.Option(None, "--dry-run", help="With --write-back github|jira: append "
                                           "the intended calls to this OUTBOX.jsonl instead of making them."),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Threads for the LLM stage and "
                                    "ticket-system write-back."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Tickets embedded together."),
    max_errors: int = typer.Option(1000, "--max-errors", help="Stop when more records than this fail "
                                   "(-1: never stop)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Report path (default OUT.report.md; "
                                          "PNG plots beside it)."),
    no_report: bool = typer.Option(False, "--no-report", help="Do not write the report."),
    csv_map: list[str] = typer.Option([], "--csv-map", help="CSV column mapping, field=Column (repeatable)."),
) -> None:
    """Annotate old tickets in bulk: resumable, skips unchanged records, caps errors, writes a report.

    Killed or stopped, run the same command again: it continues where it stopped.
    """
    from tqdm import tqdm

    from ingest import IngestWarning, read_paths
    from ingest.csv_export import parse_mapping
    from kb.jobs.backfill import (
        BackfillError,
        BackfillOptions,
        backfill_engine,
        run_backfill,
        sidecar,
    )
    from pmkb.cli import echo_err, fail, open_kb

    missing = [str(p) for p in inputs if not p.exists()]
    if missing:
        fail(f"no such file or folder: {', '.join(missing)}")
    try:
        mapping = parse_mapping(csv_map)
    except ValueError as exc:
        fail(str(exc))
    options = BackfillOptions(out=out, batch_size=batch_size, concurrency=concurrency,
                              max_errors=None if max_errors < 0 else max_errors, write_back=write_back,
                              outbox=dry_run)
    report_path = None if no_report else (report or sidecar(out, "report.md"))
    knowledge = open_kb()
    from kb.engine.suggest import SuggestionEngine

    if not SuggestionEngine(knowledge).calibration_path.exists():
        echo_err("fitting the classifier on the knowledge base (once) ...")
    engine = backfill_engine(knowledge)
    suggester = build_suggester(engine)
    # A quick first pass counts the records (good or bad), for the progress bar.
    total = sum(1 for item in read_paths(inputs, mapping or None) if not isinstance(item, IngestWarning))
    with tqdm(total=total, unit="ticket", desc="backfill", file=sys.stderr,
              smoothing=0.05, mininterval=0.5) as bar:
        try:
            result = run_backfill(engine, read_paths(inputs, mapping or None), options, suggester,
                                  report=report_path, log=lambda line: bar.write(line, file=sys.stderr),
                                  progress=bar.update)
        except BackfillError as exc:
            fail(str(exc))
    rate = result.annotated / result.seconds if result.seconds else 0.0
    typer.echo(f"annotated {result.annotated}, unchanged {result.skipped}, failed {result.failed}"
               + (f", written back {result.written_back}" if write_back else "")
               + f" in {result.seconds:.0f}s ({rate:.1f} tickets/s); LLM: {result.llm}")
    typer.echo(f"{result.in_output} records in {out}"
               + (f"; errors in {options.errors_path()}" if result.failed else "")
               + (f"; report {report_path}" if report_path else ""))
    if result.stopped:
        echo_err(f"error: {result.stopped}")
        raise typer.Exit(EXIT_STOPPED)
    if result.failed:
        echo_err(f"{result.failed} record(s) failed: see {options.errors_path()}; fix them and re-run "
                 "(finished records are skipped)")
        raise typer.Exit(EXIT_FAILED_RECORDS)


def build_suggester(engine):
    """The suggester of every shell over this engine; a model that cannot be set up stops the run."""
    from kb.llm.suggester import make_suggester
    from pmkb.cli import fail

    try:
        return make_suggester(engine)
    except ModuleNotFoundError:  # a library of an extra: pmkb's main names the extra to install
        raise
    except Exception as exc:  # noqa: BLE001 - any set-up failure is reported the same way
        fail(f"the LLM stage ({engine.settings.llm}) cannot start: {exc}. Fix the LLM settings, or run "
             "with PMKB_LLM=none")


def register(app: typer.Typer) -> None:
    """Add ``backfill`` to the pmkb command line."""
    app.command(name="backfill")(backfill)
