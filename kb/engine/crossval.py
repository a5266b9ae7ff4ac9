"""Cross-validated figures on a knowledge base's own labelled incidents, each scored as an unseen ticket.

``pmkb calibrate`` scores every labelled incident as an unseen ticket: its neighbours leave it out
and its text-classifier probabilities come from a classifier that did not see it. Those features
are all a fair test needs but the weights, which are fitted on the same incidents: here they are
fitted on the other folds. The figures say how the engine reads tickets it has not seen, on every
real report of the knowledge base (about 1,900 bundled ones) rather than on a small labelled file,
so a change can be judged on tickets in general. They leave out what needs more than the features
(close calls settled from the text, the mitigation): ``pmkb eval`` measures those on tickets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict

from kb.engine.owner import owner_first

if TYPE_CHECKING:
    from kb.engine.classify import LabelFeatures

FOLDS = 5
SEED = 1


class DimensionFigures(BaseModel):
    """The figures of the incidents whose true cause lies in one dimension."""

    model_config = ConfigDict(extra="forbid")

    n: int
    top1: float
    top3: float
    dimension: float  # the owner (most probable dimension) is this one


class LeftOutFigures(BaseModel):
    """How the engine's ranking did on labelled incidents it had not seen (k-fold over the weights)."""

    model_config = ConfigDict(extra="forbid")

    n: int
    folds: int
    top1: float  # the suggested cause (the owner's best) is the label
    top3: float
    dimension: float
    ece: float  # expected calibration error of the suggested cause's probability
    per_dimension: dict[str, DimensionFigures]
    # The same with the scope/change reading feature left out and the weights refitted: what the readings add.
    without_readings: LeftOutFigures | None = None


def cross_validate(samples: list[LabelFeatures], truths: list[str], dimension_of: Callable[[str], str | None],
                   folds: int = FOLDS, seed: int = SEED, with_levers: bool = True) -> LeftOutFigures | None:
    """Figures of ``samples`` ranked by weights fitted on the other folds, the owner first as the
    engine suggests, and (``with_levers``) the same without the readings; None when there are
    fewer incidents than folds."""
    from kb.engine.classify import FEATURES, LabelFeatures, expected_calibration_error, fit_weights, predict

    usable = [(f, t) for f, t in zip(samples, truths) if t in f.labels]
    if len(usable) < folds:
        return None
    fold = np.random.default_rng(seed).permutation(len(usable)) % folds
    rows: list[tuple[str, list[tuple[str, float]]]] = []
    for k in range(folds):
        weights, _ = fit_weights([f for (f, _), g in zip(usable, fold) if g != k],
                                 [t for (_, t), g in zip(usable, fold) if g != k])
        rows += [(t, owner_first(predict(f, weights), dimension_of)) for (f, t), g in zip(usable, fold) if g == k]
    scored = [(dimension_of(truth), ranked[0][0] == truth, truth in [c for c, _ in ranked[:3]],
               dimension_of(ranked[0][0]) == dimension_of(truth), ranked[0][1]) for truth, ranked in rows]

    def figures(group: list[tuple]) -> dict:
        return {"n": len(group), "top1": round(float(np.mean([s[1] for s in group])), 4),
                "top3": round(float(np.mean([s[2] for s in group])), 4),
                "dimension": round(float(np.mean([s[3] for s in group])), 4)}

    dimensions = sorted({s[0] for s in scored if s[0] is not None})
    without = None
    if with_levers:
        unread = []
        for f, _ in usable:
            matrix = f.matrix.copy()
            matrix[:, FEATURES.index("reading")] = 0.0
            unread.append(LabelFeatures(f.labels, matrix))
        without = cross_validate(unread, [t for _, t in usable], dimension_of, folds, seed, with_levers=False)
    return LeftOutFigures(
        folds=folds, **figures(scored),
        ece=round(expected_calibration_error([s[4] for s in scored], [s[1] for s in scored]), 4),
        per_dimension={d: DimensionFigures(**figures([s for s in scored if s[0] == d])) for d in dimensions},
        without_readings=without)


def format_left_out(figures: LeftOutFigures) -> str:
    """A Markdown table of the figures."""
    lines = [f"the knowledge base's {figures.n} incidents the weights were fitted on, each scored as an unseen ticket "
             f"(weights fitted on the other {figures.folds - 1} of {figures.folds} folds; no close call settled):", "",
             "| true dimension | n | top-1 | top-3 | dimension |", "|---|---|---|---|---|",
             *(f"| {d} | {g.n} | {g.top1:.3f} | {g.top3:.3f} | {g.dimension:.3f} |"
               for d, g in figures.per_dimension.items()),
             f"| all | {figures.n} | {figures.top1:.3f} | {figures.top3:.3f} | {figures.dimension:.3f} |",
             "", f"ECE of the suggested cause: {figures.ece:.3f}"]
    if (off := figures.without_readings) is not None:
        lines.append(f"without the scope/change readings (weights refitted): top-1 {off.top1:.3f}, "
                     f"top-3 {off.top3:.3f}, dimension {off.dimension:.3f}")
    return "\n".join(lines)
