"""Running a remediation plan on a cluster, with its audit log, and undoing it.

``SlurmCluster`` runs the plan's ``scontrol`` lines and reads node and partition state with
``scontrol show node`` and ``sinfo``; ``KubernetesCluster`` makes the plan's calls through the
official ``kubernetes`` client. Every plan considered, every step run (or refused) and its outcome
go to the audit log, a JSONL file beside the knowledge base, which also answers the policy's
questions (drains in the last hour, earlier tickets on the node) and what ``--undo`` reverses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from kb.core.remediation import Policy, RemediationError, RemediationPlan, Step
from kb.engine.remediate import TAINT_KEY, Decision, decide
from kb.tickets.outbox import append_whole_line

AUDIT_FILE = "remediation_audit.jsonl"
"""The audit log, under the knowledge-base home."""
TAKES_OUT = ("drain", "cordon")


class Cluster(Protocol):
    """What a plan needs of a scheduler."""

    def run(self, step: Step, undo: bool = False) -> str: ...
    def node_drained(self, node: str) -> bool: ...
    def partition(self, node: str) -> tuple[int | None, int]: ...


class SlurmCluster:
    """A Slurm cluster reached through its command-line tools on this host."""

    def __init__(self, timeout: float = 30.0):
        missing = [tool for tool in ("scontrol", "sinfo") if shutil.which(tool) is None]
        if missing:
            raise RemediationError(f"{', '.join(missing)} not found on PATH: run pmkb remediate where the Slurm "
                                   f"client tools are installed and configured")
        self.timeout = timeout

    def _call(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise RemediationError(f"`{' '.join(argv)}` took over {self.timeout:g} s: is slurmctld up?") from None
        if done.returncode != 0:
            raise RemediationError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout.strip()

    def run(self, step: Step, undo: bool = False) -> str:
        argv = step.undo_argv if undo else step.argv
        if not argv:
            raise RemediationError(f"the step {step.action!r} cannot be undone")
        try:
            out = self._call(argv) or "ok"
        except RemediationError as exc:
            if undo and step.action == "exclude_node" and "no longer pending" in str(exc):
                return "the job has started elsewhere: its exclusion no longer matters"
            raise
        if step.action == "requeue" and not undo:  # done once the job is pending again (its old run ended)
            return self._wait_pending(argv[-1])
        return out

    def _wait_pending(self, job: str, timeout: float = 120.0, poll: float = 0.5) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self._call(["squeue", "-h", "-j", job, "-o", "%T"])
            if state == "PENDING":
                return f"job {job} is pending again"
            if time.monotonic() > deadline:
                raise RemediationError(f"job {job} was requeued but is {state or 'gone'} after {timeout:g} s: check "
                                       f"`scontrol show job {job}`")
            time.sleep(poll)

    def node_fields(self, node: str) -> dict[str, str]:
        """``scontrol show node -o NODE`` as a mapping (State, Partitions, Reason ...)."""
        line = self._call(["scontrol", "show", "node", "-o", node])
        fields = {}
        for part in line.split(" "):
            key, sep, value = part.partition("=")
            if sep and key:
                fields[key] = value
        return fields

    def node_drained(self, node: str) -> bool:
        return "DRAIN" in self.node_fields(node).get("State", "").upper()

    def partition(self, node: str) -> tuple[int | None, int]:
        """(nodes in the node's partitions, how many of them are drained or down)."""
        partitions = self.node_fields(node).get("Partitions", "")
        if not partitions or partitions == "(null)":
            return None, 0
        lines = self._call(["sinfo", "-h", "-N", "-p", partitions, "-o", "%N %t"]).splitlines()
        states = {}
        for line in lines:
            name, _, state = line.partition(" ")
            states[name] = state.strip().lower()
        out = sum(s.startswith(("drain", "drng", "down")) for s in states.values())
        return len(states), out


POOL_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool",
               "kubernetes.azure.com/agentpool", "agentpool", "node.kubernetes.io/instance-type")
"""Node labels naming a node pool, first found wins; without one, the pool is the whole cluster."""


