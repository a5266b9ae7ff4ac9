"""Backfill: annotate many old tickets in batches, resumably, with capped errors.

A SQLite state file beside the output (``OUT.state.sqlite3``) holds one row per record id: its
content hash, status and the exact line written to the output. A batch's rows commit before its
lines are appended to the output, and every run starts by rewriting the output from the state
table; so however the previous run ended (kill -9 included), the output holds each id once.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from kb import __version__
from kb.core.incidents import Incident, Provenance
from kb.core.records import IngestError, IngestWarning, Parsed
from kb.core.redact import redact, redact_key
from kb.core.roles import Suggester
from kb.core.suggestion import EmptyTicket, Suggestion
from kb.engine.classify import Calibration
from kb.engine.knowledge import KnowledgeBase
from kb.engine.search import VotingRetriever
from kb.engine.suggest import PreparedTicket, SuggestionEngine
from kb.jobs.annotate import annotation_record
from kb.jobs.backfill_state import BackfillError, BackfillState, rewrite_output  # noqa: F401 - re-exported
from kb.jobs.collective_counts import incident_item

WRITE_BACK_TARGETS = ("kb", "github", "jira")
ACTIONS = {
    "input": "fix or remove this record in the input, then re-run (finished records are skipped)",
    "empty": "give the ticket a title or description, or remove it from the input, then re-run",
    "duplicate": "ids must be unique across the inputs: this record was not annotated; rename or drop it",
    "annotate": "re-run to retry this record; if it fails again, report it with the record",
    "llm": "check the LLM server (PMKB_LLM_BASE_URL) and re-run: the record is retried",
    "write_back": "check the ticket key, token and URL (or use --dry-run), or after a rate limit wait the time it "
                  "names, and re-run: the record is retried",
}
"""What to do next, by the stage where a record failed."""

Log = Callable[[str], None]


def sidecar(out: Path, suffix: str) -> Path:
    """A file beside the output: ``x.jsonl`` -> ``x.<suffix>``."""
    return out.with_name(f"{out.stem if out.suffix else out.name}.{suffix}")


@dataclass
class BackfillOptions:
    """How to run a backfill."""

    out: Path  # output JSONL: one annotation record per input id
    batch_size: int = 64  # tickets embedded together
    concurrency: int = 4  # threads for the LLM stage and ticket-system write-back
    max_errors: int | None = 1000  # more failed records than this stops the run
    write_back: str | None = None  # kb | github | jira
    outbox: Path | None = None  # dry run of github/jira write-back: the calls go here

    def state_path(self) -> Path:
        """Where the state file lives: OUT.state.sqlite3."""
        return sidecar(self.out, "state.sqlite3")

    def errors_path(self) -> Path:
        """Where failed records are listed: OUT.errors.jsonl."""
        return sidecar(self.out, "errors.jsonl")


@dataclass
class BackfillResult:
    """What one run did."""

    read: int = 0  # input records (good or bad)
    annotated: int = 0  # annotated in this run
    skipped: int = 0  # unchanged since an earlier run (same content hash)
    failed: int = 0  # records listed in the errors file
    written_back: int = 0
    in_output: int = 0  # lines in the output after the run
    llm: str = "none"  # LLM stage used, or why it was skipped
    stopped: str | None = None  # why the run stopped early, if it did
    seconds: float = 0.0


def backfill_engine(kb: KnowledgeBase, calibration: Calibration | None = None) -> SuggestionEngine:
    """An engine for a batch run: it retrieves the voting incidents as they were at the start.

    The run's own machine-suggested additions never vote, so reloading the corpus after each
    written-back batch would only cost time. ``calibration``: weights to use instead of the
    knowledge base's fitted ones.
    """
    engine = SuggestionEngine(kb, retriever=VotingRetriever(kb, pinned=True), calibration=calibration)
    engine.retriever.refresh()  # loaded now, not raced for by the embedding thread
    engine.calibration
    return engine


def llm_note(suggester: Suggester) -> str:
    """The LLM stage in a few words (``backend:model``, or ``none``), from the suggester's description."""
    llm = suggester.describe().get("llm")
    return f"{llm['backend']}:{llm['model']}" if llm else "none"


