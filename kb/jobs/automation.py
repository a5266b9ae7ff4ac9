"""What automating remediation would save, from a team's own history.

An incident is *plannable* when pmkb would propose a remediation plan for it: retry-safe, with a
named suspect node (kb.engine.remediate). Where an expert labelled how the incident was mitigated,
the plan was right when that was a resubmission or a node repair (the taxonomy's mitigations that
keep the job off the node, ``excludes_node``) and wrong otherwise: its precision. The on-call time
saved is the right plans times the minutes a person spends handling one such incident by hand
(``PMKB_HANDLING_MINUTES``); without labels it is the plans times those minutes, an upper bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple


class Item(NamedTuple):
    """One incident as the figures see it."""

    plannable: bool
    node: str | None
    labelled_mitigation: str | None


@dataclass
class AutomationFigures:
    """Counts behind the "what automation would save" section."""

    minutes_per_incident: float
    total: int = 0
    plans: int = 0
    labelled: int = 0  # plans whose incident carries an expert's mitigation label
    right: int = 0  # of those, mitigated by resubmission or node repair
    nodes: Counter = field(default_factory=Counter)  # plans per node

    @property
    def precision(self) -> float | None:
        return self.right / self.labelled if self.labelled else None

    @property
    def repeat_offenders(self) -> list[tuple[str, int]]:
        """Nodes named by two or more plannable incidents, most first."""
        return [(node, n) for node, n in self.nodes.most_common() if n >= 2]

    @property
    def minutes_saved(self) -> float:
        """Right plans times the handling time; all plans when none is labelled (an upper bound)."""
        counted = self.right if self.labelled else self.plans
        return counted * self.minutes_per_incident

    def as_dict(self) -> dict:
        return {"total": self.total, "plans": self.plans, "labelled": self.labelled, "right": self.right,
                "precision": self.precision, "distinct_nodes": len(self.nodes),
                "repeat_offenders": self.repeat_offenders[:10], "minutes_per_incident": self.minutes_per_incident,
                "minutes_saved": self.minutes_saved}


def automation_figures(items: Iterable[Item], resolved_by: set[str], minutes_per_incident: float) -> AutomationFigures:
    """The figures over incidents; ``resolved_by``: the mitigation ids a plan gets right."""
    figures = AutomationFigures(minutes_per_incident=minutes_per_incident)
    for item in items:
        figures.total += 1
        if not (item.plannable and item.node):
            continue
        figures.plans += 1
        figures.nodes[item.node.lower()] += 1
        if item.labelled_mitigation:
            figures.labelled += 1
            figures.right += item.labelled_mitigation in resolved_by
    return figures


def render_markdown(figures: AutomationFigures) -> list[str]:
    """The section as Markdown lines."""
    f = figures
    share = f"{f.plans / f.total:.1%}" if f.total else "-"
    precision = (f"{f.precision:.1%} ({f.right} of {f.labelled} labelled)" if f.precision is not None
                 else "unknown: no plannable incident carries a mitigation label")
    hours = f.minutes_saved / 60
    saved = (f"{hours:.1f} h ({f.right} right plans x {f.minutes_per_incident:g} min)" if f.labelled else
             f"at most {hours:.1f} h ({f.plans} plans x {f.minutes_per_incident:g} min; no labels to check them)")
    offenders = ", ".join(f"{node} ({n})" for node, n in f.repeat_offenders[:10]) or "none"
    return ["## What automating remediation would save", "",
            "Incidents where pmkb would drain the suspect node and resubmit the job without it (retry-safe, "
            "with a named node; docs/remediation.md), and how often that was what the experts did.", "",
            "| figure | value |", "|---|---|",
            f"| incidents | {f.total} |",
            f"| with a remediation plan | {f.plans} ({share}) |",
            f"| plan precision (resolved by resubmission or node repair) | {precision} |",
            f"| distinct nodes | {len(f.nodes)} |",
            f"| repeat offenders (nodes in 2+ plans) | {offenders} |",
            f"| on-call time saved at {f.minutes_per_incident:g} min per incident | {saved} |", ""]