class KubernetesCluster:
    """A Kubernetes cluster through the official client (``kubernetes.client``)."""

    def __init__(self, api_client=None):
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise RemediationError(f"no Kubernetes configuration: {exc} (set KUBECONFIG, or run in the "
                                           f"cluster with a service account)") from None
            api_client = client.ApiClient()
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def run(self, step: Step, undo: bool = False) -> str:
        args = step.undo_args if undo else step.args
        if undo and not step.undo_call:
            raise RemediationError(f"the step {step.action!r} cannot be undone")
        if step.action == "cordon":
            self.core.patch_node(args["name"], args["body"])
        elif step.action == "taint":
            node = self.core.read_node(args["name"])
            taints = [t.to_dict() for t in (node.spec.taints or []) if t.key != TAINT_KEY]
            taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
            if not undo:
                taints.append(args["add_taint"])
            self.core.patch_node(args["name"], {"spec": {"taints": taints}})
        elif step.action == "recreate_pods":
            return self._recreate(args)
        else:
            raise RemediationError(f"a Kubernetes plan has no step {step.action!r}")
        return "ok"

    def _recreate(self, args: dict) -> str:
        name, namespace, node, affinity = args["name"], args["namespace"], args["node"], args["affinity"]
        if args["kind"] == "Job":  # a suspended Job's pod scheduling may change; suspending removes its pods
            self.batch.patch_namespaced_job(name, namespace, {"spec": {"suspend": True}})
            self.batch.patch_namespaced_job(name, namespace, {"spec": {"template": {"spec": {"affinity": affinity}}}})
            self.batch.patch_namespaced_job(name, namespace, {"spec": {"suspend": False}})
            return f"Job {namespace}/{name} suspended, given the anti-affinity and resumed"
        job = self.custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name)
        replicas = {kind: {"template": {"spec": {"affinity": affinity}}}
                    for kind in job.get("spec", {}).get("pytorchReplicaSpecs", {})}
        self.custom.patch_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name,
                                                   {"spec": {"pytorchReplicaSpecs": replicas}})
        pods = self.core.list_namespaced_pod(namespace, label_selector=f"training.kubeflow.org/job-name={name}",
                                             field_selector=f"spec.nodeName={node}")
        for pod in pods.items:
            self.core.delete_namespaced_pod(pod.metadata.name, namespace)
        return f"PyTorchJob {namespace}/{name} given the anti-affinity; {len(pods.items)} pod(s) on {node} deleted"

    def node_drained(self, node: str) -> bool:
        spec = self.core.read_node(node).spec
        return bool(spec.unschedulable) or any(t.key == TAINT_KEY for t in spec.taints or [])

    def partition(self, node: str) -> tuple[int | None, int]:
        """(nodes in the node's pool, how many of them are cordoned)."""
        labels = self.core.read_node(node).metadata.labels or {}
        key = next((k for k in POOL_LABELS if k in labels), None)
        selector = f"{key}={labels[key]}" if key else None
        nodes = self.core.list_node(label_selector=selector).items
        return len(nodes), sum(bool(n.spec.unschedulable) for n in nodes)


