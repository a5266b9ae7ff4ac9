"""The ``pmkb`` command line: parses arguments, calls kb/, renders the result."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from pmkb.options import add_shared_options, shared_options, state

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="pmkb: postmortem knowledge base and triage assistant for GPU clusters.")
_OPTIONS = shared_options()


@app.callback()
def main_options(
    kb: Optional[Path] = _OPTIONS["kb"],
    config: Optional[Path] = _OPTIONS["config"],
    taxonomy: Optional[Path] = _OPTIONS["taxonomy"],
) -> None:
    """Global options (every command takes them after its name too)."""
    # Everything pmkb writes (store, queue, caches, outputs) may hold ticket text: owner only.
    os.umask(0o077)
    state.kb, state.config, state.taxonomy = kb, config, taxonomy


def settings(**overrides):
    """Settings from defaults, config file, environment and the global options."""
    from kb.core.settings import load_settings

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


def open_kb(build: bool = True, read_only: bool = False, **overrides):
    """Open the knowledge base; build it from the bundled data when empty.

    ``read_only``: for a command that only reads, which then reads the embedded store's current copy
    when there is one (no chromadb, no lock), and else leaves one for the next such command.
    """
    from kb.core.taxonomy import TaxonomyError
    from kb.engine.knowledge import KnowledgeBase
    from kb.engine.store import StoreModelMismatch
    from kb.engine.store_lock import StoreLocked

    knowledge = KnowledgeBase(settings(**overrides), read_only=read_only)
    try:
        knowledge.taxonomy
        if build:
            knowledge.ensure_built(log=echo_err)
        else:
            knowledge.store
    except (TaxonomyError, StoreModelMismatch, StoreLocked, ValueError) as exc:
        fail(str(exc))
    if read_only:
        knowledge.save_replica()
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
    from kb.engine.knowledge import dump_json

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
    from kb.engine.knowledge import dump_json
    from kb.engine.search import Retriever

    knowledge = open_kb(read_only=True)
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
def node(
    name: str = typer.Argument(..., help="The node as tickets name it (gpu-a17, cn125, ip-10-0-3-17 ...)."),
    limit: int = typer.Option(20, "-n", help="How many incidents to list, newest first."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Earlier incidents of this cluster that name a node (the bundled seed reports never count)."""
    from kb.engine.history import node_history, node_index
    from kb.engine.knowledge import dump_json

    history = node_history(node_index(open_kb(build=False, read_only=True).store.incidents()), name, shown=limit)
    if json_out:
        typer.echo(dump_json(history.model_dump(mode="json") if history else None))
        return
    if history is None:
        typer.echo(f"no incident in this knowledge base names {name} (bundled seed reports are not counted)")
        return
    typer.echo(f"{name}: {history.total} earlier incident{'s' if history.total > 1 else ''}"
               + (f", the latest {len(history.incidents)}:" if len(history.incidents) < history.total else ":"))
    for item in history.incidents:
        when = f"{item.created_at:%Y-%m-%d}" if item.created_at else "undated   "
        typer.echo(f"  {when}  {item.id}: {item.title}  ({item.root_cause or 'unlabelled'}"
                   f" -> {item.mitigation or '-'}, {item.provenance})")