@dataclass
class _Record:
    """One ticket on its way through the pipeline."""

    incident: Incident
    digest: str  # content hash of the input record
    in_output: bool  # an earlier annotation of it is in the output already
    prepared: PreparedTicket | None = None
    suggestion: Suggestion | None = None

    def row(self, engine_id: str, line: str | None = None, target: str | None = None,
            error: str | None = None) -> tuple:
        """Its state row: done with its output line, or failed with the error."""
        return (self.incident.id, self.digest, engine_id, "failed" if error else "done", line, target, error)


@dataclass
class _Batch:
    """Records annotated together (one embedding call)."""

    records: list[_Record] = field(default_factory=list)
    failed: list[tuple] = field(default_factory=list)  # state rows of records that failed early
    size: int = 0  # input records it accounts for (progress)
    vectors: Future | None = None


class Backfill:
    """One backfill run of an engine over inputs into one output (see ``BackfillOptions``).

    The engine suggests for each batch; ``suggester`` (the shell's, from ``make_suggester`` over
    the same engine) refines each of those suggestions on ``concurrency`` threads: the LLM stage,
    when a model is configured. Without one the engine's suggestions are written as they are.
    """

    def __init__(self, engine: SuggestionEngine, options: BackfillOptions, suggester: Suggester | None = None,
                 log: Log | None = None, progress: Callable[[int], None] | None = None):
        if options.write_back not in (None, *WRITE_BACK_TARGETS):
            raise BackfillError(f"unknown write-back target {options.write_back!r}; "
                                f"choose one of: {', '.join(WRITE_BACK_TARGETS)}")
        if options.outbox and options.write_back not in ("github", "jira"):
            raise BackfillError("--dry-run OUTBOX only applies to --write-back github or jira")
        self.engine, self.options = engine, options
        self.log = log or (lambda message: None)
        self.progress = progress or (lambda n: None)
        self.suggester = suggester or engine
        note = llm_note(self.suggester)
        self.result = BackfillResult(llm=note)
        self.target = f"{options.write_back}:dry-run" if options.outbox else options.write_back
        tax = engine.kb.taxonomy
        self.engine_id = (f"pmkb-engine/{__version__} {engine.kb.embedder.model_id} {tax.name}/{tax.version} "
                          f"llm={note}")
        self._seen: set[str] = set()
        self._errors = None
        self._rewrite = False  # an annotation already in the output was replaced or dropped

    def run(self, records: Iterable[Parsed]) -> BackfillResult:
        """Annotate every record not already done; returns the counts.

        ``records``: what a reader yields (``ingest.read_paths`` for files and folders): incidents,
        and the errors and warnings of records that could not be read.
        """
        started = time.perf_counter()
        options = self.options
        state = BackfillState(options.state_path())
        try:
            rewrite_output(state, options.out)  # repair whatever an interrupted run left behind
            with options.errors_path().open("w", encoding="utf-8") as self._errors, \
                    options.out.open("a", encoding="utf-8") as sink, \
                    ThreadPoolExecutor(1, thread_name_prefix="embed") as embedding, \
                    ThreadPoolExecutor(max(1, options.concurrency), thread_name_prefix="stage") as pool:
                pending = None
                try:
                    for batch in self._batches(records, state):
                        if batch.records:
                            batch.vectors = embedding.submit(self._embed, batch)
                        if pending is not None:  # finished while the next batch is being embedded
                            self._finish(pending, state, sink, pool)
                        pending = batch
                    if pending is not None:
                        self._finish(pending, state, sink, pool)
                except _TooManyErrors as stop:
                    self.result.stopped = str(stop)
            if self._rewrite or self.result.stopped:
                rewrite_output(state, options.out)
            self.result.in_output = state.count_done()
        finally:
            state.close()
        self.result.seconds = round(time.perf_counter() - started, 2)
        return self.result

    def _error(self, stage: str, message: str, record_id: str | None = None, source: str | None = None,
               where: str | None = None) -> None:
        """List a failed record; what it quotes of the record (id, source, message) is redacted."""
        entry = {"id": record_id and redact_key(record_id), "file": source and redact(source), "where": where,
                 "stage": stage, "error": redact(message), "action": ACTIONS[stage]}
        self._errors.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._errors.flush()
        self.result.failed += 1

    def _check_errors(self) -> None:
        limit = self.options.max_errors
        if limit is not None and self.result.failed > limit:
            raise _TooManyErrors(
                f"stopped: {self.result.failed} failed records, more than --max-errors {limit}. "
                f"See {self.options.errors_path()}, fix the input and re-run: finished records are kept "
                "and skipped")

    def _batches(self, items: Iterable, state: BackfillState) -> Iterator[_Batch]:
        window: list[Incident] = []
        for item in items:
            if isinstance(item, IngestWarning):
                self.log(f"warning: {item}")
                continue
            self.result.read += 1
            if isinstance(item, IngestError) or item.id in self._seen:
                if isinstance(item, IngestError):
                    self._error("input", item.message, source=item.file, where=item.where)
                else:
                    self._error("duplicate", f"id {redact_key(item.id)!r} appears more than once in the inputs",
                                record_id=item.id, source=item.source)
                self.progress(1)
                self._check_errors()
                continue
            self._seen.add(item.id)
            window.append(item)
            if len(window) >= self.options.batch_size:
                yield self._select(window, state)
                window = []
        if window:
            yield self._select(window, state)

    def _select(self, window: list[Incident], state: BackfillState) -> _Batch:
        """The records of a window that need annotating (unchanged ones are skipped)."""
        known = state.lookup([i.id for i in window])
        batch = _Batch()
        for incident in window:
            record = _Record(incident, incident.content_hash(), False)
            previous = known.get(incident.id)
            record.in_output = previous is not None and previous[2] == "done"
            if record.in_output and previous[:2] == (record.digest, self.engine_id) and (
                    self.target is None or previous[3] == self.target):
                self.result.skipped += 1
                self.progress(1)
                continue
            batch.size += 1
            self._rewrite |= record.in_output
            try:
                record.prepared = self.engine.prepare(incident)
                batch.records.append(record)
            except EmptyTicket as exc:
                message = redact(str(exc))
                self._error("empty", message, record_id=incident.id, source=incident.source)
                batch.failed.append(record.row(self.engine_id, error=message))
        return batch

    def _embed(self, batch: _Batch):
        vectors = self.engine.kb.embedder.embed_queries([r.prepared.query for r in batch.records])
        return vectors, self.engine.dense_candidates(vectors)

    def _finish(self, batch: _Batch, state: BackfillState, sink, pool: ThreadPoolExecutor) -> None:
        rows, lines = list(batch.failed), []

        def fail(stage: str, record: _Record, exc: Exception) -> None:
            message = redact(f"{type(exc).__name__}: {exc}")  # an exception may quote the ticket
            self._error(stage, message, record_id=record.incident.id, source=record.incident.source)
            rows.append(record.row(self.engine_id, error=message))

        records = []
        try:
            vectors, pools = batch.vectors.result() if batch.records else ([], [])
        except Exception as exc:  # noqa: BLE001 - the whole batch failed to embed
            vectors, pools = [], []
            for record in batch.records:
                fail("annotate", record, exc)
            batch.records = []
        try:
            texts = self.engine.text_log_probas([r.prepared.query for r in batch.records], vectors)
        except Exception as exc:  # noqa: BLE001 - per ticket instead, so only bad records fail
            self.log(f"warning: batched text classification failed ({redact(str(exc))}); classifying one by one")
            texts = [None] * len(vectors)
        for record, vector, dense, text in zip(batch.records, vectors, pools, texts):
            try:
                record.suggestion = self.engine.suggest_prepared(
                    record.prepared, vector, exclude={record.incident.id}, dense=dense, text_log_proba=text)
                records.append(record)
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the run
                fail("annotate", record, exc)
        records = self._stage(pool, "llm", records, fail,
                              lambda r: self.suggester.refine(r.prepared.ticket, r.suggestion))
        if self.options.write_back == "kb":
            records = self._write_back_kb(records, fail)
        elif self.options.write_back:
            records = self._stage(pool, "write_back", records, fail, self._write_back_ticket)
        for record in records:
            out = annotation_record(record.suggestion)
            if record.incident.mitigation:  # how the old incident was mitigated, for the report's plan precision
                out["labelled_mitigation"] = record.incident.mitigation
            # for the report's collective timeouts per month and job size
            timeout = incident_item(record.prepared.text, None, record.incident.created_at)
            out.update(collective_timeout=timeout.collective_timeout, job_gpus=timeout.gpus, month=timeout.month)
            line = json.dumps(out, ensure_ascii=False)
            rows.append(record.row(self.engine_id, line, self.target))
            if not record.in_output:
                lines.append(line + "\n")
        state.commit(rows)  # the state first: output lines are only ever written for committed rows
        sink.write("".join(lines))
        sink.flush()
        self.result.annotated += len(records)
        self.progress(batch.size)
        self._check_errors()

    def _stage(self, pool: ThreadPoolExecutor, stage: str, records: list[_Record], fail, call) -> list[_Record]:
        """Run ``call(record)`` over the records with bounded concurrency; keeps those that succeed."""
        futures = [pool.submit(call, record) for record in records]
        kept = []
        for record, future in zip(records, futures):
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - reported per record
                fail(stage, record, exc)
                continue
            if isinstance(outcome, Suggestion):
                record.suggestion = outcome
            kept.append(record)
        return kept

    def _write_back_ticket(self, record: _Record) -> dict:
        """Post to GitHub or Jira through the webhook bot's write-back (retrying transient errors)."""
        from kb.tickets.writeback import TicketRef, write_back_retrying

        ref = TicketRef(system=self.options.write_back, key=record.incident.id)
        done = write_back_retrying(self.engine.settings, ref, record.suggestion, outbox=self.options.outbox)
        self.result.written_back += 1
        return done

    def _write_back_kb(self, records: list[_Record], fail) -> list[_Record]:
        """Add confident suggestions to the knowledge base as machine-suggested incidents.

        An id the knowledge base holds with human labels is left as it is.
        """
        store = self.engine.kb.store
        existing = store.incident_hashes([r.incident.id for r in records])
        human = {i for i in existing if (found := store.get_incident(i)) is not None
                 and found.provenance != Provenance.machine_suggested}
        incidents = [r.incident.model_copy(update={
            "symptom": r.suggestion.symptom, "root_cause": r.suggestion.root_cause,
            "mitigation": r.suggestion.mitigation, "provenance": Provenance.machine_suggested})
            for r in records if not r.suggestion.abstained and r.incident.id not in human]
        try:
            report = self.engine.kb.add_incidents(incidents)
        except Exception as exc:  # noqa: BLE001 - the batch's write-back failed: retried on re-run
            for record in records:
                fail("write_back", record, exc)
            return []
        self.result.written_back += report.written
        for line in report.errors:
            self.log(f"warning: {redact(line)}")
        return records


class _TooManyErrors(RuntimeError):
    """More records failed than --max-errors allows."""


def run_backfill(engine: SuggestionEngine, records: Iterable[Parsed], options: BackfillOptions,
                 suggester: Suggester | None = None, report: Path | None = None, log: Log | None = None,
                 progress: Callable[[int], None] | None = None) -> BackfillResult:
    """Run one backfill (see ``Backfill``), then write the report of the whole output to ``report``."""
    from kb.jobs.report import read_records, write_report

    result = Backfill(engine, options, suggester, log=log, progress=progress).run(records)
    if report is not None:
        run = {"annotated": result.annotated, "unchanged (skipped)": result.skipped, "failed": result.failed,
               "written back": result.written_back, "LLM": result.llm}
        write_report(read_records(options.out), engine.kb.taxonomy, report,
                     title=f"Backfill report: {options.out.name}", run=run,
                     handling_minutes=engine.settings.handling_minutes)
    return result