class AuditLog:
    """The JSONL audit log: one line per plan considered and per step run, refused or undone."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, **record) -> None:
        """Append one record, whole or not at all (owner-only file)."""
        record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **record}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_whole_line(self.path, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))

    def plan(self, plan: RemediationPlan, actor: str, dry_run: bool, decision: Decision | None) -> None:
        """Record a plan considered (and the policy's decision, when one was taken)."""
        self.write(event="plan", ticket=plan.ticket, node=plan.node, job=plan.job, root_cause=plan.root_cause,
                   confidence=plan.confidence, scheduler=plan.scheduler, actor=actor, dry_run=dry_run,
                   allowed=decision.allowed if decision else None, reasons=decision.reasons if decision else [])

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    raise RemediationError(f"{self.path}: line {number} is not JSON; move the file aside to "
                                           f"start a new log") from None
        return out

    def drains(self, records: list[dict] | None = None) -> list[datetime]:
        """When steps that took a node out ran (over ``records`` when the caller has read them)."""
        return [datetime.fromisoformat(r["at"]) for r in (self.records() if records is None else records)
                if r.get("event") == "step" and r.get("action") in TAKES_OUT and r.get("outcome") == "done"]

    def node_tickets(self, node: str, cause: str, records: list[dict] | None = None) -> list[datetime]:
        """When plans for this node and cause were considered (one per ticket)."""
        seen = {}
        for r in self.records() if records is None else records:
            if r.get("event") == "plan" and r.get("node") == node and r.get("root_cause") == cause:
                seen.setdefault(r["ticket"], datetime.fromisoformat(r["at"]))
        return list(seen.values())

    def applied(self, ticket: str) -> list[dict]:
        """The steps done for a ticket and not undone yet, latest first."""
        done = []
        for r in self.records():
            if r.get("ticket") != ticket or r.get("event") not in ("step", "undo"):
                continue
            if r["event"] == "step" and r.get("outcome") == "done":
                done.append(r)
            elif r["event"] == "undo" and r.get("outcome") == "done":
                done = [d for d in done if d["index"] != r["index"]]
        return list(reversed(done))


def check(plan: RemediationPlan, policy: Policy, cluster: Cluster, audit: AuditLog) -> Decision:
    """The policy's decision for a plan on this cluster, now."""
    size, out = cluster.partition(plan.node)
    now, records = datetime.now(timezone.utc), audit.records()
    return decide(plan, policy, audit.drains(records), size, out, cluster.node_drained(plan.node),
                  [*audit.node_tickets(plan.node, plan.root_cause, records), now], now)


def apply(plan: RemediationPlan, cluster: Cluster, audit: AuditLog, decision: Decision, actor: str,
          progress: Callable[[str], None] = lambda line: None) -> bool:
    """Run a plan's steps in order (stopping at the first failure), each written to the audit log;
    True when every step ran."""
    if not decision.allowed:
        audit.write(event="refused", ticket=plan.ticket, node=plan.node, actor=actor, reasons=decision.reasons)
        return False
    for index, step in enumerate(plan.steps):
        try:
            result = cluster.run(step)
        except Exception as exc:  # noqa: BLE001 - recorded, reported, and the plan stops here
            audit.write(event="step", ticket=plan.ticket, node=plan.node, index=index, action=step.action,
                        command=step.shown(), actor=actor, outcome="failed", error=str(exc)[:500],
                        step=step.model_dump())
            progress(f"FAILED {step.summary}: {exc}")
            return False
        audit.write(event="step", ticket=plan.ticket, node=plan.node, index=index, action=step.action,
                    command=step.shown(), actor=actor, outcome="done", result=result[:500], step=step.model_dump())
        progress(f"done   {step.summary}")
    return True


def undo(ticket: str, cluster: Cluster, audit: AuditLog, actor: str,
         progress: Callable[[str], None] = lambda line: None) -> int:
    """Reverse the steps done for a ticket, latest first (a step that cannot be undone is said and
    skipped); the number undone."""
    applied = [(r, Step.model_validate(r["step"])) for r in audit.applied(ticket)]
    if not any(step.undo_argv or step.undo_call for _, step in applied):
        raise RemediationError(f"nothing applied for ticket {ticket!r} is left to undo (see {audit.path})")
    undone = 0
    for record, step in applied:
        if not (step.undo_argv or step.undo_call):
            progress(f"kept   {step.summary} (cannot be undone)")
            continue
        try:
            cluster.run(step, undo=True)
        except Exception as exc:  # noqa: BLE001 - recorded and reported; the other steps are still undone
            audit.write(event="undo", ticket=ticket, index=record["index"], action=step.action, actor=actor,
                        outcome="failed", error=str(exc)[:500])
            progress(f"FAILED to undo {step.summary}: {exc}")
            continue
        audit.write(event="undo", ticket=ticket, index=record["index"], action=step.action, actor=actor,
                    outcome="done")
        progress(f"undone {step.summary}")
        undone += 1
    return undone


def act_unattended(plan: RemediationPlan, policy: Policy, cluster: Cluster, audit: AuditLog,
                   actor: str) -> RemediationPlan:
    """Run a plan without a person when the policy allows it; the plan with what happened in
    ``outcome`` (which the bot writes in the ticket)."""
    try:
        decision = check(plan, policy, cluster, audit)
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster means no action, said in the ticket
        audit.write(event="refused", ticket=plan.ticket, node=plan.node, actor=actor,
                    reasons=[f"cluster state unreadable: {exc}"])
        return plan.model_copy(update={"outcome": f"not run: the cluster's state could not be read ({exc})"})
    audit.plan(plan, actor, dry_run=False, decision=decision)
    if not decision.allowed:
        apply(plan, cluster, audit, decision, actor)  # records the refusal
        return plan.model_copy(update={"outcome": "not run: " + "; ".join(decision.reasons)})
    if apply(plan, cluster, audit, decision, actor):
        done = "; ".join(step.summary for step in plan.steps)
        return plan.model_copy(update={"outcome": f"run by pmkb under the team's policy: {done} (undo: pmkb "
                                                  f"remediate --scheduler {plan.scheduler} --undo {plan.ticket})"})
    return plan.model_copy(update={"outcome": f"failed part-way (see {audit.path.name}); undo what ran: pmkb "
                                              f"remediate --scheduler {plan.scheduler} --undo {plan.ticket}"})
