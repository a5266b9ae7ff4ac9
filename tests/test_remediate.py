"""Remediation plans (kb.engine.remediate), the policy, the audit log and undo (kb.jobs.remediate),
the Kubernetes steps through the official client against a loopback API server, and
``pmkb remediate`` on a real single-host Slurm cluster (tests/slurm_cluster.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest
from test_server import kb_home  # noqa: F401 - a fixture

from kb.core.remediation import Policy, RemediationError, Step, find_job, load_policy
from kb.core.suggestion import Ticket
from kb.engine.remediate import TAINT_KEY, decide, plan_for
from kb.engine.suggest import SuggestionEngine
from kb.jobs.remediate import AuditLog, KubernetesCluster, apply, undo
from tests.conftest import ROOT, command_env

XID = Ticket(id="OPS-7", title="job 4411 died on gpu-a17",
             description="Training job 4411 crashed at step 12000. dmesg on gpu-a17: NVRM: Xid (PCI:0000:3b:00): 79, "
                         "pid=1234, GPU has fallen off the bus. nvidia-smi shows 7 GPUs.")
USER_BUG = Ticket(id="OPS-8", title="import error",
                  description="My job fails at start: ModuleNotFoundError: No module named 'apex' in my image.")


@pytest.fixture(scope="module")
def engine(shared_bundled_kb):
    return SuggestionEngine(shared_bundled_kb)


@pytest.fixture(scope="module")
def xid(engine):
    return engine.suggest(XID)


def test_a_retry_safe_ticket_with_a_node_gets_a_slurm_plan_citing_the_ticket(xid):
    plan = plan_for(xid, "slurm", XID.text())
    assert plan is not None and plan.node == "gpu-a17" and plan.job == "4411" and plan.ticket == "OPS-7"
    assert [s.action for s in plan.steps] == ["drain", "requeue", "exclude_node"]
    drain = plan.steps[0]
    assert drain.argv[:4] == ["scontrol", "update", "NodeName=gpu-a17", "State=DRAIN"]
    assert drain.argv[4] == f"Reason={plan.reason}" and "OPS-7" in plan.reason and xid.root_cause in plan.reason
    assert drain.undo_argv == ["scontrol", "update", "NodeName=gpu-a17", "State=RESUME"]
    assert plan.steps[1].argv == ["scontrol", "requeue", "4411"] and plan.steps[1].undo_argv == []
    assert "ExcNodeList=gpu-a17" in plan.steps[2].argv


def test_a_kubernetes_plan_cordons_taints_and_moves_the_pods(xid):
    plan = plan_for(xid, "kubernetes", job="train-llm", namespace="ml", kind="PyTorchJob")
    assert [s.action for s in plan.steps] == ["cordon", "taint", "recreate_pods"]
    assert plan.steps[0].args == {"name": "gpu-a17", "body": {"spec": {"unschedulable": True}}}
    assert plan.steps[1].args["add_taint"] == {"key": TAINT_KEY, "value": "OPS-7", "effect": "NoSchedule"}
    affinity = plan.steps[2].args["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a17"]}


def test_no_plan_for_a_user_bug_or_a_ticket_without_a_node(engine, xid):
    assert plan_for(engine.suggest(USER_BUG), "slurm", USER_BUG.text()) is None
    nameless = xid.model_copy(update={"suspect": None})
    assert plan_for(nameless, "slurm") is None


@pytest.mark.parametrize("text, job", [("job 4411 failed", "4411"), ("JobId=98765 State=FAILED", "98765"),
                                       ("SLURM_JOB_ID=321 on gpu-a1", "321"), ("step 12000 crashed", None),
                                       ("JobId=7 JobState=FAILED", "7"), ("my job 3 times in a row", None)])
def test_the_job_a_ticket_names(text, job):
    assert find_job(text) == job


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _decide(plan, policy, drains=(), size=40, out=0, drained=False, tickets=(NOW,)):
    return decide(plan, policy, list(drains), size, out, drained, list(tickets), NOW)


def test_the_policy_allows_only_listed_causes_sure_enough_within_its_rates(xid):
    plan = plan_for(xid, "slurm", XID.text()).model_copy(update={"confidence": 0.9, "set_size": 3})
    allowed = Policy(causes=[plan.root_cause], min_confidence=0.8)
    assert _decide(plan, allowed).allowed
    refusals = {
        "may not act unattended": (Policy(causes=["buggy_code"]), {}),
        "below 95%": (Policy(causes=[plan.root_cause], min_confidence=0.95), {}),
        "drained already": (allowed, {"drained": True}),
        "2 drains in the last hour": (allowed, {"drains": [NOW - timedelta(minutes=m) for m in (5, 50)]}),
        "would take 5 of 40 nodes": (allowed, {"out": 4}),
        "partition or node pool is unknown": (allowed, {"size": None}),
    }
    for reason, (policy, kw) in refusals.items():
        decision = _decide(plan, policy, **kw)
        assert not decision.allowed and any(reason in r for r in decision.reasons), (reason, decision)
    old_drains = [NOW - timedelta(hours=2)] * 5
    assert _decide(plan, allowed, drains=old_drains).allowed
    set_of_one = plan.model_copy(update={"confidence": 0.5, "set_size": 1})
    assert _decide(set_of_one, allowed).allowed
    assert not _decide(set_of_one, allowed.model_copy(update={"or_set_of_one": False})).allowed


def test_a_network_cause_acts_only_when_it_repeats_within_the_window(xid):
    plan = plan_for(xid, "slurm", XID.text()).model_copy(update={"root_cause": "infiniband_failure",
                                                                 "confidence": 0.95})
    policy = Policy(causes=["infiniband_failure"])
    once = _decide(plan, policy, tickets=[NOW])
    assert not once.allowed and "seen 1" in once.reasons[0]
    assert _decide(plan, policy, tickets=[NOW - timedelta(minutes=3), NOW]).allowed
    assert not _decide(plan, policy, tickets=[NOW - timedelta(minutes=9), NOW]).allowed


def test_a_policy_file_is_refused_by_name_when_wrong(tmp_path, shared_bundled_kb):
    causes = shared_bundled_kb.taxonomy.cause_ids
    path = tmp_path / "policy.yaml"
    path.write_text("causes: [gpu_lost, gpu_memory_error]\nmin_confidence: 0.7\n")
    assert load_policy(path, causes).causes == ["gpu_lost", "gpu_memory_error"]
    for text, message in [("causes: [gpu_lots]\n", "unknown root cause(s) gpu_lots"),
                          ("max_drains_per_hr: 3\n", "max_drains_per_hr"),
                          ("network_causes: [wifi]\n", "unknown root cause(s) wifi"),
                          ("min_confidence: 2\n", "min_confidence"),
                          ("a: &x [1]\nb: *x\n", "aliases"), ("- 1\n", "is a mapping")]:
        path.write_text(text)
        with pytest.raises(RemediationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_policy(path, causes)


class FakeCluster:
    """Records the steps it is asked to run; fails the step named in ``fail``."""

    def __init__(self, fail: str | None = None):
        self.ran, self.fail = [], fail

    def run(self, step: Step, undo: bool = False) -> str:
        if step.action == self.fail and not undo:
            raise RemediationError("slurm_update error: Invalid node name specified")
        self.ran.append(("undo " if undo else "") + step.action)
        return "ok"


def test_apply_and_undo_are_audited_and_undo_reverses_in_reverse_order(xid, tmp_path):
    plan = plan_for(xid, "slurm", XID.text())
    audit, cluster = AuditLog(tmp_path / "audit.jsonl"), FakeCluster()
    from kb.engine.remediate import Decision

    assert apply(plan, cluster, audit, Decision(True, ["ok"]), "test")
    assert cluster.ran == ["drain", "requeue", "exclude_node"]
    assert stat.S_IMODE(os.stat(audit.path).st_mode) == 0o600
    assert len(audit.drains()) == 1
    lines = []
    assert undo("OPS-7", cluster, audit, "test", progress=lines.append) == 2
    assert cluster.ran[3:] == ["undo exclude_node", "undo drain"] and "cannot be undone" in lines[1]
    with pytest.raises(RemediationError, match="left to undo"):
        undo("OPS-7", cluster, audit, "test")
    failing = FakeCluster(fail="requeue")
    assert not apply(plan, failing, audit, Decision(True, ["ok"]), "test")
    assert failing.ran == ["drain"]
    last = json.loads(audit.path.read_text().splitlines()[-1])
    assert last["outcome"] == "failed" and "Invalid node name" in last["error"]
    refused = AuditLog(tmp_path / "refused.jsonl")
    assert not apply(plan, cluster, refused, Decision(False, ["no"]), "test")
    assert json.loads(refused.path.read_text())["event"] == "refused"


def test_a_corrupt_audit_log_is_named_with_its_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text('{"event": "plan"}\nnot json\n')
    with pytest.raises(RemediationError, match="line 2 is not JSON"):
        AuditLog(path).drains()


class FakeApiServer(BaseHTTPRequestHandler):
    """The Kubernetes API endpoints a plan uses, on loopback; records every request."""

    requests: list = []
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a17", "labels": {
        "kubernetes.io/hostname": "gpu-a17", "cloud.google.com/gke-nodepool": "a100"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-llm-worker-3", "namespace": "ml"},
           "spec": {"nodeName": "gpu-a17", "containers": [{"name": "pytorch", "image": "train:1"}]}}

    def log_message(self, *args):
        pass

    def _answer(self, body: dict, status: int = 200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append((self.command, self.path, self.headers.get("Content-Type"), body))
        return body

    def do_GET(self):
        self._record()
        if self.path.startswith("/api/v1/nodes/gpu-a17"):
            return self._answer(self.node)
        if self.path.startswith("/api/v1/nodes"):
            other = json.loads(json.dumps(self.node))
            other["metadata"]["name"], other["spec"] = "gpu-a18", {"unschedulable": True}
            return self._answer({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [self.node, other]})
        if "/pytorchjobs/" in self.path:
            return self._answer({"spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {}}}})
        if "/pods" in self.path:
            return self._answer({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [self.pod]})
        return self._answer({"kind": "Status", "code": 404}, 404)

    def do_PATCH(self):
        self._record()
        return self._answer(self.node if "/nodes/" in self.path else {"metadata": {"name": "x"}})

    def do_DELETE(self):  # a pod's deletion answers the pod, as the API server does
        self._record()
        return self._answer(self.pod)


@pytest.fixture
def kube():
    from kubernetes import client

    FakeApiServer.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield KubernetesCluster(client.ApiClient(config)), FakeApiServer.requests
    server.shutdown()


def test_kubernetes_steps_make_exactly_these_api_calls(xid, kube, tmp_path):
    from kb.engine.remediate import Decision

    cluster, requests = kube
    assert cluster.partition("gpu-a17") == (2, 1)
    assert unquote(requests[-1][1]) == "/api/v1/nodes?labelSelector=cloud.google.com/gke-nodepool=a100"
    assert cluster.node_drained("gpu-a17") is False
    requests.clear()
    plan = plan_for(xid, "kubernetes", job="train-llm", namespace="ml", kind="PyTorchJob")
    audit = AuditLog(tmp_path / "audit.jsonl")
    assert apply(plan, cluster, audit, Decision(True, ["ok"]), "test"), audit.path.read_text()
    calls = [(method, path.split("?")[0]) for method, path, _, _ in requests]
    assert calls == [
        ("PATCH", "/api/v1/nodes/gpu-a17"),
        ("GET", "/api/v1/nodes/gpu-a17"), ("PATCH", "/api/v1/nodes/gpu-a17"),
        ("GET", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train-llm"),
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train-llm"),
        ("GET", "/api/v1/namespaces/ml/pods"), ("DELETE", "/api/v1/namespaces/ml/pods/train-llm-worker-3")]
    assert requests[0][3] == {"spec": {"unschedulable": True}}
    assert requests[2][3]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": TAINT_KEY, "value": "OPS-7", "effect": "NoSchedule"}]  # the node's own taint is kept
    patched = requests[4][3]["spec"]["pytorchReplicaSpecs"]
    assert set(patched) == {"Master", "Worker"} and "nodeAffinity" in patched["Worker"]["template"]["spec"]["affinity"]
    assert "fieldSelector=spec.nodeName=gpu-a17" in unquote(requests[5][1])
    assert "labelSelector=training.kubeflow.org/job-name=train-llm" in unquote(requests[5][1])


def test_a_plain_job_is_suspended_given_the_anti_affinity_and_resumed(xid, kube, tmp_path):
    from kb.engine.remediate import Decision

    cluster, requests = kube
    plan = plan_for(xid, "kubernetes", job="train", namespace="ml", kind="Job")
    audit = AuditLog(tmp_path / "audit.jsonl")
    assert apply(plan, cluster, audit, Decision(True, ["ok"]), "test"), audit.path.read_text()
    job_calls = [(path, body) for method, path, _, body in requests if "/jobs/" in path]
    assert [p for p, _ in job_calls] == ["/apis/batch/v1/namespaces/ml/jobs/train"] * 3
    assert [b["spec"].get("suspend") for _, b in job_calls] == [True, None, False]
    assert "affinity" in job_calls[1][1]["spec"]["template"]["spec"]


def test_remediate_without_a_scheduler_or_with_apply_and_no_policy_says_what_to_give(tmp_path):
    env = command_env() | {"PMKB_HOME": str(tmp_path)}
    base = [sys.executable, "-m", "pmkb", "remediate", XID.description]
    done = subprocess.run(base, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--scheduler slurm or kubernetes" in done.stderr
    done = subprocess.run([*base, "--scheduler", "slurm", "--kind", "Deployment"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Job or PyTorchJob" in done.stderr


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from tests.slurm_cluster import SlurmTestCluster

    why = SlurmTestCluster.available()
    if why:
        pytest.skip(why)
    cluster = SlurmTestCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


def transcript(step: str, done: subprocess.CompletedProcess | None, slurm) -> None:
    """What a step printed and the cluster's state after it (shown with ``pytest -s``)."""
    print(f"\n### {step}")
    if done is not None:
        print(done.stdout.rstrip())
    print("$ sinfo -N -o '%N %t %E'\n" + slurm.run("sinfo", "-N", "-h", "-o", "%N %t %E").rstrip())
    print("$ squeue -o '%i %T %N'\n" + slurm.run("squeue", "-h", "-o", "%i %T %N").rstrip())


