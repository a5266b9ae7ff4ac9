"""Node history: the earlier incidents of this cluster that name the ticket's suspect node.

A node that keeps turning up in incidents is one to drain and repair rather than to exclude
once more. The bundled seed reports describe other clusters, so their node names never count.
"""

from __future__ import annotations

from collections import defaultdict

from kb.core.incidents import Incident
from kb.core.suggestion import NodeHistory, NodeIncident
from kb.engine.evidence import find_nodes

BUNDLED_SOURCE = "pmkb-bundled"
"""Marks the incident reports shipped with pmkb: their ``source`` (reports written for pmkb) or one
of their ``tags`` (reports of public incidents, whose ``source`` is the public thread)."""
SHOWN = 5


def is_bundled(incident: Incident) -> bool:
    """Whether the incident is one of the reports shipped with pmkb (another cluster's nodes)."""
    return incident.source == BUNDLED_SOURCE or BUNDLED_SOURCE in incident.tags


def node_index(incidents: list[Incident]) -> dict[str, list[Incident]]:
    """Incidents by every node they name (lower case) in ticket or resolution; seed reports left out."""
    index: dict[str, list[Incident]] = defaultdict(list)
    for incident in incidents:
        if is_bundled(incident):
            continue
        for node in find_nodes(f"{incident.text()}\n{incident.resolution}"):
            index[node].append(incident)
    return dict(index)


def _newest_first(incident: Incident) -> tuple[bool, float]:
    return incident.created_at is not None, incident.created_at.timestamp() if incident.created_at else 0.0


def node_history(index: dict[str, list[Incident]], node: str, exclude: set[str] | None = None,
                 shown: int = SHOWN) -> NodeHistory | None:
    """The earlier incidents naming ``node`` (other than ``exclude``; the latest ``shown`` of them),
    or None when there are none."""
    hits = [i for i in index.get(node.lower(), []) if i.id not in (exclude or set())]
    if not hits:
        return None
    hits.sort(key=_newest_first, reverse=True)
    return NodeHistory(node=node, total=len(hits), incidents=[
        NodeIncident(id=i.id, title=i.title, created_at=i.created_at, root_cause=i.root_cause,
                     mitigation=i.mitigation, provenance=i.provenance.value) for i in hits[:shown]])
