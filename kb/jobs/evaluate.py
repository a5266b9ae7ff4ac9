"""Evaluation on labelled tickets: accuracy, macro-F1, calibration, retrieval and baselines.

Accuracy, per-class figures, macro-F1 and the confusion counts are scikit-learn's; the top-k,
alternative-label and retrieval figures are shares computed here.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

from kb.core.incidents import Incident
from kb.core.suggestion import Suggestion, Ticket
from kb.engine.classify import expected_calibration_error, neighbour_votes
from kb.engine.crossval import LeftOutFigures, format_left_out
from kb.engine.knowledge import KnowledgeBase
from kb.engine.suggest import SuggestionEngine
from kb.jobs.automation import Item, automation_figures
from kb.jobs.owner_eval import format_owner, hint_figures, owner_sweep, per_dimension
from kb.jobs.set_eval import format_sets, format_sweep, level_sweep, set_figures


@dataclass
class Case:
    """A labelled ticket: inputs and the expert labels."""

    ticket: Ticket
    root_cause: str
    dimension: str | None
    symptom: str | None
    mitigation: str | None
    alt_root_causes: list[str]
    record: dict


def load_cases(path: Path) -> list[Case]:
    """Read a labelled JSONL file (fields of shared/data/dev_incidents.jsonl)."""
    cases = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            cases.append(Case(Ticket(id=rec["id"], title=rec.get("title", ""), description=rec.get("description", "")),
                              rec["root_cause"], rec.get("root_cause_dimension"), rec.get("symptom"),
                              rec.get("mitigation"), list(rec.get("alt_root_causes") or []), rec))
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"{path}: line {number}: not a labelled record ({exc})") from exc
    if not cases:
        raise ValueError(f"{path}: no labelled records")
    return cases


def fill_dimensions(cases: list[Case], taxonomy) -> list[Case]:
    """Cases whose record gives no dimension take their root cause's dimension from the taxonomy."""
    for case in cases:
        if case.dimension is None and case.root_cause in taxonomy.cause_ids:
            case.dimension = taxonomy.dimension_of(case.root_cause)
    return cases


