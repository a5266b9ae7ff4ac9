"""Annotate a JSONL file of tickets: one suggestion record per input record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

from kb.core.roles import Suggester
from kb.core.suggestion import EmptyTicket, Suggestion, Ticket, labelling


def annotation_record(s: Suggestion) -> dict:
    """The flat record written by ``pmkb annotate`` and ``pmkb backfill``."""
    return {
        "id": s.id,
        "symptom": s.symptom,
        "symptom_confidence": s.symptom_confidence,
        "root_cause": s.root_cause,
        "root_cause_dimension": s.root_cause_dimension,
        "root_cause_confidence": s.root_cause_confidence,
        "root_cause_candidates": [c.model_dump() for c in s.root_cause_candidates],
        "root_cause_set": [c.model_dump() for c in s.root_cause_set],
        "set_level": s.set_level,
        "labelling": labelling(s),
        "label_set": None if s.label_set is None else [c.model_dump() for c in s.label_set],
        "label_level": s.label_level,
        "mitigation": s.mitigation,
        "mitigations": [m.model_dump() for m in s.mitigations],
        "similar_incidents": [{"id": h.id, "title": h.title, "score": h.score, "root_cause": h.root_cause}
                              for h in s.similar_incidents],
        "evidence": [{"signal": e.signal, "text": e.text, "category": e.category} for e in s.evidence],
        "abstained": s.abstained,
        "abstain_reason": s.abstain_reason,
        "retry_safe": s.retry_safe,
        "suspect": s.suspect,
        "node_history": s.node_history.model_dump(mode="json") if s.node_history else None,
        "low_gpu_utilisation": [h.id for h in s.low_gpu_utilisation],
        "explanation": s.explanation,
        "trace": s.trace,
    }


def read_tickets(path: Path) -> Iterator[tuple[int, Ticket | str]]:
    """(line number, Ticket) per JSONL line, or (line number, error message) for a bad line."""
    from kb.core.records import read_text

    text, _ = read_text(path)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("expected a JSON object")
            if "id" not in record:
                raise ValueError("record has no id")
            yield number, Ticket(id=record["id"], title=record.get("title") or "",
                                 description=record.get("description") or "", log=record.get("log") or "")
        except (ValueError, TypeError) as exc:
            yield number, f"{path}: line {number}: {exc}"


def annotate_file(suggester: Suggester, source: Path, out: Path,
                  progress: Callable[[int], None] | None = None) -> list[str]:
    """Write one annotation per good input line to ``out`` (from ``make_suggester``'s suggester, as
    in every shell); returns the errors for bad lines."""
    errors = []
    with out.open("w", encoding="utf-8") as sink:
        for number, item in read_tickets(source):
            if isinstance(item, str):
                errors.append(item)
            else:
                try:
                    sink.write(json.dumps(annotation_record(suggester.suggest(item)), ensure_ascii=False) + "\n")
                except EmptyTicket as exc:
                    errors.append(f"{source}: line {number}: {exc}")
            if progress:
                progress(1)
    return errors
