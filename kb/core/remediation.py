"""Remediation plans: the steps that take a suspect node out and resubmit the job without it, as data
a program can execute and a person can read, and the policy that decides whether they may run
unattended.

A plan is made for a suggestion that is retry-safe and names a suspect node
(``kb.engine.remediate.plan_for``). Each step says what it changes and how to undo it. Slurm steps
are ``scontrol`` command lines; Kubernetes steps are calls of the official client
(``CoreV1Api.patch_node`` and friends) with their bodies.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb.core import yamlsafe

Scheduler = Literal["slurm", "kubernetes"]
SCHEDULERS: tuple[str, ...] = ("slurm", "kubernetes")


class RemediationError(ValueError):
    """A plan or policy that cannot be used, with what to do about it."""


class Step(BaseModel):
    """One action of a plan."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["drain", "exclude_node", "requeue", "cordon", "taint", "recreate_pods"]
    summary: str  # what a person reads: "Drain gpu-c12 (new jobs go elsewhere; running ones finish)"
    changes: str  # what running it changes, said before it runs
    argv: list[str] = Field(default_factory=list)  # Slurm: the command line
    call: str | None = None  # Kubernetes: the client method, e.g. CoreV1Api.patch_node
    args: dict = Field(default_factory=dict)  # Kubernetes: the call's arguments (body included)
    undo_argv: list[str] = Field(default_factory=list)  # Slurm: the command that reverses it ([] if none)
    undo_call: str | None = None
    undo_args: dict = Field(default_factory=dict)

    def shown(self) -> str:
        """The step as a person would type it (a shell line, or the client call)."""
        if self.argv:
            return shlex.join(self.argv)
        return f"{self.call}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"


class RemediationPlan(BaseModel):
    """What to do about a retry-safe ticket with a suspect node."""

    model_config = ConfigDict(extra="forbid")

    ticket: str  # the ticket's id, cited in every reason the plan writes on the cluster
    scheduler: Scheduler
    node: str
    job: str | None = None  # the job to resubmit, when the ticket names one
    root_cause: str
    confidence: float
    set_size: int  # causes in the suggestion's prediction set (1: the engine is sure of the cause)
    reason: str  # the drain reason / taint value written on the cluster: cites the ticket
    steps: list[Step]
    note: str = ""  # what the plan leaves to a person (no job named, a network flap seen once ...)
    outcome: str | None = None  # what pmkb did with it unattended (the bot, when its policy allows), said in the ticket


class Policy(BaseModel):
    """When a plan may run unattended (``pmkb remediate --apply``, and the bot)."""

    model_config = ConfigDict(extra="forbid")

    causes: list[str] = Field(default_factory=list)  # root causes that may act unattended
    min_confidence: float = Field(0.8, ge=0, le=1)  # least root-cause confidence ...
    or_set_of_one: bool = True  # ... or a prediction set holding that cause alone
    max_drains_per_hour: int = Field(2, ge=0)
    max_partition_share: float = Field(0.1, gt=0, le=1)  # never drain more of a partition / node pool
    network_causes: list[str] = Field(default_factory=lambda: ["infiniband_failure", "network_switch_cable",
                                                                "nic_failure"])
    network_repeats: int = Field(2, ge=1)  # a network cause acts only after this many tickets on the node ...
    network_window_minutes: float = Field(5.0, gt=0)  # ... within this window
    bot_may_act: bool = False  # the webhook bot applies allowed plans itself


def load_policy(path: Path, cause_ids: list[str]) -> Policy:
    """Read a policy file (YAML), refusing unknown fields and causes by name."""
    try:
        raw = yamlsafe.load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RemediationError(f"cannot read the remediation policy {path}: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RemediationError(f"{path}: a remediation policy is a mapping (see docs/remediation.md)")
    try:
        policy = Policy.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RemediationError(f"{path}: {problems}") from None
    named = [*policy.causes, *(policy.network_causes if "network_causes" in raw else [])]
    unknown = [c for c in named if c not in cause_ids]
    if unknown:
        raise RemediationError(f"{path}: unknown root cause(s) {', '.join(unknown)}; see `pmkb taxonomy`")
    return policy


_JOB_FIELD = re.compile(r"\b(?:SLURM_JOB_ID|JobId)=(\d{1,12})\b", re.I)
# "job 7" is too often a count; the gaps are bounded so a long run of spaces cannot make it backtrack
_JOB_WORD = re.compile(r"\bjob(?:[ _-]?id)?[ \t]{0,3}[:#=]?[ \t]{0,3}(\d{2,12})\b", re.I)


def find_job(text: str) -> str | None:
    """The Slurm job id a ticket names ("JobId=4411", "SLURM_JOB_ID=4411", "job 4411"), or None."""
    match = _JOB_FIELD.search(text) or _JOB_WORD.search(text)
    return match.group(1) if match else None