def label_figures(truth: list[str], pred: list[str]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support for every label seen in truth or prediction."""
    labels = sorted(set(truth) | set(pred))
    if not labels:
        return {}
    precision, recall, f1, support = precision_recall_fscore_support(truth, pred, labels=labels,
                                                                     zero_division=0.0)
    return {label: {"support": int(n), "precision": float(p), "recall": float(r), "f1": float(f)}
            for label, p, r, f, n in zip(labels, precision, recall, f1, support)}


def macro_f1(truth: list[str], pred: list[str]) -> float:
    """Macro-averaged F1 over the classes present in the truth."""
    labels = sorted(set(truth))
    return float(f1_score(truth, pred, labels=labels, average="macro", zero_division=0.0)) if labels else 0.0


def accuracy(truth: list[str | None], pred: list[str | None]) -> float:
    """Share of predictions equal to the truth; NaN when there is nothing to compare. A missing
    label (None) counts as a label of its own, equal only to another missing one."""
    if not truth:
        return float("nan")
    return float(accuracy_score(["" if t is None else t for t in truth], ["" if p is None else p for p in pred]))


def score(cases: list[Case], preds: list[Suggestion]) -> dict:
    """All figures for one set of predictions."""
    truth = [c.root_cause for c in cases]
    top1 = [p.root_cause for p in preds]
    correct = [t == p for t, p in zip(truth, top1)]
    kept = [i for i, p in enumerate(preds) if not p.abstained]
    return {
        "n": len(cases),
        "top1": accuracy(truth, top1),
        "top1_alt": float(np.mean([p.root_cause in {c.root_cause, *c.alt_root_causes}
                                   for c, p in zip(cases, preds)])),
        "macro_f1": macro_f1(truth, top1),
        "top3": float(np.mean([c.root_cause in [x.id for x in p.root_cause_candidates[:3]]
                               for c, p in zip(cases, preds)])),
        "dimension": _field_accuracy(cases, preds, "dimension", "root_cause_dimension"),
        "symptom": _field_accuracy(cases, preds, "symptom"),
        "mitigation": _field_accuracy(cases, preds, "mitigation"),
        "coverage": len(kept) / len(cases),
        "precision_when_labelled": accuracy([truth[i] for i in kept], [top1[i] for i in kept]),
        "ece": expected_calibration_error([p.root_cause_confidence for p in preds], correct),
        "recall_at_5": float(np.mean([any(h.root_cause == c.root_cause for h in p.similar_incidents[:5])
                                      for c, p in zip(cases, preds)])),
    }


def _field_accuracy(cases: list[Case], preds: list[Suggestion], field: str, predicted: str | None = None) -> float:
    """Accuracy of one label over the cases that have it (NaN when none has)."""
    pairs = [(getattr(c, field), getattr(p, predicted or field)) for c, p in zip(cases, preds) if getattr(c, field)]
    return accuracy([t for t, _ in pairs], [p for _, p in pairs])


def confusion(cases: list[Case], preds: list[Suggestion], field: str = "root_cause") -> dict[str, dict[str, int]]:
    """truth -> {predicted: count}, errors only, for ``root_cause`` or ``symptom``; each row's most
    frequent confusion first (ties in the order they first occur)."""
    pairs = [(getattr(c, field), getattr(p, field)) for c, p in zip(cases, preds) if getattr(c, field)]
    if not pairs:
        return {}
    labels = sorted({x for pair in pairs for x in pair})
    matrix = confusion_matrix([t for t, _ in pairs], [p for _, p in pairs], labels=labels)
    first_seen = {pair: n for n, pair in reversed(list(enumerate(pairs)))}
    table = {}
    for row, truth in enumerate(labels):
        errors = [(labels[col], int(n)) for col, n in enumerate(matrix[row]) if n and col != row]
        errors.sort(key=lambda item: (-item[1], first_seen[truth, item[0]]))
        if errors:
            table[truth] = dict(errors)
    return table


def per_class(cases: list[Case], preds: list[Suggestion]) -> dict[str, dict[str, float]]:
    """Root-cause precision, recall, F1 and support for every label seen in truth or prediction."""
    return label_figures([c.root_cause for c in cases], [p.root_cause for p in preds])


RISK_THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def risk_coverage(cases: list[Case], preds: list[Suggestion],
                  thresholds: tuple[float, ...] = RISK_THRESHOLDS) -> list[dict[str, float]]:
    """For each candidate abstain threshold: the share of tickets labelled (confidence at or above
    it) and the root-cause precision on them. It is how a team picks ``abstain_threshold``."""
    rows = []
    for threshold in thresholds:
        kept = [(c.root_cause, p.root_cause) for c, p in zip(cases, preds) if p.root_cause_confidence >= threshold]
        rows.append({"threshold": threshold, "coverage": len(kept) / len(cases),
                     "precision": accuracy([t for t, _ in kept], [p for _, p in kept])})
    return rows


def second_expert(cases: list[Case], dimension_of: Callable[[str], str | None] | None = None) -> dict | None:
    """How often a second expert's blind labels (``second_opinion`` in the labelled file) agree
    with the first expert's: the human reference for the engine's figures. None when the file
    has no second opinions."""
    pairs = [(c, c.record["second_opinion"]) for c in cases
             if isinstance(c.record.get("second_opinion"), dict) and c.record["second_opinion"].get("root_cause")]
    if not pairs:
        return None

    def agree(field: str) -> float:
        rows = [(getattr(c, field), other.get(field)) for c, other in pairs if getattr(c, field)]
        return accuracy([mine for mine, _ in rows], [theirs for _, theirs in rows])

    # not "top1_alt": a file's alternatives usually include the second expert's own reading
    out = {"n": len(pairs), "top1": agree("root_cause"), "symptom": agree("symptom"),
           "mitigation": agree("mitigation")}
    dims = [(c.dimension, dimension_of(other["root_cause"])) for c, other in pairs if c.dimension and dimension_of]
    if dims:
        out["dimension"] = accuracy([mine for mine, _ in dims], [theirs for _, theirs in dims])
    return out


def baselines(engine: SuggestionEngine, cases: list[Case], preds: list[Suggestion]) -> dict[str, dict]:
    """Majority class of the knowledge base, and the neighbours' vote alone, in the same run."""
    incidents = engine.retriever.incidents()
    majority = Counter(i.root_cause for i in incidents if i.root_cause).most_common(1)[0][0]
    truth = [c.root_cause for c in cases]
    out = {"majority_class": {"label": majority, "top1": accuracy(truth, [majority] * len(truth)),
                              "macro_f1": macro_f1(truth, [majority] * len(truth))}}
    ids = engine.kb.taxonomy.cause_ids
    vote_preds = []
    for p in preds:
        votes = neighbour_votes(p.similar_incidents, ids, "root_cause")
        vote_preds.append(max(votes, key=votes.get) if any(votes.values()) else majority)
    out["neighbour_vote"] = {"top1": accuracy(truth, vote_preds),
                             "macro_f1": macro_f1(truth, vote_preds)}
    return out


def evaluate(engine: SuggestionEngine, cases: list[Case],
             progress: Callable[[int], None] | None = None, suggester=None) -> dict:
    """Run the engine (or another suggester over it, e.g. the LLM one) over labelled cases and
    compute every figure plus baselines."""
    preds, latencies = [], []
    suggester = suggester or engine
    cases = fill_dimensions(cases, engine.kb.taxonomy)
    for case in cases:
        started = time.perf_counter()
        preds.append(suggester.suggest(case.ticket))
        latencies.append((time.perf_counter() - started) * 1000)
        if progress:
            progress(1)
    result = _result(engine, cases, preds, latencies)
    set_calibration = engine.calibration.root_cause_set
    if set_calibration is not None:
        rankings = engine.cause_rankings([case.ticket for case in cases])
        result["level_sweep"] = level_sweep(cases, preds, rankings, set_calibration, engine.kb.taxonomy)
    if engine.calibration.owner is not None:
        result["owner_sweep"] = owner_sweep(cases, preds, engine.calibration.owner)
    return {**result,
            "llm_failed": sum(1 for p in preds if p.trace.get("llm_failed")),
            "predictions": [{"id": c.ticket.id, "truth": c.root_cause, "predicted": p.root_cause,
                             "confidence": p.root_cause_confidence, "symptom": p.symptom}
                            for c, p in zip(cases, preds)]}


def _result(engine: SuggestionEngine, cases: list[Case], preds: list[Suggestion], latencies: list[float]) -> dict:
    """Every figure and table of one evaluation run."""
    latencies = sorted(latencies)
    result = {"figures": score(cases, preds), "baselines": baselines(engine, cases, preds),
              "confusion": confusion(cases, preds), "symptom_confusion": confusion(cases, preds, "symptom"),
              "per_class": per_class(cases, preds), "risk_coverage": risk_coverage(cases, preds),
              "latency_ms_p50": latencies[len(latencies) // 2]}
    result |= {"per_dimension": per_dimension(cases, preds), "close_call_hints": hint_figures(cases, preds)}
    sets = set_figures(cases, preds)
    if sets:
        result["sets"] = sets
    tax = engine.kb.taxonomy
    result["automation"] = automation_figures(
        [Item(p.retry_safe and not p.abstained, (p.suspect or {}).get("node"), c.mitigation)
         for c, p in zip(cases, preds)], tax.node_exclusion_mitigations, engine.settings.handling_minutes).as_dict()
    reference = second_expert(cases, lambda cause: tax.dimension_of(cause) if cause in tax.cause_ids else None)
    if reference:
        result["second_expert"] = reference
    left_out = engine.calibration.left_out
    if left_out is not None:
        result["knowledge_base_left_out"] = left_out.model_dump()
    return result


def case_incident(case: Case) -> Incident:
    """A labelled case as a knowledge-base incident (for k-fold evaluation)."""
    rec = case.record
    return Incident(id=f"eval:{case.ticket.id}", title=case.ticket.title, description=case.ticket.description,
                    resolution=rec.get("resolution") or "", symptom=case.symptom, root_cause=case.root_cause,
                    mitigation=case.mitigation, source=rec.get("source") or "eval")


def evaluate_kfold(kb: KnowledgeBase, cases: list[Case], folds: int = 5, seed: int = 0,
                   progress: Callable[[int], None] | None = None, refit: bool = False) -> dict:
    """Each fold is annotated against the knowledge base plus the other folds' labelled cases.

    The text classifier and the retrieval index always include the other folds; ``refit`` also
    refits the classifier weights leave-one-out per fold (slower).
    """
    cases = fill_dimensions(cases, kb.taxonomy)
    order = list(range(len(cases)))
    random.Random(seed).shuffle(order)
    fold_of = {i: n % folds for n, i in enumerate(order)}
    all_preds: list[Suggestion | None] = [None] * len(cases)
    with tempfile.TemporaryDirectory(prefix="pmkb-kfold-") as tmp:
        for fold in range(folds):
            home = Path(tmp) / f"fold{fold}"
            shutil.copytree(kb.settings.home, home, ignore=shutil.ignore_patterns("calibration.json"))
            fold_kb = KnowledgeBase(kb.settings.model_copy(update={"home": home}), embedder=kb.embedder)
            fold_kb.add_incidents([case_incident(cases[i]) for i in order if fold_of[i] != fold])
            engine = SuggestionEngine(fold_kb)
            if refit:
                engine.fit_calibration(save=False)
            for i in order:
                if fold_of[i] == fold:
                    all_preds[i] = engine.suggest(cases[i].ticket)
                    if progress:
                        progress(1)
        preds = [p for p in all_preds if p is not None]
        return {**_result(engine, cases, preds, [p.trace.get("latency_ms", 0.0) for p in preds]), "folds": folds}


FIGURE_NAMES = {
    "top1": "root cause top-1", "top1_alt": "top-1 within label or alt", "macro_f1": "root cause macro-F1",
    "top3": "root cause top-3", "dimension": "dimension accuracy", "symptom": "symptom accuracy",
    "mitigation": "mitigation accuracy", "coverage": "coverage (not abstained)",
    "precision_when_labelled": "precision when not abstaining", "ece": "ECE (root cause)",
    "recall_at_5": "retrieval recall@5",
}


def format_side_by_side(engine_only: dict, with_llm: dict, backend: str) -> str:
    """The engine's figures beside the LLM-assisted ones, same tickets, same run."""
    lines = [f"## engine alone vs with LLM ({backend})", "", "| figure | engine | with LLM |", "|---|---|---|"]
    for key, name in FIGURE_NAMES.items():
        lines.append(f"| {name} | {engine_only['figures'][key]:.3f} | {with_llm['figures'][key]:.3f} |")
    lines.append(f"| latency p50 per ticket (ms) | {engine_only['latency_ms_p50']:.0f} | "
                 f"{with_llm['latency_ms_p50']:.0f} |")
    lines.append(f"| model answers not used (invalid, timeout, down) | - | {with_llm['llm_failed']} |")
    return "\n".join(lines)


def format_report(result: dict, title: str) -> str:
    """Plain-text tables: the figures (beside a second expert's blind agreement when the labelled
    file has one), the baselines, per-class figures, precision by abstain threshold and the
    confusion tables."""
    reference = result.get("second_expert") or {}
    lines = [f"## {title}", ""]
    if reference:
        lines += [f"| figure | pmkb | second expert, blind (n={reference['n']}) |", "|---|---|---|"]
    else:
        lines += ["| figure | value |", "|---|---|"]
    for key, name in FIGURE_NAMES.items():
        row = f"| {name} | {result['figures'][key]:.3f} |"
        if reference:
            row += f" {reference[key]:.3f} |" if key in reference else " - |"
        lines.append(row)
    lines.append(f"| n | {result['figures']['n']} |" + (" |" if reference else ""))
    lines.append(f"| suggest latency p50 (ms) | {result['latency_ms_p50']:.0f} |" + (" |" if reference else ""))
    base = result["baselines"]
    lines += ["", "| baseline | top-1 | macro-F1 |", "|---|---|---|",
              f"| majority class ({base['majority_class']['label']}) | {base['majority_class']['top1']:.3f} | "
              f"{base['majority_class']['macro_f1']:.3f} |",
              f"| neighbour vote alone | {base['neighbour_vote']['top1']:.3f} | "
              f"{base['neighbour_vote']['macro_f1']:.3f} |",
              f"| pmkb engine | {result['figures']['top1']:.3f} | {result['figures']['macro_f1']:.3f} |"]
    lines += format_owner(result)
    if "knowledge_base_left_out" in result:
        lines += ["", format_left_out(LeftOutFigures(**result["knowledge_base_left_out"]))]
    if "risk_coverage" in result:
        lines += ["", "| abstain below | coverage | precision |", "|---|---|---|"]
        lines += [f"| {row['threshold']:.1f} | {row['coverage']:.3f} | {row['precision']:.3f} |"
                  for row in result["risk_coverage"]]
    if "sets" in result:
        lines += format_sets(result["sets"])
    if "level_sweep" in result:
        lines += format_sweep(result["level_sweep"])
    if "automation" in result:
        a = result["automation"]
        precision = f"{a['precision']:.3f}" if a["precision"] is not None else "-"
        lines += ["", "| remediation plans (retry-safe, node named) | value |", "|---|---|",
                  f"| plans | {a['plans']} of {a['total']} |",
                  f"| plan precision (labelled mitigation: resubmission or node repair) | {precision} "
                  f"({a['right']} of {a['labelled']}) |",
                  f"| distinct nodes / repeat offenders | {a['distinct_nodes']} / {len(a['repeat_offenders'])} |",
                  f"| on-call hours saved at {a['minutes_per_incident']:g} min each | {a['minutes_saved'] / 60:.1f} |"]
    if "per_class" in result:
        lines += ["", "| root cause | support | precision | recall | F1 |", "|---|---|---|---|---|"]
        lines += [f"| {label} | {row['support']} | {row['precision']:.2f} | {row['recall']:.2f} | {row['f1']:.2f} |"
                  for label, row in result["per_class"].items()]
    for key, name in (("confusion", "root cause"), ("symptom_confusion", "symptom")):
        if key in result:
            lines += ["", f"{name} confusion (truth -> predicted: count, errors only):"]
            lines += [f"  {truth:32} " + ", ".join(f"{p}: {n}" for p, n in row.items())
                      for truth, row in result[key].items()]
    return "\n".join(lines)