@pytest.mark.slow
@pytest.mark.slurm
def test_pmkb_remediate_drains_the_node_and_the_requeued_job_runs_elsewhere(slurm, _built_kb_dir, tmp_path):
    import shutil

    home = tmp_path / "kb"
    shutil.copytree(_built_kb_dir, home)
    job = slurm.run("sbatch", "--parsable", "-o", str(tmp_path / "job-%j.out"), "--wrap", "sleep 600")
    slurm.wait(lambda: slurm.job(job)[0] == "RUNNING", 60, f"job {job} to run")
    first = slurm.job(job)[1]
    other = next(n for n in ("gpu-a1", "gpu-a2") if n != first)
    policy = tmp_path / "policy.yaml"
    policy.write_text("causes: [gpu_lost]\nmin_confidence: 0.5\nmax_partition_share: 0.5\n")
    ticket = (f"Training crashed at step 12000 (JobId={job} JobState=FAILED). dmesg on {first}: NVRM: Xid "
              f"(PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus. nvidia-smi shows 7 GPUs.")
    env = command_env(slurm.env) | {"PMKB_HOME": str(home)}
    remediate = [sys.executable, "-m", "pmkb", "remediate", "--scheduler", "slurm", "--id", "OPS-7", ticket]

    dry = subprocess.run(remediate, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    transcript("pmkb remediate (dry run)", dry, slurm)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"$ scontrol update NodeName={first} State=DRAIN" in dry.stdout and "nothing was changed" in dry.stdout
    assert f"$ scontrol requeue {job}" in dry.stdout
    assert slurm.node_states()[first] == "alloc" and slurm.job(job) == ("RUNNING", first)

    applied = subprocess.run([*remediate, "--apply", "--policy", str(policy)], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    transcript("pmkb remediate --apply --policy policy.yaml", applied, slurm)
    assert applied.returncode == 0, applied.stdout + applied.stderr[-2000:] + slurm.log()
    assert "policy: --apply would act" in applied.stdout
    fields = slurm.run("scontrol", "show", "node", "-o", first)
    assert "DRAIN" in fields and "Reason=pmkb OPS-7: gpu_lost" in fields
    slurm.wait(lambda: slurm.job(job) == ("RUNNING", other), 90, f"job {job} to run on {other}")
    transcript("after the requeue", None, slurm)

    again = subprocess.run([*remediate, "--apply", "--policy", str(policy)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and f"{first} is drained already: left alone" in again.stdout + again.stderr

    undone = subprocess.run([sys.executable, "-m", "pmkb", "remediate", "--scheduler", "slurm", "--undo", "OPS-7"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    transcript("pmkb remediate --undo OPS-7", undone, slurm)
    assert undone.returncode == 0, undone.stderr
    slurm.wait(lambda: "DRAIN" not in slurm.run("scontrol", "show", "node", "-o", first), 30, "the node resumed")
    audit = [json.loads(line) for line in (home / "remediation_audit.jsonl").read_text().splitlines()]
    assert [r["event"] for r in audit] == ["plan", "plan", "step", "step", "step", "plan", "refused", "undo", "undo"]
    assert all(r["outcome"] == "done" for r in audit if r["event"] in ("step", "undo"))
    slurm.run("scancel", job)


class PolicyCluster(FakeCluster):
    """A fake cluster that also answers the policy's questions: 20 nodes in the partition, none out."""

    def node_drained(self, node: str) -> bool:
        return any(r == "drain" for r in self.ran)

    def partition(self, node: str) -> tuple[int | None, int]:
        return 20, 0


@pytest.mark.parametrize("bot_may_act", [True, False])
def test_the_bot_acts_only_when_its_policy_says_so_and_says_in_the_ticket_what_it_did(
        bot_may_act, kb_home, embedder, tmp_path):  # noqa: F811
    import shutil

    from fake_ticket_api import FakeTicketApi
    from test_server import GITHUB_SECRET, REPO, LiveServer, issues_event, post_github, wait_finished

    from kb.engine.knowledge import KnowledgeBase
    from pmkb.server import create_app
    from tests.conftest import make_settings

    home = tmp_path / "kb"
    shutil.copytree(kb_home, home)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"causes: [gpu_lost]\nmin_confidence: 0.5\nbot_may_act: {str(bot_may_act).lower()}\n")
    cluster = PolicyCluster()
    with FakeTicketApi() as api:
        settings = make_settings(home, github_webhook_secret=GITHUB_SECRET, github_api_url=api.url,
                                 github_token="t", queue_backoff=0.1, scheduler="slurm", remediation_policy=policy)
        app = create_app(settings, engine=SuggestionEngine(KnowledgeBase(settings, embedder=embedder)), poll=0.1)
        app.state.service.cluster_factory = lambda scheduler: cluster
        with LiveServer(app) as server:
            event = post_github(server.url, issues_event("opened", 12, XID.title, XID.description), "bot-1").json()
            assert wait_finished(server.service, event["event_id"], 120).status == "done"
            comment = api.comments[f"{REPO}#12"][-1]["body"]
    if bot_may_act:
        assert cluster.ran == ["drain", "requeue", "exclude_node"]
        assert "**Remediation** (slurm): run by pmkb under the team" in comment and "Drain gpu-a17" in comment
        audit = [json.loads(line) for line in (home / "remediation_audit.jsonl").read_text().splitlines()]
        assert {r["actor"] for r in audit} == {"pmkb serve"} and [r["event"] for r in audit][-3:] == ["step"] * 3
    else:
        assert cluster.ran == [] and not (home / "remediation_audit.jsonl").exists()
        assert "**Remediation plan** (slurm, not run" in comment and "scontrol update NodeName=gpu-a17" in comment


def test_the_terminal_card_and_both_comment_markups_show_the_plan(xid):
    from kb.tickets.writeback import render_comment
    from pmkb.cli import render_card

    shown = xid.model_copy(update={"remediation": plan_for(xid, "slurm", XID.text())})
    card = render_card(shown)
    assert "remediation plan (slurm; `pmkb remediate` runs it, dry run first):" in card
    assert "$ scontrol requeue 4411" in card
    github = render_comment(shown, False, "github")
    assert "**Remediation plan** (slurm, not run" in github and "`scontrol requeue 4411`" in github
    jira = render_comment(shown, False, "jira")
    assert "*Remediation plan* (slurm, not run" in jira and "{{scontrol requeue 4411}}" in jira
    done = shown.model_copy(update={"remediation": shown.remediation.model_copy(update={"outcome": "run by pmkb"})})
    assert "**Remediation** (slurm): run by pmkb" in render_comment(done, False, "github")
    assert "remediation plan" not in render_card(xid)  # no scheduler, no plan


def test_a_policy_the_bot_cannot_read_never_acts_and_says_why_in_the_log(tmp_path, embedder, caplog):
    import logging

    from kb.engine.knowledge import KnowledgeBase
    from pmkb.server import Service
    from tests.conftest import make_settings

    settings = make_settings(tmp_path / "kb", scheduler="slurm", remediation_policy=tmp_path / "missing.yaml")
    service = Service(settings, engine=SuggestionEngine(KnowledgeBase(settings, embedder=embedder)))
    service.cluster_factory = lambda scheduler: FakeCluster()
    with caplog.at_level(logging.ERROR):
        assert service.remediator() is None
    assert "the bot will not remediate: cannot read the remediation policy" in caplog.text
    (tmp_path / "policy.yaml").write_text("causes: [gpu_lost]\n")  # bot_may_act is false by default
    quiet = Service(settings.model_copy(update={"remediation_policy": tmp_path / "policy.yaml"}),
                    engine=service.engine)
    assert quiet.remediator() is None


@pytest.mark.parametrize("text", ["job" + " " * 65536 + "x", "job:" * 16384, "JobId=" + "9" * 65530,
                                  "SLURM_JOB_ID=" * 5000, ("job id " + "\t" * 30) * 1500])
def test_a_64_kib_ticket_built_to_backtrack_is_read_in_linear_time(text):
    import time

    from kb.engine.remediate import _label_value

    started = time.perf_counter()
    find_job(text)
    _label_value(text)
    assert time.perf_counter() - started < 1.0  # the unbounded gaps took about 50 s on 64 KiB of spaces


def test_two_processes_writing_the_audit_log_at_once_leave_only_whole_lines(tmp_path):
    path = tmp_path / "audit.jsonl"
    writer = ("import sys; from pathlib import Path; from kb.jobs.remediate import AuditLog\n"
              "log = AuditLog(Path(sys.argv[1]))\n"
              "for n in range(200): log.write(event='step', ticket=sys.argv[2], index=n, result='x' * 5000)\n")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(path), name], cwd=ROOT) for name in ("A", "B")]
    assert [p.wait(120) for p in procs] == [0, 0]
    records = AuditLog(path).records()
    assert len(records) == 400 and {r["ticket"] for r in records} == {"A", "B"}
