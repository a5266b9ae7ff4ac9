"""Cross-validated figures on a knowledge base's own labelled incidents, each scored as an unseen ticket.

``pmkb calibrate`` scores every labelled incident as an unseen ticket: its neighbours leave it out
and its text-classifier probabilities come from a classifier that did not see it. Those features
are all a fair test needs but the weights, which are fitted on the same incidents: here they are
fitted on the other folds. The figures say how the engine reads tickets it has not seen, on every
real report of the knowledge base (about 1,900 bundled ones) rather than on a small labelled file,
so a change can be judged on tickets in general. They leave out what needs more than the features
(the mitigation): ``pmkb eval`` measures it on tickets.

Two levers are refitted on the same incidents: without the scope/change readings (what the reader
adds), and with each incident's expert-labelled readings in place of the reader's (the most a
better reader could add through the readings).
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
    # The same with the expert's readings in place of the reader's, weights refitted: what a perfect reader adds.
    with_expert_readings: LeftOutFigures | None = None


def cross_validate(samples: list[LabelFeatures], truths: list[str], dimension_of: Callable[[str], str | None],
                   folds: int = FOLDS, seed: int = SEED, with_levers: bool = True,
                   expert_readings: list[np.ndarray | None] | None = None) -> LeftOutFigures | None:
    """Figures of ``samples`` ranked by weights fitted on the other folds, the owner first as the
    engine suggests, and (``with_levers``) the same without the readings and, given
    ``expert_readings`` (per sample, the reading feature from its expert-labelled readings, None
    where it has none), with them in place of the reader's; None when there are fewer incidents
    than folds."""
    from kb.engine.classify import expected_calibration_error, fit_weights, predict

    experts = expert_readings if expert_readings is not None else [None] * len(samples)
    kept = [(f, t, e) for f, t, e in zip(samples, truths, experts, strict=True) if t in f.labels]
    usable = [(f, t) for f, t, _ in kept]
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
    without = expert = None
    if with_levers:
        kept_truths = [t for _, t in usable]
        without = cross_validate([_with_reading(f, 0.0) for f, _ in usable], kept_truths, dimension_of, folds, seed,
                                 with_levers=False)
        if any(e is not None for _, _, e in kept):
            expert = cross_validate([f if e is None else _with_reading(f, e) for f, _, e in kept], kept_truths,
                                    dimension_of, folds, seed, with_levers=False)
    return LeftOutFigures(
        folds=folds, **figures(scored),
        ece=round(expected_calibration_error([s[4] for s in scored], [s[1] for s in scored]), 4),
        per_dimension={d: DimensionFigures(**figures([s for s in scored if s[0] == d])) for d in dimensions},
        without_readings=without, with_expert_readings=expert)


def _with_reading(features: LabelFeatures, column: np.ndarray | float) -> LabelFeatures:
    """The same features with the reading feature's column replaced."""
    from kb.engine.classify import FEATURES, LabelFeatures

    matrix = features.matrix.copy()
    matrix[:, FEATURES.index("reading")] = column
    return LabelFeatures(features.labels, matrix)


def format_left_out(figures: LeftOutFigures) -> str:
    """A Markdown table of the figures."""
    lines = [f"the knowledge base's {figures.n} incidents the weights were fitted on, each scored as an unseen ticket "
             f"(weights fitted on the other {figures.folds - 1} of {figures.folds} folds):", "",
             "| true dimension | n | top-1 | top-3 | dimension |", "|---|---|---|---|---|",
             *(f"| {d} | {g.n} | {g.top1:.3f} | {g.top3:.3f} | {g.dimension:.3f} |"
               for d, g in figures.per_dimension.items()),
             f"| all | {figures.n} | {figures.top1:.3f} | {figures.top3:.3f} | {figures.dimension:.3f} |",
             "", f"ECE of the suggested cause: {figures.ece:.3f}"]
    if (off := figures.without_readings) is not None:
        lines.append(f"without the scope/change readings (weights refitted): top-1 {off.top1:.3f}, "
                     f"top-3 {off.top3:.3f}, dimension {off.dimension:.3f}")
    if (expert := figures.with_expert_readings) is not None:
        lines.append(f"with the expert's readings in place of the reader's (weights refitted; the most a better "
                     f"reader adds): top-1 {expert.top1:.3f}, top-3 {expert.top3:.3f}, "
                     f"dimension {expert.dimension:.3f}")
    return "\n".join(lines)
