"""Data for the knowledge-base pages: flat incident rows, distributions, trends and filters.

Plain lists of dicts, so any front end (the chat page, a notebook, JSON) can render them.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

from kb.core.incidents import Incident
from kb.core.taxonomy import Taxonomy

UNLABELLED = "unlabelled"
GROUPINGS = ("symptom", "root_cause", "dimension", "mitigation", "provenance")
"""Fields a distribution can be computed over."""
PERIODS = {"month": 7, "year": 4, "day": 10}
"""Length of the ISO date prefix that names a period."""


def incident_row(incident: Incident, taxonomy: Taxonomy) -> dict:
    """One incident as a flat row: id, title, labels, dimension, provenance, dates."""
    dimension = (taxonomy.dimension_of(incident.root_cause)
                 if incident.root_cause in taxonomy.cause_ids else None)
    return {
        "id": incident.id,
        "title": incident.title,
        "symptom": incident.symptom,
        "root_cause": incident.root_cause,
        "dimension": dimension,
        "mitigation": incident.mitigation,
        "provenance": incident.provenance.value,
        "created_at": incident.created_at.isoformat() if incident.created_at else None,
        "source": incident.source,
        "tags": ", ".join(incident.tags),
    }


def incident_rows(incidents: Iterable[Incident], taxonomy: Taxonomy) -> list[dict]:
    """Flat rows for every incident, newest first (undated ones last, then by id)."""
    rows = [incident_row(i, taxonomy) for i in incidents]
    rows.sort(key=lambda r: r["id"])
    rows.sort(key=lambda r: r["created_at"] or "", reverse=True)
    return rows


def distribution(rows: list[dict], field: str) -> list[dict]:
    """Counts and shares per value of ``field``, most frequent first (missing -> "unlabelled")."""
    if field not in GROUPINGS:
        raise ValueError(f"cannot group incidents by {field!r}; choose one of {', '.join(GROUPINGS)}")
    counts = Counter(r[field] or UNLABELLED for r in rows)
    total = sum(counts.values())
    return [{field: label, "incidents": n, "share": round(n / total, 4)}
            for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def published_split(taxonomy: Taxonomy) -> dict[str, float]:
    """Share of issues per dimension as published (the taxonomy's dimension shares)."""
    return {d.id: d.share for d in taxonomy.dimensions if d.share is not None}


def published_source(taxonomy: Taxonomy) -> str:
    """Citation of the publication behind the dimension shares ("" when none is named)."""
    cited = {d.source for d in taxonomy.dimensions if d.share is not None and d.source}
    citations = {s.id: s.citation for s in taxonomy.sources}
    return "; ".join(citations.get(source, source) for source in sorted(cited))


def dimension_comparison(rows: list[dict], taxonomy: Taxonomy) -> list[dict]:
    """Per dimension: its share among labelled incidents here beside the published share."""
    counts = Counter(r["dimension"] for r in rows if r["dimension"])
    labelled = sum(counts.values())
    published = published_split(taxonomy)
    return [{"dimension": d.id, "name": d.name, "incidents": counts.get(d.id, 0),
             "knowledge_base": round(counts.get(d.id, 0) / labelled, 4) if labelled else 0.0,
             "published": published.get(d.id)}
            for d in taxonomy.dimensions]


def over_time(rows: list[dict], field: str = "dimension", period: str = "month") -> list[dict]:
    """Incident counts per period and value of ``field``, oldest period first (dated rows only)."""
    if period not in PERIODS:
        raise ValueError(f"unknown period {period!r}; choose one of {', '.join(PERIODS)}")
    if field not in GROUPINGS:
        raise ValueError(f"cannot group incidents by {field!r}; choose one of {', '.join(GROUPINGS)}")
    width = PERIODS[period]
    counts = Counter((r["created_at"][:width], r[field] or UNLABELLED) for r in rows if r["created_at"])
    return [{"period": p, field: label, "incidents": n} for (p, label), n in sorted(counts.items())]


class IncidentFilter(BaseModel):
    """What the incident browser narrows to; an empty list or text means no restriction."""

    model_config = ConfigDict(extra="forbid")

    symptoms: list[str] = Field(default_factory=list)
    root_causes: list[str] = Field(default_factory=list)
    dimensions: list[str] = Field(default_factory=list)
    provenances: list[str] = Field(default_factory=list)
    text: str = ""  # every word must appear in id, title, description, resolution, source or tags

    def matches(self, row: dict, incident: Incident | None = None) -> bool:
        """True when the row (and its incident's text, if given) passes every restriction."""
        checks = ((self.symptoms, "symptom"), (self.root_causes, "root_cause"),
                  (self.dimensions, "dimension"), (self.provenances, "provenance"))
        for allowed, field in checks:
            if allowed and (row[field] or UNLABELLED) not in allowed:
                return False
        words = self.text.lower().split()
        if not words:
            return True
        haystack = " ".join(str(row[k] or "") for k in ("id", "title", "source", "tags"))
        if incident is not None:
            haystack += f" {incident.description} {incident.resolution}"
        haystack = haystack.lower()
        return all(word in haystack for word in words)


def filter_incidents(incidents: list[Incident], taxonomy: Taxonomy,
                     flt: IncidentFilter) -> list[dict]:
    """Rows of the incidents that pass the filter, newest first."""
    kept = [i for i in incidents if flt.matches(incident_row(i, taxonomy), i)]
    return incident_rows(kept, taxonomy)


def summary(rows: list[dict]) -> dict:
    """Headline counts: incidents, labelled, confirmed, machine-suggested, dated."""
    provenance = Counter(r["provenance"] for r in rows)
    return {"incidents": len(rows),
            "labelled": sum(1 for r in rows if r["root_cause"]),
            "confirmed": provenance.get("confirmed", 0),
            "machine_suggested": provenance.get("machine_suggested", 0),
            "dated": sum(1 for r in rows if r["created_at"])}


def automation(incidents: Iterable[Incident], taxonomy: Taxonomy, minutes_per_incident: float) -> dict:
    """What automating remediation would have saved on this cluster's own incidents (the bundled
    seed reports describe other clusters and are left out): ``kb.jobs.automation``'s figures, with
    an incident plannable when its labelled cause is retry-safe and its text names a node."""
    from kb.engine.evidence import find_node
    from kb.engine.history import is_bundled
    from kb.jobs.automation import Item, automation_figures

    safe = taxonomy.retry_safe_causes
    items = [Item(i.root_cause in safe, find_node(i.text()), i.mitigation)
             for i in incidents if not is_bundled(i) and i.labelled]
    return automation_figures(items, taxonomy.node_exclusion_mitigations, minutes_per_incident).as_dict()


def collective_timeouts(incidents: Iterable[Incident]) -> dict:
    """Collective-timeout crashes per month and by job size on this cluster's own incidents (the
    bundled reports describe other clusters and are left out): ``kb.jobs.collective_counts``."""
    from kb.engine.history import is_bundled
    from kb.jobs.collective_counts import collective_figures, incident_item

    return collective_figures(incident_item(i.text(), i.symptom, i.created_at)
                              for i in incidents if not is_bundled(i) and i.symptom).as_dict()
