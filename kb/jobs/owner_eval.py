"""Figures of how the engine decides the owner: accuracy by the truth's dimension, close calls the
ticket's own text points to an answer of (and how often rightly), and what each lever adds (the same tickets with
the readings switched off, and against knowledge bases of the written or the public reports alone)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kb.core.abstain import TOO_LITTLE_TEXT
from kb.core.suggestion import Suggestion
from kb.engine.history import BUNDLED_SOURCE
from kb.engine.knowledge import KnowledgeBase
from kb.engine.owner import OwnerCalibration
from kb.engine.suggest import SuggestionEngine

if TYPE_CHECKING:
    from kb.jobs.evaluate import Case

LEVER_FIGURES = ("top1", "top3", "dimension", "mitigation", "platform_top1")
"""The figures the lever table compares."""
OWNER_PRECISIONS = (0.95, 0.9, 0.85, 0.8, 0.7)
"""The wanted precisions ``owner_sweep`` reports, to choose ``owner_precision`` by."""


def per_dimension(cases: list[Case], preds: list[Suggestion]) -> dict[str, dict[str, float]]:
    """Top-1, top-3, dimension and mitigation accuracy over the tickets of each true dimension."""
    groups: dict[str, list[tuple[Case, Suggestion]]] = {}
    for case, pred in zip(cases, preds):
        groups.setdefault(case.dimension or "?", []).append((case, pred))
    out = {}
    for dimension, pairs in sorted(groups.items()):
        with_mitigation = [(c, p) for c, p in pairs if c.mitigation]
        out[dimension] = {
            "n": len(pairs),
            "top1": float(np.mean([p.root_cause == c.root_cause for c, p in pairs])),
            "top3": float(np.mean([c.root_cause in [x.id for x in p.root_cause_candidates[:3]] for c, p in pairs])),
            "dimension": float(np.mean([p.root_cause_dimension == c.dimension for c, p in pairs])),
            "mitigation": float(np.mean([p.mitigation == c.mitigation for c, p in with_mitigation]))
            if with_mitigation else float("nan"),
        }
    return out


def hint_figures(cases: list[Case], preds: list[Suggestion]) -> dict:
    """How many tickets had a close call, on how many the ticket's text points to an answer, and how
    often that answer, and the engine's suggestion on the same tickets, is the expert's cause."""
    asked = [(c, p) for c, p in zip(cases, preds) if p.close_call is not None]
    hinted = [(c, p) for c, p in asked if p.close_call.ticket_points_to]
    return {
        "close_calls": len(asked), "hinted": len(hinted),
        "hint_right": sum(p.close_call.ticket_points_to == c.root_cause for c, p in hinted),
        "hint_accepted": sum(p.close_call.ticket_points_to in {c.root_cause, *c.alt_root_causes} for c, p in hinted),
        "hint_agrees": sum(p.close_call.ticket_points_to == p.root_cause for c, p in hinted),
        "suggestion_right": sum(p.root_cause == c.root_cause for c, p in hinted),
    }


def owner_sweep(cases: list[Case], preds: list[Suggestion], calibration: OwnerCalibration,
                precisions: tuple[float, ...] = OWNER_PRECISIONS) -> list[dict[str, float]]:
    """For each wanted precision: the threshold fitted for it, the share of the knowledge base's
    left-out incidents it labels, and the share of these tickets it labels and how often rightly."""
    rows = []
    for precision in precisions:
        tau = calibration.threshold(precision)
        labelled = [p.owner.dimension == c.dimension for c, p in zip(cases, preds)
                    if p.owner is not None and p.owner.confidence >= tau and p.abstain_reason != TOO_LITTLE_TEXT]
        rows.append({"wanted": precision, "threshold": tau, "fitted_share": calibration.labelled_share(precision),
                     "share": len(labelled) / len(cases) if cases else 0.0,
                     "precision": float(np.mean(labelled)) if labelled else float("nan")})
    return rows


def lever_row(cases: list[Case], preds: list[Suggestion]) -> dict[str, float]:
    """The lever table's figures for one run."""
    dims = per_dimension(cases, preds)
    return {"top1": float(np.mean([p.root_cause == c.root_cause for c, p in zip(cases, preds)])),
            "top3": float(np.mean([c.root_cause in [x.id for x in p.root_cause_candidates[:3]]
                                   for c, p in zip(cases, preds)])),
            "dimension": float(np.mean([p.root_cause_dimension == c.dimension for c, p in zip(cases, preds)])),
            "mitigation": float(np.mean([p.mitigation == c.mitigation for c, p in zip(cases, preds) if c.mitigation])),
            "platform_top1": dims.get("platform", {}).get("top1", float("nan"))}


