"""A real single-host Slurm cluster for tests: munged, slurmctld and one slurmd per node name
(``slurmd -N``), all on loopback ports, state under a temporary directory.

Needs the Debian packages ``slurm-wlm`` and ``munge`` (``make slurm`` installs them) and root (the
daemons run as root here). ``SlurmTestCluster.available()`` says why not when it cannot start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

NODES = ("gpu-a1", "gpu-a2")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmTestCluster:
    """Start with ``start()``, stop with ``stop()``; ``env`` points the Slurm tools at it."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    @staticmethod
    def available() -> str | None:
        """Why a cluster cannot start here (None when it can)."""
        missing = [tool for tool in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch")
                   if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]
        if missing:
            return f"Slurm is not installed ({', '.join(missing)} missing): run `make slurm`"
        if os.geteuid() != 0:
            return "the test cluster's daemons run as root"
        return None

    def _write_conf(self) -> None:
        host = socket.gethostname()
        for name in ("state", "log", *(f"spool/{n}" for n in NODES)):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 "
                          f"RealMemory=500 State=UNKNOWN" for n in NODES)
        self.conf.write_text(f"""ClusterName=pmkbtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
AuthType=auth/munge
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd-%n.log
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
JobRequeue=1
MpiDefault=none
{nodes}
PartitionName=gpu Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def _sbin(self, tool: str) -> str:
        return shutil.which(tool) or f"/usr/sbin/{tool}"

    def start(self) -> None:
        self._write_conf()
        self._start_munged()
        self.daemons.append(subprocess.Popen([self._sbin("slurmctld"), "-D", "-f", str(self.conf)], env=self.env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for node in NODES:
            self.daemons.append(subprocess.Popen([self._sbin("slurmd"), "-D", "-f", str(self.conf), "-N", node],
                                                 env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            self.wait(lambda: self.node_states() == dict.fromkeys(NODES, "idle"), 60, "both nodes idle")
        except TimeoutError as err:
            raise TimeoutError(f"{err}; the daemons logged:\n{self.log()}") from None

    @staticmethod
    def _munge_works() -> bool:
        """Whether a munged answers: a socket file can outlive its daemon (a stale /run/munge)."""
        try:
            return subprocess.run(["munge", "-n"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munged(self) -> None:
        if self._munge_works():
            return
        munge_dir = Path("/run/munge")
        munge_dir.mkdir(parents=True, exist_ok=True)
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run([self._sbin("mungekey"), "--create"], check=True, capture_output=True)
        subprocess.run(["chown", "-R", "munge:munge", "/etc/munge", str(munge_dir)], capture_output=True)
        started = subprocess.run([self._sbin("munged"), "--force"], capture_output=True, text=True)
        self.wait(self._munge_works, 15, f"munged to answer (munged --force: {started.stderr.strip() or 'ok'})")

    def stop(self) -> None:
        try:  # the jobs first, so no batch script outlives its slurmd
            self.run("scancel", "--user", "root")
            self.wait(lambda: not self.run("squeue", "-h"), 30, "the jobs to end")
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            pass
        for daemon in self.daemons:
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()

    def run(self, *argv: str) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def node_states(self) -> dict[str, str]:
        try:
            lines = self.run("sinfo", "-h", "-N", "-o", "%N %t").splitlines()
        except (RuntimeError, subprocess.TimeoutExpired):  # the controller is not up yet
            return {}
        return dict(line.split() for line in lines if line.strip())

    def job(self, job_id: str) -> tuple[str, str]:
        """(state, node list) of a job."""
        state, _, nodes = self.run("squeue", "-h", "-j", job_id, "-o", "%T %N").partition(" ")
        return state, nodes.strip()

    def log(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").glob("*.log")))

    @staticmethod
    def wait(check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm test cluster: {what} not within {timeout:g} s")
            time.sleep(0.5)
