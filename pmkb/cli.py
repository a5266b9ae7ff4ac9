"""The ``pmkb`` command line: parses arguments, calls kb/, renders the result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="pmkb: postmortem knowledge base and triage assistant for GPU clusters.")


class State:
    """Options shared by every command."""

    kb: Optional[Path] = None
    config: Optional[Path] = None
    taxonomy: Optional[Path] = None


state = State()


@app.callback()
def main_options(
    kb: Optional[Path] = typer.Option(None, "--kb", help="Knowledge-base directory (default: $PMKB_HOME "
                                      "or ~/.local/share/pmkb)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML settings file (or $PMKB_CONFIG)."),
    taxonomy: Optional[Path] = typer.Option(None, "--taxonomy", help="Taxonomy YAML to use instead of "
                                            "the bundled one."),
) -> None:
    """Global options."""
    state.kb, state.config, state.taxonomy = kb, config, taxonomy


def settings(**overrides):
    """Settings from defaults, config file, environment and the global options."""
    from kb.settings import load_settings

    try:
        return load_settings(state.config, home=state.kb, taxonomy=state.taxonomy, **overrides)
    except ValueError as exc:
        fail(str(exc))


def fail(message: str, code: int = 2):
    """Print an error on stderr and exit."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def echo_err(message: str) -> None:
    """A status line on stderr (stdout stays clean for --json)."""
    typer.echo(message, err=True)


def open_kb(build: bool = True, **overrides):
    """Open the knowledge base; build it from the bundled data when empty."""
    from kb.knowledge import KnowledgeBase
    from kb.store import StoreModelMismatch
    from kb.taxonomy import TaxonomyError

    knowledge = KnowledgeBase(settings(**overrides))
    try:
        knowledge.taxonomy
        if build:
            knowledge.ensure_built(log=echo_err)
        else:
            knowledge.store
    except (TaxonomyError, StoreModelMismatch, ValueError) as exc:
        fail(str(exc))
    return knowledge


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="JSONL, JSON, CSV, Markdown folders or GitHub exports."),
    strict: bool = typer.Option(False, "--strict", help="Any bad record is fatal and nothing is written."),
    csv_map: list[str] = typer.Option([], "--csv-map", help="CSV column mapping, field=Column (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Read incident reports into the knowledge base (idempotent: unchanged records are skipped)."""
    from tqdm import tqdm

    from ingest import IngestError, IngestWarning, read_paths
    from ingest.csv_export import parse_mapping
    from kb.knowledge import dump_json

    try:
        mapping = parse_mapping(csv_map)
    except ValueError as exc:
        fail(str(exc))
    knowledge = open_kb(build=False)
    incidents, errors = [], []
    for item in read_paths(paths, mapping):
        if isinstance(item, IngestWarning):
            echo_err(f"warning: {item}")
        elif isinstance(item, IngestError):
            errors.append(str(item))
        else:
            incidents.append(item)
    if strict:
        _, label_errors = knowledge.prepare(incidents)
        if errors or label_errors:
            for line in errors + label_errors:
                echo_err(f"error: {line}")
            fail(f"--strict: {len(errors) + len(label_errors)} bad record(s); nothing was written", code=1)
    if not knowledge.store.taxonomy_entries():
        knowledge.sync_taxonomy()
    with tqdm(total=len(incidents), unit="incident", desc="ingest", file=sys.stderr,
              disable=len(incidents) < 200) as bar:
        report = knowledge.add_incidents(incidents, progress=bar.update)
    read = len(incidents) + len(errors)
    errors = errors + report.errors
    summary = {"read": read, "added": report.added,
               "updated": report.updated, "unchanged": report.unchanged, "failed": len(errors),
               "errors": errors, "kb": str(knowledge.store.location)}
    if json_out:
        typer.echo(dump_json(summary))
    else:
        for line in errors:
            echo_err(f"error: {line}")
        typer.echo(f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
                   f"failed {len(errors)} -> {knowledge.store.location}")
    if errors:
        echo_err("some records were skipped; fix them and re-run (unchanged records are not re-added)")
        raise typer.Exit(1)


@app.command()
def search(
    query: str = typer.Argument(..., help="Ticket text or keywords."),
    k: int = typer.Option(5, "-k", help="How many incidents."),
    root_cause: Optional[str] = typer.Option(None, "--root-cause", help="Only incidents with this cause."),
    symptom: Optional[str] = typer.Option(None, "--symptom", help="Only incidents with this symptom."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Nearest past incidents to a query, with scores (hybrid BM25 + dense)."""
    from kb.knowledge import dump_json
    from kb.search import Retriever

    knowledge = open_kb()
    where = {k_: v for k_, v in (("root_cause", root_cause), ("symptom", symptom)) if v}
    hits = Retriever(knowledge).retrieve_similar(query, k=k, where=where or None)
    if json_out:
        typer.echo(dump_json([h.model_dump() for h in hits]))
        return
    if not hits:
        typer.echo("no incidents found")
    for rank, hit in enumerate(hits, 1):
        typer.echo(f"{rank}. [{hit.score:.3f}] {hit.id}: {hit.title}")
        typer.echo(f"   {hit.symptom or '-'} / {hit.root_cause or '-'} ({hit.root_cause_dimension or '-'})"
                   f" -> {hit.mitigation or '-'}")


@app.command()
def taxonomy(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the taxonomy in use: symptoms, root causes by dimension, mitigations."""
    from kb.knowledge import dump_json
    from kb.taxonomy import TaxonomyError, load_taxonomy

    cfg = settings()
    try:
        tax = load_taxonomy(cfg.taxonomy)
    except TaxonomyError as exc:
        fail(str(exc))
    if json_out:
        typer.echo(dump_json(tax.model_dump()))
        return
    typer.echo(f"taxonomy {tax.name} ({cfg.taxonomy})")
    typer.echo("\nsymptoms:")
    for s in tax.symptoms:
        typer.echo(f"  {s.id:26} {s.name}")
    for dim in tax.dimensions:
        share = f" ({dim.share:.2%} in {dim.source})" if dim.share else ""
        typer.echo(f"\n{dim.id}{share}:")
        for c in tax.root_causes:
            if c.dimension == dim.id:
                typer.echo(f"  {c.id:32} {c.name}  -> {', '.join(c.default_mitigations)}")
    typer.echo("\nmitigations:")
    for m in tax.mitigations:
        typer.echo(f"  {m.id:24} {m.name}")


@app.command()
def stats(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Counts of stored incidents by symptom, root cause, dimension and provenance."""
    from kb.knowledge import dump_json

    data = open_kb().stats()
    if json_out:
        typer.echo(dump_json(data))
        return
    typer.echo(f"{data['incidents']} incidents in {data['location']} (model {data['embedding_model']})")
    for key in ("dimension", "symptom", "root_cause", "provenance"):
        typer.echo(f"\nby {key}:")
        for label, count in data[key].items():
            typer.echo(f"  {label:32} {count:5}")


@app.command()
def build() -> None:
    """Build the knowledge base from the bundled incident reports if it is empty."""
    knowledge = open_kb()
    typer.echo(f"knowledge base ready: {knowledge.store.count()} incidents in {knowledge.store.location}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
