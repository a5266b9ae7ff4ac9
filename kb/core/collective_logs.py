"""What each rank of a failed distributed job said: the collective it timed out on, the last one it
completed, its host and GPU, its first error.

Formats read: PyTorch's ProcessGroupNCCL watchdog (``WorkNCCL(SeqNum=.., OpType=..)``, "last
enqueued/completed NCCL work"), NCCL_DEBUG=INFO/WARN lines (``host:pid:tid [dev] NCCL ...``, the
communicator's "rank R nranks N cudaDev D busId B" line, NET/IB errors, ``ncclRemoteError``),
torchelastic's failure summary (host, rank, exit code, "Root Cause"), gloo's timeouts, PyTorch's
flight-recorder dumps, and lines prefixed by rank (``[rank3]:`` or ``srun --label``'s ``3:``).
Every pattern is anchored or bounded, so a line costs linear time whatever it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kb.core.rank_logs import LogSource


@dataclass(frozen=True)
class LogLine:
    """A line of the logs, cited by source and number."""

    source: str
    number: int
    text: str

    def cite(self) -> str:
        """``source:number: text`` (the text shortened)."""
        text = self.text.strip()
        return f"{self.source}:{self.number}: {text[:220]}{'...' if len(text) > 220 else ''}"


@dataclass
class RankFacts:
    """What one rank's lines say."""

    rank: int
    host: str | None = None
    gpu: str | None = None  # cudaDev and bus id, as NCCL printed them
    timed_out: tuple[int, str] | None = None  # (sequence number, collective) its watchdog reported
    group: str = "0"  # the process group of that collective (0: the default group)
    last_enqueued: int | None = None
    last_completed: int | None = None
    ops: dict[int, str] = field(default_factory=dict)  # sequence number -> collective, from a dump
    sizes: dict[int, str] = field(default_factory=dict)  # sequence number -> input sizes, from a dump
    first_error: LogLine | None = None
    network_errors: list[LogLine] = field(default_factory=list)
    peers: set[str] = field(default_factory=set)  # remote peers its network errors name
    hardware_errors: list[LogLine] = field(default_factory=list)
    exit: str | None = None  # torchelastic's exit code or signal
    root_cause: bool = False  # torchelastic's "first observed failure"
    launcher_line: LogLine | None = None  # the launcher summary's line for this rank
    lines: int = 0  # how many lines this rank wrote
    timeout_line: LogLine | None = None
    dump: str | None = None  # the flight-recorder dump read for it
    marks_completion: bool = True  # whether its dump marks entries completed (NCCL does, gloo does not)
    # Two timeout reports of one process group far apart, or two collectives at one number: the logs
    # of two runs (jobs, or a launcher's restart attempts) mixed together.
    other_run: tuple[tuple[int, str], tuple[int, str]] | None = None


@dataclass
class JobLogs:
    """Every rank's facts, and what the logs say about the job as a whole."""

    ranks: dict[int, RankFacts] = field(default_factory=dict)
    world_size: int | None = None
    mismatch: list[LogLine] = field(default_factory=list)  # PyTorch's collective-mismatch reports
    missing: set[int] = field(default_factory=set)  # ranks the flight-recorder analyser says never joined
    missing_line: LogLine | None = None
    notes: list[str] = field(default_factory=list)
    unattributed_errors: list[LogLine] = field(default_factory=list)  # errors no rank can be named for

    def rank(self, rank: int) -> RankFacts:
        """The facts of ``rank``, created empty on first use."""
        if rank not in self.ranks:
            self.ranks[rank] = RankFacts(rank)
        return self.ranks[rank]


RUN_GAP = 16  # sequence numbers one rank's timeout reports may lie apart within one run (works in flight)
_TORCH_PREFIX = re.compile(r"\[rank(\d{1,6})\]:\s?")  # searched in a line's first 300 characters
_SRUN_LABEL = re.compile(r"^ {0,5}(\d{1,6}): ")
_RANK_IN_MESSAGE = re.compile(r"\[(?:PG [^\]\[]{0,120} )?Rank (\d{1,6})\]")
_NCCL = re.compile(r"^\s{0,8}([A-Za-z0-9][\w.\-]{0,252}):(\d{1,10}):(\d{1,10}) \[(\d{1,3})\] "
                   r"(?:[\w./\-]{1,120}:\d{1,6} )?NCCL (INFO|WARN|ERROR)\b")
