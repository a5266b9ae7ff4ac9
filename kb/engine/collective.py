"""A ticket's pasted logs read as a collective timeout (``kb.core.collective_triage``), and the
ranking that follows the verdict.

The verdict is read only when the text carries a rank's collective state (a watchdog report, a
"last completed" line, a launcher's failure summary, a collective mismatch, an analyser's missing
ranks, an NCCL warning), so an ordinary ticket costs one scan.
"""

from __future__ import annotations

import re

from kb.core.collective_logs import read_job
from kb.core.collective_triage import CollectiveVerdict, triage
from kb.core.rank_logs import LogSource, split_lines

_MARKERS = re.compile(r"WorkNCCL\(|WorkGloo\(|last enqueued (?:NCCL )?work|Root Cause \(first observed failure\)|"
                      r"Detected mismatch between collectives|missing ranks: \{|NCCL WARN|"
                      r"Timed out waiting \d{1,12}ms for (?:recv|send)")

# How far a verdict moves the odds of the causes it points to: the first, then the others. The logs of
# the ranks are direct evidence of where the job stopped, stronger than words shared with past tickets.
DECISIVE = {"one_node", "one_link", "diverging"}
VERDICT_ODDS = {"one_node": (10.0, 4.0), "one_link": (10.0, 4.0), "diverging": (10.0, 4.0), "everything": (2.0, 2.0)}


def read_collective(text: str) -> CollectiveVerdict | None:
    """The verdict on the logs in a ticket's text; None when the text holds no collective state or
    the logs decide nothing."""
    if not _MARKERS.search(text):
        return None
    verdict = triage(read_job([LogSource("ticket", lines=split_lines(text))]))
    return None if verdict.kind == "undetermined" else verdict


def follow_verdict(causes: list[tuple[str, float]], verdict: CollectiveVerdict,
                   dimension_of: dict[str, str]) -> list[tuple[str, float]]:
    """The cause ranking with the odds of the verdict's causes raised (``VERDICT_ODDS``), renormalised.

    A decisive verdict (one node, one link, diverging ranks) decides the owner: when a cause of
    another dimension still leads, those causes are scaled down until the best cause of the
    verdict's dimension leads two to one. The text and the neighbours still decide the cause
    within that dimension."""
    first, rest = VERDICT_ODDS.get(verdict.kind, (1.0, 1.0))
    pointed = [c for c in verdict.causes if c in dimension_of]
    factor = {c: (first if n == 0 else rest) for n, c in enumerate(pointed)}
    raised = [(cause, p * factor.get(cause, 1.0)) for cause, p in causes]
    if verdict.kind in DECISIVE and verdict.dimension:
        inside = max((p for c, p in raised if dimension_of.get(c) == verdict.dimension), default=0.0)
        outside = max((p for c, p in raised if dimension_of.get(c) != verdict.dimension), default=0.0)
        if inside > 0 and outside >= inside / 2:
            scale = inside / (2 * outside)
            raised = [(c, p if dimension_of.get(c) == verdict.dimension else p * scale) for c, p in raised]
    total = sum(p for _, p in raised) or 1.0
    return sorted(((cause, p / total) for cause, p in raised), key=lambda item: -item[1])
