"""The verdict on a collective timeout: which ranks never arrived, on which hosts, and what that
points to.

Every healthy rank reports the timeout; the rank that caused it often says nothing. So the ranks
are grouped by their last state (waiting in the stuck collective, never arrived, silent, ran a
different collective), the dominant group is taken as healthy and the outlier groups are the
suspects. Quick isolation of a few suspects beats slow exact localisation: the verdict names them
with the lines that show it, and says what it points to:

* ``one_node``: the suspects sit on one host: suspect node, hardware, retry safe without it;
* ``one_link``: suspects on a few hosts (a link or switch port they share): the network;
* ``everything``: every rank stuck alike, or suspects on most hosts: the fabric or the platform;
* ``diverging``: ranks ran different collectives at the same sequence number, or a suspect died
  in its own code: the user's program;
* ``undetermined``: the logs hold no collective state to compare.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb.core.collective_logs import JobLogs, LogLine, RankFacts

Kind = Literal["one_node", "one_link", "everything", "diverging", "undetermined"]

_USER_EXCEPTION = re.compile(r"^\s*(?:[\w.]{1,80}\.)?(\w{1,60}(?:Error|Exception)): ")
_NOT_USER = re.compile(r"DistBackendError|DistNetworkError|DistStoreError|ChildFailedError|NCCL|nccl|CUDA error|"
                       r"Timed out|timed out|Connection|gloo", re.I)
_GPU_LOST = re.compile(r"Xid\D{0,20}79\b|fallen off the bus|GPU is lost", re.I)
_ECC = re.compile(r"ECC|Xid\D{0,20}(?:48|63|64|92|94|95)\b|row remap", re.I)
_NVLINK = re.compile(r"NVLink|Xid\D{0,20}74\b", re.I)
_STOPPED = {"-15", "-2"}  # SIGTERM, SIGINT: the launcher stopping the ranks after another failed


class RankState(BaseModel):
    """One rank's last state, as its lines (or its silence) show it."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    host: str | None = None
    gpu: str | None = None
    state: str  # e.g. "waiting in #12 ALLREDUCE", "never arrived (last completed #11)", "silent"
    last_completed: int | None = None
    entered: bool | None = None  # whether it entered the stuck collective (None: unknown)
    first_error: str | None = None  # its first error line, cited
    exit: str | None = None  # the exit code torchelastic reported


class RankGroup(BaseModel):
    """Ranks that ended in the same state."""

    model_config = ConfigDict(extra="forbid")

    state: str
    ranks: list[int]
    hosts: list[str]
    healthy: bool  # the dominant group


class CollectiveVerdict(BaseModel):
    """What the ranks' logs say about a collective timeout."""

    model_config = ConfigDict(extra="forbid")

    kind: Kind
    summary: str  # one sentence for cards, comments and the terminal
    collective: str | None = None  # e.g. "ALLREDUCE"
    sequence: int | None = None  # its sequence number on the default process group
    world_size: int | None = None
    suspects: list[int] = Field(default_factory=list)  # ranks that never arrived or went elsewhere
    suspect_hosts: list[str] = Field(default_factory=list)
    dimension: str | None = None  # the taxonomy dimension the verdict points to
    causes: list[str] = Field(default_factory=list)  # root causes it points to, likeliest first
    retry_safe: bool = False  # resubmitting (without the suspect hosts) should clear it
    evidence: list[str] = Field(default_factory=list)  # cited log lines, "source:line: text"
    groups: list[RankGroup] = Field(default_factory=list)
    ranks: list[RankState] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # what was skipped or could not be read

    def describe(self) -> str:
        """One line for cards, comments and the terminal."""
        return f"Collective timeout: {self.kind.replace('_', ' ')}: {self.summary}"

    @property
    def suspect_node(self) -> str | None:
        """The one host to take out, when the verdict names exactly one."""
        return self.suspect_hosts[0] if self.kind == "one_node" and len(self.suspect_hosts) == 1 else None


def _stuck_group(job: JobLogs) -> str:
    """The process group whose collective timed out: the default group when any rank reports on it."""
    groups = Counter(f.group for f in job.ranks.values() if f.timed_out)
    return "0" if "0" in groups or not groups else groups.most_common(1)[0][0]


