"""Evaluation of the prediction sets: coverage and sizes at the configured level, the labels the
bot's rule writes with their precision, and the same at other levels (to choose ``set_alpha`` and
``label_alpha`` by)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kb.core.abstain import TOO_LITTLE_TEXT
from kb.core.suggestion import (
    CAUSE_LABEL,
    COMMENT_ONLY,
    DIMENSION_LABEL,
    Candidate,
    Suggestion,
    labelling,
    set_labelling,
)
from kb.engine.conformal import SetCalibration

if TYPE_CHECKING:
    from kb.jobs.evaluate import Case


def set_figures(cases: list[Case], preds: list[Suggestion]) -> dict | None:
    """Figures of the prediction sets (None when the engine has no set calibration): coverage of
    the true cause (and of the cause or one of its accepted alternatives), set sizes, singletons
    and their precision, coverage by the truth's dimension, the symptom set's coverage and size;
    and the labels the bot's rule writes (``labelling``), with the precision of each kind."""
    pairs = [(c, p) for c, p in zip(cases, preds) if p.root_cause_set]
    if not pairs:
        return None
    sizes = np.array([len(p.root_cause_set) for _, p in pairs])
    covered = np.array([c.root_cause in {m.id for m in p.root_cause_set} for c, p in pairs])
    accepted = np.array([bool({c.root_cause, *c.alt_root_causes} & {m.id for m in p.root_cause_set})
                         for c, p in pairs])
    singles = sizes == 1
    by_dimension: dict[str, list[bool]] = {}
    for (c, _), hit in zip(pairs, covered):
        by_dimension.setdefault(c.dimension or "?", []).append(bool(hit))
    symptoms = [(c, p) for c, p in pairs if c.symptom and p.symptom_set]
    kinds = {CAUSE_LABEL: [], DIMENSION_LABEL: [], COMMENT_ONLY: []}
    for c, p in pairs:
        kind = labelling(p)
        right = (p.root_cause == c.root_cause if kind == CAUSE_LABEL
                 else p.root_cause_dimension == c.dimension if kind == DIMENSION_LABEL else None)
        kinds[kind].append(right)
    return {
        "n": len(pairs), "level": pairs[0][1].set_level, "coverage": float(covered.mean()),
        "label_level": pairs[0][1].label_level or pairs[0][1].set_level,
        "coverage_accepted": float(accepted.mean()),
        "mean_size": float(sizes.mean()), "median_size": float(np.median(sizes)),
        "singletons": float(singles.mean()),
        "singleton_precision": float(covered[singles].mean()) if singles.any() else float("nan"),
        "two_causes": float((sizes == 2).mean()), "wider": float((sizes > 2).mean()),
        "coverage_by_dimension": {d: float(np.mean(hits)) for d, hits in sorted(by_dimension.items())},
        "symptom_coverage": float(np.mean([c.symptom in {m.id for m in p.symptom_set} for c, p in symptoms]))
        if symptoms else float("nan"),
        "symptom_mean_size": float(np.mean([len(p.symptom_set) for _, p in symptoms])) if symptoms else float("nan"),
        "bot": {kind: {"share": len(rights) / len(pairs),
                       "precision": float(np.mean(rights)) if rights and kind != COMMENT_ONLY else float("nan")}
                for kind, rights in kinds.items()},
    }


def format_sets(sets: dict) -> list[str]:
    """The prediction-set figures as table lines."""
    lines = ["", f"| prediction set (level {sets['level']:.2f}, n={sets['n']}) | value |", "|---|---|",
             f"| root-cause coverage | {sets['coverage']:.3f} |",
             f"| coverage of the cause or an accepted alternative | {sets['coverage_accepted']:.3f} |",
             f"| mean size | {sets['mean_size']:.2f} |",
             f"| median size | {sets['median_size']:.1f} |", f"| singletons | {sets['singletons']:.3f} |",
             f"| singleton precision | {sets['singleton_precision']:.3f} |",
             f"| two causes / wider | {sets['two_causes']:.3f} / {sets['wider']:.3f} |"]
    lines += [f"| coverage, {dim} tickets | {value:.3f} |" for dim, value in sets["coverage_by_dimension"].items()]
    lines += [f"| symptom coverage / mean size | {sets['symptom_coverage']:.3f} / {sets['symptom_mean_size']:.2f} |",
              "", f"| bot writes (labels follow the {sets['label_level']:.2f} set) | share of tickets | precision |",
              "|---|---|---|"]
    names = {CAUSE_LABEL: "cause label (set of one)",
             DIMENSION_LABEL: "dimension label (set in one dimension, or a sure owner)", COMMENT_ONLY: "comment only"}
    lines += [f"| {names[kind]} | {row['share']:.3f} | " + ("-" if kind == COMMENT_ONLY else f"{row['precision']:.3f}")
              + " |" for kind, row in sets["bot"].items()]
    return lines


SWEEP_LEVELS = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)
"""The set levels ``level_sweep`` reports, to choose ``set_alpha`` and ``label_alpha`` by."""


def level_sweep(cases: list[Case], preds: list[Suggestion], rankings: list[list[tuple[str, float]]],
                calibration: SetCalibration, taxonomy, levels: tuple[float, ...] = SWEEP_LEVELS) -> list[dict]:
    """For each set level, from the same full rankings: the set's coverage and mean size, and what
    the labelling rule would write there: the share of tickets given a cause label, its precision
    against the expert label and against the label or an accepted alternative, and the share and
    precision of dimension labels. A ticket that says too little is never labelled, as by the bot."""
    rows = []
    for level in levels:
        sets = [[Candidate(id=c, confidence=0.0, dimension=taxonomy.dimension_of(c))
                 for c in calibration.predict(ranking, round(1 - level, 6))] for ranking in rankings]
        kinds = [COMMENT_ONLY if p.abstain_reason == TOO_LITTLE_TEXT else set_labelling(members)
                 for p, members in zip(preds, sets)]
        causes = [(c, members[0].id) for c, members, kind in zip(cases, sets, kinds) if kind == CAUSE_LABEL]
        dimensions = [c.dimension == members[0].dimension
                      for c, members, kind in zip(cases, sets, kinds) if kind == DIMENSION_LABEL]
        rows.append({
            "level": level,
            "coverage": float(np.mean([c.root_cause in {m.id for m in members} for c, members in zip(cases, sets)])),
            "mean_size": float(np.mean([len(members) for members in sets])),
            "cause_labels": len(causes) / len(cases),
            "cause_precision": float(np.mean([c.root_cause == top for c, top in causes])) if causes else float("nan"),
            "cause_accepted": float(np.mean([top in {c.root_cause, *c.alt_root_causes} for c, top in causes]))
            if causes else float("nan"),
            "dimension_labels": len(dimensions) / len(cases),
            "dimension_precision": float(np.mean(dimensions)) if dimensions else float("nan"),
        })
    return rows


def format_sweep(rows: list[dict]) -> list[str]:
    """The level sweep as table lines ("-" where a level writes no label of a kind)."""
    def share(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"

    lines = ["", "| set level | coverage | mean size | cause labels | precision | label or alt | "
             "dimension labels | precision |", "|---|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['level']:.2f} | {r['coverage']:.3f} | {r['mean_size']:.2f} | {r['cause_labels']:.3f} | "
                    f"{share(r['cause_precision'])} | {share(r['cause_accepted'])} | {r['dimension_labels']:.3f} | "
                    f"{share(r['dimension_precision'])} |" for r in rows]
