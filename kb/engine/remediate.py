"""From a suggestion to a remediation plan, and whether a policy lets it run unattended.

A plan is made only for a retry-safe suggestion that names a suspect node: take the node out
(Slurm: drain it; Kubernetes: cordon and taint it), then resubmit the job without it (Slurm:
requeue the job and exclude the node; Kubernetes: give the job's pods a node anti-affinity and
let them be recreated). The drain reason and the taint cite the ticket, so whoever finds the node
drained can trace why.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import NamedTuple

from kb.core.remediation import Policy, RemediationPlan, Step, find_job
from kb.core.suggestion import Suggestion

TAINT_KEY = "pmkb.io/suspect"
"""The taint pmkb puts on a suspect Kubernetes node (NoSchedule); its value is the ticket."""
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def _label_value(text: str) -> str:
    """``text`` as a Kubernetes label value (63 characters of [A-Za-z0-9_.-], alphanumeric ends)."""
    return _LABEL_VALUE.sub("-", text)[:63].strip("-_.") or "ticket"


def plan_for(suggestion: Suggestion, scheduler: str, text: str = "", job: str | None = None,
             namespace: str = "default", kind: str = "Job") -> RemediationPlan | None:
    """The plan for a suggestion on this scheduler; None unless it is retry-safe with a suspect node.

    ``text`` is the ticket's text, read for the job it names (Slurm job id) when ``job`` is not given;
    on Kubernetes ``job`` is the Job or PyTorchJob name in ``namespace`` (``kind``).
    """
    node = (suggestion.suspect or {}).get("node")
    if not suggestion.retry_safe or not node or suggestion.abstained:
        return None
    if scheduler == "slurm" and job is None:
        job = find_job(text)
    reason = f"pmkb {suggestion.id}: {suggestion.root_cause} ({suggestion.root_cause_confidence:.0%})"
    steps = _slurm_steps(node, job, reason) if scheduler == "slurm" else _kubernetes_steps(
        node, job, namespace, kind, suggestion.id)
    note = "" if job else ("No job is named in the ticket: the node is taken out; resubmit the job yourself "
                           "(or give the job to `pmkb remediate --job`).")
    return RemediationPlan(ticket=suggestion.id, scheduler=scheduler, node=node, job=job,
                           root_cause=suggestion.root_cause, confidence=suggestion.root_cause_confidence,
                           set_size=len(suggestion.root_cause_set) or len(suggestion.root_cause_candidates),
                           reason=reason, steps=steps, note=note)


def no_plan_reason(suggestion: Suggestion) -> str:
    """Why ``plan_for`` made no plan for this suggestion, for a person."""
    node = (suggestion.suspect or {}).get("node")
    why = ("pmkb is not sure of the cause" if suggestion.abstained else
           f"{suggestion.root_cause} is not retry-safe" if not suggestion.retry_safe else "the ticket names no node")
    return (f"no remediation plan: {why} (root cause {suggestion.root_cause} at "
            f"{suggestion.root_cause_confidence:.0%}, suspect node {node or 'none'})")


def _slurm_steps(node: str, job: str | None, reason: str) -> list[Step]:
    steps = [Step(action="drain", summary=f"Drain {node}: no new jobs start there; running ones finish",
                  changes=f"{node} goes to DRAIN with the reason {reason!r}",
                  argv=["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
                  undo_argv=["scontrol", "update", f"NodeName={node}", "State=RESUME"])]
    if job:
        steps += [
            Step(action="requeue", summary=f"Requeue job {job}: it goes back to pending and runs again",
                 changes=f"job {job} is requeued (what it had done is kept only by its own checkpoints)",
                 argv=["scontrol", "requeue", job]),
            Step(action="exclude_node", summary=f"Keep job {job} off {node} and let it start now",
                 changes=f"job {job} gets ExcNodeList={node} and may start at once (no requeue delay)",
                 argv=["scontrol", "update", f"JobId={job}", f"ExcNodeList={node}", "StartTime=now"],
                 undo_argv=["scontrol", "update", f"JobId={job}", "ExcNodeList="]),
        ]
    return steps


def _kubernetes_steps(node: str, job: str | None, namespace: str, kind: str, ticket: str) -> list[Step]:
    taint = {"key": TAINT_KEY, "value": _label_value(ticket), "effect": "NoSchedule"}
    steps = [
        Step(action="cordon", summary=f"Cordon {node}: no new pods are scheduled there",
             changes=f"node {node} spec.unschedulable becomes true",
             call="CoreV1Api.patch_node", args={"name": node, "body": {"spec": {"unschedulable": True}}},
             undo_call="CoreV1Api.patch_node", undo_args={"name": node, "body": {"spec": {"unschedulable": False}}}),
        Step(action="taint", summary=f"Taint {node} {TAINT_KEY}={taint['value']}:NoSchedule (cites the ticket)",
             changes=f"node {node} gains the taint {TAINT_KEY}:NoSchedule (other taints kept)",
             call="CoreV1Api.patch_node", args={"name": node, "add_taint": taint},
             undo_call="CoreV1Api.patch_node", undo_args={"name": node, "remove_taint": TAINT_KEY}),
    ]
    if job:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}]}]}}}
        steps.append(Step(
            action="recreate_pods", summary=f"Recreate the pods of {kind} {namespace}/{job} away from {node}",
            changes=(f"{kind} {namespace}/{job} gets a node anti-affinity to {node} in its pod template(s), and its "
                     f"pods on {node} are deleted so they are recreated elsewhere"),
            call=("BatchV1Api.patch_namespaced_job" if kind == "Job"
                  else "CustomObjectsApi.patch_namespaced_custom_object"),
            args={"kind": kind, "name": job, "namespace": namespace, "node": node, "affinity": affinity}))
    return steps


class Decision(NamedTuple):
    """Whether a plan may run unattended, and why (or why not)."""

    allowed: bool
    reasons: list[str]


def decide(plan: RemediationPlan, policy: Policy, drains: list[datetime], partition_size: int | None,
           partition_drained: int, node_drained: bool, node_tickets: list[datetime], now: datetime) -> Decision:
    """Check a plan against the policy.

    ``drains``: when this policy's earlier drains ran (the audit log); ``partition_size`` and
    ``partition_drained``: nodes in the suspect node's partition or pool, and how many are drained
    already (None: unknown, which refuses); ``node_drained``: the node is drained already (left
    alone); ``node_tickets``: when tickets named this node with this cause (for network causes).
    """
    refused = []
    if plan.root_cause not in policy.causes:
        refused.append(f"{plan.root_cause} may not act unattended (policy causes: "
                       f"{', '.join(policy.causes) or 'none'})")
    sure = plan.confidence >= policy.min_confidence or (policy.or_set_of_one and plan.set_size == 1)
    if not sure:
        refused.append(f"confidence {plan.confidence:.0%} is below {policy.min_confidence:.0%} and the prediction "
                       f"set holds {plan.set_size} causes")
    if node_drained:
        refused.append(f"{plan.node} is drained already: left alone")
    recent = [t for t in drains if now - t < timedelta(hours=1)]
    if len(recent) >= policy.max_drains_per_hour:
        refused.append(f"{len(recent)} drains in the last hour (policy: at most {policy.max_drains_per_hour})")
    if partition_size is None:
        refused.append(f"the size of {plan.node}'s partition or node pool is unknown")
    elif (partition_drained + 1) / partition_size > policy.max_partition_share:
        refused.append(f"draining {plan.node} would take {partition_drained + 1} of {partition_size} nodes out "
                       f"(policy: at most {policy.max_partition_share:.0%})")
    if plan.root_cause in policy.network_causes:
        window = timedelta(minutes=policy.network_window_minutes)
        repeats = [t for t in node_tickets if now - t <= window]
        if len(repeats) < policy.network_repeats:
            refused.append(f"a network cause acts after {policy.network_repeats} tickets on {plan.node} within "
                           f"{policy.network_window_minutes:g} min; seen {len(repeats)}")
    if refused:
        return Decision(False, refused)
    return Decision(True, [f"{plan.root_cause} at {plan.confidence:.0%} is allowed by the policy"])