@app.command()
def taxonomy(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the taxonomy in use: symptoms, root causes by dimension, mitigations."""
    from kb.core.taxonomy import TaxonomyError, load_taxonomy
    from kb.engine.knowledge import dump_json

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
    from kb.engine.knowledge import dump_json

    data = open_kb(read_only=True).stats()
    if json_out:
        typer.echo(dump_json(data))
        return
    typer.echo(f"{data['incidents']} incidents in {data['location']} (model {data['embedding_model']})")
    for key in ("dimension", "symptom", "root_cause", "provenance"):
        typer.echo(f"\nby {key}:")
        for label, count in data[key].items():
            typer.echo(f"  {label:32} {count:5}")


def open_engine(read_only: bool = False, **overrides):
    """The suggestion engine over the (built) knowledge base (``read_only``: see ``open_kb``)."""
    from kb.engine.suggest import SuggestionEngine

    engine = SuggestionEngine(open_kb(read_only=read_only, **overrides))
    engine.load_calibration(on_fit=lambda: echo_err("fitting the classifier on the knowledge base (once) ..."))
    return engine


def read_ticket_text(text: Optional[str], file: Optional[Path], title: str) -> str:
    """The ticket text from the argument or --file; exits with a clear error when there is none."""
    if file is not None:
        from kb.core.records import read_text

        try:
            text, warning = read_text(file)
        except OSError as exc:
            fail(f"cannot read {file}: {exc}")
        if warning:
            echo_err(f"warning: {file}: {warning}")
    if not (text or title):
        fail("give the ticket text as an argument, or --file F")
    return text or ""


def check_llm(llm: Optional[str]) -> Optional[str]:
    """Validate a --llm value against the backends."""
    from kb.llm.backends import GENERATORS

    if llm is not None and llm not in GENERATORS:
        fail(f"LLM backend {llm!r} is not supported. Available: {', '.join(GENERATORS)}")
    return llm


def render_card(s) -> str:
    """A readable suggestion card for the terminal."""
    from kb.core.abstain import TOO_LITTLE_ADVICE, TOO_LITTLE_TEXT

    lines = []
    verdict = "NOT SURE" if s.abstained else "root cause"
    lines.append(f"{verdict}: {s.root_cause} ({s.root_cause_name}) [{s.root_cause_dimension}] "
                 f"{s.root_cause_confidence:.0%}")
    if s.abstain_reason == TOO_LITTLE_TEXT:
        lines.append(f"  {TOO_LITTLE_ADVICE}")
    if len(s.root_cause_set) > 1:
        lines.append(f"  one of these {len(s.root_cause_set)} causes ({s.set_level:.0%}): "
                     + ", ".join(f"{m.id} [{m.dimension}] {m.confidence:.0%}" for m in s.root_cause_set))
    else:
        others = ", ".join(f"{c.id} {c.confidence:.0%}" for c in s.root_cause_candidates[1:3])
        lines.append(f"  next candidates: {others}" + (f"  (alone in the {s.set_level:.0%} prediction set)"
                                                        if s.root_cause_set else ""))
    if s.close_call and s.close_call.answered:
        lines.append(f"  answered: {s.close_call.question}")
        lines.append(f"    -> {s.close_call.answered}: {s.close_call.answers[s.close_call.answered]}")
    elif s.close_call:
        first, second = s.close_call.causes
        lines.append(f"  to decide: {s.close_call.question}")
        lines += [f"    {c}: {s.close_call.answers[c]}" for c in (first, second)]
        if s.close_call.ticket_says:
            lines.append(f'    the ticket says "{s.close_call.ticket_says.span}", which points to '
                         f"{s.close_call.ticket_points_to} (check it)")
    if s.owner:
        lines.append(s.owner.describe())
    lines += [r.describe() for r in s.readings]
    if s.collective:
        lines.append(s.collective.describe())
        lines += [f"  {line}" for line in s.collective.evidence[:4]]
    lines.append(f"symptom: {s.symptom} {s.symptom_confidence:.0%}")
    lines.append(f"retry safe: {'yes' if s.retry_safe else 'no'}"
                 + (f"   suspect: {', '.join(f'{k} {v}' for k, v in s.suspect.items())}" if s.suspect else ""))
    if s.node_history:
        lines.append(f"seen before: {s.node_history.summary()}")
    if s.remediation:
        plan = s.remediation
        lines.append(f"remediation plan ({plan.scheduler}; `pmkb remediate` runs it, dry run first):")
        lines += [f"  {n}. {step.summary}\n     $ {step.shown()}" for n, step in enumerate(plan.steps, 1)]
        if plan.note:
            lines.append(f"  note: {plan.note}")
    if s.evidence:
        lines.append("evidence:")
        lines += [f"  - [{e.signal}] {e.text}  -> {e.points_to}: {e.explanation}" for e in s.evidence[:6]]
    lines.append("mitigations:")
    lines += [f"  {n}. {m.id} ({m.confidence:.0%}): {m.next_step}" for n, m in enumerate(s.mitigations, 1)]
    if s.low_gpu_utilisation:
        lines.append("low GPU utilisation checks:")
        lines += [f"  - {h.name}: {h.fix}" for h in s.low_gpu_utilisation]
    lines.append("similar incidents:")
    lines += [f"  [{h.score:.2f}] {h.id}: {h.title} ({h.root_cause})" for h in s.similar_incidents]
    return "\n".join(lines)


@app.command()
def suggest(
    text: Optional[str] = typer.Argument(None, help="Ticket text (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the ticket text from a file."),
    title: str = typer.Option("", "--title", help="Ticket title."),
    json_out: bool = typer.Option(False, "--json", help="Print the Suggestion as JSON."),
    llm: Optional[str] = typer.Option(None, "--llm", help="LLM backend: none | llamacpp | openai "
                                      "(overrides PMKB_LLM)."),
    logs: Optional[list[Path]] = typer.Option(None, "--logs", help="The failed job's logs (files per rank, a "
                                              "directory or a tarball; repeat the option): a collective "
                                              "timeout in them is traced to its ranks and node."),
    local: bool = typer.Option(False, "--local", help="Answer in this process even when a pmkb serve on "
                                                     "this knowledge base is running (by default it is asked)."),
) -> None:
    """Suggest symptom, root cause, mitigation and similar incidents for one ticket."""
    from kb.core.rank_logs import RankLogError, read_sources, sources_as_text
    from kb.core.suggestion import EmptyTicket, Ticket

    text = read_ticket_text(text, file, title)
    try:
        log = sources_as_text(read_sources(logs)) if logs else ""
    except RankLogError as exc:
        fail(str(exc))
    ticket = Ticket(title=title, description=text, log=log)
    result = None
    if not local and llm is None:
        from pmkb.local_service import ServiceRefused, ask

        try:
            result = ask(settings(), ticket)
        except ServiceRefused as exc:
            echo_err(f"note: {exc}; answering here")
    if result is None:
        from kb.llm.suggester import make_suggester

        suggester = make_suggester(open_engine(read_only=True, llm=check_llm(llm)))
        try:
            result = suggester.suggest(ticket)
        except EmptyTicket as exc:
            fail(str(exc))
    typer.echo(result.model_dump_json(indent=2) if json_out else render_card(result))


@app.command()
def annotate(
    input: Path = typer.Argument(..., help="JSONL with id, title, description (labels are never read)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL: one suggestion per input record."),
    llm: Optional[str] = typer.Option(None, "--llm", help="LLM backend: none | llamacpp | openai "
                                      "(overrides PMKB_LLM)."),
) -> None:
    """Annotate a JSONL file of tickets."""
    from tqdm import tqdm

    from kb.jobs.annotate import annotate_file
    from kb.llm.suggester import make_suggester

    if not input.exists():
        fail(f"no such file: {input}")
    suggester = make_suggester(open_engine(llm=check_llm(llm)))
    total = sum(1 for line in input.open("rb") if line.strip())
    with tqdm(total=total, unit="ticket", desc="annotate", file=sys.stderr) as bar:
        errors = annotate_file(suggester, input, out, progress=bar.update)
    for line in errors:
        echo_err(f"error: {line}")
    typer.echo(f"wrote {total - len(errors)} annotations to {out}" + (f"; {len(errors)} failed" if errors else ""))
    if errors:
        raise typer.Exit(1)


@app.command(name="eval")
def eval_cmd(
    labelled: Path = typer.Argument(..., help="Labelled JSONL (id, title, description, root_cause, ...)."),
    kfold: int = typer.Option(0, "--kfold", help="Also run k-fold: other folds join the knowledge base."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write all figures as JSON here."),
    llm: Optional[str] = typer.Option(None, "--llm", help="LLM backend: none | llamacpp | openai "
                                      "(overrides PMKB_LLM)."),
    levers: bool = typer.Option(False, "--levers", help="Also rerun with the readings off and against the "
                                "written or public bundled reports alone (fits two knowledge bases: minutes)."),
) -> None:
    """Evaluate the engine on labelled tickets, with baselines, against the knowledge base.

    With --llm, the same tickets also go through the LLM-assisted suggester and both sets of
    figures (and latencies) are printed side by side. With --levers, a table shows what the
    readings and each kind of bundled report add.
    """
    from tqdm import tqdm

    from kb.engine.knowledge import dump_json
    from kb.jobs.evaluate import evaluate, evaluate_kfold, format_report, load_cases

    try:
        cases = load_cases(labelled)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    engine = open_engine(llm=check_llm(llm))
    with tqdm(total=len(cases), unit="ticket", desc="eval", file=sys.stderr) as bar:
        result = evaluate(engine, cases, progress=bar.update)
    if levers:
        from kb.jobs.evaluate import fill_dimensions
        from kb.jobs.owner_eval import levers as lever_table

        filled = fill_dimensions(cases, engine.kb.taxonomy)
        echo_err("levers: the readings off, then knowledge bases of the written and of the public reports "
                 "(each built and fitted: several minutes) ...")
        result["levers"] = lever_table(engine, filled, lambda e: [e.suggest(c.ticket) for c in filled], result)
    typer.echo(format_report(result, f"{labelled.name} against the knowledge base "
                                     f"({engine.kb.store.count()} incidents)"))
    results = {"knowledge_base": result}
    if engine.settings.llm != "none":
        from kb.jobs.evaluate import format_side_by_side
        from kb.llm.suggester import make_suggester

        with tqdm(total=len(cases), unit="ticket", desc=f"eval --llm {engine.settings.llm}",
                  file=sys.stderr) as bar:
            results["with_llm"] = evaluate(engine, cases, progress=bar.update,
                                           suggester=make_suggester(engine))
        typer.echo("")
        typer.echo(format_side_by_side(result, results["with_llm"], engine.settings.llm))
    if kfold > 1:
        with tqdm(total=len(cases), unit="ticket", desc=f"{kfold}-fold", file=sys.stderr) as bar:
            results["kfold"] = evaluate_kfold(engine.kb, cases, folds=kfold, progress=bar.update)
        typer.echo("")
        typer.echo(format_report(results["kfold"], f"{labelled.name}, {kfold}-fold (other folds join "
                                                   "the knowledge base)"))
    if json_out:
        json_out.write_text(dump_json(results))


@app.command()
def calibrate(
    out: Optional[Path] = typer.Option(None, "--out", help="Write the weights here instead of the "
                                       "knowledge base (e.g. data/calibration/ for the weights shipped with pmkb)."),
    sets_only: bool = typer.Option(False, "--sets-only", help="Refit only the prediction sets, keeping "
                                   "the classifier weights in use."),
) -> None:
    """Refit the classifier weights and the prediction sets on the knowledge base (after adding many
    incidents, or confirming many suggestions)."""
    from kb.core.files import per_model_file
    from kb.engine.crossval import format_left_out
    from kb.engine.suggest import SuggestionEngine

    engine = SuggestionEngine(open_kb())
    echo_err("scoring every labelled incident as an unseen ticket (a few minutes) ...")
    cal = engine.fit_sets() if sets_only else engine.fit_calibration(save=out is None)
    if out is not None or sets_only:
        path = engine.calibration_path if out is None else per_model_file(out, engine.kb.embedder.model_id, ".json")
        cal.save(path)
        echo_err(f"weights written to {path}")
    sets = cal.root_cause_set
    typer.echo(f"fitted on {cal.fitted_on}: log loss {cal.log_loss}; prediction sets on {cal.sets_fitted_on}: "
               f"cause set threshold at {1 - engine.settings.set_alpha:.0%}: "
               f"{sets.threshold(engine.settings.set_alpha) if sets else 'none'}")
    if cal.left_out is not None and not sets_only:
        typer.echo("\n" + format_left_out(cal.left_out))


@app.command()
def build() -> None:
    """Build the knowledge base from the bundled incident reports if it is empty.

    Also gets what the first suggestion needs ready: the fitted text classifiers and the ONNX export
    of the embedding model, so a new process answers without torch or scikit-learn."""
    from kb.engine.suggest import SuggestionEngine

    knowledge = open_kb()
    SuggestionEngine(knowledge).snapshot()  # fits and caches the text classifiers when they are stale
    knowledge.save_replica()
    prepare = getattr(knowledge.embedder, "prepare_fast_queries", None)
    if prepare is not None and not prepare():
        typer.echo("note: queries are embedded with torch (no ONNX export of the model could be made)", err=True)
    typer.echo(f"knowledge base ready: {knowledge.store.count()} incidents in {knowledge.store.location}")


COMMAND_MODULES = ("pmkb.serve_cmd", "pmkb.queue_cmd", "pmkb.backfill_cmd", "pmkb.llm_cmd", "pmkb.mcp_cmd",
                   "pmkb.remediate_cmd", "pmkb.nccl_cmd")
"""Modules that add commands to the app through a ``register(app)`` function."""


def _register_commands() -> None:
    import importlib
    import importlib.util

    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(app)


_register_commands()
add_shared_options(app)


def main() -> None:
    """Console-script entry point."""
    from kb.engine.store_lock import StoreLocked
    from pmkb.extras import missing_extra_hint

    try:
        app()
    except StoreLocked as exc:  # a command that opened the store outside open_kb
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a library of an optional install (pmkb[serve], ...)
        hint = missing_extra_hint(exc)
        if hint is None:
            raise
        typer.echo(f"error: {hint}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