_COMM = re.compile(r"\bcomm 0x[0-9a-fA-F]{1,16} rank (\d{1,6}) nranks (\d{1,6}) cudaDev (\d{1,3})"
                   r"(?: nvmlDev \d{1,3})? busId ([0-9a-fA-F]{1,16})")
_WATCHDOG = re.compile(r"Work(?:NCCL|Gloo)?\(SeqNum=(\d{1,12}), OpType=([A-Za-z_]{1,40})")
_PG = re.compile(r"\[PG (?:ID )?(\d{1,6})\b")
_FINGERPRINT = re.compile(r"Rank (\d{1,6}) is running (?:inconsistent )?collective: CollectiveFingerPrint\("
                          r"SequenceNumber=(\d{1,12}), OpType=([A-Za-z_]{1,40})")
_MISSING = re.compile(r"missing ranks: \{([\d, ]{1,20000})\}")
_PEER = re.compile(r"(?:from|by remote) peer ([\w.:\-]{1,64}?)<\d{1,6}>")
_LAST_WORK = re.compile(r"last enqueued (?:NCCL )?work: (-?\d{1,12}), last completed (?:NCCL )?work: (-?\d{1,12})")
_ELASTIC_HOST = re.compile(r"^\s{0,8}host\s{0,12}: (\S{1,253})")
_ELASTIC_RANK = re.compile(r"^\s{0,8}rank\s{0,12}: (\d{1,6})")
_ELASTIC_EXIT = re.compile(r"^\s{0,8}exitcode\s{0,12}: (-?\d{1,4})")
_ELASTIC_SECTION = re.compile(r"^\s{0,8}(Failures|Root Cause \(first observed failure\)):")
_WORLD = re.compile(r"\b(?:world[_ ]size|WORLD_SIZE|nranks)[=: ]{1,3}(\d{1,6})")
_UNNUMBERED_TIMEOUT = re.compile(r"Timed out waiting \d{1,12}ms for (?:recv|send) operation|"
                                 r"Watchdog caught collective operation timeout|"
                                 r"Application timeout caused pair closure")
UNNUMBERED = (0, "?")  # a timeout whose collective the line does not number
_MISMATCH = re.compile(r"Detected mismatch between collectives on ranks|collective operation mismatch", re.I)

_NETWORK = re.compile(r"NET/IB|NET/Socket|IBV_WC_|ibv_\w{1,30} failed|ncclRemoteError|ncclSystemError|"
                      r"Connection (?:closed|reset) by (?:remote )?peer|port error|link (?:is )?down|"
                      r"Connection refused|No route to host", re.I)
_HARDWARE = re.compile(r"\bXid\b|fallen off the bus|uncorrectable ECC|ECC error|NVRM:|GPU is lost|"
                       r"ncclUnhandledCudaError|CUDA error: (?:unknown error|an illegal instruction|"
                       r"uncorrectable)|NVLink error|row remap", re.I)
_ERROR = re.compile(r"NCCL WARN|\bError\b|Error: |Exception|Segmentation fault|"
                    r"SIG(?:ABRT|SEGV|KILL|BUS)|\bKilled\b|timed out|Timed out|\bFATAL\b|nccl\w{0,20}Error", re.I)
# Consequences every rank prints once the collective is stuck: not a rank's own first error.
_CONSEQUENCE = re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out|"
                          r"Some NCCL operations have failed or timed out|To avoid data inconsistency|"
                          r"Timeout at NCCL work|ChildFailedError|Root Cause \(first observed failure\)|"
                          r"Signal \d+ \(SIG\w+\) received by PID|elastic\.multiprocessing|"
                          r"NCCL watchdog thread terminated|ProcessGroupNCCL's watchdog got stuck|"
                          r"Received a dump signal|Timed out waiting \d+ms for|Application timeout caused pair closure|"
                          r"Sending process \d+ closing signal|failed \(exitcode", re.I)


