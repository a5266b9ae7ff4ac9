"""Collective-timeout crashes per month and by job size, beside their share of all crashes.

Whether NCCL-timeout crashes grow with job scale is an open question of the study behind the
taxonomy; these figures let a team answer it on its own history. An incident is a *collective
timeout* when its text shows one (the watchdog's report, "NCCL timeout", a collective that timed
out) and it ended the job (symptom job_crash, or job_hang: the watchdog kills a hung job). The job
size is the GPU count the ticket states (world size, nodes x GPUs, "64 GPUs"); tickets that do not
state it are counted as "not stated".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, NamedTuple

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|WorkNCCL\(SeqNum=|"
                      r"\bNCCL\b[^\n]{0,60}?\b(?:time ?out|timed out|timing out)|"
                      r"collective(?: operation)?[^\n]{0,30}?\b(?:time ?out|timed out)|"
                      r"\b(?:all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier)\b[^\n]{0,40}?\btimed out",
                      re.I)
_WORLD = re.compile(r"\b(?:world[_ ]?size|WORLD_SIZE|nranks)\s{0,3}[=:]?\s{0,3}(\d{1,6})\b", re.I)
_NODES_X_GPUS = re.compile(r"\b(\d{1,5})\s{0,2}(?:nodes?|hosts?|servers?|machines?)\s{0,3}(?:x|×|\*|with|of)\s{0,3}"
                           r"(\d{1,2})\s{0,2}(?:x\s{0,2})?(?:GPUs?|gpus?|[AHBL]\d{2,3}s?|V100s?)\b", re.I)
_PER_NODE = re.compile(r"\b(\d{1,2})\s{0,2}(?:GPUs?|gpus?)\s{0,2}(?:per|/|each)\s{0,2}(?:node|host|server)", re.I)
_NODES = re.compile(r"\b(\d{1,5})\s{0,2}(?:nodes?|hosts?)\b", re.I)
_GPUS = re.compile(r"\b(\d{1,6})\s{0,2}(?:x\s{0,2})?(?:GPUs|gpus|GPU|[AH]100s|H200s|B200s|V100s)\b")
_TIMES_GPU = re.compile(r"\b(\d{1,4})\s{0,2}x\s{0,2}(?:[AHB]\d{2,3}|V100|GPU)\b")
_NPROC = re.compile(r"--nproc[_-]per[_-]node[= ](\d{1,3})[^\n]{0,200}?--nnodes[= ](\d{1,5})|"
                    r"--nnodes[= ](\d{1,5})[^\n]{0,200}?--nproc[_-]per[_-]node[= ](\d{1,3})")

SIZES = (("1-8 GPUs", 1, 8), ("9-64 GPUs", 9, 64), ("65-512 GPUs", 65, 512), ("513+ GPUs", 513, 10**9))
NOT_STATED = "not stated"
ENDS_THE_JOB = {"job_crash", "job_hang"}


def is_collective_timeout(text: str) -> bool:
    """Whether a ticket's text shows a collective (NCCL) timeout."""
    return bool(_TIMEOUT.search(text))


def job_gpus(text: str) -> int | None:
    """The job's GPU count as the ticket states it, or None."""
    world = _WORLD.search(text)
    if world and int(world.group(1)) > 1:
        return int(world.group(1))
    nproc = _NPROC.search(text)
    if nproc:
        per, nodes = (nproc.group(1), nproc.group(2)) if nproc.group(1) else (nproc.group(4), nproc.group(3))
        return int(per) * int(nodes)
    grid = _NODES_X_GPUS.search(text)
    if grid:
        return int(grid.group(1)) * int(grid.group(2))
    per_node, nodes = _PER_NODE.search(text), _NODES.search(text)
    if per_node and nodes:
        return int(per_node.group(1)) * int(nodes.group(1))
    gpus = _GPUS.search(text) or _TIMES_GPU.search(text)
    return int(gpus.group(1)) if gpus and int(gpus.group(1)) > 0 else None


def size_bucket(gpus: int | None) -> str:
    """The job-size row a GPU count falls in."""
    if gpus is None:
        return NOT_STATED
    return next(name for name, low, high in SIZES if low <= gpus <= high)


class Item(NamedTuple):
    """One incident as the figures see it."""

    symptom: str | None
    collective_timeout: bool
    gpus: int | None
    month: str | None  # YYYY-MM


def incident_item(text: str, symptom: str | None, created_at: datetime | str | None) -> Item:
    """The figures' view of an incident or a backfilled ticket."""
    month = created_at.strftime("%Y-%m") if isinstance(created_at, datetime) else (created_at or "")[:7] or None
    return Item(symptom, is_collective_timeout(text), job_gpus(text), month)


@dataclass
class CollectiveFigures:
    """Collective-timeout crashes and all crashes, per month and per job size."""

    crashes: int = 0  # incidents that ended the job (a crash, or a hang the watchdog ended as a timeout)
    timeouts: int = 0
    by_month: dict[str, Counter] = field(default_factory=dict)  # month -> Counter(crashes=, timeouts=)
    by_size: dict[str, Counter] = field(default_factory=dict)

    @property
    def share(self) -> float | None:
        return self.timeouts / self.crashes if self.crashes else None

    def as_dict(self) -> dict:
        rows = lambda table: [{"key": k, "crashes": c["crashes"], "timeouts": c["timeouts"],  # noqa: E731
                               "share": c["timeouts"] / c["crashes"] if c["crashes"] else None}
                              for k, c in table.items()]
        return {"crashes": self.crashes, "timeouts": self.timeouts, "share": self.share,
                "by_month": rows(dict(sorted(self.by_month.items()))), "by_size": rows(self._sizes())}

    def _sizes(self) -> dict[str, Counter]:
        order = [name for name, _, _ in SIZES] + [NOT_STATED]
        return {name: self.by_size[name] for name in order if name in self.by_size}


def collective_figures(items: Iterable[Item]) -> CollectiveFigures:
    """The figures over incidents."""
    figures = CollectiveFigures()
    for item in items:
        timeout = item.collective_timeout and item.symptom in ENDS_THE_JOB
        if item.symptom != "job_crash" and not timeout:
            continue
        figures.crashes += 1
        figures.timeouts += timeout
        for table, key in ((figures.by_month, item.month or "undated"), (figures.by_size, size_bucket(item.gpus))):
            row = table.setdefault(key, Counter())
            row["crashes"] += 1
            row["timeouts"] += timeout
    return figures


def render_markdown(figures: CollectiveFigures, months: int = 12) -> list[str]:
    """The section as Markdown lines: the last ``months`` months and every job size."""
    data = figures.as_dict()
    share = lambda row: f"{row['share']:.1%}" if row["share"] is not None else "-"  # noqa: E731
    lines = ["## Collective timeouts", "",
             "Crashes whose ticket shows a collective (NCCL) timeout, beside all crashes, per month and by the "
             "job's GPU count as the ticket states it (docs/nccl.md).", "",
             f"Collective timeouts: {figures.timeouts} of {figures.crashes} crashes"
             + (f" ({figures.share:.1%})." if figures.share is not None else "."), "",
             "| month | crashes | collective timeouts | share |", "|---|---:|---:|---:|"]
    lines += [f"| {r['key']} | {r['crashes']} | {r['timeouts']} | {share(r)} |" for r in data["by_month"][-months:]]
    lines += ["", "| job size | crashes | collective timeouts | share |", "|---|---:|---:|---:|"]
    lines += [f"| {r['key']} | {r['crashes']} | {r['timeouts']} | {share(r)} |" for r in data["by_size"]]
    return lines + [""]