def _stuck(job: JobLogs, group: str) -> tuple[int, str | None] | None:
    """The collective most ranks report as timed out on ``group`` (sequence number, collective)."""
    reported = Counter(f.timed_out for f in job.ranks.values() if f.timed_out and f.group == group)
    if reported:
        (seq, op), _ = max(reported.items(), key=lambda item: (item[1], -item[0][0]))
        return seq, op
    pending = Counter(f.last_completed + 1 for f in job.ranks.values()
                      if f.last_completed is not None and f.last_enqueued is not None
                      and f.last_enqueued > f.last_completed)
    if pending:
        return pending.most_common(1)[0][0], None
    return None


def _state(facts: RankFacts | None, seq: int, op: str | None) -> tuple[str, bool | None]:
    """A rank's state relative to the stuck collective, and whether it entered it."""
    if facts is None or facts.lines == 0:
        return "silent: wrote nothing", None
    if facts.timed_out and facts.timed_out[0] != seq and facts.timed_out[0] and seq:
        return f"waiting in #{facts.timed_out[0]} {facts.timed_out[1]}", None
    ran = facts.ops.get(seq) or (facts.timed_out[1] if facts.timed_out and facts.timed_out[0] == seq else None)
    if ran and op and ran != op and "?" not in (ran, op):
        return f"ran {ran} at #{seq}", True
    waiting = f"waiting in #{seq}" if seq else "waiting: timed out"
    if facts.timed_out and facts.timed_out[0] == seq:
        return waiting, True
    if facts.last_enqueued is not None and facts.last_enqueued >= seq:
        return waiting, True
    if facts.last_enqueued is not None:
        return f"never arrived (last completed #{facts.last_completed})", False
    if facts.first_error is not None:
        return "failed before the collective", None
    return "no collective state", None