def read_job(sources: list[LogSource]) -> JobLogs:
    """Every rank's facts from the sources."""
    job = JobLogs()
    for source in sources:
        job.notes.extend(source.notes)
        if source.dump is not None:
            _read_dump(job, source)
        else:
            _read_lines(job, source)
    for facts in job.ranks.values():
        _stuck_in_dump(facts)
    return job


def _stuck_in_dump(facts: RankFacts) -> None:
    """The collective a rank's dump shows it stuck in, once its lines are read too."""
    if facts.dump is None or facts.last_enqueued is None:
        return
    if not facts.marks_completion:
        # gloo never marks an entry completed: a dump taken at a timeout ends in the stuck collective,
        # one taken at any other failure (an exception in the rank's own code) does not
        if facts.timed_out is None:
            facts.last_completed = facts.last_enqueued
            return
        facts.last_completed = facts.last_enqueued - 1
    stuck = (facts.last_completed or 0) + 1
    if stuck in facts.ops:
        if facts.timed_out in (None, UNNUMBERED):
            facts.timed_out = (stuck, facts.ops[stuck])
        facts.timeout_line = facts.timeout_line or LogLine(facts.dump, 0, f"flight recorder: collective "
                                                           f"#{stuck} {facts.ops[stuck]} not completed")


def _read_lines(job: JobLogs, source: LogSource) -> None:
    pid_rank: dict[tuple[str, str], int] = {}  # (host, pid) -> rank, from the communicator line
    elastic: dict[str, str | int | bool | None] = {}
    previous: tuple[int | None, str] = (None, "")
    for number, text in enumerate(source.lines, 1):
        if not text.strip():
            continue
        line = LogLine(source.name, number, text)
        rank, body = _line_rank(text, source.rank)
        if rank is None and (body.lstrip().startswith("WorkNCCL(") or previous[1].rstrip().endswith(":")):
            rank = previous[0]  # a message wrapped onto the next line
            body = previous[1][-500:].rstrip() + " " + body.strip()
        previous = (rank, body)
        nccl = _NCCL.match(body)
        if nccl:
            host, pid = nccl.group(1), nccl.group(2)
            comm = _COMM.search(body)
            if comm:
                size = int(comm.group(2))
                if size >= (job.world_size or 0):  # the world communicator, not a sub-group
                    job.world_size = size
                    pid_rank[(host, pid)] = int(comm.group(1))
                    facts = job.rank(int(comm.group(1)))
                    facts.host, facts.gpu = host, f"cudaDev {comm.group(3)} busId {comm.group(4)}"
            rank = pid_rank.get((host, pid), rank)
            if rank is not None and job.rank(rank).host is None:
                job.rank(rank).host = host
        _read_elastic(job, elastic, body, line)
        world = _WORLD.search(body)
        if world and not nccl:
            job.world_size = max(job.world_size or 0, int(world.group(1)))
        if _MISMATCH.search(body):
            job.mismatch.append(line)
            for match in _FINGERPRINT.finditer(body):
                job.rank(int(match.group(1))).ops.setdefault(int(match.group(2)), match.group(3).upper())
        missing = _MISSING.search(body)
        if missing:
            job.missing |= {int(r) for r in missing.group(1).replace(" ", "").split(",") if r}
            job.missing_line = job.missing_line or line
        if rank is None:
            if _ERROR.search(body) and not _CONSEQUENCE.search(body) and len(job.unattributed_errors) < 50:
                job.unattributed_errors.append(line)
            continue
        _read_rank_line(job.rank(rank), body, line, _group_of(body, rank))


def _line_rank(text: str, file_rank: int | None) -> tuple[int | None, str]:
    """The rank a line speaks for and the line without its rank prefix."""
    match = _TORCH_PREFIX.search(text, 0, 300)
    if match:
        return int(match.group(1)), text[match.end():]
    match = _SRUN_LABEL.match(text)
    if match:
        return int(match.group(1)), text[match.end():]
    match = _RANK_IN_MESSAGE.search(text)
    return (int(match.group(1)) if match else file_rank), text


def _group_of(body: str, rank: int) -> str:
    """The process group a line's message speaks of: its PG id, else a sub-group when the message's
    rank differs from the line's global rank ("[rank13]: [Rank 1] Watchdog ..."), else the default."""
    group = _PG.search(body)
    if group:
        return group.group(1)
    in_message = _RANK_IN_MESSAGE.search(body)
    return "sub-group" if in_message and int(in_message.group(1)) != rank else "0"