def without_readings(engine: SuggestionEngine) -> SuggestionEngine:
    """The same engine with the readings switched off: no reading feature, no close call pointed to
    an answer from the text (the other weights as fitted)."""
    calibration = engine.calibration
    off = calibration.model_copy(update={"root_cause": calibration.root_cause.model_copy(update={"reading": 0.0})})
    other = SuggestionEngine(engine.kb, engine.retriever, calibration=off)
    other.hint_close_calls = False
    return other


def without_owner_first(engine: SuggestionEngine) -> SuggestionEngine:
    """The same engine suggesting the most probable cause, whatever its dimension's probability."""
    other = SuggestionEngine(engine.kb, engine.retriever, calibration=engine.calibration)
    other.owner_decides = False
    return other


def fitted_on_every_report(engine: SuggestionEngine) -> SuggestionEngine:
    """The same knowledge base with weights and sets fitted on every labelled report, the written
    ones included (minutes: every incident is scored left out again)."""
    other = SuggestionEngine(engine.kb, engine.retriever)
    other.calibrator.real_only = False
    other.fit_calibration(save=False)
    return other


def subset_engine(engine: SuggestionEngine, keep: Callable, home: Path) -> SuggestionEngine:
    """An engine over a new knowledge base of the bundled reports that ``keep`` accepts, with its
    own fitted weights (the embedding model shared)."""
    settings = engine.settings.model_copy(update={"home": home})
    kb = KnowledgeBase(settings, embedder=engine.kb.embedder)
    kb.add_incidents([i for i in kb.bundled_incidents() if keep(i)])
    sub = SuggestionEngine(kb)
    sub.fit_calibration(save=False)
    return sub


def levers(engine: SuggestionEngine, cases: list[Case], run: Callable[[SuggestionEngine], list[Suggestion]],
           evaluated: dict, with_sources: bool = True) -> dict[str, dict[str, float]]:
    """The lever table: the engine as ``evaluated`` (``evaluate``'s result on these cases), with the
    readings off, suggesting the top cause whatever its owner and, with ``with_sources``, with weights
    fitted on every report and against the written reports alone and the public ones alone (each
    fitted anew; minutes)."""
    figures = evaluated["figures"]
    everything = {key: figures[key] for key in ("top1", "top3", "dimension", "mitigation")}
    everything["platform_top1"] = evaluated["per_dimension"].get("platform", {}).get("top1", float("nan"))
    rows = {"everything": everything, "no scope/change readings": lever_row(cases, run(without_readings(engine))),
            "top cause whatever its owner": lever_row(cases, run(without_owner_first(engine)))}
    if with_sources:
        rows["weights fitted on every report"] = lever_row(cases, run(fitted_on_every_report(engine)))
        with tempfile.TemporaryDirectory(prefix="pmkb-levers-") as tmp:
            for name, keep in (("written reports only", lambda i: i.source == BUNDLED_SOURCE),
                               ("public reports only", lambda i: i.source != BUNDLED_SOURCE)):
                rows[name] = lever_row(cases, run(subset_engine(engine, keep, Path(tmp) / name.split()[0])))
    return rows


def format_owner(result: dict) -> list[str]:
    """Table lines: figures by dimension, close calls the ticket's text speaks to and, when run, the levers."""
    lines = ["", "| true dimension | n | top-1 | top-3 | dimension | mitigation |", "|---|---|---|---|---|---|"]
    lines += [f"| {d} | {r['n']} | {r['top1']:.3f} | {r['top3']:.3f} | {r['dimension']:.3f} | {r['mitigation']:.3f} |"
              for d, r in result.get("per_dimension", {}).items()]
    hints = result.get("close_call_hints")
    if hints:
        lines += ["", f"close calls: {hints['close_calls']} tickets; the ticket's text points to an answer on "
                      f"{hints['hinted']}: the expert's cause {hints['hint_right']} times (or an accepted alternative "
                      f"{hints['hint_accepted']}); it is the suggestion on {hints['hint_agrees']}, and the "
                      f"suggestion is the expert's cause on {hints['suggestion_right']}"]
    if result.get("owner_sweep"):
        lines += ["", "| owner label: wanted precision | threshold | left-out incidents labelled | tickets labelled "
                      "| precision |", "|---|---|---|---|---|"]
        lines += [f"| {row['wanted']:.2f} | {row['threshold']:.3f} | {row['fitted_share']:.3f} | {row['share']:.3f} | "
                  f"{row['precision']:.3f} |" for row in result["owner_sweep"]]
    if result.get("levers"):
        lines += ["", "| lever | top-1 | top-3 | dimension | mitigation | platform top-1 |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in LEVER_FIGURES) + " |"
                  for name, row in result["levers"].items()]
    return lines
