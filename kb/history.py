"""Node history: the earlier incidents of this cluster that name the ticket's suspect node.

A node that keeps turning up in incidents is one to drain and repair rather than to exclude
once more. The bundled seed reports describe other clusters, so their node names never count.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from kb.evidence import find_nodes
from kb.incidents import Incident

BUNDLED_SOURCE = "pmkb-bundled"
"""The ``source`` of the incident reports shipped with pmkb."""
SHOWN = 5


class NodeIncident(BaseModel):
    """An earlier incident that names the node."""

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    created_at: datetime | None = None
    root_cause: str | None = None
    mitigation: str | None = None
    provenance: str = "human_labelled"


class NodeHistory(BaseModel):
    """How often the suspect node appears in earlier incidents, and the latest of them."""

    model_config = ConfigDict(extra="forbid")

    node: str
    total: int  # earlier incidents naming the node
    incidents: list[NodeIncident]  # the latest SHOWN of them, newest first (undated last)

    def summary(self) -> str:
        """One line for cards and comments."""
        plural = "incident" if self.total == 1 else "incidents"
        latest = ", ".join(f"{i.id} ({i.root_cause or 'unlabelled'}"
                           + (f", {i.created_at:%Y-%m-%d}" if i.created_at else "") + ")" for i in self.incidents)
        return f"{self.node} appears in {self.total} earlier {plural}: {latest}"


def node_index(incidents: list[Incident]) -> dict[str, list[Incident]]:
    """Incidents by every node they name (lower case) in ticket or resolution; seed reports left out."""
    index: dict[str, list[Incident]] = defaultdict(list)
    for incident in incidents:
        if incident.source == BUNDLED_SOURCE:
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
