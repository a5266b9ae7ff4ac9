"""``pmkb remediate``: take a ticket's suspect node out and resubmit its job without it.

Dry run by default: prints the plan and what each step would change (and, with a policy, whether
``--apply`` would act). ``--apply`` runs the plan only when the policy allows it; ``--undo TICKET``
reverses what was applied for a ticket. Every plan, step and outcome goes to the audit log.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Optional

import typer


def _policy(path: Optional[Path], taxonomy_path: Path):
    from kb.core.remediation import RemediationError, load_policy
    from kb.core.taxonomy import load_taxonomy
    from pmkb.cli import fail

    if path is None:
        return None
    try:
        return load_policy(path, load_taxonomy(taxonomy_path).cause_ids)
    except RemediationError as exc:
        fail(str(exc))


def _cluster(scheduler: str):
    from kb.core.remediation import RemediationError
    from kb.jobs.remediate import KubernetesCluster, SlurmCluster
    from pmkb.cli import fail

    try:
        return SlurmCluster() if scheduler == "slurm" else KubernetesCluster()
    except RemediationError as exc:
        fail(str(exc))


def render_plan(plan, decision=None) -> str:
    """The plan as a person reads it: each step, the command, what it changes, how to undo it."""
    job = f", job {plan.job}" if plan.job else ""
    lines = [f"remediation plan for {plan.ticket} on {plan.scheduler}: {plan.root_cause} at {plan.confidence:.0%}"
             f" (prediction set of {plan.set_size}), suspect node {plan.node}{job}"]
    for n, step in enumerate(plan.steps, 1):
        lines.append(f"  {n}. {step.summary}")
        lines.append(f"     $ {step.shown()}")
        lines.append(f"     changes: {step.changes}")
        undo = " ".join(step.undo_argv) if step.undo_argv else step.undo_call
        lines.append(f"     undo: {undo or 'not reversible'}")
    if plan.note:
        lines.append(f"  note: {plan.note}")
    if decision is not None:
        verdict = "would act" if decision.allowed else "would NOT act"
        lines.append(f"policy: --apply {verdict}: " + "; ".join(decision.reasons))
    return "\n".join(lines)


def remediate(
    text: Optional[str] = typer.Argument(None, help="Ticket text (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the ticket text from a file."),
    title: str = typer.Option("", "--title", help="Ticket title."),
    ticket_id: str = typer.Option("ticket", "--id", help="The ticket's key: cited in the drain reason or taint."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="slurm | kubernetes (default: "
                                            "PMKB_SCHEDULER)."),
    job: Optional[str] = typer.Option(None, "--job", help="The job to resubmit (default: the Slurm job id the "
                                      "ticket names). Kubernetes: the Job or PyTorchJob name."),
    namespace: str = typer.Option("default", "--namespace", help="Kubernetes namespace of the job."),
    kind: str = typer.Option("Job", "--kind", help="Kubernetes: Job | PyTorchJob."),
    apply_plan: bool = typer.Option(False, "--apply", help="Run the plan, if the policy allows it."),
    policy_path: Optional[Path] = typer.Option(None, "--policy", help="Policy file (default: "
                                               "PMKB_REMEDIATION_POLICY); --apply needs one."),
    undo_ticket: Optional[str] = typer.Option(None, "--undo", metavar="TICKET",
                                              help="Reverse what was applied for this ticket, latest first."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan (and the decision) as JSON."),
) -> None:
    """Plan, and with --apply run, draining the suspect node and resubmitting the job without it."""
    from kb.core.remediation import SCHEDULERS, RemediationError
    from kb.jobs.remediate import AUDIT_FILE, AuditLog, apply, check, undo
    from pmkb.cli import echo_err, fail, settings

    cfg = settings()
    scheduler = scheduler or cfg.scheduler
    if scheduler not in SCHEDULERS:
        fail(f"give --scheduler {' or '.join(SCHEDULERS)} (or set PMKB_SCHEDULER)")
    if kind not in ("Job", "PyTorchJob"):
        fail(f"--kind {kind!r} is not supported: Job or PyTorchJob")
    audit = AuditLog(cfg.home / AUDIT_FILE)
    actor = f"pmkb remediate ({getpass.getuser()})"
    if undo_ticket is not None:
        try:
            count = undo(undo_ticket, _cluster(scheduler), audit, actor, progress=echo_err)
        except RemediationError as exc:
            fail(str(exc))
        typer.echo(f"undid {count} step(s) for {undo_ticket}; audit log: {audit.path}")
        return
    plan = _plan(text, file, title, ticket_id, scheduler, job, namespace, kind)
    policy = _policy(policy_path or cfg.remediation_policy, cfg.taxonomy)
    if apply_plan and policy is None:
        fail("--apply needs a policy: --policy FILE or PMKB_REMEDIATION_POLICY (docs/remediation.md)")
    decision = None
    cluster = _cluster(scheduler) if apply_plan or policy is not None else None
    try:
        if policy is not None:
            decision = check(plan, policy, cluster, audit)
    except RemediationError as exc:
        if apply_plan:
            fail(f"the cluster's state could not be read, nothing was changed: {exc}")
        echo_err(f"policy not checked: {exc}")
    audit.plan(plan, actor, dry_run=not apply_plan, decision=decision)
    if json_out:
        typer.echo(json.dumps({"plan": plan.model_dump(), "decision": decision._asdict() if decision else None},
                              indent=2))
    else:
        typer.echo(render_plan(plan, decision))
    if not apply_plan:
        if not json_out:
            typer.echo("dry run: nothing was changed (--apply runs it when the policy allows)")
        return
    if not apply(plan, cluster, audit, decision, actor, progress=echo_err):
        fail("not applied: " + ("; ".join(decision.reasons) if not decision.allowed else
                                f"a step failed (see above); undo what ran with --undo {plan.ticket}"), code=1)
    typer.echo(f"applied; audit log: {audit.path} (undo: pmkb remediate --scheduler {scheduler} --undo {plan.ticket})")


def _plan(text, file, title, ticket_id, scheduler, job, namespace, kind):
    from kb.core.suggestion import EmptyTicket, Ticket
    from kb.engine.remediate import no_plan_reason, plan_for
    from kb.llm.suggester import make_suggester
    from pmkb.cli import fail, open_engine, read_ticket_text

    text = read_ticket_text(text, file, title)
    try:
        suggester = make_suggester(open_engine(read_only=True))
        suggestion = suggester.suggest(Ticket(id=ticket_id, title=title, description=text))
    except EmptyTicket as exc:
        fail(str(exc))
    plan = plan_for(suggestion, scheduler, f"{title}\n{text}", job=job, namespace=namespace, kind=kind)
    if plan is None:
        fail(no_plan_reason(suggestion), code=1)
    return plan


def register(app: typer.Typer) -> None:
    app.command()(remediate)
