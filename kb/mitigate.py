"""Mitigation: ranked next steps from the likely causes' defaults and the neighbours' resolutions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kb.classify import neighbour_votes
from kb.evidence import Evidence
from kb.search import SimilarIncident
from kb.taxonomy import LowUtilTaxonomy, Taxonomy

DEFAULTS_SHARE = 0.5
"""Share of the cause defaults in a mitigation's score; the neighbours' mitigations take the rest."""


class MitigationStep(BaseModel):
    """A mitigation with its score and the concrete next step for this ticket."""

    model_config = ConfigDict(extra="forbid")

    id: str
    confidence: float
    next_step: str
    from_incidents: list[str] = []  # similar incidents resolved this way


class LowUtilisationHint(BaseModel):
    """A low-GPU-utilisation category that fits a slowdown or idle-GPU ticket, with its fix."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    fix: str
    signal: str | None = None  # the evidence that pointed to it, if any


def _default_weights(defaults: list[str]) -> dict[str, float]:
    raw = {m: 1.0 / (rank + 1) for rank, m in enumerate(defaults)}
    total = sum(raw.values())
    return {m: w / total for m, w in raw.items()}


def rank_mitigations(taxonomy: Taxonomy, cause_probs: list[tuple[str, float]],
                     similar: list[SimilarIncident], suspect: dict | None) -> list[MitigationStep]:
    """Blend the probable causes' default mitigations with how similar incidents were mitigated."""
    ids = taxonomy.mitigation_ids
    from_defaults = dict.fromkeys(ids, 0.0)
    for cause, prob in cause_probs:
        for mid, weight in _default_weights(taxonomy.root_cause(cause).default_mitigations).items():
            from_defaults[mid] += prob * weight
    votes = neighbour_votes(similar, ids, "mitigation")
    has_votes = any(votes.values())
    share = DEFAULTS_SHARE if has_votes else 1.0
    scores = {m: share * from_defaults[m] + (1 - share) * votes[m] for m in ids}
    steps = []
    for mid, score in sorted(scores.items(), key=lambda kv: -kv[1]):
        if score < 0.02:
            continue
        step = taxonomy.mitigation(mid).next_step
        if suspect and suspect.get("node") and mid in {"job_resubmission", "node_repair"}:
            step = f"{step} Suspect node: {suspect['node']}" + (
                f", GPU {suspect['gpu']}." if suspect.get("gpu") else ".")
        steps.append(MitigationStep(id=mid, confidence=round(score, 4), next_step=step,
                                    from_incidents=[h.id for h in similar if h.mitigation == mid][:3]))
    return steps


def low_utilisation_hints(low_util: LowUtilTaxonomy, evidence: list[Evidence],
                          text: str, limit: int = 3) -> list[LowUtilisationHint]:
    """Low-GPU-utilisation categories pointed to by evidence, else by indicator phrases."""
    hints: dict[str, LowUtilisationHint] = {}
    for item in evidence:
        if item.low_gpu_utilisation and item.low_gpu_utilisation not in hints:
            cat = low_util.category(item.low_gpu_utilisation)
            hints[cat.id] = LowUtilisationHint(id=cat.id, name=cat.name, fix=cat.fix, signal=item.signal)
    lowered = text.lower()
    scored = []
    for cat in low_util.categories:
        if cat.id in hints:
            continue
        hits = sum(1 for phrase in cat.indicators if phrase.lower() in lowered)
        if hits:
            scored.append((hits, cat.count, cat))
    for _, _, cat in sorted(scored, key=lambda s: (-s[0], -s[1])):
        hints[cat.id] = LowUtilisationHint(id=cat.id, name=cat.name, fix=cat.fix)
    if not hints:  # nothing specific: the most frequent categories in the study, as a checklist
        for cat in sorted(low_util.categories, key=lambda c: -c.count)[:limit]:
            hints[cat.id] = LowUtilisationHint(id=cat.id, name=cat.name, fix=cat.fix)
    return list(hints.values())[:limit]