def _failed_first(job: JobLogs) -> list[int]:
    """With no collective stuck: the rank the launcher saw fail first (not one it stopped), else the
    few ranks that printed an error while the others did not."""
    if job.missing:
        return sorted(job.missing)
    roots = [f.rank for f in job.ranks.values() if f.root_cause and f.exit not in _STOPPED]
    if roots:
        return roots
    for signal in ("network_errors", "hardware_errors", "first_error"):
        erred = [f.rank for f in job.ranks.values() if getattr(f, signal)]
        if 0 < len(erred) <= max(1, len(job.ranks) // 4):
            return erred
    return []


def _launcher_state(facts: RankFacts | None, failed_first: bool, job: JobLogs) -> str:
    if failed_first and job.missing:
        return "never joined (flight-recorder analyser)"
    if failed_first and facts is not None and facts.exit is None and (facts.network_errors or facts.hardware_errors):
        return "failed first: " + ("network errors" if facts.network_errors else "hardware errors")
    if failed_first:
        return "failed first" + (f" (exit {facts.exit})" if facts and facts.exit else "")
    if facts is not None and facts.exit in _STOPPED:
        return "stopped by the launcher"
    return "silent: wrote nothing" if facts is None or facts.lines == 0 else "no collective state"


def _is_user_error(facts: RankFacts) -> bool:
    line = facts.first_error.text if facts.first_error else ""
    return bool(_USER_EXCEPTION.match(line.split("]:", 1)[-1])) and not _NOT_USER.search(line) \
        and not facts.hardware_errors


def _hardware_causes(suspects: list[RankFacts]) -> list[str]:
    text = " ".join(line.text for f in suspects for line in f.hardware_errors)
    if _GPU_LOST.search(text):
        return ["gpu_lost", "gpu_processor_fault", "node_outage"]
    if _ECC.search(text):
        return ["gpu_memory_error", "gpu_processor_fault"]
    if _NVLINK.search(text):
        return ["gpu_nvlink_error", "gpu_processor_fault"]
    network = " ".join(line.text for f in suspects for line in f.network_errors)
    if re.search(r"NET/IB|IBV_WC|ibv_", network):
        return ["infiniband_failure", "nic_failure", "network_switch_cable"]
    if network:
        return ["nic_failure", "network_switch_cable", "node_outage"]
    return ["node_outage", "gpu_processor_fault", "gpu_lost"]


MAX_SILENT = 1024  # ranks counted as silent beyond four times the ranks that wrote


def triage(job: JobLogs) -> CollectiveVerdict:
    """The verdict on a job's logs (see the module docstring)."""
    group = _stuck_group(job)
    stuck = _stuck(job, group)
    first = [] if stuck else _failed_first(job)
    if stuck is None and not first and not job.mismatch:
        return CollectiveVerdict(kind="undetermined", world_size=job.world_size, notes=job.notes,
                                 summary="No collective timeout found in the logs: no watchdog report, no "
                                         "'last completed' line and no flight-recorder dump.")
    mixed = next((f for f in job.ranks.values() if f.other_run), None)
    if mixed is not None:
        (a_seq, a_op), (b_seq, b_op) = mixed.other_run
        return CollectiveVerdict(kind="undetermined", world_size=job.world_size, notes=job.notes,
                                 summary=f"The logs hold more than one run: rank {mixed.rank} reported timeouts at "
                                         f"{a_op} #{a_seq} and at {b_op} #{b_seq}. Give the logs of one job (or "
                                         "of one restart attempt) and triage again.")
    seq, op = stuck if stuck else (0, None)
    # Ranks are numbered from 0: a rank below the highest one seen exists, even if it wrote nothing,
    # unless the numbers lie far beyond the ranks that wrote (a stray or hostile number).
    size = max(job.world_size or 0, max(job.ranks, default=-1) + 1)
    if size > 4 * len(job.ranks) + MAX_SILENT:
        job.notes.append(f"the logs name {size:,} ranks but only {len(job.ranks):,} wrote lines: ranks that "
                         "wrote nothing are not counted")
        size = 0
    expected = sorted(set(range(size)) | set(job.ranks))
    states: dict[int, RankState] = {}
    for rank in expected:
        facts = job.ranks.get(rank)
        state, entered = _state(facts, seq, op) if stuck else (_launcher_state(facts, rank in first, job), None)
        states[rank] = RankState(rank=rank, host=facts.host if facts else None, gpu=facts.gpu if facts else None,
                                 state=state, entered=entered,
                                 last_completed=facts.last_completed if facts else None,
                                 first_error=facts.first_error.cite() if facts and facts.first_error else None,
                                 exit=facts.exit if facts else None)
    if stuck and group != "0":  # a sub-group's collective: a rank that says nothing of it may not be a member
        for rank, state in states.items():
            facts = job.ranks.get(rank)
            if state.entered is None and not (facts and facts.group == group):
                state.state = f"not seen in process group {group}"
    groups = _groups(states, f"waiting in #{seq}" if seq else "waiting: timed out")
    healthy = next((g for g in groups if g.healthy), None)
    suspects = [r for g in groups if not g.healthy and not g.state.startswith("not seen") for r in g.ranks]
    if not stuck:
        suspects = [r for r in suspects if r in first]
    verdict = _decide(job, states, suspects, seq, op, stuck is not None)
    verdict.groups, verdict.ranks, verdict.notes = groups, list(states.values()), job.notes
    verdict.collective, verdict.sequence = (op if op != "?" else None), (seq or None)
    verdict.world_size = job.world_size or (len(expected) or None)
    verdict.evidence = _evidence(job, healthy, suspects)
    return verdict


def _groups(states: dict[int, RankState], stuck_state: str) -> list[RankGroup]:
    by_state: dict[str, list[int]] = {}
    for rank, s in states.items():
        by_state.setdefault(s.state, []).append(rank)
    waiting = [k for k in by_state if k.startswith("waiting")]
    others = [k for k in by_state if not k.startswith(("failed first", "never joined"))]
    dominant = (max(waiting or others, key=lambda k: (len(by_state[k]), k == stuck_state))
                if waiting or others else None)
    return sorted((RankGroup(state=k, ranks=v, healthy=k == dominant,
                             hosts=sorted({states[r].host for r in v if states[r].host}))
                   for k, v in by_state.items()), key=lambda g: (not g.healthy, -len(g.ranks), g.ranks[0]))


def _decide(job: JobLogs, states: dict[int, RankState], suspects: list[int], seq: int,
            op: str | None, stuck: bool) -> CollectiveVerdict:
    facts = [job.ranks[r] for r in suspects if r in job.ranks]
    where = f"{op if op and op != '?' else 'collective'} #{seq}" if seq else "the collective that timed out"
    named = _ranks_text(suspects, states)
    reasons = {states[r].state for r in suspects}
    missed = (f"never arrived at {where}" if stuck else "never joined the collective (flight-recorder analyser)"
              if job.missing else "hit network errors first" if "failed first: network errors" in reasons
              else "hit hardware errors first" if "failed first: hardware errors" in reasons
              else "failed first and the launcher stopped the other ranks")
    peers = sorted({peer for f in facts for peer in f.peers})
    if peers:
        missed += f"; its network errors name peer {', '.join(peers[:3])}"
    diverged = [r for r in suspects if states[r].state.startswith("ran ")]
    skewed = [r for r in suspects if states[r].state.startswith("waiting in #")]
    if job.mismatch or diverged or skewed:
        suspects = diverged or skewed or suspects
        named = _ranks_text(suspects, states)
        detail = (f"{named} ran a different collective at #{seq}" if diverged else
                  f"{named} waited in #{states[suspects[0]].state[12:]} while the others waited in {where}"
                  if skewed else "PyTorch reports a mismatch between the ranks' collectives")
        return CollectiveVerdict(kind="diverging", dimension="user", causes=["buggy_code"], suspects=suspects,
                                 summary=f"Diverging ranks: {detail}; the program issues different collectives "
                                         "on different ranks (user code), so a resubmission fails the same way.")
    user = [f for f in facts if _is_user_error(f)]
    if user:
        left = f"and left {where}; the other ranks waited for it" if stuck else "and the launcher stopped the others"
        error = user[0].first_error.text.split("]: ", 1)[-1].strip()[:160]
        return CollectiveVerdict(kind="diverging", dimension="user", causes=["buggy_code", "improper_configuration"],
                                 suspects=[f.rank for f in user],
                                 summary=f"{_ranks_text([f.rank for f in user], states)} raised in its own code "
                                         f"{left} (user code): {error}")
    hosts = sorted({states[r].host for r in suspects if states[r].host})
    all_hosts = {s.host for s in states.values() if s.host}
    waiting = [s for s in states.values() if s.state.startswith("waiting")]
    partial = any(s.state.startswith("not seen") for s in states.values()) or len(waiting) < 2
    if (not suspects and not partial) or (len(hosts) > 1 and len(hosts) * 2 >= max(len(all_hosts), 2)):
        scope = ("every rank is stuck alike" if not suspects
                 else f"the suspects span {len(hosts)} of {len(all_hosts)} hosts")
        return CollectiveVerdict(kind="everything", dimension=None, suspects=suspects,
                                 causes=["network_switch_cable", "infiniband_failure", "platform_misconfiguration"],
                                 summary=f"{where} timed out everywhere at once ({scope}): the fabric or the "
                                         "platform, not one node; check the switches and recent platform changes "
                                         "before resubmitting.")
    if not suspects or (not hosts and len(suspects) > 1):
        return CollectiveVerdict(kind="undetermined", suspects=suspects,
                                 summary=f"{named} {missed}; their hosts are not in the logs (NCCL_DEBUG=INFO prints "
                                         "them), so one node and one link cannot be told apart."
                                 if suspects else f"Only the ranks that timed out in {where} are in the logs; "
                                                  "nothing shows which member of the group never arrived.")
    if len(hosts) <= 1:
        node = hosts[0] if hosts else None
        return CollectiveVerdict(kind="one_node", dimension="hardware", suspects=suspects, suspect_hosts=hosts,
                                 causes=_hardware_causes(facts), retry_safe=True,
                                 summary=f"{named} {missed}"
                                         + (f": one node, {node}; resubmit without it." if node else
                                            "; its host is not in the logs (NCCL_DEBUG=INFO prints it)."))
    return CollectiveVerdict(kind="one_link", dimension="hardware", suspects=suspects, suspect_hosts=hosts,
                             causes=["network_switch_cable", "infiniband_failure", "nic_failure"], retry_safe=True,
                             summary=f"{named} on {', '.join(hosts)} never arrived at {where}: a link or switch "
                                     "port these hosts share; resubmit without them and check the port.")


def _ranks_text(ranks: list[int], states: dict[int, RankState]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    hosts = sorted({states[r].host for r in ranks if states[r].host})
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}" + (f" ({', '.join(hosts[:4])})" if hosts else "")


def _evidence(job: JobLogs, healthy: RankGroup | None, suspects: list[int]) -> list[str]:
    lines: list[LogLine] = []
    if healthy:
        example = job.ranks.get(healthy.ranks[0])
        if example and example.timeout_line:
            lines.append(example.timeout_line)
    for rank in suspects[:6]:
        facts = job.ranks.get(rank)
        if facts is None:
            continue
        for line in (facts.timeout_line, facts.launcher_line, facts.first_error, *facts.hardware_errors[:2],
                     *facts.network_errors[:2]):
            if line is not None and line not in lines:
                lines.append(line)
    lines.extend(job.mismatch[:2])
    if job.missing_line:
        lines.append(job.missing_line)
    return [line.cite() for line in lines[:12]]
