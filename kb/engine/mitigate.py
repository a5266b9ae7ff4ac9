"""Mitigation: ranked next steps from the likely causes' defaults and the neighbours' resolutions."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from kb.core.suggestion import Evidence, LowUtilisationHint, MitigationStep, SimilarIncident
from kb.core.taxonomy import LowUtilTaxonomy, Taxonomy
from kb.engine.classify import neighbour_votes

DEFAULTS_SHARE = 0.5
"""Share of the causes' usual mitigations in a mitigation's score; the neighbours' take the rest."""
HISTORY_STRENGTH = 5.0
"""How many incidents' worth of weight a cause's taxonomy defaults carry against the knowledge
base's own record of how incidents of that cause were mitigated."""


def _default_weights(defaults: list[str]) -> dict[str, float]:
    raw = {m: 1.0 / (rank + 1) for rank, m in enumerate(defaults)}
    total = sum(raw.values())
    return {m: w / total for m, w in raw.items()}


def cause_mitigations(taxonomy: Taxonomy, incidents: Iterable) -> dict[str, dict[str, float]]:
    """For each root cause, how its incidents were mitigated: the shares among the labelled
    incidents with that cause, smoothed toward the taxonomy's default mitigations (which alone
    decide for a cause the knowledge base has no incident of)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for incident in incidents:
        if incident.root_cause and incident.mitigation:
            counts[incident.root_cause][incident.mitigation] += 1
    table = {}
    for cause in taxonomy.root_causes:
        defaults, seen = _default_weights(cause.default_mitigations), counts[cause.id]
        total = sum(seen.values()) + HISTORY_STRENGTH
        table[cause.id] = {m: (seen[m] + HISTORY_STRENGTH * defaults.get(m, 0.0)) / total
                           for m in {*defaults, *seen}}
    return table


def rank_mitigations(taxonomy: Taxonomy, cause_probs: list[tuple[str, float]],
                     similar: list[SimilarIncident], suspect: dict | None,
                     usual: dict[str, dict[str, float]] | None = None) -> list[MitigationStep]:
    """Blend the probable causes' usual mitigations (``usual``, from ``cause_mitigations``; the
    taxonomy's defaults when absent) with how the similar incidents were mitigated."""
    ids = taxonomy.mitigation_ids
    from_defaults = dict.fromkeys(ids, 0.0)
    for cause, prob in cause_probs:
        shares = (usual or {}).get(cause) or _default_weights(taxonomy.root_cause(cause).default_mitigations)
        for mid, weight in shares.items():
            if mid in from_defaults:
                from_defaults[mid] += prob * weight
    votes = neighbour_votes(similar, ids, "mitigation")
    has_votes = any(votes.values())
    share = DEFAULTS_SHARE if has_votes else 1.0
    scores = {m: share * from_defaults[m] + (1 - share) * votes[m] for m in ids}
    names_node = taxonomy.node_exclusion_mitigations if suspect and suspect.get("node") else set()
    steps = []
    for mid, score in sorted(scores.items(), key=lambda kv: -kv[1]):
        if score < 0.02:
            continue
        step = taxonomy.mitigation(mid).next_step
        if mid in names_node:
            step = f"{step} Suspect node: {suspect['node']}" + (
                f", GPU {suspect['gpu']}." if suspect.get("gpu") else ".")
        steps.append(MitigationStep(id=mid, confidence=round(score, 4), next_step=step,
                                    from_incidents=[h.id for h in similar if h.mitigation == mid][:3]))
    return steps


def wants_low_utilisation_hints(taxonomy: Taxonomy, symptom: str, evidence: list[Evidence]) -> bool:
    """Whether a ticket gets the low-GPU-utilisation hints: its symptom is flagged
    ``low_gpu_utilisation`` in the taxonomy, or a log signature points to such a category."""
    return symptom in taxonomy.low_utilisation_symptoms or any(e.low_gpu_utilisation for e in evidence)


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