def _read_rank_line(facts: RankFacts, body: str, line: LogLine, group: str = "0") -> None:
    facts.lines += 1
    watchdog = _WATCHDOG.search(body)
    if watchdog and any(word in body.lower() for word in ("timeout", "timed out", "timing out")):
        report = (int(watchdog.group(1)), watchdog.group(2).upper())
        if (facts.timed_out not in (None, UNNUMBERED, report) and facts.group == group and not facts.other_run
                and (abs(facts.timed_out[0] - report[0]) > RUN_GAP or facts.timed_out[0] == report[0])):
            facts.other_run = (facts.timed_out, report)  # two runs' logs (two jobs, or restarts) in one
        facts.timed_out = report
        facts.group = group
        facts.timeout_line = facts.timeout_line or line
    elif facts.timed_out is None and _UNNUMBERED_TIMEOUT.search(body):
        facts.timed_out = UNNUMBERED  # gloo and older watchdogs do not print the sequence number
        facts.timeout_line = facts.timeout_line or line
    last = _LAST_WORK.search(body)
    if last and facts.timed_out is None:
        facts.group = group
    if last:
        facts.last_enqueued, facts.last_completed = int(last.group(1)), int(last.group(2))
        facts.timeout_line = facts.timeout_line or line
    if "NCCL INFO" in body:  # set-up chatter ("NET/IB : Using mlx5_0"), never an error
        return
    if _NETWORK.search(body):
        facts.network_errors.append(line)
        facts.peers.update(m.group(1) for m in _PEER.finditer(body))
    if _HARDWARE.search(body):
        facts.hardware_errors.append(line)
    if facts.first_error is None and _ERROR.search(body) and not _CONSEQUENCE.search(body):
        facts.first_error = line


def _read_elastic(job: JobLogs, state: dict, body: str, line: LogLine) -> None:
    """torchelastic's failure summary: blocks of host, rank and exit code, the first under 'Root Cause'."""
    section = _ELASTIC_SECTION.match(body)
    if section:
        state.clear()
        state["root"] = section.group(1).startswith("Root")
        return
    if "root" not in state:
        return
    host = _ELASTIC_HOST.match(body)
    if host:
        state["host"] = host.group(1)
        return
    rank = _ELASTIC_RANK.match(body)
    if rank:
        facts = job.rank(int(rank.group(1)))
        facts.host = facts.host or state.get("host")
        facts.root_cause = facts.root_cause or bool(state["root"])
        facts.launcher_line = line if state["root"] or facts.launcher_line is None else facts.launcher_line
        state["rank"] = facts.rank
        return
    code = _ELASTIC_EXIT.match(body)
    if code and state.get("rank") is not None:
        job.rank(state["rank"]).exit = code.group(1)


def _read_dump(job: JobLogs, source: LogSource) -> None:
    """A flight-recorder dump: the rank's collectives on the default group, by sequence number."""
    if source.rank is None:
        job.notes.append(f"{source.name}: a flight-recorder dump whose name gives no rank, skipped")
        return
    facts = job.rank(source.rank)
    states = set()
    for entry in source.dump.get("entries", []):
        if not isinstance(entry, dict) or entry.get("is_p2p") or str(_group(entry)) not in {"0", "default_pg"}:
            continue
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        op = str(entry.get("profiling_name", "?")).rsplit(":", 1)[-1].upper()
        facts.ops[seq], facts.sizes[seq] = op, str(entry.get("input_sizes"))
        facts.last_enqueued = max(facts.last_enqueued or 0, seq)
        states.add(entry.get("state"))
        if entry.get("state") == "completed":
            facts.last_completed = max(facts.last_completed or 0, seq)
        facts.lines += 1
    facts.dump = source.name
    facts.marks_completion = "completed" in states
    groups = source.dump.get("pg_config")
    for group in groups.values() if isinstance(groups, dict) else ():
        if isinstance(group, dict) and isinstance(group.get("ranks"), str) and group["ranks"].strip("[] "):
            job.world_size = max(job.world_size or 0, group["ranks"].count(",") + 1)


def _group(entry: dict) -> str:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    return str(entry.get("pg_id", "0"))
